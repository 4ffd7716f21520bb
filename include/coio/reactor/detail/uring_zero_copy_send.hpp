#pragma once
// UringReactor::sendZeroCopy: the awaitable (UringZeroCopySend) and the
// list of such sends in flight (ZeroCopySends), whose connections the
// reactor resets before it waits for the kernel to let go of everything.
// Needs liburing: link coio::uring.
#include <coio/core/result.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/iovec.hpp>
#include <coio/reactor/detail/reset_connection.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/detail/uring_io_operation.hpp>
#include <coio/reactor/detail/uring_ring.hpp>
#include <coio/reactor/uring_operation.hpp>

#include <liburing.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stop_token>
#include <utility>

namespace coio::detail {

class UringZeroCopySend;

/// A ring's zero-copy sends between their SQE and their last completion.
/// Loop thread only.
class ZeroCopySends {
 public:
  /// Whether sends use SEND_ZC / SENDMSG_ZC (else a copying sendmsg).
  bool enabled() const noexcept { return enabled_; }
  void enable(bool on) noexcept { enabled_ = on; }

  void add(UringZeroCopySend& op) noexcept;
  void remove(UringZeroCopySend& op) noexcept;
  /// Before the ring is quiesced: a zero-copy send's notification waits for
  /// the peer to acknowledge the data, which a peer that stopped reading
  /// never does, so the wait for it could last for ever; with the
  /// connection reset, the kernel drops the data.
  void resetConnections() noexcept;
  /// After the ring was quiesced: all completed (unseen by their operations).
  void clear() noexcept { head_ = nullptr; }

 private:
  UringZeroCopySend* head_ = nullptr;  // a list through UringZeroCopySend::next_
  bool enabled_ = false;
};

/// What UringReactor::sendZeroCopy returns: `co_await` yields the bytes
/// sent (or the error), on the loop thread, once the kernel is done with the
/// memory (see sendZeroCopy).
///
/// A zero-copy send completes twice: its own CQE (the result, with
/// IORING_CQE_F_MORE when a notification follows: always once the kernel
/// took data) and the notification (IORING_CQE_F_NOTIF, no F_MORE). The
/// result is kept from the first, the coroutine resumes at the last, and
/// until then the operation is in its ring's ZeroCopySends.
/// Without zero copy (the fallback) there is one CQE.
class [[nodiscard]] UringZeroCopySend : UringOperation, public CancellableOperation<UringZeroCopySend> {
  using Base = CancellableOperation<UringZeroCopySend>;
  friend Base;
  friend class ZeroCopySends;

 public:
  UringZeroCopySend(UringRing& ring, ZeroCopySends& sends, int fd, std::span<const iovec> parts,
                    std::stop_token stop) noexcept
      : UringOperation{&UringZeroCopySend::onComplete}, Base(ring.loop(), std::move(stop)), ring_(ring),
        sends_(sends), fd_(fd), message_(messageOf(parts)) {}

 private:
  bool tryNow() const noexcept { return false; }  // never done without an SQE, but for a stop already requested
  bool start() {
    const bool zeroCopy = sends_.enabled();
    ring_.submit(*this, [&](io_uring_sqe* sqe) { prepare(sqe, zeroCopy); });
    if (zeroCopy) sends_.add(*this);  // a copying send is cancelled like any other
    return true;
  }
  void cancel() noexcept {
    if (!sent_) ring_.cancel(*this);  // after the send's CQE only its notification is due
  }
  Result<std::size_t> result() const { return toResult<std::size_t>(this->result_); }

  void prepare(io_uring_sqe* sqe, bool zeroCopy) const noexcept {
    if (!zeroCopy) {
      io_uring_prep_sendmsg(sqe, fd_, &message_, kSendSqeFlags);
    } else if (message_.msg_iovlen == 1) {  // no msghdr for the kernel to import
      const iovec& part = message_.msg_iov[0];
      // The SQE's length is 32 bits: clamped to what one send takes anyway (MAX_RW_COUNT).
      const auto length = static_cast<unsigned>(std::min<std::size_t>(part.iov_len, 0x7ffff000));
      io_uring_prep_send_zc(sqe, fd_, part.iov_base, length, kSendSqeFlags, 0);
    } else {
      io_uring_prep_sendmsg_zc(sqe, fd_, &message_, kSendSqeFlags);
    }
  }

  static void onComplete(UringOperation* op, int result, unsigned flags) noexcept {
    auto* self = static_cast<UringZeroCopySend*>(op);
    if (!(flags & IORING_CQE_F_NOTIF)) self->result_ = result;  // the send's own CQE
    if (flags & IORING_CQE_F_MORE) {
      self->sent_ = true;  // the kernel still references the memory: wait for its notification
      return;
    }
    self->sends_.remove(*self);
    self->resume();
  }

  UringRing& ring_;
  ZeroCopySends& sends_;
  int fd_;
  msghdr message_;     // lives in the operation until the kernel has read it
  bool sent_ = false;  // the send's own CQE came
  UringZeroCopySend* prev_ = nullptr;  // ZeroCopySends' list
  UringZeroCopySend* next_ = nullptr;
};

inline void ZeroCopySends::add(UringZeroCopySend& op) noexcept {
  op.next_ = head_;
  if (head_) head_->prev_ = &op;
  head_ = &op;
}

inline void ZeroCopySends::remove(UringZeroCopySend& op) noexcept {
  if (!enabled_) return;
  (op.prev_ ? op.prev_->next_ : head_) = op.next_;
  if (op.next_) op.next_->prev_ = op.prev_;
  op.prev_ = op.next_ = nullptr;
}

inline void ZeroCopySends::resetConnections() noexcept {
  for (UringZeroCopySend* op = head_; op; op = op->next_) (void)resetConnection(op->fd_);
}

}  // namespace coio::detail
