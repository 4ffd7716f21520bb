#pragma once
// What Generator and AsyncGenerator share: how a `co_yield` hands its
// consumer a reference without a copy. The promise keeps a pointer to the
// yielded object, which stays where the body has it until the body is
// resumed: a local of the body's frame, or a temporary of the co_yield
// expression (a temporary lives to the end of its full-expression, and the
// body stays suspended inside that expression). Only a const lvalue yielded
// by a generator of mutable values is copied, into the awaiter, which lives
// in the body's frame as long as the suspension.
#include <concepts>
#include <coroutine>
#include <memory>
#include <type_traits>

namespace coio::detail {

// Promise mixin. `Suspend` is the awaiter every co_yield returns: how the
// body gives control back to its consumer (it gets the body's handle).
template <typename T, typename Suspend>
class YieldSlot {
  static_assert(!std::is_void_v<T>, "a generator of void: yield a coio::Unit");
  static_assert(!std::is_rvalue_reference_v<T>, "a generator of T&&: use T (the consumer may move from a T&)");

 public:
  using Value = std::remove_cvref_t<T>;
  using Object = std::remove_reference_t<T>;  // what the consumer gets a reference to: const if it may not modify it

  Suspend yield_value(Object& value) noexcept {
    yielded = std::addressof(value);
    return {};
  }
  // A temporary (also one made by an implicit conversion): alive until the
  // body resumes.
  Suspend yield_value(Object&& value) noexcept {
    yielded = std::addressof(value);
    return {};
  }

  // A const lvalue where the consumer gets a mutable reference to a value
  // it may move from: the consumer gets a copy.
  struct CopyAwaiter : Suspend {
    Value copy;
    template <typename Promise>
    auto await_suspend(std::coroutine_handle<Promise> body) noexcept {
      body.promise().yielded = std::addressof(copy);
      return Suspend::await_suspend(body);
    }
  };
  template <std::same_as<Value> U>
    requires(!std::is_reference_v<T> && !std::is_const_v<Object> && std::copy_constructible<U>)
  CopyAwaiter yield_value(const U& value) {
    return CopyAwaiter{{}, value};
  }

  Object* yielded;  // set by each co_yield, read by the consumer while the body is suspended there
};

}  // namespace coio::detail
