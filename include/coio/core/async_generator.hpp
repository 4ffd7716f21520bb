#pragma once
#include <coio/core/awaitable_traits.hpp>
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/detail/owned_coroutine.hpp>
#include <coio/core/detail/yield_slot.hpp>
#include <coio/core/task.hpp>

#include <concepts>
#include <coroutine>
#include <exception>
#include <functional>
#include <type_traits>
#include <utility>

namespace coio {

template <typename T>
class AsyncGenerator;

namespace detail {

// A co_yield, and the end of the body, hand control back to the consumer
// waiting in next(): by symmetric transfer, on the thread the body is on.
struct ResumeConsumer {
  bool await_ready() const noexcept { return false; }
  template <typename Promise>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> body) noexcept {
    return std::exchange(body.promise().consumer, nullptr);
  }
  void await_resume() const noexcept {}
};

// The body and its consumer never run at the same time: the consumer is
// suspended in next() from the moment it resumes the body until the body
// resumes it. Each hand-over is a resumption, which orders what one side
// wrote before it with what the other reads after it, so no field needs
// an atomic.
template <typename T>
class AsyncGeneratorPromise final : public PooledFrame, public StopTokenCarrier, public YieldSlot<T, ResumeConsumer> {
 public:
  AsyncGenerator<T> get_return_object() noexcept;
  std::suspend_always initial_suspend() noexcept { return {}; }
  ResumeConsumer final_suspend() noexcept { return {}; }
  void return_void() noexcept {}
  void unhandled_exception() noexcept { exception = std::current_exception(); }

  std::coroutine_handle<> consumer;  // awaiting next(); null between two next()s
  std::exception_ptr exception;      // for next() to rethrow
};

}  // namespace detail

/// A lazy asynchronous generator: a coroutine that may `co_await` (coio
/// awaitables, reactor operations) and `co_yield`s a sequence of T, consumed
/// one item at a time with `co_await gen.next()` (or with coio::forEach).
///
/// `co_await gen.next()` yields a pointer to the object the body yielded
/// (`T*`, or `U*` / `const U*` for a `AsyncGenerator<U&>` /
/// `AsyncGenerator<const U&>`), or nullptr once the body has finished. The
/// object is the body's own (a local, or the temporary of the `co_yield`
/// expression: no copy), valid until the next `next()` or the generator's
/// destruction; the consumer may modify it or move from it. Only a const
/// lvalue yielded by an `AsyncGenerator<U>` of mutable U is copied (once).
/// The loop, written by hand (bind the pointer, then test it: g++ 12
/// miscompiles a `co_await` inside a condition, see docs/troubleshooting.md):
///
///     for (;;) {
///       auto* item = co_await gen.next();
///       if (!item) break;
///       use(*item);
///     }
///
/// Guarantees:
/// - Lazy: nothing of the body runs before the first `co_await next()`.
/// - `co_await gen.next()` resumes the body by symmetric transfer, on the
///   awaiting thread; the body runs to its next `co_yield` or its end, and
///   the consumer resumes, by symmetric transfer, on the thread the body was
///   on when it yielded or finished: inline, if the body did not suspend
///   meanwhile; else the thread that resumed the body's last `co_await`.
/// - One `next()` at a time: awaiting `next()` while another `next()` is
///   pending is a programming error (asserted). Successive `next()`s may come
///   from different coroutines and threads, each started after the previous
///   one returned (the callers ordering them, e.g. through a Baton).
/// - An exception escaping the body is rethrown from the `next()` that
///   resumed it; the generator has then ended. After the end, `next()`
///   yields nullptr at once, without suspending.
/// - Cancellation: during each `next()`, the body runs under the stop token
///   of the coroutine awaiting that `next()` (see currentStopToken, which
///   the body may await too): a reactor operation, a sleep, a cancellable
///   wait or a Task inside the body that is given no token of its own is
///   cancelled when the consumer's task is stopped.
/// - Move-only; the AsyncGenerator owns the body's frame. Destroying it
///   while the body is not running (not started, at a `co_yield`, ended)
///   destroys the frame and the body's locals. Destroying it while a
///   `next()` is pending (the body suspended inside an awaited operation)
///   is allowed only together with the consumer waiting in that `next()`
///   (the generator is a local of the consumer's frame, destroyed without
///   being resumed, e.g. a reactor destroying its suspended coroutines): the
///   body's frame then goes as a Task's would, with the awaiter of the
///   operation it waits on (coio's waits leave their queues, as Baton's and
///   the semaphores' do), and nothing is resumed. Destroying it under a
///   consumer that stays alive would leave that consumer suspended for
///   ever: a programming error (not asserted).
template <typename T>
class [[nodiscard]] AsyncGenerator {
 public:
  using promise_type = detail::AsyncGeneratorPromise<T>;
  /// The values generated, without reference or cv-qualifiers.
  using value_type = std::remove_cvref_t<T>;
  /// How the consumer sees an item: `T&`, or T itself if it is a reference.
  using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;
  /// What `co_await next()` yields: a pointer to the item, null at the end.
  using pointer = std::add_pointer_t<reference>;

