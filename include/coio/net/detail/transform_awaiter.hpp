#pragma once
// TransformAwaiter: wraps an awaiter and maps its result, without a
// coroutine frame of its own (e.g. a recv's 0 bytes into Errc::eof).
#include <coroutine>
#include <utility>

namespace coio::detail {

template <typename Awaiter, typename Fn>
struct [[nodiscard]] TransformAwaiter {
  Awaiter inner;
  Fn fn;

  bool await_ready() { return inner.await_ready(); }
  // Typed: the inner awaiter may read the awaiting promise (its stop token).
  template <typename Promise>
  decltype(auto) await_suspend(std::coroutine_handle<Promise> h) {
    return inner.await_suspend(h);
  }
  decltype(auto) await_resume() { return fn(inner.await_resume()); }
};

}  // namespace coio::detail
