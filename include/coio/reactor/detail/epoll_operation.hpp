#pragma once
// EpollReactor's operations: the non-blocking system call behind each
// (an Attempt) and the awaitable that tries it and waits for readiness.
#include <coio/core/result.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/epoll_backend.hpp>
#include <coio/reactor/detail/iovec.hpp>
#include <coio/reactor/detail/splice_call.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/loop_stats.hpp>

#include <sys/sendfile.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stop_token>
#include <tuple>
#include <utility>

namespace coio::detail {

// The non-blocking system call behind each operation: the raw result, or
// -EAGAIN when it would block. `exhausted(result)`: the result proves the
// fd is no longer ready (a short read drained the socket, a short write
// filled it), so the next attempt would only find EAGAIN; the next edge
// reports new readiness. (Not 0 from recv: end of stream stays readable.)
// Each attempt's `kind` is the LoopStats counter of its waits.
struct RecvAttempt {
  static constexpr OpKind kind = OpKind::recv;
  int fd;
  std::span<std::byte> buffer;
  long operator()() noexcept { return retryOnEintr([&] { return ::recv(fd, buffer.data(), buffer.size(), 0); }); }
  bool exhausted(long result) const noexcept { return result > 0 && static_cast<std::size_t>(result) < buffer.size(); }
};
struct SendAttempt {
  static constexpr OpKind kind = OpKind::send;
  int fd;
  std::span<const std::byte> buffer;
  long operator()() noexcept {
    return retryOnEintr([&] { return ::send(fd, buffer.data(), buffer.size(), MSG_NOSIGNAL); });
  }
  bool exhausted(long result) const noexcept { return result > 0 && static_cast<std::size_t>(result) < buffer.size(); }
};
struct SendvAttempt {
  static constexpr OpKind kind = OpKind::send;
  int fd;
  std::span<const iovec> parts;
  long operator()() noexcept {
    msghdr message = messageOf(parts);
    return retryOnEintr([&] { return ::sendmsg(fd, &message, MSG_NOSIGNAL); });
  }
  bool exhausted(long result) const noexcept { return result > 0 && static_cast<std::size_t>(result) < totalBytes(parts); }
};
struct NeverExhausted {
  bool exhausted(long) const noexcept { return false; }
};
struct AcceptAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::accept;
  int fd;
  long operator()() noexcept {
    for (;;) {
      const long r = retryOnEintr([&] { return ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC); });
      if (r != -ECONNABORTED) return r;  // a connection reset while queued: take the next one
    }
  }
};
struct ConnectAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::connect;
  int fd;
  sockaddr_storage address;
  socklen_t length;
  bool started = false;
  long operator()() noexcept {
    if (!started) {
      started = true;
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) return 0;
      // EINTR: the connection attempt goes on asynchronously, like EINPROGRESS.
      return errno == EINPROGRESS || errno == EINTR ? -EAGAIN : -errno;
    }
    int error = 0;
    socklen_t size = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return -errno;
    return -error;
  }
};
struct ReadinessAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::poll;
  long operator()() const noexcept { return 0; }
};
// splice and tee: either end may be the one not ready, so the attempt
// names the fd to wait on (waitEnd) each time it would block.
struct SpliceAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::other;
  SpliceCall call;
  long operator()() const noexcept { return withoutSigpipe(call); }
  std::pair<int, Direction> waitEnd() const noexcept {
    const SpliceWait wait = spliceWait(call.in, call.out);
    return {wait.fd, wait.write ? Direction::write : Direction::read};
  }
};
// sendfile(2) waits on `out` alone (its input is a regular file). A short
// count may be the file's end: it proves nothing about `out`.
struct SendfileAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::other;
  int out;
  int in;
  std::int64_t offset;
  std::size_t length;
  long operator()() const noexcept {
    const long r = withoutSigpipe([&] {
      off_t at = offset;
      return retryOnEintr([&] { return ::sendfile(out, in, &at, std::min(length, kMaxSpliceChunk)); });
    });
    // An `in` without offsets (a pipe, a socket): EINVAL, as a splice from
    // it at an offset (UringReactor's sendfile) says.
    return r == -ESPIPE ? -EINVAL : r;
  }
};