  class NextAwaiter {
   public:
    explicit NextAwaiter(std::coroutine_handle<promise_type> body) noexcept : body_(body) {}
    bool await_ready() const noexcept { return body_.done(); }
    template <typename Promise>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> consumer) noexcept {
      promise_type& p = body_.promise();
      COIO_ASSERT(!p.consumer, "AsyncGenerator::next() while another next() is pending");
      p.consumer = consumer;
      p.setStopToken(detail::stopTokenOf(consumer));
      return body_;
    }
    pointer await_resume() {
      promise_type& p = body_.promise();
      if (!body_.done()) return p.yielded;
      if (p.exception) std::rethrow_exception(std::exchange(p.exception, nullptr));
      return nullptr;
    }

   private:
    std::coroutine_handle<promise_type> body_;
  };

  /// An empty generator (as a moved-from one): next() may not be called.
  AsyncGenerator() noexcept = default;
  /// Takes over `other`'s coroutine; `other` becomes empty.
  AsyncGenerator(AsyncGenerator&& other) noexcept = default;
  /// Destroys the coroutine held, if any (see the class comment), and takes over `other`'s.
  AsyncGenerator& operator=(AsyncGenerator&& other) noexcept = default;

  /// True if the generator holds a coroutine (it was not moved from).
  bool valid() const noexcept { return body_.get() != nullptr; }

  /// `co_await gen.next()`: runs the body to its next `co_yield` (yields a
  /// pointer to the item) or its end (yields nullptr; rethrows what escaped
  /// the body). Resumes on the thread the body yielded or finished on.
  NextAwaiter next() noexcept {
    COIO_ASSERT(valid(), "next() on an empty coio::AsyncGenerator");
    return NextAwaiter{body_.get()};
  }

 private:
  friend class detail::AsyncGeneratorPromise<T>;
  explicit AsyncGenerator(std::coroutine_handle<promise_type> h) noexcept : body_(h) {}

  detail::OwnedCoroutine<promise_type> body_;
};

template <typename T>
AsyncGenerator<T> detail::AsyncGeneratorPromise<T>::get_return_object() noexcept {
  return AsyncGenerator<T>{std::coroutine_handle<AsyncGeneratorPromise>::from_promise(*this)};
}

/// Consumes `gen` to its end: `fn(item)` for each item in order (`item` is
/// the generator's `reference`); if `fn` returns an awaitable (e.g. a
/// `Task<void>`), it is awaited before the next item is asked for. Owns
/// `gen`, which is destroyed when the Task finishes.
///
/// The loop over `co_await gen.next()` as a Task, with the same guarantees:
/// the body runs under the stop token of the coroutine awaiting forEach;
/// `fn` runs on the thread the body yielded the item on; the awaiting
/// coroutine resumes on the thread the loop ended on (the one the body
/// finished on, or the one `fn` threw on). An exception from the body or
/// from `fn` ends the loop and is rethrown from the `co_await`; the
/// generator is destroyed where it stands. To stop early, write the loop by
/// hand (see AsyncGenerator).
template <typename T, typename F>
  requires std::invocable<F&, typename AsyncGenerator<T>::reference>
Task<void> forEach(AsyncGenerator<T> gen, F fn) {
  using Result = std::invoke_result_t<F&, typename AsyncGenerator<T>::reference>;
  static_assert(std::is_void_v<Result> || Awaitable<Result>, "forEach: fn must return void or an awaitable");
  for (;;) {
    auto* item = co_await gen.next();
    if (!item) co_return;
    if constexpr (std::is_void_v<Result>) {
      std::invoke(fn, *item);
    } else {
      co_await std::invoke(fn, *item);
    }
  }
}

}  // namespace coio
