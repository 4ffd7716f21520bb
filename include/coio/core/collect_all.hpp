#pragma once
#include <coio/core/detail/collect.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>

#include <cstddef>
#include <stop_token>
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
/// exception (in time) is rethrown. The children run under the awaiting
/// coroutine's stop token (see currentStopToken); a child that throws does
/// not stop the others.
template <typename... Ts>
Task<std::tuple<detail::UnitIfVoid<Ts>...>> collectAll(Task<Ts>... tasks) {
  std::tuple<detail::CollectChild<Ts, detail::CollectLatch>...> children{
      detail::makeCollectChild<detail::CollectLatch>(std::move(tasks))...};
  detail::CollectLatch latch;
  co_await detail::CollectAwaiter(latch, sizeof...(Ts), [&](const std::stop_token* stop) {
    std::apply([&](auto&... child) { (child.start(latch, stop), ...); }, children);
  });
  co_return std::apply(
      [](auto&... child) { return std::tuple<detail::UnitIfVoid<Ts>...>{child.result()...}; }, children);
}

/// collectAll over a vector: results in input order. A vector of
/// `Task<void>` yields `Task<void>`. Same threading, exception and stop
/// token rules as collectAll.
template <typename T>
auto collectAllRange(std::vector<Task<T>> tasks) -> Task<detail::RangeResult<T>> {
  static_assert(!std::is_reference_v<T>, "collectAllRange does not support Task<T&>: return pointers");
  auto children = detail::makeCollectChildren<detail::CollectLatch>(std::move(tasks));
  detail::CollectLatch latch;
  co_await detail::CollectAwaiter(latch, children.size(), [&](const std::stop_token* stop) {
    for (auto& child : children) child.start(latch, stop);
  });
  if constexpr (!std::is_void_v<T>) co_return detail::collectResults(children);
}

}  // namespace coio
