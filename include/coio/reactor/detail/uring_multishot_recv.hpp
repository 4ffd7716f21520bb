#pragma once
// UringReactor's multishot receive (RecvMode): one receiver per socket
// (UringReceiver) keeps a multishot recv armed that lands data in a ring of
// provided buffers shared by the reactor's sockets (UringReceivers owns
// both); a read (MultishotRead) takes what its receiver kept, or waits for
// it; UringRecv is recv's awaitable, a plain recv SQE or such a read.
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/provided_buffer_ring.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/detail/uring_io_operation.hpp>
#include <coio/reactor/detail/uring_ring.hpp>
#include <coio/reactor/detail/uring_setup.hpp>
#include <coio/reactor/uring_operation.hpp>
#include <coio/reactor/uring_options.hpp>

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <coroutine>
#include <cstddef>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace coio::detail {

/// What one socket's multishot recv keeps for its reader before it stops
/// taking data off the socket (TCP's flow control then holds the peer):
/// UringReactor::kRecvBacklogLimit.
inline constexpr std::size_t kRecvBacklogLimit = 64 * 1024;
/// Reads (or completions) in a row that switch a socket's recv mode under
/// RecvMode::adaptive: UringReactor::kRecvModeSwitch.
inline constexpr unsigned kRecvModeSwitch = 4;

class UringReceiver;
class MultishotRead;

/// The receivers of a reactor's sockets (unless RecvMode::plain), found by
/// fd, and the provided buffers their recvs share. Each receiver is also in
/// the list until freed, including after its socket was forgotten while its
/// recv was still armed. Loop thread only.
class UringReceivers {
 public:
  /// Checks the options (std::invalid_argument) before any ring exists.
  explicit UringReceivers(const UringOptions& options)
      : mode_(options.recvMode), count_(options.recvBuffers), size_(options.recvBufferSize) {
    if (mode_ != RecvMode::plain && (count_ == 0 || count_ > 32768 || (count_ & (count_ - 1)) != 0 || size_ == 0)) {
      throw std::invalid_argument(
          "coio::UringReactor: recvBuffers must be a power of two up to 32768 and recvBufferSize positive");
    }
  }
  UringReceivers(const UringReceivers&) = delete;
  UringReceivers& operator=(const UringReceivers&) = delete;
  /// Sockets still open here (their owners outlive the reactor) or closed
  /// while their recv was being cancelled: the kernel holds none of them
  /// now. The buffers go after the ring (the owner declares this first).
  ~UringReceivers() {
    while (list_) destroy(list_);
  }

  /// Registers the provided buffers with `ring` unless the mode is plain
  /// or the kernel has no multishot recv (before Linux 6.0: then plain):
  /// 0 or an errno (adaptive falls back to plain instead). Before the ring
  /// is enabled: a TaskRun::deferred ring takes registrations from its
  /// submitter thread only, which it does not have yet.
  int setUp(UringRing& ring) noexcept {
    ring_ = &ring;
    if (mode_ == RecvMode::plain || !kernelAtLeast(6, 0)) return 0;
    const int err = buffers_.emplace().setUp(ring.get(), kGroup, count_, size_);
    if (err && mode_ == RecvMode::adaptive) {
      buffers_.reset();  // not registered: reads stay plain, as before Linux 6.0
      return 0;
    }
    return err;
  }

  /// The recv mode in effect (UringReactor::recvMode()).
  RecvMode mode() const noexcept { return buffers_ ? mode_ : RecvMode::plain; }
  UringRing& ring() noexcept { return *ring_; }
  ProvidedBufferRing& buffers() noexcept { return *buffers_; }

