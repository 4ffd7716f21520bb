#pragma once
#include <coio/core/event.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <chrono>
#include <stop_token>
#include <system_error>

namespace coio {

/// Waits until `event` is set, for at most `timeout`: "this happened, or a
/// deadline" (a response, a grant, a drain), in one call, without a
/// std::stop_source standing in for the event. Yields an empty Result if
/// the event is set, `std::errc::timed_out` at the deadline, and
/// `std::errc::operation_canceled` if the awaiting task is stopped first
/// (see currentStopToken; `withStopToken(token, waitFor(...))` waits under
/// a token of your own instead).
///
/// Guarantees:
/// - A set event wins: one set before the call yields success at once,
///   without suspending or arming a timer; one set before the wait saw the
///   deadline or the stop yields success even if they came too.
/// - It returns only once the timer is gone (withTimeout's guarantee): no
///   wake-up of it comes later.
/// - Must be awaited on the reactor's thread; resumes there. When the
///   event is set, the awaiting coroutine resumes in a later iteration of
///   the loop, not inside set(): whoever sets the event finishes first.
/// - The event must outlive the wait.
template <Reactor R>
Task<Result<void>> waitFor(R& reactor, Event& event, std::chrono::steady_clock::duration timeout) {
  if (event.isSet()) co_return Result<void>{};
  co_return co_await withTimeout(
      reactor,
      [&event](std::stop_token stop) -> Task<Result<void>> {
        if (co_await event.wait(std::move(stop))) co_return Result<void>{};
        co_return std::make_error_code(std::errc::operation_canceled);
      },
      timeout);
}

}  // namespace coio
