#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/owned_coroutine.hpp>
#include <coio/core/detail/yield_slot.hpp>

#include <coroutine>
#include <cstddef>
#include <exception>
#include <iterator>
#include <ranges>
#include <type_traits>
#include <utility>

namespace coio {

template <typename T>
class Generator;

namespace detail {

template <typename T>
class GeneratorPromise final : public PooledFrame, public YieldSlot<T, std::suspend_always> {
 public:
  Generator<T> get_return_object() noexcept;
  std::suspend_always initial_suspend() noexcept { return {}; }
  std::suspend_always final_suspend() noexcept { return {}; }
  void return_void() noexcept {}
  // Kept for begin() / ++ to rethrow, as AsyncGenerator must (its consumer
  // is not on this stack); the body has then ended at its final suspend.
  void unhandled_exception() noexcept { exception = std::current_exception(); }

  // Nothing would resume a synchronous generator that suspended elsewhere
  // than at a co_yield. (A co_yield does not go through await_transform.)
  template <typename U>
  std::suspend_never await_transform(U&&) = delete;

  // Runs the body to its next co_yield or its end; rethrows what escaped it.
  void resumeBody() {
    std::coroutine_handle<GeneratorPromise>::from_promise(*this).resume();
    if (exception) std::rethrow_exception(std::exchange(exception, nullptr));
  }

  std::exception_ptr exception;
};

}  // namespace detail

/// A lazy, synchronous generator: a coroutine that `co_yield`s a sequence
/// of T, consumed as a C++20 input range (`for (auto& x : numbers())`,
/// std::ranges algorithms and views), like cppcoro::generator and C++23's
/// std::generator.
///
/// Guarantees:
/// - Lazy: the body runs only inside `begin()` and the iterator's `++`, on
///   the calling thread, each time up to its next `co_yield` or its end. It
///   cannot `co_await` (a compile error): nothing would resume it. For a
///   body that awaits, use AsyncGenerator.
/// - No copies: `*it` is a reference (`T&`, or T itself for a `Generator<U&>`)
///   to the object the body yielded, in the body's frame (a local, or the
///   temporary of the `co_yield` expression), valid until the iterator is
///   incremented or the generator destroyed. The consumer may modify it or
///   move from it (move-only T works). Only a const lvalue yielded by a
///   `Generator<U>` of mutable U is copied (once), since the consumer gets a
///   `U&`. `T` may be a value type or an lvalue reference, not `void` or
///   `U&&`.
/// - An exception escaping the body is rethrown from the `begin()` or `++`
///   that resumed it; the generator has then ended (`it == end()`).
/// - Move-only; the Generator owns the frame, and destroying it, wherever
///   the body is (not started, at a `co_yield`, ended), destroys the frame
///   and the body's locals: breaking out of a range-for over it is clean.
/// - A view (`std::ranges::view`) and an input range: `begin()` may be
///   called once (asserted), and only one pass is possible. Not
///   thread-safe: iterate it from one thread at a time.
template <typename T>
class [[nodiscard]] Generator : public std::ranges::view_base {
  // A view through view_base, not view_interface: clang before 16 cannot
  // instantiate libstdc++'s view_interface (llvm-project issue 44178), and
  // Generator would not even be a range there.
 public:
  using promise_type = detail::GeneratorPromise<T>;
  /// The values generated, without reference or cv-qualifiers.
  using value_type = std::remove_cvref_t<T>;
  /// What `*it` yields: `T&`, or T itself if it is a reference.
  using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;

  /// The range's iterator: an input iterator whose end is `std::default_sentinel`.
  /// Copies share the generator's position (as for any input iterator).
  class Iterator {
   public:
    /// Single pass.
    using iterator_concept = std::input_iterator_tag;
    /// As required of iterators; never used to measure a distance.
    using difference_type = std::ptrdiff_t;
    /// The generator's value_type.
    using value_type = Generator::value_type;
    /// The generator's reference.
    using reference = Generator::reference;

    /// An iterator of no generator: only assignable.
    Iterator() noexcept = default;

    /// The object the body yielded last; not at the end (asserted).
    reference operator*() const noexcept {
      COIO_ASSERT(!handle_.done(), "dereferencing a coio::Generator's end");
      return static_cast<reference>(*handle_.promise().yielded);
    }
    /// Runs the body to its next `co_yield` or its end, on this thread;
    /// rethrows what escapes it. Not at the end (asserted).
    Iterator& operator++() {
      COIO_ASSERT(!handle_.done(), "incrementing a coio::Generator's end");
      handle_.promise().resumeBody();
      return *this;
    }
    /// Same as `++it` (an input iterator has no previous value to return).
    void operator++(int) { ++*this; }
    /// True once the body has ended (returned or thrown).
    friend bool operator==(const Iterator& it, std::default_sentinel_t) noexcept {
      return !it.handle_ || it.handle_.done();
    }

   private:
    friend class Generator;
    explicit Iterator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    std::coroutine_handle<promise_type> handle_;
  };

  /// An empty generator (as a moved-from one): not iterable.
  Generator() noexcept = default;
  /// Takes over `other`'s coroutine; `other` becomes empty.
  Generator(Generator&& other) noexcept = default;
  /// Destroys the coroutine held, if any, and takes over `other`'s.
  Generator& operator=(Generator&& other) noexcept = default;

  /// True if the generator holds a coroutine (it was not moved from).
  bool valid() const noexcept { return body_.get() != nullptr; }

  /// Starts the body and runs it to its first `co_yield` or its end, on this
  /// thread; rethrows what escapes it. Once per generator (asserted).
  Iterator begin() {
    COIO_ASSERT(valid(), "begin() on an empty coio::Generator");
    COIO_ASSERT(!started_, "begin() twice on a coio::Generator: it is a single-pass range");
    started_ = true;
    body_.get().promise().resumeBody();
    return Iterator{body_.get()};
  }
  /// The end of the range.
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  friend class detail::GeneratorPromise<T>;
  explicit Generator(std::coroutine_handle<promise_type> h) noexcept : body_(h) {}

  detail::OwnedCoroutine<promise_type> body_;
  bool started_ = false;  // moves along: a moved-from generator is empty anyway
};

template <typename T>
Generator<T> detail::GeneratorPromise<T>::get_return_object() noexcept {
  return Generator<T>{std::coroutine_handle<GeneratorPromise>::from_promise(*this)};
}

}  // namespace coio
