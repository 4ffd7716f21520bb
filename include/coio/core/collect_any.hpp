#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/collect.hpp>
#include <coio/core/detail/linked_stop_source.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace coio {

namespace detail {

// collectAny's latch: the first child to finish wins and asks the others
// to stop.
struct RaceLatch final : ArrivingLatch<RaceLatch> {
  std::atomic<void*> winner{nullptr};  // the frame of the first child to finish
  LinkedStopSource children;           // what the children run under

  // The winner's exception stays in its outcome, for the parent to
  // rethrow; the losers' are dropped. Before the arrival, so the parent
  // cannot be resumed meanwhile (by a loser that the stop finishes inline)
  // and free the source; the arrival's acq_rel then publishes `winner` to
  // the parent.
  void settle(void* child, const std::exception_ptr* /*exception*/) noexcept {
    void* none = nullptr;
    if (winner.compare_exchange_strong(none, child, std::memory_order_relaxed)) children.requestStop();
  }
};

// The winner's result as alternative I of Variant, I its argument index.
template <typename Variant, std::size_t I = 0, typename Children>
Variant winnerResult(Children& children, void* winner) {
  auto& child = std::get<I>(children);
  if constexpr (I + 1 < std::tuple_size_v<Children>) {
    if (childAddress(child) != winner) return winnerResult<Variant, I + 1>(children, winner);
  }
  return Variant(std::in_place_index<I>, childResult(child));
}

}  // namespace detail

/// Runs the tasks concurrently and yields the result of the first one to
/// finish, as the alternative of a `std::variant` whose index is that
/// task's argument index (a `Task<void>` contributes `Unit`); the others are
/// asked to stop, and awaited.
///
/// Guarantees:
/// - The children start in argument order on the awaiting thread, each
///   running until its first suspension. If one finishes while they start,
///   it has won and those after it start under a stopped token.
/// - The children run under a fresh stop token, stopped when the first
///   child finishes and when the awaiting coroutine's token is (at once if
///   it already is). The stop callbacks of the losers (their reactor
///   operations, cancellable waits) run on the thread that finished the
///   winner, or that stopped the enclosing token.
/// - No child outlives the call: `co_await collectAny(...)` returns only
///   after every child has finished, however long a loser that ignores the
///   stop takes. Every frame is freed before it returns.
/// - The awaiting coroutine resumes on the thread that finishes the last
///   child (or continues inline if they all finished synchronously).
/// - Exceptions: the first child to finish wins whether it returned or
///   threw; if it threw, `co_await` rethrows its exception (once every child
///   finished). Exceptions of the children that finish later are dropped,
///   as collectAll drops all but the first.
///
/// Example:
/// \snippet api_examples.cpp collectAny
template <typename... Ts>
Task<std::variant<UnitIfVoid<Ts>...>> collectAny(Task<Ts>... tasks) {
  static_assert(sizeof...(Ts) > 0, "collectAny of no task: nothing can finish first");
  static_assert((!std::is_reference_v<Ts> && ...), "collectAny does not support Task<T&>: return pointers");
  std::tuple<Task<Ts>...> children{std::move(tasks)...};  // a local: freed before the parent resumes
  detail::RaceLatch latch;
  co_await detail::CollectAwaiter(latch, sizeof...(Ts), [&](const std::stop_token* stop) {
    return detail::startChildren(children, latch, latch.children.linkTo(stop));
  });
  co_return detail::winnerResult<std::variant<UnitIfVoid<Ts>...>>(
      children, latch.winner.load(std::memory_order_relaxed));
}

/// collectAny over a vector: yields the index of the first task to finish
/// and its result (`Unit` for `Task<void>`). Same guarantees as collectAny;
/// the vector must not be empty (asserted).
template <typename T>
Task<std::pair<std::size_t, UnitIfVoid<T>>> collectAnyRange(std::vector<Task<T>> tasks) {
  static_assert(!std::is_reference_v<T>, "collectAnyRange does not support Task<T&>: return pointers");
  COIO_ASSERT(!tasks.empty(), "collectAnyRange of no task: nothing can finish first");
  std::vector<Task<T>> children = std::move(tasks);  // a local: freed before the parent resumes
  detail::RaceLatch latch;
  co_await detail::CollectAwaiter(latch, children.size(), [&](const std::stop_token* stop) {
    return detail::startChildren(children, latch, latch.children.linkTo(stop));
  });
  void* const winner = latch.winner.load(std::memory_order_relaxed);
  std::size_t i = 0;
  while (detail::childAddress(children[i]) != winner) ++i;
  co_return std::pair<std::size_t, UnitIfVoid<T>>(i, detail::childResult(children[i]));
}

}  // namespace coio
