#pragma once
// The machinery behind collectAll and its relatives. Each child Task
// reports to a latch from its own final suspend (its continuation is the
// latch, see continuation.hpp), so a child costs no frame beyond its own;
// the last to arrive resumes the parent. The latch type says what else a
// finishing child does (collectAny's stops the others, collectAllWindowed's
// starts the next one).
//
// Arriving is an atomic read-modify-write, as much as a small child costs
// in all. A child that finishes before its start returns (on the starting
// thread, without suspending for long) skips it: its start settles it and
// counts it, and the parent arrives for all those at once. collectAllRange
// goes further: such a child hands its value over and frees its frame as it
// finishes (startRange).
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/continuation.hpp>
#include <coio/core/detail/inherited_stop.hpp>
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
#include <vector>

namespace coio::detail {

// Counts the children still running plus one for the parent; the last to
// arrive resumes the parent. Also keeps the first exception (in time).
// The base of every collect latch.
struct CollectLatch : FanIn {
  std::atomic<std::size_t> remaining{0};
  std::coroutine_handle<> parent;
  std::atomic<bool> failed{false};
  std::exception_ptr firstException;

  std::coroutine_handle<> arrive() noexcept {
    return remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 ? parent : std::noop_coroutine();
  }
  void fail(const std::exception_ptr& e) noexcept {
    if (!failed.exchange(true, std::memory_order_relaxed)) firstException = e;
  }
  // What a finishing child does besides arriving (the same whether its
  // start or its final suspend does it).
  void settle(void* /*child*/, const std::exception_ptr* exception) noexcept {
    if (exception) fail(*exception);
  }

