#pragma once
// Outcome<T>: the result slot of a coroutine: nothing yet, a value, or an
// exception. References are stored as pointers, void as nothing.
#include <coio/core/detail/assert.hpp>

#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

namespace coio::detail {

template <typename T>
class Outcome {
  using Stored = std::conditional_t<std::is_reference_v<T>, std::remove_reference_t<T>*, T>;

 public:
  Outcome() noexcept {}
  Outcome(const Outcome&) = delete;
  Outcome& operator=(const Outcome&) = delete;
  ~Outcome() {
    if (hasValue_) std::destroy_at(&value_);
  }

  template <typename U>
  void setValue(U&& value) {
    COIO_ASSERT(!hasValue_ && !exception_, "coroutine result set twice");
    if constexpr (std::is_reference_v<T>) {
      std::construct_at(&value_, std::addressof(value));
    } else {
      std::construct_at(&value_, std::forward<U>(value));
    }
    hasValue_ = true;
  }
  void setException(std::exception_ptr e) noexcept { exception_ = std::move(e); }

  bool hasException() const noexcept { return exception_ != nullptr; }
  std::exception_ptr exception() const noexcept { return exception_; }

  /// The value (moved out), or rethrows the stored exception.
  T get() {
    if (exception_) std::rethrow_exception(exception_);
    COIO_ASSERT(hasValue_, "coroutine result read before it completed");
    if constexpr (std::is_reference_v<T>) {
      return static_cast<T>(*value_);
    } else {
      return std::move(value_);
    }
  }

 private:
  // A union and a flag rather than std::variant: the variant's index switch
  // in set/get/destroy was most of Task's overhead over a bare coroutine
  // (callgrind: 139 vs 119 instructions per create+await+destroy).
  union {
    Stored value_;
  };
  bool hasValue_ = false;
  std::exception_ptr exception_;
};

template <>
class Outcome<void> {
 public:
  void setValue() noexcept {}
  void setException(std::exception_ptr e) noexcept { exception_ = std::move(e); }
  bool hasException() const noexcept { return exception_ != nullptr; }
  std::exception_ptr exception() const noexcept { return exception_; }
  void get() {
    if (exception_) std::rethrow_exception(exception_);
  }

 private:
  std::exception_ptr exception_;
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
  void return_void() noexcept {}
  void unhandled_exception() noexcept { outcome.setException(std::current_exception()); }
  Outcome<void> outcome;
};

}  // namespace coio::detail