  /// `fd`'s receiver, made on first use; null if there is no memory for
  /// one or `fd` is negative (not a socket: the plain recv reports EBADF).
  UringReceiver* receiverFor(int fd) noexcept;
  /// UringReactor::readsAhead.
  bool readsAhead(int fd) const noexcept;
  /// UringReactor::forget.
  void forget(int fd) noexcept;
  /// Frees `receiver` (its recv is not armed).
  void destroy(UringReceiver* receiver) noexcept;
  /// After the ring was quiesced: the kernel holds no recv any more.
  void disarmAll() noexcept;

 private:
  static constexpr unsigned short kGroup = 1;  // the provided buffers' group

  RecvMode mode_;
  unsigned count_;
  unsigned size_;
  UringRing* ring_ = nullptr;
  std::optional<ProvidedBufferRing> buffers_;  // set up iff multishot recvs may be used
  std::vector<UringReceiver*> byFd_;
  UringReceiver* list_ = nullptr;  // every receiver, a list through UringReceiver::next
};

/// One socket's receiver (unless RecvMode::plain), owned by the reactor.
/// In multishot mode its recv, armed by the first read that finds nothing
/// buffered, stays armed across reads; each completion's data goes to the
/// waiting read, the rest to a backlog for the next reads. In direct mode
/// (RecvMode::adaptive only) reads are plain recv SQEs of their own, which
/// report their sizes here. Loop thread only.
///
/// State machine, in a few words: `armed_` from the SQE until a completion
/// without IORING_CQE_F_MORE (end of stream, an error, ENOBUFS when the
/// provided buffers ran out, or our cancel); `end_` once the stream ended
/// for good (sticky, after the data before it); `released_` once the socket
/// was forgotten: the receiver then only waits for its last completion to
/// free itself. `multishot_` is the mode; leaving multishot mode cancels the
/// recv, and reads are served here until it is disarmed and the backlog is
/// drained (a read waiting then gets a one-shot recv from the provided
/// buffers), so the bytes keep their order.
class UringReceiver : UringOperation {
 public:
  UringReceiver(UringReceivers& owner, int fd, bool adaptive) noexcept
      : UringOperation{&UringReceiver::onComplete}, owner_(owner), fd_(fd), adaptive_(adaptive),
        multishot_(!adaptive) {}
  UringReceiver(const UringReceiver&) = delete;
  UringReceiver& operator=(const UringReceiver&) = delete;

  /// Whether the next read is a plain recv of its own (direct mode, nothing
  /// armed or kept here).
  bool readsDirect() const noexcept { return !multishot_ && !readsAhead(); }
  /// Whether a recv is armed or data (or the end) is kept here.
  bool readsAhead() const noexcept { return armed_ || buffered() != 0 || end_; }
  /// A direct read's result, `requested` bytes asked: kRecvModeSwitch short
  /// ones in a row (less than asked and than one provided buffer: the
  /// socket was drained) switch to multishot mode; one of a whole provided
  /// buffer or more resets the count. A small read that got all it asked
  /// for says nothing (the socket may hold more).
  void noteDirect(const Result<std::size_t>& read, std::size_t requested) noexcept {
    if (!read || *read == 0) return;  // errors and the end say nothing about the traffic
    if (*read >= bufferSize()) {
      streak_ = 0;
    } else if (*read < requested && ++streak_ == kRecvModeSwitch) {
      multishot_ = true;
      streak_ = 0;
    }
  }

  /// Copies what is buffered into `into`, or yields the end of the stream:
  /// true (with `result` set) if the read is done without waiting.
  bool tryTake(std::span<std::byte> into, int& result) noexcept {
    if (buffered() != 0 || into.empty()) {
      result = static_cast<int>(take(into));
      return true;
    }
    if (end_) result = *end_;
    return end_.has_value();
  }

