#pragma once
// The coroutines the loop drives itself: RootPromise owns a spawned task,
// DriverTask runs runUntil's task and keeps its result.
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/outcome.hpp>
#include <coio/core/task.hpp>

#include <coroutine>
#include <exception>
#include <utility>

namespace coio::detail {

class LoopCore;

// The coroutine that owns a spawned task. It lives in the loop's list of
// roots until it finishes (then it unlinks and frees itself), until the loop
// stops before it started (then the loop destroys it), or until the reactor
// is destroyed (then the reactor destroys it, and with it the whole chain of
// frames it awaits). FinalAwaiter and unhandled_exception are defined in
// loop_core.hpp, beside the list they leave.
struct RootPromise : PooledFrame {
  struct InitialAwaiter {
    RootPromise& promise;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept { promise.started = true; }
  };
  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    void await_suspend(std::coroutine_handle<RootPromise> h) noexcept;
    void await_resume() noexcept {}
  };
  struct Handle {
    using promise_type = RootPromise;
    std::coroutine_handle<RootPromise> h;
  };
  Handle get_return_object() noexcept { return {std::coroutine_handle<RootPromise>::from_promise(*this)}; }
  InitialAwaiter initial_suspend() noexcept { return {*this}; }
  FinalAwaiter final_suspend() noexcept { return {}; }
  void return_void() noexcept {}
  void unhandled_exception() noexcept;

  LoopCore* owner = nullptr;
  RootPromise* prev = nullptr;
  RootPromise* next = nullptr;
  std::exception_ptr failure;  // what escaped the task, handed to the owner at the end
  bool started = false;        // loop thread only: resumed at least once
};

inline RootPromise::Handle makeRoot(Task<void> task) { co_await std::move(task); }
inline void RootPromise::unhandled_exception() noexcept { failure = std::current_exception(); }

// runUntil's driver: suspends at the end so that the result can be read.
template <typename T>
class DriverTask {
 public:
  struct promise_type : OutcomeReturn<T> {
    DriverTask get_return_object() noexcept {
      return DriverTask{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
  };
  DriverTask(DriverTask&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  DriverTask& operator=(DriverTask&&) = delete;
  ~DriverTask() {
    if (handle_) handle_.destroy();
  }
  std::coroutine_handle<> handle() const noexcept { return handle_; }
  bool done() const noexcept { return handle_.done(); }
  T result() { return handle_.promise().outcome.get(); }

 private:
  explicit DriverTask(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

template <typename T>
DriverTask<T> makeDriver(Task<T> task) {
  co_return co_await std::move(task);
}
template <>
inline DriverTask<void> makeDriver(Task<void> task) {
  co_await std::move(task);
}

}  // namespace coio::detail
