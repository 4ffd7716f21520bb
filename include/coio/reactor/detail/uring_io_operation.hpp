#pragma once
// UringReactor's single-shot operations: what each puts in its SQE (a
// Prep, with tryNow() if a non-blocking call may finish it first) and the
// awaitable that submits it. A new io_uring operation is a Prep here and
// a member of UringReactor that returns UringIoOperation<ItsPrep, T>.
// Needs liburing: link coio::uring.
#include <coio/core/result.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/detail/uring_ring.hpp>
#include <coio/reactor/uring_operation.hpp>

#include <liburing.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <optional>
#include <span>
#include <stop_token>
#include <utility>

namespace coio::detail {

struct RecvPrep {
  int fd;
  std::span<std::byte> buffer;
  int flags = 0;  // MSG_WAITALL for recvAll
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_recv(sqe, fd, buffer.data(), buffer.size(), flags);
  }
};
// A socket with room in its send buffer takes the data at once: one
// send(2) then costs less than an io_uring round trip (an enter to submit
// and one to reap). So the send operations try a non-blocking call first;
// this is its outcome as tryNow() reports it: the byte count (at most
// MAX_RW_COUNT, as an io_uring result), -errno, or nothing if the socket
// is full. What the socket did not take goes in an SQE with MSG_WAITALL:
// the kernel sends the rest as room frees (one completion, not one loop
// iteration per socket-buffer's worth) and completes with all of it, or
// with what it sent before an error or a cancellation.
inline constexpr int kSendSqeFlags = MSG_NOSIGNAL | MSG_WAITALL;
inline std::optional<int> sentNow(ssize_t n) noexcept {
  if (n >= 0) return static_cast<int>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::nullopt;
  return -errno;
}
struct SendPrep {
  int fd;
  std::span<const std::byte> buffer;
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_send(sqe, fd, buffer.data(), buffer.size(), kSendSqeFlags);
  }
  std::optional<int> tryNow() const noexcept {
    return sentNow(::send(fd, buffer.data(), buffer.size(), MSG_NOSIGNAL | MSG_DONTWAIT));
  }
};
struct SendvPrep {
  int fd;
  msghdr message;  // lives in the operation until the kernel has read it
  void operator()(io_uring_sqe* sqe) const noexcept { io_uring_prep_sendmsg(sqe, fd, &message, kSendSqeFlags); }
  std::optional<int> tryNow() const noexcept {
    return sentNow(::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT));
  }
};
struct AcceptPrep {
  int fd;
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_accept(sqe, fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  }
};
struct ConnectPrep {
  int fd;
  sockaddr_storage address;  // lives in the operation until the kernel has read it
  socklen_t length;
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_connect(sqe, fd, reinterpret_cast<const sockaddr*>(&address), length);
  }
};
struct PollPrep {
  int fd;
  unsigned events;
  void operator()(io_uring_sqe* sqe) const noexcept { io_uring_prep_poll_add(sqe, fd, events); }
};

/// One io_uring operation (see UringReactor). `co_await` yields Result<T>;
/// the coroutine resumes on the loop thread when the completion arrives, or
/// goes on without suspending if the operation finished inline (`tryNow`).
/// A stop cancels it; it still resumes only at its completion.
template <typename Prep, typename T>
class [[nodiscard]] UringIoOperation : UringOperation, public CancellableOperation<UringIoOperation<Prep, T>> {
  using Base = CancellableOperation<UringIoOperation>;
  friend Base;

 public:
  UringIoOperation(UringRing& ring, Prep prep, std::stop_token stop) noexcept
      : UringOperation{&UringIoOperation::onComplete}, Base(ring.loop(), std::move(stop)), ring_(ring),
        prep_(std::move(prep)) {}

 private:
  // True (result_ set) if the operation can finish at once (send) and did.
  bool tryNow() noexcept {
    if constexpr (requires(const Prep& p) { p.tryNow(); }) {
      if (const std::optional<int> done = prep_.tryNow()) {
        this->result_ = *done;
        return true;
      }
    }
    return false;
  }
  bool start() {
    ring_.submit(*this, prep_);
    return true;
  }
  void cancel() noexcept { ring_.cancel(*this); }
  Result<T> result() const { return toResult<T>(this->result_); }

  static void onComplete(UringOperation* op, int result, unsigned) noexcept {
    auto* self = static_cast<UringIoOperation*>(op);
    self->result_ = result;
    self->resume();
  }

  UringRing& ring_;
  Prep prep_;
};

}  // namespace coio::detail
