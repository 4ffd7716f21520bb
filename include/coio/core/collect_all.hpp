#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/collect.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace coio {

namespace detail {

// collectAllWindowed's latch: a child that finishes starts, by symmetric
// transfer on its own thread, the first child not started yet.
struct WindowLatch final : CollectLatch {
  std::vector<std::coroutine_handle<>> children;  // bound to this latch, in input order
  std::atomic<std::size_t> next{0};                // index of the next child to start

  std::coroutine_handle<> takeNext() noexcept {
    const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
    return i < children.size() ? children[i] : nullptr;
  }

 protected:
  // Every child gets here: the start loop resumes them without startChild.
  std::coroutine_handle<> childDone(void* /*child*/, const std::exception_ptr* exception) noexcept override {
    settle(nullptr, exception);
    if (std::coroutine_handle<> following = takeNext()) {
      arrive();  // never the last arrival: `following` has not finished
      return following;
    }
    return arrive();
  }
};

}  // namespace detail

/// What collectAllRange and collectAllWindowed yield for `Task<T>`
/// children: the results in input order, or nothing for `Task<void>`.
template <typename T>
using CollectedResults = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;

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
///
/// Example (with collectAllRange):
/// \snippet api_examples.cpp collectAll
template <typename... Ts>
Task<std::tuple<UnitIfVoid<Ts>...>> collectAll(Task<Ts>... tasks) {
  std::tuple<Task<Ts>...> children{std::move(tasks)...};  // a local: freed before the parent resumes
  detail::AllLatch latch;
  co_await detail::CollectAwaiter(latch, sizeof...(Ts), [&](const std::stop_token* stop) {
    return detail::startChildren(children, latch, stop);
  });
  co_return std::apply(
      [](auto&... child) { return std::tuple<UnitIfVoid<Ts>...>{detail::childResult(child)...}; },
      children);
}

/// collectAll over a vector: results in input order. A vector of
/// `Task<void>` yields `Task<void>`. Same threading, exception and stop
/// token rules as collectAll. If T moves without throwing (or is void), a
/// child that finishes as it starts without throwing, as did every child
/// before it, frees its frame at once, its value moved aside; the others'
/// frames are freed once all children finished, before the awaiting
/// coroutine resumes.
template <typename T>
auto collectAllRange(std::vector<Task<T>> tasks) -> Task<CollectedResults<T>> {
  static_assert(!std::is_reference_v<T>, "collectAllRange does not support Task<T&>: return pointers");
  std::vector<Task<T>> children = std::move(tasks);  // a local: freed before the parent resumes
  detail::RangeValues<T> values(children.size());
  detail::AllLatch latch;
  co_await detail::CollectAwaiter(latch, children.size(), [&](const std::stop_token* stop) {
    return latch.startRange(children, values, stop);
  });
  co_return detail::collectResults(children, &values);
}

/// collectAllRange with bounded concurrency (folly's collectAllWindowed):
/// at most `window` children run at once; results in input order.
///
/// The first `window` children start in input order on the awaiting
/// thread, each running until its first suspension; from then on, each
/// child that finishes starts the next one on its own thread (by symmetric
/// transfer, so a run of children that finish synchronously uses constant
/// stack). The awaiting coroutine resumes on the thread that finishes the
/// last child. Same exception and stop token rules as collectAll: every
/// child runs, even after one threw or the token was stopped (it then
/// starts under a stopped token). `window` must be at least 1 (asserted).
template <typename T>
auto collectAllWindowed(std::vector<Task<T>> tasks, std::size_t window) -> Task<CollectedResults<T>> {
  static_assert(!std::is_reference_v<T>, "collectAllWindowed does not support Task<T&>: return pointers");
  COIO_ASSERT(window > 0, "collectAllWindowed with a window of 0 would start nothing");
  std::vector<Task<T>> children = std::move(tasks);  // a local: freed before the parent resumes
  detail::WindowLatch latch;
  latch.children.reserve(children.size());  // here: startAll below must not throw
  co_await detail::CollectAwaiter(latch, children.size(), [&](const std::stop_token* stop) {
    for (Task<T>& child : children) latch.children.push_back(detail::bindChild(child, latch, stop));
    for (std::size_t i = 0; i < window; ++i) {
      const std::coroutine_handle<> child = latch.takeNext();
      if (!child) break;
      child.resume();
    }
    return std::size_t{0};  // every child arrives itself
  });
  co_return detail::collectResults(children);
}

}  // namespace coio
