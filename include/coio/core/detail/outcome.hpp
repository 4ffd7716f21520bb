#pragma once
// Outcome<T>: the result slot of a coroutine: still running, a value, or an
// exception. References are stored as pointers, void as nothing.
//
// While the coroutine runs, the word that will hold its exception holds the
// stop token it runs under (see inherited_stop.hpp): a running body has no
// exception yet, and a finished one needs no token. Sharing it keeps a
// Task<int> frame in the frame pool's 64-byte class (g++ 12: 64 bytes, 72
// with a word of its own; frame_pool_test.cpp pins it).
#include <coio/core/detail/assert.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace coio::detail {

template <typename T>
class Outcome {
  struct NoValue {};
  using Stored = std::conditional_t<std::is_void_v<T>, NoValue,
                                    std::conditional_t<std::is_reference_v<T>, std::remove_reference_t<T>*, T>>;
  enum class State : std::uint8_t { running, value, exception };

 public:
  Outcome() noexcept {}
  Outcome(const Outcome&) = delete;
  Outcome& operator=(const Outcome&) = delete;
  ~Outcome() {
    if (state_ == State::value) std::destroy_at(&value_);
    if (state_ == State::exception) std::destroy_at(&exception_);
  }

  /// The token the coroutine runs under (null: none). Unset until
  /// setStopToken: creating a coroutine costs no store for it.
  const std::stop_token* stopToken() const noexcept {
    COIO_ASSERT(state_ != State::exception, "stop token read after the coroutine threw");
    return stopToken_;
  }
  void setStopToken(const std::stop_token* token) noexcept {
    COIO_ASSERT(state_ == State::running, "stop token set on a finished coroutine");
    stopToken_ = token;
  }

  /// One argument, or none for Outcome<void>.
  template <typename... U>
  void setValue(U&&... value) {
    COIO_ASSERT(state_ == State::running, "coroutine result set twice");
    if constexpr (std::is_reference_v<T>) {
      std::construct_at(&value_, std::addressof(value)...);
    } else {
      std::construct_at(&value_, std::forward<U>(value)...);
    }
    state_ = State::value;
  }
  // Also after setValue: a local's destructor may throw once the body returned.
  void setException(std::exception_ptr e) noexcept {
    if (state_ == State::value) std::destroy_at(&value_);
    std::construct_at(&exception_, std::move(e));
    state_ = State::exception;
  }

  bool hasException() const noexcept { return state_ == State::exception; }
  const std::exception_ptr& exception() const noexcept {
    COIO_ASSERT(hasException(), "no exception stored");
    return exception_;
  }

  /// The value stored (for a value type: not a reference or void).
  Stored& value() noexcept {
    COIO_ASSERT(state_ == State::value, "coroutine result read before it completed");
    return value_;
  }

  /// The value (moved out), or rethrows the stored exception.
  T get() {
    if (state_ == State::exception) [[unlikely]] rethrow();
    COIO_ASSERT(state_ == State::value, "coroutine result read before it completed");
    if constexpr (std::is_reference_v<T>) {
      return static_cast<T>(*value_);
    } else if constexpr (!std::is_void_v<T>) {
      return std::move(value_);
    }
  }

 private:
  // Out of line: inlined, the exception_ptr copy and the call made every
  // coroutine that awaits a Task keep registers and a stack slot for them
  // (g++ 12: task/create_await_destroy 6.7 -> 5.6-6.0 ns).
  [[noreturn, gnu::noinline, gnu::cold]] void rethrow() const { std::rethrow_exception(exception_); }

  // Unions and a state byte rather than std::variant: the variant's index
  // switch in set/get/destroy was most of Task's overhead over a bare
  // coroutine (callgrind: 139 vs 119 instructions per create+await+destroy).
  // The value first, the state byte in its tail: an int and the state fit
  // one word.
  union {
    Stored value_;
  };
  State state_ = State::running;
  union {
    const std::stop_token* stopToken_;
    std::exception_ptr exception_;
  };
};

/// Promise mixin: `co_return` and `unhandled_exception` store into an Outcome.
template <typename T>
struct OutcomeReturn {
  template <typename U = T>
    requires std::is_convertible_v<U&&, T>
  void return_value(U&& value) {
    outcome.setValue(std::forward<U>(value));
  }
  void unhandled_exception() noexcept { outcome.setException(std::current_exception()); }
  Outcome<T> outcome;
};

template <>
struct OutcomeReturn<void> {
  void return_void() noexcept { outcome.setValue(); }
  void unhandled_exception() noexcept { outcome.setException(std::current_exception()); }
  Outcome<void> outcome;
};

}  // namespace coio::detail
