#pragma once
#include <coio/core/collect_all.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>

#include <chrono>
#include <concepts>
#include <stop_token>
#include <system_error>
#include <type_traits>
#include <utility>

namespace coio {

namespace detail {

template <typename T>
struct IsResult : std::false_type {};
template <typename T>
struct IsResult<Result<T>> : std::true_type {};

// The operation's awaitable is created inside this frame: I/O awaiters
// cannot move once made.
template <typename Start>
auto runThenStop(Start& start, std::stop_token token, std::stop_source& timer)
    -> Task<AwaitResult<std::invoke_result_t<Start&, std::stop_token>>> {
  auto result = co_await start(std::move(token));
  timer.request_stop();
  co_return result;
}

template <typename R>
Task<void> stopWhenDue(R& reactor, std::chrono::steady_clock::duration timeout, std::stop_token timerStop,
                       std::stop_source& operation, bool& fired) {
  const bool due = co_await reactor.sleepFor(timeout, std::move(timerStop));
  if (due) {
    fired = true;
    operation.request_stop();
  }
}

}  // namespace detail

/// Runs `start(token)` (which returns an awaitable yielding Result<T>, e.g.
/// `[&](std::stop_token t) { return stream.read(buf, t); }`) and requests
/// stop on `token` once `timeout` has passed. The operation is really
/// cancelled (io_uring async cancel, epoll deregistration, semaphore
/// dequeue...) and withTimeout then yields std::errc::timed_out in place of
/// the operation's std::errc::operation_canceled.
///
/// Guarantees:
/// - It returns only after the operation has finished: a cancelled io_uring
///   operation has delivered its completion, so the buffers it used are free.
/// - If the operation completes before it sees the cancellation (it won the
///   race), its own result is returned, even after the deadline.
/// - Must be awaited on the reactor's thread; resumes there.
template <Reactor R, typename Start>
  requires std::invocable<Start&, std::stop_token> &&
           detail::IsResult<AwaitResult<std::invoke_result_t<Start&, std::stop_token>>>::value
auto withTimeout(R& reactor, Start start, std::chrono::steady_clock::duration timeout)
    -> Task<AwaitResult<std::invoke_result_t<Start&, std::stop_token>>> {
  std::stop_source operation;
  std::stop_source timer;
  bool fired = false;
  auto [result, unit] = co_await collectAll(
      detail::runThenStop(start, operation.get_token(), timer),
      detail::stopWhenDue(reactor, timeout, timer.get_token(), operation, fired));
  (void)unit;
  if (fired && result.error() == std::errc::operation_canceled) co_return std::errc::timed_out;
  co_return std::move(result);
}

}  // namespace coio
