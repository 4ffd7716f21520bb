#pragma once
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/task.hpp>

#include <coroutine>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace coio {

namespace detail {

// Reads the awaiting promise and goes on without suspending.
class [[nodiscard]] CurrentStopTokenAwaiter {
 public:
  bool await_ready() const noexcept { return false; }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> awaiting) noexcept {
    if (const std::stop_token* token = stopTokenOf(awaiting)) token_ = *token;
    return false;
  }
  std::stop_token await_resume() noexcept { return std::move(token_); }

 private:
  std::stop_token token_;
};

// Makes the awaiting Task run under `*token` from here on, and with it
// everything it awaits afterwards.
struct RunUnder {
  const std::stop_token* token;
  bool await_ready() const noexcept { return false; }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> awaiting) const noexcept {
    static_assert(carriesStopToken<Promise>, "only a coio::Task can change the token it runs under");
    awaiting.promise().setStopToken(token);
    return false;
  }
  void await_resume() const noexcept {}
};

}  // namespace detail

/// What currentStopToken() returns: `co_await` it in a coroutine to get
/// the `std::stop_token` that coroutine runs under; it never suspends.
using CurrentStopTokenAwaitable = detail::CurrentStopTokenAwaiter;

/// `co_await coio::currentStopToken()` yields the `std::stop_token` the
/// current coroutine runs under: the one its awaiter ran under (down from a
/// `withStopToken`, a `collectAny`, `withTimeout` or an `AsyncScope`), or a
/// default token that never stops at the root (a Task run by
/// `blockingWait` or a reactor's `spawn`, or any coroutine that is not a
/// coio one).
///
/// Never suspends: the awaiting coroutine goes on at once, on its thread.
/// The token is a copy: keep it as long as you like.
inline CurrentStopTokenAwaitable currentStopToken() noexcept { return {}; }

/// Runs `task` under `token` instead of the awaiting coroutine's: `task`,
/// every Task it awaits, and every reactor operation or cancellable wait in
/// them that is given no token of its own see `token`.
///
/// The token replaces the enclosing one, it is not merged with it: a stop
/// of the enclosing token does not reach `task`. With a default-constructed
/// token, that shields cleanup code (closing a session, writing a last
/// record) from an enclosing stop.
///
/// Same guarantees as awaiting `task` itself: it starts on the awaiting
/// thread, and the awaiter resumes on the thread that finishes it, with its
/// value or its exception. Costs one extra coroutine frame.
template <typename T>
Task<T> withStopToken(std::stop_token token, Task<T> task) {
  co_await detail::RunUnder{&token};  // `token` lives in this frame, which outlives `task`'s
  co_return co_await std::move(task);  // (a void co_await makes a plain co_return)
}

}  // namespace coio
