#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/task.hpp>

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <stop_token>
#include <utility>

namespace coio {

/// Owns fire-and-forget tasks and lets one coroutine wait for all of them.
///
/// Guarantees:
/// - `spawn(task)` starts the task at once, inline on the calling thread,
///   until its first suspension; it then runs wherever its awaitables
///   resume it. The scope keeps it alive until it finishes.
/// - `co_await scope.join()` resumes once every spawned task has finished:
///   inline if they already have, otherwise on the thread that finishes the
///   last one. Join once; spawning after `join()` began is a programming
///   error, and so is destroying a scope that has not been joined while
///   tasks remain.
/// - An exception escaping a spawned task is never lost: it goes to the
///   handler given at construction (called on the thread where the task
///   failed), or, without a handler, the first one is rethrown by `join()`
///   and `failedCount()` counts them all.
/// - Cancellation: every spawned task runs under the scope's stop token
///   (`stopToken()`, `co_await currentStopToken()` inside). `requestStop()`
///   then `co_await join()` cancels everything the scope owns (the reactor
///   operations and cancellable waits in it that were given no token of
///   their own) and waits for all of it; a task that ignores the stop is
///   still waited for. A task spawned after `requestStop()` starts under a
///   stopped token.
class AsyncScope {
 public:
  /// Receives each exception that escapes a spawned task, on the thread where the task failed.
  using ExceptionHandler = std::function<void(std::exception_ptr)>;

  AsyncScope() = default;
  /// A scope whose tasks' exceptions go to `onException` instead of `join()`.
  explicit AsyncScope(ExceptionHandler onException) : onException_(std::move(onException)) {}
  AsyncScope(const AsyncScope&) = delete;
  AsyncScope& operator=(const AsyncScope&) = delete;
  ~AsyncScope() {
    COIO_ASSERT(count_.load(std::memory_order_acquire) == (joinStarted() ? 0u : 1u),
                "AsyncScope destroyed while spawned tasks are still running");
  }

  /// Starts `task` at once on the calling thread and keeps it alive until it finishes.
  void spawn(Task<void> task) {
    COIO_ASSERT(!joinStarted(), "AsyncScope::spawn after join");
    count_.fetch_add(1, std::memory_order_relaxed);
    run(std::move(task), this).handle.resume();
  }

  /// Tasks spawned and not yet finished.
  std::size_t outstanding() const noexcept {
    const std::size_t n = count_.load(std::memory_order_acquire);
    return joinStarted() ? n : n - 1;
  }

  /// Stops the token every spawned task runs under. Callable from any
  /// thread, any number of times; the stop callbacks (e.g. a cancelled
  /// semaphore wait resuming its coroutine) run inline on the calling
  /// thread, so request it on the thread those operations require (a
  /// reactor's operations: its loop thread). If that finishes the last task,
  /// the joiner resumes inline too, and may destroy the scope before this
  /// call returns: it touches nothing of the scope afterwards.
  void requestStop() noexcept {
    std::stop_source(stopSource_).request_stop();  // the copy keeps the stop state alive throughout
  }

  /// The token spawned tasks run under, stopped by requestStop().
  std::stop_token stopToken() const noexcept { return stopToken_; }

  /// Spawned tasks that ended with an exception.
  std::size_t failedCount() const noexcept { return failed_.load(std::memory_order_acquire); }

  class [[nodiscard]] JoinAwaiter {
   public:
    explicit JoinAwaiter(AsyncScope& scope) noexcept : scope_(scope) {}
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) noexcept {
      COIO_ASSERT(!scope_.joinStarted(), "AsyncScope joined twice");
      scope_.joiner_ = h;
      scope_.joinStarted_.store(true, std::memory_order_relaxed);
      // Drop the scope's own reference; if it was the last, nothing runs.
      return scope_.count_.fetch_sub(1, std::memory_order_acq_rel) != 1;
    }
    void await_resume() const {
      std::lock_guard lock(scope_.mutex_);
      if (scope_.firstException_) std::rethrow_exception(scope_.firstException_);
    }

   private:
    AsyncScope& scope_;
  };

  /// Awaits every spawned task: resumes inline if all have finished, else on the thread that
  /// finishes the last; rethrows the first exception when there is no handler.
  JoinAwaiter join() noexcept { return JoinAwaiter{*this}; }

 private:
  struct Detached {
    struct promise_type : detail::PooledFrame, detail::StopTokenCarrier {
      struct FinalAwaiter {
        bool await_ready() noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
          AsyncScope* scope = h.promise().scope;
          h.destroy();
          return scope->count_.fetch_sub(1, std::memory_order_acq_rel) == 1 ? scope->joiner_
                                                                             : std::noop_coroutine();
        }
        void await_resume() noexcept {}
      };
      explicit promise_type(Task<void>&, AsyncScope* s) noexcept : scope(s) { setStopToken(&s->stopToken_); }
      Detached get_return_object() noexcept { return {std::coroutine_handle<promise_type>::from_promise(*this)}; }
      std::suspend_always initial_suspend() noexcept { return {}; }
      FinalAwaiter final_suspend() noexcept { return {}; }
      void return_void() noexcept {}
      void unhandled_exception() noexcept { std::terminate(); }  // run() catches everything
      AsyncScope* scope;
    };
    std::coroutine_handle<promise_type> handle;
  };

  static Detached run(Task<void> task, AsyncScope* scope) {
    try {
      co_await std::move(task);
    } catch (...) {
      scope->report(std::current_exception());
    }
  }

  void report(std::exception_ptr e) noexcept {
    failed_.fetch_add(1, std::memory_order_acq_rel);
    if (onException_) {
      onException_(std::move(e));
      return;
    }
    std::lock_guard lock(mutex_);
    if (!firstException_) firstException_ = std::move(e);
  }

  std::stop_source stopSource_;
  std::stop_token stopToken_ = stopSource_.get_token();  // what the tasks point to
  // 1 (the scope's own reference, dropped by join) + running tasks.
  std::atomic<std::size_t> count_{1};
  std::atomic<std::size_t> failed_{0};
  bool joinStarted() const noexcept { return joinStarted_.load(std::memory_order_relaxed); }
  std::atomic<bool> joinStarted_{false};
  std::coroutine_handle<> joiner_;
  ExceptionHandler onException_;
  mutable std::mutex mutex_;
  std::exception_ptr firstException_;
};

}  // namespace coio