  /// Makes `read` the waiting read, arming the recv if needed; false (with
  /// the errno in the read's result) if it could not be armed.
  bool wait(MultishotRead& read) noexcept;
  /// Forgets `read` if it is the waiting one (its stop was requested, or
  /// its frame is destroyed).
  void abandon(MultishotRead* read) noexcept {
    if (waiter_ == read) waiter_ = nullptr;
  }
  /// The socket is being forgotten: true if the receiver can be freed now,
  /// false if it frees itself at its recv's last completion.
  bool release() noexcept;
  /// After the reactor quiesced: the kernel holds no recv any more.
  void disarm() noexcept { armed_ = cancelling_ = false; }
  /// The loop of the ring its recv goes to.
  LoopCore& loop() noexcept;

  UringReceiver* prev = nullptr;  // UringReceivers' list
  UringReceiver* next = nullptr;

 private:
  std::size_t buffered() const noexcept { return backlog_.size() - head_; }
  std::size_t take(std::span<std::byte> into) noexcept {
    const std::size_t n = std::min(into.size(), buffered());
    std::memcpy(into.data(), backlog_.data() + head_, n);
    head_ += n;
    if (head_ == backlog_.size()) {
      backlog_.clear();
      head_ = 0;
    }
    return n;
  }
  std::size_t bufferSize() const noexcept;
  bool arm() noexcept;
  void cancel() noexcept;
  // A multishot completion of `size` bytes: kRecvModeSwitch full buffers in
  // a row switch an adaptive receiver to direct mode.
  void noteMultishot(std::size_t size) noexcept {
    if (!adaptive_ || !multishot_) return;
    if (size < bufferSize()) {
      streak_ = 0;
    } else if (++streak_ == kRecvModeSwitch) {
      leaveMultishot();
    }
  }
  void leaveMultishot() noexcept {
    multishot_ = false;
    streak_ = 0;
    if (armed_) cancel();
  }
  // Hands `data` to the waiting read, the rest to the backlog; true if the
  // waiting read got some.
  bool deliver(std::span<const std::byte> data) noexcept;
  static void onComplete(UringOperation* op, int result, unsigned flags) noexcept;

  UringReceivers& owner_;
  int fd_;
  const bool adaptive_;
  bool multishot_;
  unsigned streak_ = 0;  // reads or completions in a row that argue for the other mode
  bool armed_ = false;
  bool cancelling_ = false;
  bool released_ = false;
  std::optional<int> end_;        // 0 (end of stream) or -errno, once the recv ended for good
  std::vector<std::byte> backlog_;  // received, not read yet: [head_, size())
  std::size_t head_ = 0;
  MultishotRead* waiter_ = nullptr;
};

/// A read served by the socket's UringReceiver: completes at once from the
/// backlog, else resumes on the loop thread when data (or the end) arrives.
/// Cancelling it leaves the receiver's recv as it is (the kernel holds no
/// buffer of this read's): it resumes in a later loop iteration with
/// operation_canceled, and data arriving later waits for the next read.
class [[nodiscard]] MultishotRead : public CancellableOperation<MultishotRead> {
  using Base = CancellableOperation<MultishotRead>;
  friend Base;
  friend class UringReceiver;

 public:
  MultishotRead(UringReceiver& receiver, std::span<std::byte> buffer, std::stop_token stop) noexcept;
  ~MultishotRead() {
    if (waiting_ && receiver_) receiver_->abandon(this);  // the frame is destroyed while suspended here
  }

 private:
  // True (result_ set) if the receiver kept data (or the end) for the read.
  bool tryNow() noexcept {
    int taken = 0;
    if (!receiver_->tryTake(buffer_, taken)) return false;
    result_ = taken;
    return true;
  }
  bool start() noexcept {
    waiting_ = receiver_->wait(*this);
    return waiting_;
  }
  void cancel() noexcept {
    if (receiver_) std::exchange(receiver_, nullptr)->abandon(this);
    waiting_ = false;
    result_ = -ECANCELED;
    resumeLater();
  }
  Result<std::size_t> result() noexcept {
    waiting_ = false;  // the socket may be forgotten before this is destroyed
    return toResult<std::size_t>(result_);
  }