/// One epoll-driven operation (see EpollReactor). `co_await` yields
/// Result<T>; the coroutine resumes on the loop thread. The system call is
/// tried first (unless Rearm: a readiness wait), and again at each edge.
/// An Attempt with a `waitEnd()` (splice, tee) waits where that says each
/// time the call would block, the fd's current state reported (a rearm),
/// rather than on the fd it was made with and that fd's known readiness.
template <typename Attempt, typename T, bool Rearm>
class [[nodiscard]] EpollOperation : EpollWaiter, public CancellableOperation<EpollOperation<Attempt, T, Rearm>> {
  using Base = CancellableOperation<EpollOperation>;
  friend Base;
  static constexpr bool kPicksEnd = requires(const Attempt& a) { a.waitEnd(); };

 public:
  EpollOperation(EpollBackend& backend, int fd, Direction dir, Attempt attempt, std::stop_token stop) noexcept
      : Base(backend.core(), std::move(stop)), backend_(backend), fd_(fd), dir_(dir), attempt_(std::move(attempt)) {
    onReady = &EpollOperation::ready;
  }
  ~EpollOperation() {
    if (waiting_) backend_.endWait(fd_, dir_, Attempt::kind);  // the frame is destroyed while suspended here
  }

 private:
  // True (result_ set) if the operation is over without waiting.
  bool tryNow() {
    if (fd_ < 0) {  // a closed or moved-from socket: no fd state to touch
      this->result_ = -EBADF;
      return true;
    }
    if constexpr (Rearm) {
      return false;
    } else {
      // The system call, if the fd may be ready; true if it did not block.
      if (!mayBeReady()) return false;
      this->result_ = attempt_();
      if (this->result_ == -EAGAIN) return false;
      attempted(this->result_);
      return true;
    }
  }

  bool mayBeReady() {
    if constexpr (kPicksEnd) {
      return true;
    } else {
      return backend_.state(fd_).ready[static_cast<std::size_t>(dir_)];
    }
  }
  // After an attempt that did not block: what it proves about the fd.
  void attempted(long result) {
    if constexpr (!kPicksEnd) backend_.state(fd_).attempted(dir_, attempt_.exhausted(result));
  }

  bool start() {
    if constexpr (kPicksEnd) std::tie(fd_, dir_) = attempt_.waitEnd();
    if (const int err = backend_.startWait(fd_, dir_, *this, Rearm || kPicksEnd, Attempt::kind)) {
      this->result_ = -err;
      return false;
    }
    waiting_ = true;
    return true;
  }

  void cancel() noexcept {
    if (!waiting_) return;
    finish(-ECANCELED);
    this->resumeLater();
  }

  Result<T> result() const { return toResult<T>(this->result_); }

  void finish(long result) noexcept {
    backend_.endWait(fd_, dir_, Attempt::kind);
    waiting_ = false;
    this->result_ = result;
  }

  static void ready(EpollWaiter* w) noexcept {
    auto* self = static_cast<EpollOperation*>(w);
    const long r = self->attempt_();
    if (r == -EAGAIN) {
      if constexpr (kPicksEnd) {  // the other end, maybe: wait where the attempt says now
        self->backend_.endWait(self->fd_, self->dir_, Attempt::kind);
        self->waiting_ = false;
        if (!self->start()) self->resume();  // the wait failed: its error
      } else {  // spurious: wait for the next edge
        self->backend_.state(self->fd_).ready[static_cast<std::size_t>(self->dir_)] = false;
      }
      return;
    }
    self->attempted(r);
    self->finish(r);
    self->resume();
  }

  EpollBackend& backend_;
  int fd_;
  Direction dir_;
  bool waiting_ = false;
  Attempt attempt_;
};

}  // namespace coio::detail
