// ReactorPool's constructor when a thread cannot be started. A binary of
// its own: it replaces the global operator new to make that happen.
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
// Allocations this thread may still make before one fails; -1: no limit.
thread_local int allocationsBeforeFailure = -1;
}  // namespace

// Every form of plain operator new/delete is replaced, so that sanitizers
// see malloc/free pair up.
void* operator new(std::size_t size) {
  if (allocationsBeforeFailure == 0) {
    allocationsBeforeFailure = -1;
    throw std::bad_alloc();
  }
  if (allocationsBeforeFailure > 0) --allocationsBeforeFailure;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return ::operator new(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return ::operator new(size, std::nothrow); }
// g++ sees free() in an operator delete and flags it: here they do pair up.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace {

// Once the last reactor is built, lets the pool's thread vector and first
// thread allocate, then fails the second thread's start.
struct ArmingReactor : coio::EpollReactor {
  static inline int built = 0;
  static inline std::atomic<int> ran{0};
  explicit ArmingReactor(int armAfter) {
    if (++built == armAfter) allocationsBeforeFailure = 2;
  }
  void run() {
    ++ran;
    coio::EpollReactor::run();
  }
};

}  // namespace

TEST_CASE("ReactorPool: a thread that fails to start stops and joins the others, then rethrows",
          "[reactor][pool][threads]") {
  // Before the fix the first thread was left joinable when the constructor
  // threw: std::terminate.
  CHECK_THROWS_AS(coio::ReactorPool<ArmingReactor>(2, 2), std::bad_alloc);
  allocationsBeforeFailure = -1;
  CHECK(ArmingReactor::built == 2);
  CHECK(ArmingReactor::ran == 1);  // the first thread ran (and returned: stopped)
}
