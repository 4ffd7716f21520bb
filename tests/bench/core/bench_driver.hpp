#pragma once
// An eager coroutine that runs one benchmark loop and frees itself at the
// end. Every loop that awaits, baseline, coio or peer, runs inside one, so
// the awaiting side is the same whatever is awaited.
#include <coroutine>
#include <exception>

namespace coio::bench {

struct Driver {
  struct promise_type {
    Driver get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

}  // namespace coio::bench
