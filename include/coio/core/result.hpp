#pragma once
#include <coio/core/detail/assert.hpp>

#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace coio {

/// Errors coio reports that have no errno equivalent. Where POSIX has a
/// code (timeouts: std::errc::timed_out, cancellation:
/// std::errc::operation_canceled, reset: std::errc::connection_reset) coio
/// uses it, so `ec == std::errc::timed_out` works across layers.
enum class Errc {
  eof = 1,          ///< the peer closed its end in an orderly way
  closed,           ///< the object was closed locally while the operation was pending
  invalidArgument,  ///< a request violated a documented limit (with a clearer message than EINVAL)
  notSupported,     ///< the kernel or device lacks a required feature
};

}  // namespace coio

/// @cond INTERNAL
template <>
struct std::is_error_code_enum<coio::Errc> : std::true_type {};
/// @endcond

namespace coio {

namespace detail {
class CoioCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "coio"; }
  std::string message(int ev) const override {
    switch (static_cast<Errc>(ev)) {
      case Errc::eof: return "end of stream (peer closed the connection)";
      case Errc::closed: return "closed locally while the operation was pending";
      case Errc::invalidArgument: return "invalid argument";
      case Errc::notSupported: return "not supported by this kernel or device";
    }
    return "unknown coio error";
  }
};
}  // namespace detail

/// The error category of coio::Errc ("coio").
inline const std::error_category& coioCategory() noexcept {
  static const detail::CoioCategory category;
  return category;
}

/// Makes coio::Errc usable as a std::error_code (found by ADL).
inline std::error_code make_error_code(Errc e) noexcept {  // NOLINT: found by ADL, name fixed by the standard
  return {static_cast<int>(e), coioCategory()};
}

/// An errno value as an error_code in the system category.
inline std::error_code systemError(int errnoValue) noexcept {
  return {errnoValue, std::system_category()};
}

/// The outcome of an I/O operation: a value or a `std::error_code`.
///
/// Guarantees: exactly one of the two is present; a default-constructed
/// Result<void> is a success. Reading the value of a failed Result (or the
/// error of a successful one) is a programming error and throws
/// `std::system_error` carrying the error, so it cannot go unnoticed.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_reference_v<T>, "Result<T&> is not supported: use Result<T*> or std::reference_wrapper");
  static_assert(!std::is_same_v<std::remove_cv_t<T>, std::error_code>, "Result<std::error_code> is ambiguous");

 public:
  /// The type of the value.
  using value_type = T;

  /// A success holding `value`.
  template <typename U = T>
    requires std::is_constructible_v<T, U&&> && (!std::is_same_v<std::remove_cvref_t<U>, Result>) &&
             (!std::is_same_v<std::remove_cvref_t<U>, std::error_code>) &&
             (!std::is_error_code_enum_v<std::remove_cvref_t<U>>) &&
             (!std::is_error_condition_enum_v<std::remove_cvref_t<U>>)
  Result(U&& value) : storage_(std::in_place_index<0>, std::forward<U>(value)) {}  // NOLINT: implicit by design

  /// A failure; `ec` must be non-zero.
  Result(std::error_code ec) noexcept : storage_(std::in_place_index<1>, ec) {  // NOLINT: implicit by design
    COIO_ASSERT(ec, "a Result error must be a non-zero error_code");
  }
  /// A failure from an error enum (coio::Errc, std::errc, ...).
  template <typename E>
    requires std::is_error_code_enum_v<E> || std::is_error_condition_enum_v<E>
  Result(E e) : Result(std::error_code(make_error_code(e))) {}  // NOLINT: implicit by design

  /// Whether the Result holds a value.
  bool hasValue() const noexcept { return storage_.index() == 0; }
  /// Same as hasValue().
  explicit operator bool() const noexcept { return hasValue(); }

  /// The value; throws std::system_error carrying the error if there is none.
  T& value() & { check(); return *std::get_if<0>(&storage_); }
  /// The value; throws std::system_error carrying the error if there is none.
  const T& value() const& { check(); return *std::get_if<0>(&storage_); }
  /// The value, moved out; throws std::system_error carrying the error if there is none.
  T&& value() && { check(); return std::move(*std::get_if<0>(&storage_)); }

  /// Same as value().
  T& operator*() & { return value(); }
  /// Same as value().
  const T& operator*() const& { return value(); }
  /// Same as value().
  T&& operator*() && { return std::move(*this).value(); }
  /// Member access to the value (throws like value()).
  T* operator->() { return &value(); }
  /// Member access to the value (throws like value()).
  const T* operator->() const { return &value(); }

  /// The value, or `fallback` converted to T when the Result holds an error.
  template <typename U>
  T valueOr(U&& fallback) const& {
    return hasValue() ? *std::get_if<0>(&storage_) : static_cast<T>(std::forward<U>(fallback));
  }

  /// The error; an empty error_code when the Result holds a value.
  std::error_code error() const noexcept {
    const auto* ec = std::get_if<1>(&storage_);
    return ec ? *ec : std::error_code{};
  }

 private:
  void check() const {
    if (!hasValue()) throw std::system_error(*std::get_if<1>(&storage_), "coio::Result::value() on an error");
  }
  std::variant<T, std::error_code> storage_;
};

/// The outcome of an operation that yields nothing: success or a `std::error_code`.
template <>
class [[nodiscard]] Result<void> {
 public:
  /// void.
  using value_type = void;
  Result() noexcept = default;
  /// Holds `ec`: a failure, or a success when `ec` is zero.
  Result(std::error_code ec) noexcept : ec_(ec) {}  // NOLINT: implicit by design
  /// A failure from an error enum (coio::Errc, std::errc, ...).
  template <typename E>
    requires std::is_error_code_enum_v<E> || std::is_error_condition_enum_v<E>
  Result(E e) : ec_(make_error_code(e)) {}  // NOLINT: implicit by design

  /// Whether the operation succeeded.
  bool hasValue() const noexcept { return !ec_; }
  /// Same as hasValue().
  explicit operator bool() const noexcept { return hasValue(); }
  /// Throws std::system_error carrying the error if the Result holds one.
  void value() const {
    if (ec_) throw std::system_error(ec_, "coio::Result::value() on an error");
  }
  /// The error; an empty error_code on success.
  std::error_code error() const noexcept { return ec_; }

 private:
  std::error_code ec_;
};

}  // namespace coio