  std::span<std::byte> buffer_;
  UringReceiver* receiver_;  // null once the socket was forgotten
  bool waiting_ = false;     // the receiver's waiting read, until resumed
};

inline bool UringReceiver::release() noexcept {
  released_ = true;
  // A read still pending (only after stop(): its frame is destroyed later,
  // maybe after this receiver) must not reach back into it.
  if (waiter_) std::exchange(waiter_, nullptr)->receiver_ = nullptr;
  if (!armed_) return true;
  cancel();
  return false;
}

inline MultishotRead::MultishotRead(UringReceiver& receiver, std::span<std::byte> buffer,
                                    std::stop_token stop) noexcept
    : Base(receiver.loop(), std::move(stop)), buffer_(buffer), receiver_(&receiver) {}

inline bool UringReceiver::wait(MultishotRead& read) noexcept {
  COIO_ASSERT(waiter_ == nullptr, "two reads pending on one socket");
  if (!armed_ && !arm()) {
    read.result_ = -owner_.ring().submitError();
    return false;
  }
  waiter_ = &read;
  return true;
}

inline std::size_t UringReceiver::bufferSize() const noexcept { return owner_.buffers().bufferSize(); }
inline LoopCore& UringReceiver::loop() noexcept { return owner_.ring().loop(); }

inline bool UringReceiver::arm() noexcept {
  armed_ = owner_.ring().trySubmit(*this, [&](io_uring_sqe* sqe) {
    if (multishot_) {
      io_uring_prep_recv_multishot(sqe, fd_, nullptr, 0, 0);
    } else {
      io_uring_prep_recv(sqe, fd_, nullptr, 0, 0);  // leaving multishot mode: one buffer's worth
    }
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = owner_.buffers().group();
  });
  return armed_;
}

inline void UringReceiver::cancel() noexcept {
  if (cancelling_) return;
  cancelling_ = true;
  owner_.ring().cancel(*this);
}

inline bool UringReceiver::deliver(std::span<const std::byte> data) noexcept {
  if (end_) return false;  // broken (see below): nothing after the gap may be read
  const bool served = waiter_ != nullptr;  // a read waits only on an empty backlog
  if (served) {  // the usual case: straight to the reader
    const std::size_t n = std::min(data.size(), waiter_->buffer_.size());
    std::memcpy(waiter_->buffer_.data(), data.data(), n);
    waiter_->result_ = static_cast<int>(n);
    data = data.subspan(n);
  }
  try {
    backlog_.insert(backlog_.end(), data.begin(), data.end());
  } catch (const std::bad_alloc&) {
    // Received but nowhere to keep it: the stream is broken from here on.
    end_ = -ENOMEM;
    backlog_.clear();
    head_ = 0;
  }
  return served;
}

inline void UringReceiver::onComplete(UringOperation* op, int result, unsigned flags) noexcept {
  auto* self = static_cast<UringReceiver*>(op);
  if (!(flags & IORING_CQE_F_MORE)) self->disarm();
  bool delivered = false;
  if (flags & IORING_CQE_F_BUFFER) {
    const auto id = static_cast<unsigned short>(flags >> IORING_CQE_BUFFER_SHIFT);
    ProvidedBufferRing& buffers = self->owner_.buffers();
    if (result > 0 && !self->released_) {
      delivered = self->deliver(buffers.data(id, static_cast<std::size_t>(result)));
      self->noteMultishot(static_cast<std::size_t>(result));
    }
    buffers.recycle(id);  // also when the kernel picked a buffer for an end of stream
  }
  if (result == 0 || (result < 0 && result != -ENOBUFS && result != -ECANCELED)) {
    self->end_ = result;  // end of stream, or the socket's error
  }
  if (self->released_) {
    if (!self->armed_) self->owner_.destroy(self);
    return;
  }
  // Past the limit, or broken (no memory for the backlog): stop taking data
  // (an adaptive receiver takes the limit for a stream).
  if (self->armed_ && self->end_) self->cancel();
  if (self->armed_ && self->buffered() >= kRecvBacklogLimit) {
    if (self->adaptive_) {
      self->leaveMultishot();
    } else {
      self->cancel();
    }
  }
  MultishotRead* read = self->waiter_;
  if (!read) return;
  if (!delivered) {
    if (self->end_) {
      read->result_ = *self->end_;
    } else if (self->armed_ || self->arm()) {
      return;  // still waiting (after ENOBUFS or our cancel, on a re-armed recv)
    } else {
      read->result_ = -self->owner_.ring().submitError();
    }
  }
  self->waiter_ = nullptr;
  read->resume();  // last: the reader may read again, or close the socket
}