 protected:
  CollectLatch() = default;
  ~CollectLatch() = default;
};

// collectAll's and collectAny's latches: Latch::settle, then arrive.
template <typename Latch>
struct ArrivingLatch : CollectLatch {
 protected:
  std::coroutine_handle<> childDone(void* child, const std::exception_ptr* exception) noexcept final {
    static_cast<Latch*>(this)->settle(child, exception);
    return arrive();
  }
};

// Ties `task` to `latch` and to the token it runs under; resuming the
// handle returned starts it.
template <typename T>
std::coroutine_handle<TaskPromise<T>> bindChild(Task<T>& task, FanIn& latch, const std::stop_token* stop) noexcept {
  const std::coroutine_handle<TaskPromise<T>> h = TaskAccess::handle(task);
  COIO_ASSERT(h, "collecting an empty coio::Task");
  h.promise().continuation_ = Continuation(latch);
  h.promise().setStopToken(stop);
  return h;
}

// Settles a child that finished in its start, where it did not arrive.
template <typename Latch, typename T>
void settleStarted(Latch& latch, std::coroutine_handle<TaskPromise<T>> h) noexcept {
  const Outcome<T>& outcome = h.promise().outcome;
  latch.settle(h.address(), outcome.hasException() ? &outcome.exception() : nullptr);
}

struct AllLatch final : ArrivingLatch<AllLatch> {
  // Starts the children in input order; returns how many finished while
  // starting. While every child so far finished in its start without
  // throwing, each hands its value to `values` and frees its own frame
  // (continuation.hpp); the first that does not ends that, so that
  // `values` stays in input order, and the rest keep their values in their
  // frames.
  // Not inlined: in the caller's coroutine, the loop's state would spill
  // to the stack.
  template <typename T>
  [[gnu::noinline]] std::size_t startRange(std::vector<Task<T>>& children, RangeValues<T>& values,
                                           const std::stop_token* stop) noexcept {
    if constexpr (handsOverValue<T>) earlyValues_ = &values;
    std::size_t waiting = 0;
    for (Task<T>& child : children) {
      const std::coroutine_handle<TaskPromise<T>> h = bindChild(child, *this, stop);
      tlsChildStarting = h.address();
      h.resume();
      if (tlsChildStarting == handedOverMark()) [[likely]] {
        TaskAccess::release(child);  // its frame is gone
        continue;
      }
      earlyValues_ = nullptr;
      if (tlsChildStarting != nullptr) {
        ++waiting;  // it arrives itself
        continue;
      }
      settleStarted(*this, h);
    }
    earlyValues_ = nullptr;
    return children.size() - waiting;
  }
};

// Binds `task` and runs it on this thread until its first suspension. True
// if it finished meanwhile: then it did not arrive, and this settled it
// (the caller counts it).
template <typename Latch, typename T>
bool startChild(Task<T>& task, Latch& latch, const std::stop_token* stop) noexcept {
  const std::coroutine_handle<TaskPromise<T>> h = bindChild(task, latch, stop);
  tlsChildStarting = h.address();
  h.resume();
  if (tlsChildStarting != nullptr) return false;
  settleStarted(latch, h);
  return true;
}

// Starts the children in input order; returns how many finished while
// starting (see startChild).
template <typename Latch, typename T>
std::size_t startChildren(std::vector<Task<T>>& children, Latch& latch, const std::stop_token* stop) noexcept {
  std::size_t finished = 0;
  for (Task<T>& child : children) finished += startChild(child, latch, stop);
  return finished;
}
template <typename Latch, typename... Ts>
std::size_t startChildren(std::tuple<Task<Ts>...>& children, Latch& latch, const std::stop_token* stop) noexcept {
  return std::apply(
      [&](auto&... child) {
        std::size_t finished = 0;
        ((finished += startChild(child, latch, stop)), ...);  // a comma fold: in order
        return finished;
      },
      children);
}

// A finished child's frame, as FanIn::childDone names it.
template <typename T>
void* childAddress(const Task<T>& task) noexcept {
  return TaskAccess::handle(task).address();
}

// A finished child's value (Unit for void), or rethrows its exception.
template <typename T>
decltype(auto) childResult(const Task<T>& task) {
  auto& outcome = TaskAccess::handle(task).promise().outcome;
  if constexpr (std::is_void_v<T>) {
    outcome.get();
    return Unit{};
  } else {
    return outcome.get();
  }
}

// The results of a range of finished children, in input order: a
// std::vector, nothing for void children (collectAll's CollectedResults).
// `early` holds those of the first early->size() (startRange), the frames
// those of the rest. Frees each of these once its result is out, in the
// same pass, while its frame is in cache.
template <typename T>
auto collectResults(std::vector<Task<T>>& children, RangeValues<T>* early = nullptr) {
  if constexpr (!std::is_void_v<T>) {
    std::vector<T> results = early != nullptr ? early->take() : std::vector<T>();
    results.reserve(children.size());
    for (auto child = children.begin() + static_cast<std::ptrdiff_t>(results.size()); child != children.end(); ++child) {
      const Task<T> done = std::move(*child);
      results.push_back(childResult(done));
    }
    return results;
  }
}

// Starts `count` children when awaited, through `startAll`, which gets the
// token the awaiting coroutine runs under and returns how many children
// finished in their start (without arriving); resumes the awaiting
// coroutine once every child has finished.
template <typename StartAll>
class CollectAwaiter {
 public:
  CollectAwaiter(CollectLatch& latch, std::size_t count, StartAll startAll) noexcept
      : latch_(latch), count_(count), startAll_(std::move(startAll)) {}
  bool await_ready() const noexcept { return count_ == 0; }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> parent) noexcept {
    latch_.parent = parent;
    latch_.remaining.store(count_ + 1, std::memory_order_relaxed);
    // This may itself run in a child's start (ours are nested inside it).
    void* const enclosing = tlsChildStarting;
    const std::size_t finished = startAll_(stopTokenOf(parent));
    tlsChildStarting = enclosing;
    // The parent's own arrival and those of the children that finished
    // while starting: if that is all of them, there is nothing to wait for.
    return latch_.remaining.fetch_sub(finished + 1, std::memory_order_acq_rel) != finished + 1;
  }
  void await_resume() const {
    if (latch_.failed.load(std::memory_order_relaxed)) std::rethrow_exception(latch_.firstException);
  }

 private:
  CollectLatch& latch_;
  std::size_t count_;
  StartAll startAll_;
};

}  // namespace coio::detail
