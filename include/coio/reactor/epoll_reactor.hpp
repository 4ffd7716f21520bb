#pragma once
#include <coio/reactor/detail/epoll_backend.hpp>
#include <coio/reactor/detail/epoll_operation.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/reactor_loop.hpp>
#include <coio/reactor/splice.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stop_token>

namespace coio {

class EpollReactor;
template <>
struct detail::BackendOf<EpollReactor> {
  using type = EpollBackend;
};

/// An event loop over epoll, driven by one thread; it models coio::Reactor,
/// whose comment lists what every reactor guarantees.
///
/// Guarantees:
/// - Every awaitable below resumes its coroutine on the loop thread (the
///   thread inside run() / runUntil()), and must be awaited there, once.
///   Each operation returns an awaitable named after it (RecvAwaitable...),
///   whose comment says what `co_await` yields.
/// - I/O operations try their system call first and wait only if it would
///   block; an fd is registered once (edge-triggered, both directions) on its
///   first wait and stays registered until `forget(fd)`.
/// - Fairness: at most kInlineTurnsPerIteration operations per loop
///   iteration complete without suspending (a ready fd, an fd < 0, a stop
///   already requested); later ones still make their system call at once
///   but resume their coroutine in the next iteration, after timers and
///   other fds. A socket that is always readable
///   or writable cannot starve the rest of the loop.
/// - One operation per fd and direction may wait at a time (asserted).
/// - splice, tee and sendfile (it is a SpliceReactor) make their system
///   call non-blocking and, when it would block, wait on whichever end was
///   not ready (splice, tee) or on the output (sendfile).
/// - Cancellation: each operation takes a std::stop_token; a stop requested
///   (on the loop thread) while it waits deregisters the waiter and the
///   operation yields std::errc::operation_canceled in a later iteration.
///   Nothing of the caller's buffer is touched after that. Given no token
///   (a default one), an operation awaited from a coio Task uses the token
///   the Task runs under (see currentStopToken).
/// - stop() (any thread) makes run() return after the current iteration;
///   spawned tasks that never started are destroyed then, the others with
///   the reactor, deregistering their waits.
/// - Timers wake the loop through one timerfd, set only when the earliest
///   deadline changes (a wait with a timeout of its own costs the kernel an
///   hrtimer per wait).
/// run, runUntil, spawn, schedule, the timers, stats() and the stall
/// detector are the loop's (ReactorLoop), which both reactors share; the
/// waiting is EpollBackend's, the operations EpollOperation's
/// (reactor/detail/epoll_backend.hpp, epoll_operation.hpp).
class EpollReactor : public ReactorLoop<EpollReactor> {
 public:
  /// The awaitable type of this reactor's I/O operations.
  template <typename Attempt, typename T, bool Rearm = false>
  using Operation = detail::EpollOperation<Attempt, T, Rearm>;

  /// What readable() and writable() return: `co_await` yields Result<void>.
  using ReadinessAwaitable = detail::EpollOperation<detail::ReadinessAttempt, void, true>;
  /// What accept() returns: `co_await` yields Result<int>, the new socket.
  using AcceptAwaitable = detail::EpollOperation<detail::AcceptAttempt, int, false>;
  /// What connect() returns: `co_await` yields Result<void>.
  using ConnectAwaitable = detail::EpollOperation<detail::ConnectAttempt, void, false>;
  /// What recv() returns: `co_await` yields Result<std::size_t>, the bytes read.
  using RecvAwaitable = detail::EpollOperation<detail::RecvAttempt, std::size_t, false>;
  /// What send() returns: `co_await` yields Result<std::size_t>, the bytes written.
  using SendAwaitable = detail::EpollOperation<detail::SendAttempt, std::size_t, false>;
  /// What sendv() returns: `co_await` yields Result<std::size_t>, the bytes written.
  using SendvAwaitable = detail::EpollOperation<detail::SendvAttempt, std::size_t, false>;
  /// What splice() and tee() return: `co_await` yields Result<std::size_t>,
  /// the bytes moved (see SpliceReactor).
  using SpliceAwaitable = detail::EpollOperation<detail::SpliceAttempt, std::size_t, false>;
  /// What sendfile() returns: `co_await` yields Result<std::size_t>, the
  /// bytes sent (see SpliceReactor).
  using SendfileAwaitable = detail::EpollOperation<detail::SendfileAttempt, std::size_t, false>;

  /// Throws std::system_error if epoll, the wake-up eventfd or the timerfd
  /// cannot be created.
  EpollReactor() = default;

  /// Completes once `fd` is readable (resp. writable) at or after the call:
  /// the fd's state is checked when the wait starts, so an edge that came
  /// before the call is not lost and a drained fd is not reported again.
  /// Yields an error if the fd cannot be polled (e.g. a regular file: EPERM).
  ReadinessAwaitable readable(int fd, std::stop_token stop = {}) noexcept;
  /// As readable(), for writability.
  ReadinessAwaitable writable(int fd, std::stop_token stop = {}) noexcept;

