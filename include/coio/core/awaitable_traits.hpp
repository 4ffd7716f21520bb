#pragma once
#include <concepts>
#include <coroutine>
#include <type_traits>
#include <utility>

namespace coio {

namespace detail {
template <typename T>
concept HasMemberCoAwait = requires(T&& t) { std::forward<T>(t).operator co_await(); };
template <typename T>
concept HasFreeCoAwait = requires(T&& t) { operator co_await(std::forward<T>(t)); };
template <typename T>
concept IsAwaiter = requires(T&& t) {
  { t.await_ready() } -> std::convertible_to<bool>;
  t.await_resume();
};
}  // namespace detail

/// The awaiter `co_await t` would use (member or free operator co_await, or t itself).
template <typename T>
decltype(auto) getAwaiter(T&& t) {
  if constexpr (detail::HasMemberCoAwait<T>) {
    return std::forward<T>(t).operator co_await();
  } else if constexpr (detail::HasFreeCoAwait<T>) {
    return operator co_await(std::forward<T>(t));
  } else {
    return std::forward<T>(t);
  }
}

/// Something `co_await` accepts (without an await_transform).
template <typename T>
concept Awaitable = detail::HasMemberCoAwait<T> || detail::HasFreeCoAwait<T> || detail::IsAwaiter<T>;

/// The type `co_await std::declval<T>()` produces.
template <Awaitable T>
using AwaitResult = decltype(getAwaiter(std::declval<T>()).await_resume());

}  // namespace coio
