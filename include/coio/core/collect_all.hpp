#pragma once
#include <coio/core/detail/collect.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace coio {

/// Runs the tasks concurrently and yields all their results as a tuple
/// (a `Task<void>` contributes `Unit`).
///
/// The children start in argument order on the awaiting thread, each running
/// until its first suspension; they then interleave at their suspension
/// points. The awaiting coroutine resumes on the thread that finishes the
/// last child (or continues inline if they all finished synchronously). If
/// any child throws, all are still awaited to the end and then the first
/// exception (in time) is rethrown.
template <typename... Ts>
Task<std::tuple<detail::UnitIfVoid<Ts>...>> collectAll(Task<Ts>... tasks) {
  std::tuple<detail::CollectChild<Ts>...> children{detail::makeCollectChild<Ts>(std::move(tasks))...};
  detail::CollectLatch latch;
  co_await detail::CollectAwaiter(latch, sizeof...(Ts), [&] {
    std::apply([&](auto&... child) { (child.start(latch), ...); }, children);
  });
  co_return std::apply(
      [](auto&... child) { return std::tuple<detail::UnitIfVoid<Ts>...>{child.result()...}; }, children);
}

/// collectAll over a vector: results in input order. A vector of
/// `Task<void>` yields `Task<void>`. Same threading and exception rules as
/// collectAll.
template <typename T>
auto collectAllRange(std::vector<Task<T>> tasks) -> Task<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> {
  static_assert(!std::is_reference_v<T>, "collectAllRange does not support Task<T&>: return pointers");
  std::vector<detail::CollectChild<T>> children;
  children.reserve(tasks.size());
  for (auto& t : tasks) children.push_back(detail::makeCollectChild<T>(std::move(t)));
  detail::CollectLatch latch;
  co_await detail::CollectAwaiter(latch, children.size(), [&] {
    for (auto& child : children) child.start(latch);
  });
  if constexpr (!std::is_void_v<T>) {
    std::vector<T> results;
    results.reserve(children.size());
    for (auto& child : children) results.push_back(child.result());
    co_return results;
  }
}

}  // namespace coio