/// What UringReactor::recv returns: a plain recv SQE (UringIoOperation) or
/// a MultishotRead, as the reactor's recv mode and the socket's receiver
/// say (decided when recv() is called).
class [[nodiscard]] UringRecv {
 public:
  /// A plain recv; `receiver` (direct mode) hears its result.
  UringRecv(UringRing& ring, RecvPrep prep, std::stop_token stop, UringReceiver* receiver) noexcept
      : op_(std::in_place_index<0>, ring, prep, std::move(stop)), receiver_(receiver),
        requested_(prep.buffer.size()) {}
  UringRecv(UringReceiver& receiver, std::span<std::byte> buffer, std::stop_token stop) noexcept
      : op_(std::in_place_index<1>, receiver, buffer, std::move(stop)) {}

  bool await_ready() noexcept {
    return std::visit([](auto& op) { return op.await_ready(); }, op_);
  }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    return std::visit(
        [h](auto& op) {
          if constexpr (std::is_void_v<decltype(op.await_suspend(h))>) {
            op.await_suspend(h);
            return true;
          } else {
            return op.await_suspend(h);
          }
        },
        op_);
  }
  Result<std::size_t> await_resume() {
    Result<std::size_t> read = std::visit([](auto& op) { return op.await_resume(); }, op_);
    if (receiver_) receiver_->noteDirect(read, requested_);
    return read;
  }

 private:
  std::variant<UringIoOperation<RecvPrep, std::size_t>, MultishotRead> op_;
  UringReceiver* receiver_ = nullptr;  // direct reads: hears the result
  std::size_t requested_ = 0;
};

inline UringReceiver* UringReceivers::receiverFor(int fd) noexcept {
  if (fd < 0) return nullptr;
  const auto slot = static_cast<std::size_t>(fd);
  try {
    if (slot >= byFd_.size()) byFd_.resize(slot + 1);
    if (!byFd_[slot]) {
      auto* receiver = new UringReceiver(*this, fd, mode_ == RecvMode::adaptive);
      receiver->next = list_;
      if (list_) list_->prev = receiver;
      list_ = receiver;
      byFd_[slot] = receiver;
    }
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  return byFd_[slot];
}

inline bool UringReceivers::readsAhead(int fd) const noexcept {
  const auto slot = static_cast<std::size_t>(fd);
  return fd >= 0 && slot < byFd_.size() && byFd_[slot] && byFd_[slot]->readsAhead();
}

inline void UringReceivers::forget(int fd) noexcept {
  if (fd < 0 || static_cast<std::size_t>(fd) >= byFd_.size()) return;
  UringReceiver* receiver = std::exchange(byFd_[static_cast<std::size_t>(fd)], nullptr);
  if (receiver && receiver->release()) destroy(receiver);
}

inline void UringReceivers::destroy(UringReceiver* receiver) noexcept {
  (receiver->prev ? receiver->prev->next : list_) = receiver->next;
  if (receiver->next) receiver->next->prev = receiver->prev;
  delete receiver;
}

inline void UringReceivers::disarmAll() noexcept {
  for (UringReceiver* r = list_; r; r = r->next) r->disarm();
}

}  // namespace coio::detail
