#pragma once
#include <coio/core/awaitable_traits.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/loop_stats.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <stop_token>

namespace coio {

/// An awaitable whose `co_await` yields exactly T.
template <typename A, typename T>
concept AwaitableOf = Awaitable<A> && std::same_as<AwaitResult<A>, T>;

/// An event loop driven by one thread; EpollReactor and UringReactor model
/// it, and every I/O awaitable above (net, disk, rdma) is a template over it.
/// Both are a ReactorLoop (run, spawn, schedule, sleeps, stats) over a
/// backend (ReactorBackend) plus their I/O operations.
///
/// What every model guarantees:
/// - `run()` drives the loop on the calling thread until `stop()`;
///   `runUntil(task)` until `task` finishes. One thread at a time.
/// - `spawn(task)` and `co_await schedule()` work from any thread and wake a
///   sleeping loop; spawned tasks are owned by the reactor and start on the
///   loop thread. `stop()` works from any thread and is final: pending
///   operations are cancelled; spawned tasks that had not started are
///   destroyed unrun when the loop stops, and a task spawned after stop()
///   at once, so nobody waits for them in vain; tasks that had started are
///   destroyed (all their frames) when the reactor is destroyed. Coroutines
///   owned elsewhere (e.g. by a blockingWait on another thread) that still
///   wait on a stopped reactor are never resumed: stop it after they are done.
/// - An exception escaping a spawned task, on whatever thread it ran last,
///   stops the reactor and is rethrown by its run() / runUntil().
/// - Fairness: operations that could complete at once every time (an
///   always-readable or always-writable socket, data read ahead, an error
///   known up front) still let the loop run its timers and other fds at
///   least once per bounded batch of completions: per loop iteration at
///   most `kInlineTurnsPerIteration` awaits complete without suspending,
///   later ones resume in the next iteration. The disk layer's awaitables
///   share the budget.
/// - Every other awaitable resumes its coroutine on the loop thread and must
///   be awaited there. I/O awaitables yield `Result<T>` (errno values in the
///   system category) and take a std::stop_token: a stop requested on the
///   loop thread cancels the operation, which then yields
///   std::errc::operation_canceled. A cancelled operation resumes only once
///   the kernel has let go of its buffers.
/// - `readable(fd)` / `writable(fd)` complete once the fd is ready at or
///   after the call (its state is checked when the wait starts), which makes
///   them safe for edge-triggered sources: drain, then wait again.
/// - `forget(fd)` before closing an fd the reactor has waited on: the
///   reactor keeps state by fd number, which the next fd opened under that
///   number would otherwise inherit (under UringReactor's default recv mode
///   that can be bytes read ahead from the closed socket).
/// - Sockets are made, configured and closed through the reactor
///   (`openSocket`, `bindSocket`, `listenSocket`, `setSocketOption`,
///   `socketName`, `shutdownSocket`, `resetSocket`, `closeSocket`): the
///   system calls on a real reactor, simulated ones in a simulation; the
///   net layer (TcpListener, TcpStream) calls nothing else, so that it runs
///   on either. Errors are errno's values.
/// - `now()`: the loop's clock, which its sleeps and deadlines measure
///   against (steady_clock's, or virtual time in a simulation): code meant
///   to run on any reactor reads the time there.
/// - A view into the loop, on the loop thread: `stats()` (LoopStats:
///   operations submitted and completed by kind, queue depths, time waiting
///   and running), `setLoopTiming(on)`, and `setStallHandler(threshold,
///   handler)`, which calls the handler after each turn of the loop that
///   ran longer than the threshold (LoopStall). Counting is a plain
///   increment per operation; timing (off by default) a clock read per
///   phase of a turn that ran something.
template <typename R>
concept Reactor = requires(R& r, const R& cr, Task<void> task, int fd, std::span<std::byte> in,
                           std::span<const std::byte> out, std::span<const iovec> parts, const sockaddr* address,
                           socklen_t length, sockaddr_storage& name, const void* option,
                           std::chrono::steady_clock::duration d, std::chrono::steady_clock::time_point t,
                           std::stop_token stop, StallHandler handler) {
  r.run();
  r.runUntil(std::move(task));
  r.stop();
  r.spawn(std::move(task));
  { cr.isInLoopThread() } -> std::same_as<bool>;
  { cr.now() } -> std::same_as<std::chrono::steady_clock::time_point>;
  { r.schedule() } -> AwaitableOf<void>;
  { r.sleepFor(d) } -> AwaitableOf<void>;
  { r.sleepUntil(t) } -> AwaitableOf<void>;
  { r.sleepFor(d, stop) } -> AwaitableOf<bool>;
  { r.sleepUntil(t, stop) } -> AwaitableOf<bool>;
  { r.readable(fd, stop) } -> AwaitableOf<Result<void>>;
  { r.writable(fd, stop) } -> AwaitableOf<Result<void>>;
  { r.accept(fd, stop) } -> AwaitableOf<Result<int>>;
  { r.connect(fd, address, length, stop) } -> AwaitableOf<Result<void>>;
  { r.recv(fd, in, stop) } -> AwaitableOf<Result<std::size_t>>;
  { r.send(fd, out, stop) } -> AwaitableOf<Result<std::size_t>>;
  { r.sendv(fd, parts, stop) } -> AwaitableOf<Result<std::size_t>>;
  r.forget(fd);
  { r.openSocket(AF_INET) } -> std::same_as<Result<int>>;
  { r.bindSocket(fd, address, length) } -> std::same_as<Result<void>>;
  { r.listenSocket(fd, 1) } -> std::same_as<Result<void>>;
  { r.setSocketOption(fd, SOL_SOCKET, SO_REUSEADDR, option, length) } -> std::same_as<Result<void>>;
  { r.socketName(fd, true, name) } -> std::same_as<Result<socklen_t>>;
  { r.shutdownSocket(fd, SHUT_WR) } -> std::same_as<Result<void>>;
  { r.resetSocket(fd) } -> std::same_as<Result<void>>;
  r.closeSocket(fd);
  { cr.stats() } -> std::same_as<LoopStats>;
  r.setLoopTiming(true);
  r.setStallHandler(d, std::move(handler));
};

/// What ReactorLoop needs of its backend B, the part of a reactor that
/// waits for I/O (seastar calls it reactor_backend): EpollBackend (epoll, a
/// timerfd) and UringBackend (an io_uring), internals under
/// coio/reactor/detail/, model it.
/// The loop constructs it with its LoopCore (and the reactor's options) and
/// calls, on the loop thread:
/// - `poll(timeout)`: wait for I/O at most `timeout` (nullopt: until
///   something happens; zero: not at all) and dispatch what completed,
///   resuming the coroutines that waited. Right after its wait returns it
///   calls `core.woke(timeout)`; when the core's wake-up eventfd fired it
///   drains it and calls `core.resumeRemote()`; it counts its operations in
///   `core.meter()` where it submits, completes and dispatches them.
/// - `armDeadline(t)`: make the next waits end by `t` (the earliest timer)
///   without a timeout on each; false if it cannot (the loop then passes a
///   timeout to poll).
/// - `quiesce()`: make sure the kernel holds no reference to any operation,
///   without resuming anything (after a stop, and before the reactor's
///   tasks are destroyed).
/// - `leaveLoop()`: as run() / runUntil() return, undo what that run tied
///   to its thread.
/// - `unsubmitted()`: operations prepared but not handed to the kernel yet
///   (LoopStats::unsubmitted).
template <typename B>
concept ReactorBackend = requires(B& b, const B& cb, std::optional<std::chrono::steady_clock::duration> timeout,
                                  std::chrono::steady_clock::time_point t) {
  b.poll(timeout);
  { b.armDeadline(t) } noexcept -> std::same_as<bool>;
  { b.quiesce() } noexcept;
  { b.leaveLoop() } noexcept;
  { cb.unsubmitted() } noexcept -> std::same_as<std::size_t>;
};

}  // namespace coio
