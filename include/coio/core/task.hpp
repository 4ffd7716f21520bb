#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/continuation.hpp>
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/detail/outcome.hpp>

#include <coroutine>
#include <stop_token>
#include <utility>

namespace coio {

template <typename T = void>
class Task;

namespace detail {

template <typename T>
class TaskPromise final : public PooledFrame, public OutcomeReturn<T> {
 public:
  // Final suspend hands control straight to the awaiting coroutine
  // (symmetric transfer): a loop awaiting tasks that complete synchronously
  // runs in constant stack space where the compiler emits the tail call. A
  // collectAll child reports to its latch instead, or, finished in its
  // start, hands its value over and frees its frame without suspending
  // (continuation.hpp).
  struct FinalAwaiter {
    // Whether final_suspend handed the value over: the frame then frees
    // itself. Asked of the thread rather than kept in the awaiter, which
    // g++ 12 would store in the frame, a byte and a test more per Task.
    bool await_ready() noexcept {
      if (!handsOverValue<T> || tlsChildStarting != handingOverMark()) return false;
      tlsChildStarting = handedOverMark();
      return true;
    }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<TaskPromise> h) noexcept {
      const Continuation next = h.promise().continuation_;
      if (next.isFanIn()) [[unlikely]] return reportFinished(h);
      return next.handle();
    }
    void await_resume() noexcept {}
  };

  Task<T> get_return_object() noexcept;
  std::suspend_always initial_suspend() noexcept { return {}; }
  FinalAwaiter final_suspend() noexcept {
    if constexpr (handsOverValue<T>) {
      if (continuation_.isFanIn()) [[unlikely]] handOverValue(continuation_.fanIn());
    }
    return {};
  }

  // The stop token lives in the outcome, sharing the exception's word.
  const std::stop_token* stopToken() const noexcept { return this->outcome.stopToken(); }
  void setStopToken(const std::stop_token* token) noexcept { this->outcome.setStopToken(token); }

  Continuation continuation_;

 private:
  // Out of line, so that the common path to the awaiting coroutine keeps
  // its registers.
  [[gnu::noinline]] static std::coroutine_handle<> reportFinished(std::coroutine_handle<TaskPromise> h) noexcept {
    const Outcome<T>& outcome = h.promise().outcome;
    return h.promise().continuation_.fanIn().childFinished(h.address(),
                                                           outcome.hasException() ? &outcome.exception() : nullptr);
  }

  // A collect child finished: if FanIn::earlyValues says so, the value
  // goes to the range's values and the thread is marked (handingOverMark).
  void handOverValue(FanIn& fanIn) noexcept {
    if (this->outcome.hasException()) return;
    RangeValues<T>* values = fanIn.earlyValues<T>(std::coroutine_handle<TaskPromise>::from_promise(*this).address());
    if (values == nullptr) return;
    if constexpr (std::is_void_v<T>) {
      values->add();
    } else {
      values->add(std::move(this->outcome.value()));
    }
    tlsChildStarting = handingOverMark();
  }
};

// For collectAll and its relatives, which start a Task's coroutine
// themselves (detail/collect.hpp).
struct TaskAccess {
  template <typename T>
  static std::coroutine_handle<TaskPromise<T>> handle(const Task<T>& task) noexcept {
    return task.handle_;
  }
  // For a child whose frame freed itself: the Task lets go of it.
  template <typename T>
  static void release(Task<T>& task) noexcept {
    task.handle_ = nullptr;
  }
};

}  // namespace detail

/// A lazy coroutine producing a T (or a T&, or nothing).
///
/// Guarantees:
/// - Lazy: the body does not run until the Task is awaited (or handed to
///   `blockingWait` / `AsyncScope::spawn`, which await it).
/// - Move-only; the Task owns the coroutine frame and destroys it in its
///   destructor, whether or not the body ever ran.
/// - `co_await std::move(task)` starts the body on the awaiting thread by
///   symmetric transfer; when the body finishes, the awaiter is resumed by
///   symmetric transfer on whichever thread finished the body (the thread
///   that resumed its last suspension point). Exceptions escaping the body
///   are stored and rethrown from the `co_await`.
/// - A Task can be awaited once. Awaiting an empty (moved-from) Task is a
///   programming error (asserted).
/// - Cancellation: the body runs under the stop token of the coroutine that
///   awaits it (`co_await currentStopToken()`, <coio/core/cancellation.hpp>),
///   passed down as a pointer, never copied; a Task awaited from outside any
///   coio coroutine (`blockingWait`, a reactor's `spawn`) runs under a token
///   that never stops. Reactor operations and cancellable waits given no
///   token of their own use it.
///
/// Example:
/// \snippet api_examples.cpp task
template <typename T>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::TaskPromise<T>;
  /// The type `co_await` on the task yields.
  using value_type = T;

  Task() noexcept = default;
  /// Takes over `other`'s coroutine; `other` becomes empty.
  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  /// Destroys the coroutine held, if any, and takes over `other`'s.
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { reset(); }

  /// True if the Task holds a coroutine (it was not moved from).
  bool valid() const noexcept { return handle_ != nullptr; }

  class Awaiter {
   public:
    explicit Awaiter(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    bool await_ready() const noexcept { return false; }
    template <typename Promise>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> awaiting) noexcept {
      promise_type& p = handle_.promise();
      p.continuation_ = detail::Continuation(awaiting);
      p.setStopToken(detail::stopTokenOf(awaiting));
      return handle_;
    }
    T await_resume() { return handle_.promise().outcome.get(); }

   private:
    std::coroutine_handle<promise_type> handle_;
  };

  /// Starts the task by symmetric transfer; the awaiter resumes on the thread that finishes it.
  /// The task must be an rvalue: `co_await std::move(task)` or `co_await f()`.
  Awaiter operator co_await() && noexcept {
    COIO_ASSERT(handle_, "co_await on an empty coio::Task");
    return Awaiter{handle_};
  }

 private:
  friend class detail::TaskPromise<T>;
  friend struct detail::TaskAccess;
  explicit Task(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  void reset() noexcept {
    if (handle_) std::exchange(handle_, nullptr).destroy();
  }

  std::coroutine_handle<promise_type> handle_;
};

template <typename T>
Task<T> detail::TaskPromise<T>::get_return_object() noexcept {
  return Task<T>{std::coroutine_handle<TaskPromise>::from_promise(*this)};
}

}  // namespace coio
