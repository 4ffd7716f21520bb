#pragma once
// The machinery behind collectAll and its relatives: each child task is
// wrapped in a CollectChild coroutine that reports to a latch when it
// finishes; the last one to arrive resumes the parent.
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/outcome.hpp>
#include <coio/core/task.hpp>
#include <coio/core/unit.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <utility>

namespace coio::detail {

// Counts the children still running plus one for the parent; the last to
// arrive resumes the parent. Also keeps the first exception (in time).
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
};

template <typename T>
class CollectChild {
 public:
  struct promise_type : PooledFrame, OutcomeReturn<T> {
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        auto& p = h.promise();
        if (p.outcome.hasException()) p.latch->fail(p.outcome.exception());
        return p.latch->arrive();
      }
      void await_resume() noexcept {}
    };
    CollectChild get_return_object() noexcept {
      return CollectChild{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    FinalAwaiter final_suspend() noexcept { return {}; }
    CollectLatch* latch = nullptr;
  };

  CollectChild(CollectChild&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CollectChild& operator=(CollectChild&&) = delete;
  ~CollectChild() {
    if (handle_) handle_.destroy();
  }

  // Runs the child on this thread until its first suspension.
  void start(CollectLatch& latch) noexcept {
    handle_.promise().latch = &latch;
    handle_.resume();
  }
  decltype(auto) result() {
    if constexpr (std::is_void_v<T>) {
      return Unit{};
    } else {
      return handle_.promise().outcome.get();
    }
  }

 private:
  explicit CollectChild(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

template <typename T>
CollectChild<T> makeCollectChild(Task<T> task) {
  co_return co_await std::move(task);
}

template <>
inline CollectChild<void> makeCollectChild(Task<void> task) {
  co_await std::move(task);
}

// Starts `count` children (through `startAll`) when awaited; resumes the
// awaiting coroutine once every child has finished.
template <typename StartAll>
class CollectAwaiter {
 public:
  CollectAwaiter(CollectLatch& latch, std::size_t count, StartAll startAll) noexcept
      : latch_(latch), count_(count), startAll_(std::move(startAll)) {}
  bool await_ready() const noexcept { return count_ == 0; }
  bool await_suspend(std::coroutine_handle<> parent) noexcept {
    latch_.parent = parent;
    latch_.remaining.store(count_ + 1, std::memory_order_relaxed);
    startAll_();
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

template <typename T>
using UnitIfVoid = std::conditional_t<std::is_void_v<T>, Unit, T>;

}  // namespace coio::detail