  /// accept4 (non-blocking, close-on-exec): the new fd.
  AcceptAwaitable accept(int fd, std::stop_token stop = {}) noexcept;
  /// Connects a non-blocking socket.
  ConnectAwaitable connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop = {}) noexcept;
  /// recv: bytes read, 0 at end of stream.
  RecvAwaitable recv(int fd, std::span<std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// send (MSG_NOSIGNAL): bytes written, possibly fewer than asked.
  SendAwaitable send(int fd, std::span<const std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// sendmsg of `parts` (MSG_NOSIGNAL, at most IOV_MAX of them): bytes
  /// written, possibly fewer than asked. `parts` must stay valid until the
  /// co_await returns.
  SendvAwaitable sendv(int fd, std::span<const iovec> parts, std::stop_token stop = {}) noexcept;

  /// splice(2) from `in` into `out`, one of them a pipe, non-blocking, on
  /// the loop thread; an end that is not ready is waited for with epoll.
  /// What it guarantees (partial transfers, errors, O_DIRECT, SIGPIPE): see
  /// SpliceReactor. Reading a file's pages from disk blocks the loop.
  SpliceAwaitable splice(int in, std::int64_t inOffset, int out, std::int64_t outOffset, std::size_t length,
                         std::stop_token stop = {}) noexcept;
  /// tee(2) from pipe `in` into pipe `out`, as splice() is made.
  SpliceAwaitable tee(int in, int out, std::size_t length, std::stop_token stop = {}) noexcept;
  /// sendfile(2) of `in` from `offset` into `out`, non-blocking, waiting
  /// for `out` to be writable when it is full; `pipe` is not used (see
  /// SpliceReactor).
  SendfileAwaitable sendfile(int out, int in, std::int64_t offset, std::size_t length, Pipe& pipe,
                             std::stop_token stop = {}) noexcept;

  /// Forgets `fd`; call it before closing an fd this reactor has waited on.
  /// No operation may be pending on it, unless the reactor has stopped.
  void forget(int fd) noexcept { backend_.forget(fd); }
};

inline auto EpollReactor::readable(int fd, std::stop_token stop) noexcept -> ReadinessAwaitable {
  return {backend_, fd, detail::Direction::read, {}, std::move(stop)};
}
inline auto EpollReactor::writable(int fd, std::stop_token stop) noexcept -> ReadinessAwaitable {
  return {backend_, fd, detail::Direction::write, {}, std::move(stop)};
}
inline auto EpollReactor::accept(int fd, std::stop_token stop) noexcept -> AcceptAwaitable {
  return {backend_, fd, detail::Direction::read, detail::AcceptAttempt{{}, fd}, std::move(stop)};
}
inline auto EpollReactor::connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop) noexcept
    -> ConnectAwaitable {
  detail::ConnectAttempt attempt{{}, fd, {}, length};
  std::memcpy(&attempt.address, address, std::min<std::size_t>(length, sizeof attempt.address));
  return {backend_, fd, detail::Direction::write, attempt, std::move(stop)};
}
inline auto EpollReactor::recv(int fd, std::span<std::byte> buffer, std::stop_token stop) noexcept -> RecvAwaitable {
  return {backend_, fd, detail::Direction::read, detail::RecvAttempt{fd, buffer}, std::move(stop)};
}
inline auto EpollReactor::send(int fd, std::span<const std::byte> buffer, std::stop_token stop) noexcept
    -> SendAwaitable {
  return {backend_, fd, detail::Direction::write, detail::SendAttempt{fd, buffer}, std::move(stop)};
}

inline auto EpollReactor::sendv(int fd, std::span<const iovec> parts, std::stop_token stop) noexcept
    -> SendvAwaitable {
  return {backend_, fd, detail::Direction::write, detail::SendvAttempt{fd, parts}, std::move(stop)};
}

inline auto EpollReactor::splice(int in, std::int64_t inOffset, int out, std::int64_t outOffset, std::size_t length,
                                 std::stop_token stop) noexcept -> SpliceAwaitable {
  // The fd is where it waits (the attempt picks the end), or -1 for EBADF at once.
  return {backend_, in < 0 ? in : out, detail::Direction::write,
          detail::SpliceAttempt{{}, {false, in, inOffset, out, outOffset, length}}, std::move(stop)};
}
inline auto EpollReactor::tee(int in, int out, std::size_t length, std::stop_token stop) noexcept
    -> SpliceAwaitable {
  return {backend_, in < 0 ? in : out, detail::Direction::write,
          detail::SpliceAttempt{{}, {true, in, kNoOffset, out, kNoOffset, length}}, std::move(stop)};
}
inline auto EpollReactor::sendfile(int out, int in, std::int64_t offset, std::size_t length, Pipe&,
                                   std::stop_token stop) noexcept -> SendfileAwaitable {
  return {backend_, out, detail::Direction::write, detail::SendfileAttempt{{}, out, in, offset, length},
          std::move(stop)};
}

}  // namespace coio
