#pragma once
// Outcome<T>: the result slot of a coroutine: nothing yet, a value, or an
// exception. References are stored as pointers, void as nothing.
#include <coio/core/detail/assert.hpp>

#include <exception>
#include <memory>
#include <type_traits>
#include <utility>
#include <variant>

namespace coio::detail {

template <typename T>
class Outcome {
  using Stored = std::conditional_t<std::is_reference_v<T>, std::remove_reference_t<T>*, T>;

 public:
  template <typename U>
  void setValue(U&& value) {
    if constexpr (std::is_reference_v<T>) {
      storage_.template emplace<1>(std::addressof(value));
    } else {
      storage_.template emplace<1>(std::forward<U>(value));
    }
  }
  void setException(std::exception_ptr e) noexcept { storage_.template emplace<2>(std::move(e)); }

  bool hasException() const noexcept { return storage_.index() == 2; }
  std::exception_ptr exception() const noexcept {
    const auto* e = std::get_if<2>(&storage_);
    return e ? *e : nullptr;
  }

  /// The value (moved out), or rethrows the stored exception.
  T get() {
    if (auto* e = std::get_if<2>(&storage_)) std::rethrow_exception(*e);
    auto* v = std::get_if<1>(&storage_);
    COIO_ASSERT(v != nullptr, "coroutine result read before it completed");
    if constexpr (std::is_reference_v<T>) {
      return static_cast<T>(**v);
    } else {
      return std::move(*v);
    }
  }

 private:
  std::variant<std::monostate, Stored, std::exception_ptr> storage_;
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
