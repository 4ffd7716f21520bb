#pragma once
// How a stop token flows down a tree of coroutines without a copy per await.
//
// Each coio promise (Task's, AsyncGenerator's, AsyncScope's roots')
// holds a non-owning pointer to the std::stop_token it runs under; null
// means none (a token that never stops). An awaited Task takes the awaiting
// promise's pointer: one load and one store, where copying a stop_token
// would be an atomic reference-count update per await. The token itself
// lives where it was made (a withStopToken or collectAny frame, an
// AsyncScope), which outlives every coroutine below it, since a parent
// outlives the children it awaits.
//
// An awaitable that takes a std::stop_token and was given none learns the
// awaiting coroutine's in a templated await_suspend (inheritStopToken).
#include <concepts>
#include <coroutine>
#include <stop_token>
#include <type_traits>

namespace coio::detail {

/// Promise mixin: the stop token the coroutine runs under. A promise
/// carries one if it has `stopToken()` and `setStopToken()`, as this mixin
/// gives; Task's keeps it in its Outcome (outcome.hpp says why).
struct StopTokenCarrier {
  const std::stop_token* stopToken() const noexcept { return stopToken_; }
  void setStopToken(const std::stop_token* token) noexcept { stopToken_ = token; }

 private:
  // Null: none. Set by whoever starts the coroutine, before its body first
  // runs; left uninitialised otherwise, so that creating a coroutine costs
  // no store.
  const std::stop_token* stopToken_;
};

template <typename Promise>
inline constexpr bool carriesStopToken = requires(Promise& p, const std::stop_token* token) {
  { p.stopToken() } -> std::same_as<const std::stop_token*>;
  p.setStopToken(token);
};

/// The token the coroutine `h` runs under; null if it runs under none or
/// is not a coio coroutine (e.g. a type-erased handle).
template <typename Promise>
const std::stop_token* stopTokenOf(std::coroutine_handle<Promise> h) noexcept {
  if constexpr (carriesStopToken<Promise>) {
    return h.promise().stopToken();
  } else {
    return nullptr;
  }
}

/// For an awaitable that takes a std::stop_token: if it was given none (a
/// token that can never be stopped, e.g. a default-constructed one), it
/// adopts the one the awaiting coroutine runs under. Returns true in that
/// case: await_ready could not know the token then, so what it would check
/// (a stop already requested) is for await_suspend to check.
template <typename Promise>
bool inheritStopToken(std::stop_token& stop, std::coroutine_handle<Promise> awaiting) noexcept {
  if (stop.stop_possible()) return false;
  if (const std::stop_token* inherited = stopTokenOf(awaiting)) stop = *inherited;
  return true;
}

}  // namespace coio::detail
