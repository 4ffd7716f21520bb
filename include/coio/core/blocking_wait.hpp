#pragma once
#include <coio/core/awaitable_traits.hpp>
#include <coio/core/detail/outcome.hpp>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>

namespace coio {

namespace detail {

// Lives on the blocked thread's stack. The signaller publishes "posted",
// wakes the waiter, then publishes "done touching"; the waiter returns (and
// the signal dies) only after the latter, so the wake-up never touches a
// dead object. Unlike a notify under a mutex, the woken thread does not
// run into a held lock and sleep again (two extra context switches).
class BlockingSignal {
 public:
  void set() noexcept {
    state_.store(kPosted, std::memory_order_release);
    state_.notify_one();
    state_.store(kReleased, std::memory_order_release);
  }
  void wait() noexcept {
    state_.wait(kWaiting, std::memory_order_acquire);
    // Only the few instructions between notify_one and the last store.
    while (state_.load(std::memory_order_acquire) != kReleased) std::this_thread::yield();
  }

 private:
  static constexpr std::uint32_t kWaiting = 0, kPosted = 1, kReleased = 2;
  std::atomic<std::uint32_t> state_{kWaiting};
};

template <typename T>
class BlockingWaitTask {
 public:
  struct promise_type : OutcomeReturn<T> {
    // Not pooled: the frame may be freed on this thread after another
    // thread finished it, and blockingWait is not a hot path.
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<promise_type> h) noexcept { h.promise().signal->set(); }
      void await_resume() noexcept {}
    };
    BlockingWaitTask get_return_object() noexcept {
      return BlockingWaitTask{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    FinalAwaiter final_suspend() noexcept { return {}; }
    BlockingSignal* signal = nullptr;
  };

  explicit BlockingWaitTask(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  BlockingWaitTask(BlockingWaitTask&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  BlockingWaitTask& operator=(BlockingWaitTask&&) = delete;
  ~BlockingWaitTask() {
    if (handle_) handle_.destroy();
  }

  T run() {
    BlockingSignal signal;
    handle_.promise().signal = &signal;
    handle_.resume();
    signal.wait();
    return handle_.promise().outcome.get();
  }

 private:
  std::coroutine_handle<promise_type> handle_;
};

template <typename A>
BlockingWaitTask<AwaitResult<A>> makeBlockingWaitTask(A&& awaitable) {
  co_return co_await std::forward<A>(awaitable);
}

template <typename A>
  requires std::is_void_v<AwaitResult<A>>
BlockingWaitTask<void> makeBlockingWaitTask(A&& awaitable) {
  co_await std::forward<A>(awaitable);
}

}  // namespace detail

/// Runs `awaitable` to completion, blocking the calling thread, and returns
/// its result (or rethrows its exception).
///
/// The awaitable starts on the calling thread. If it suspends and is resumed
/// by another thread (a Baton posted elsewhere, a reactor thread), the rest
/// of it runs there and this thread sleeps until it is done. Never call it on
/// a thread the awaitable needs in order to make progress (a reactor's own
/// thread): that deadlocks, as in folly.
///
/// Example:
/// \snippet api_examples.cpp blockingWait
template <Awaitable A>
AwaitResult<A> blockingWait(A&& awaitable) {
  auto task = detail::makeBlockingWaitTask(std::forward<A>(awaitable));
  return task.run();
}

}  // namespace coio
