#pragma once
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/detail/linked_stop_source.hpp>
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

// Result<T>, or T itself when it already is a Result.
template <typename T>
struct TimeoutResult {
  using type = Result<T>;
};
template <typename T>
struct TimeoutResult<Result<T>> {
  using type = Result<T>;
};

// The operation's awaitable is created inside this frame: I/O awaiters
// cannot move once made.
template <typename Start>
auto runThenStop(Start& start, std::stop_token token, std::stop_source& timer)
    -> Task<AwaitResult<std::invoke_result_t<Start&, std::stop_token>>> {
  auto result = co_await start(std::move(token));
  timer.request_stop();
  co_return result;
}

// Runs `task` under `token`, then ends the timer, also if the task threw.
template <typename T>
Task<T> runUnderThenStop(Task<T> task, const std::stop_token* token, std::stop_source& timer) {
  struct EndTimer {
    std::stop_source& timer;
    ~EndTimer() { timer.request_stop(); }
  } endTimer{timer};
  co_await RunUnder{token};
  co_return co_await std::move(task);
}

template <typename R>
Task<void> stopWhenDue(R& reactor, std::chrono::steady_clock::duration timeout, std::stop_token timerStop,
                       LinkedStopSource& operation, bool& fired) {
  const bool due = co_await reactor.sleepFor(timeout, std::move(timerStop));
  if (due) {
    fired = true;
    operation.requestStop();
  }
}

}  // namespace detail

/// What withTimeout(reactor, task, timeout) yields for a `Task<T>`:
/// `Result<T>`, or T itself when it already is a `Result<U>`.
template <typename T>
using TimeoutResult = typename detail::TimeoutResult<T>::type;

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
/// - `token` is also stopped when the awaiting coroutine's token is (see
///   currentStopToken): the operation then yields its
///   std::errc::operation_canceled.
/// - Must be awaited on the reactor's thread; resumes there.
template <Reactor R, typename Start>
  requires std::invocable<Start&, std::stop_token> &&
           detail::IsResult<AwaitResult<std::invoke_result_t<Start&, std::stop_token>>>::value
auto withTimeout(R& reactor, Start start, std::chrono::steady_clock::duration timeout)
    -> Task<AwaitResult<std::invoke_result_t<Start&, std::stop_token>>> {
  detail::LinkedStopSource operation;  // stopped at the deadline or with the enclosing token
  std::stop_source timer;
  bool fired = false;
  const std::stop_token enclosing = co_await currentStopToken();
  auto [result, unit] = co_await collectAll(
      detail::runThenStop(start, *operation.linkTo(&enclosing), timer),
      detail::stopWhenDue(reactor, timeout, timer.get_token(), operation, fired));
  (void)unit;
  if (fired && result.error() == std::errc::operation_canceled) co_return std::errc::timed_out;
  co_return std::move(result);
}

/// Runs the whole of `task` under a stop token that is stopped once
/// `timeout` has passed (and when the awaiting coroutine's token is): every
/// reactor operation, sleep and cancellable wait inside it that was given no
/// token of its own is cancelled at the deadline. Yields `Result<T>`
/// (`Result<U>` when T already is a `Result<U>`): the task's value if it
/// finished before the deadline, `std::errc::timed_out` if the deadline
/// fired first.
///
/// Guarantees:
/// - No orphan: it returns only once the task has finished, whatever the
///   deadline; so every buffer and object the task uses is free again.
/// - What the task does with the stop is up to the task. If it ignores the
///   stop (or runs under a token of its own, e.g. `withStopToken`), it runs
///   to its end and withTimeout returns only then, still with
///   `std::errc::timed_out`: the value it returned after the deadline is
///   destroyed (not returned, even if it is a success). Use the callable form
///   above, per operation, where a result that raced the deadline must not
///   be lost (e.g. bytes a read consumed).
/// - An exception thrown by the task is rethrown, before or after the
///   deadline.
/// - Must be awaited on the reactor's thread, and the task must finish
///   there (it may hop elsewhere in between); resumes there.
///
/// Example:
/// \snippet api_examples.cpp withTimeout
template <Reactor R, typename T>
auto withTimeout(R& reactor, Task<T> task, std::chrono::steady_clock::duration timeout)
    -> Task<TimeoutResult<T>> {
  static_assert(!std::is_reference_v<T>, "withTimeout does not support Task<T&>: return a pointer");
  detail::LinkedStopSource operation;  // the task's token: stopped at the deadline or with ours
  std::stop_source timer;              // ends the timer once the task finished
  bool fired = false;
  const std::stop_token enclosing = co_await currentStopToken();
  const std::stop_token* token = operation.linkTo(&enclosing);
  auto [result, unit] = co_await collectAll(detail::runUnderThenStop(std::move(task), token, timer),
                                            detail::stopWhenDue(reactor, timeout, timer.get_token(), operation, fired));
  (void)unit;
  if (fired) co_return std::errc::timed_out;
  if constexpr (std::is_void_v<T>) {
    co_return Result<void>{};
  } else {
    co_return std::move(result);
  }
}

}  // namespace coio
