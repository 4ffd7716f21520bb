#pragma once
// The machinery behind collectAll and its relatives: each child task is
// wrapped in a CollectChild coroutine that reports to a latch when it
// finishes; the last one to arrive resumes the parent. The latch type says
// what else a finishing child does (collectAny's stops the others,
// collectAllWindowed's starts the next one).
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/detail/outcome.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

namespace coio::detail {

// Counts the children still running plus one for the parent; the last to
// arrive resumes the parent. Also keeps the first exception (in time).
// collectAll's latch; the others extend it.
struct CollectLatch {
  std::atomic<std::size_t> remaining{0};
  std::coroutine_handle<> parent;
  std::atomic<bool> failed{false};
  std::exception_ptr firstException;

  std::coroutine_handle<> arrive() noexcept {
    return remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 ? parent : std::noop_coroutine();
  }
  void fail(std::exception_ptr e) noexcept {
    if (!failed.exchange(true, std::memory_order_relaxed)) firstException = std::move(e);
  }
  // A child (its frame at `child`) finished, after fail() if it threw:
  // the coroutine to run next on this thread.
  std::coroutine_handle<> childDone(void* /*child*/) noexcept { return arrive(); }
};

template <typename T, typename Latch>
class CollectChild {
 public:
  struct promise_type : PooledFrame, OutcomeReturn<T>, StopTokenCarrier {
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        auto& p = h.promise();
        if (p.outcome.hasException()) p.latch->fail(p.outcome.exception());
        return p.latch->childDone(h.address());
      }
      void await_resume() noexcept {}
    };
    CollectChild get_return_object() noexcept {
      return CollectChild{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    FinalAwaiter final_suspend() noexcept { return {}; }
    Latch* latch = nullptr;
  };

  CollectChild(CollectChild&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CollectChild& operator=(CollectChild&&) = delete;
  ~CollectChild() {
    if (handle_) handle_.destroy();
  }

  // Ties the child to its latch and to the token it runs under; resuming
  // the handle returned starts it.
  std::coroutine_handle<> bind(Latch& latch, const std::stop_token* stop) noexcept {
    handle_.promise().latch = &latch;
    handle_.promise().stopToken = stop;
    return handle_;
  }
  // Runs the child on this thread until its first suspension.
  void start(Latch& latch, const std::stop_token* stop) noexcept { bind(latch, stop).resume(); }
  // Its frame, as CollectLatch::childDone names it.
  void* address() const noexcept { return handle_.address(); }
  // Its value, or rethrows its exception.
  decltype(auto) result() {
    if constexpr (std::is_void_v<T>) {
      handle_.promise().outcome.get();
      return Unit{};
    } else {
      return handle_.promise().outcome.get();
    }
  }

 private:
  explicit CollectChild(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

template <typename Latch, typename T>
CollectChild<T, Latch> makeCollectChild(Task<T> task) {
  co_return co_await std::move(task);
}

template <typename Latch>
CollectChild<void, Latch> makeCollectChild(Task<void> task) {
  co_await std::move(task);
}

template <typename Latch, typename T>
std::vector<CollectChild<T, Latch>> makeCollectChildren(std::vector<Task<T>> tasks) {
  std::vector<CollectChild<T, Latch>> children;
  children.reserve(tasks.size());
  for (auto& t : tasks) children.push_back(makeCollectChild<Latch>(std::move(t)));
  return children;
}

template <typename T>
using UnitIfVoid = std::conditional_t<std::is_void_v<T>, Unit, T>;

// What collectAllRange yields: the results in input order, or nothing.
template <typename T>
using RangeResult = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;

// The results of a range of finished children, in input order (nothing
// for void children).
template <typename T, typename Latch>
auto collectResults(std::vector<CollectChild<T, Latch>>& children) {
  if constexpr (!std::is_void_v<T>) {
    std::vector<T> results;
    results.reserve(children.size());
    for (auto& child : children) results.push_back(child.result());
    return results;
  }
}

// Starts `count` children (through `startAll`, which gets the token the
// awaiting coroutine runs under) when awaited; resumes the awaiting
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
    startAll_(stopTokenOf(parent));
    // The parent's own arrival: if the children all finished synchronously
    // there is nothing to wait for.
    return latch_.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1;
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
