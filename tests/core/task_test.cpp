#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "test_helpers.hpp"

using coio::Task;
using coio::blockingWait;

static_assert(!std::is_copy_constructible_v<Task<int>>);
static_assert(!std::is_copy_assignable_v<Task<int>>);
static_assert(std::is_nothrow_move_constructible_v<Task<int>>);

namespace {

Task<int> answer() { co_return 42; }
Task<std::string> text() { co_return std::string(100, 'x'); }
Task<void> nothing(int& ran) {
  ++ran;
  co_return;
}
Task<int&> refTo(int& x) { co_return x; }
Task<std::unique_ptr<int>> moveOnly() { co_return std::make_unique<int>(7); }
Task<int> thrower() {
  throw std::runtime_error("boom");
  co_return 0;
}

}  // namespace

TEST_CASE("Task is lazy: the body runs only when awaited", "[task]") {
  int ran = 0;
  Task<void> t = nothing(ran);
  CHECK(ran == 0);
  CHECK(t.valid());
  blockingWait(std::move(t));
  CHECK(ran == 1);
}

TEST_CASE("Task returns values, references, move-only values and void", "[task]") {
  CHECK(blockingWait(answer()) == 42);
  CHECK(blockingWait(text()) == std::string(100, 'x'));
  int x = 1;
  int& r = blockingWait(refTo(x));
  CHECK(&r == &x);
  CHECK(*blockingWait(moveOnly()) == 7);
  int ran = 0;
  blockingWait([&]() -> Task<void> { co_await nothing(ran); }());
  CHECK(ran == 1);
}

TEST_CASE("Task stores an exception and rethrows it at the awaiter", "[task]") {
  auto outer = []() -> Task<std::string> {
    try {
      co_await thrower();
    } catch (const std::runtime_error& e) {
      co_return std::string("caught ") + e.what();
    }
    co_return "not thrown";
  };
  CHECK(blockingWait(outer()) == "caught boom");
  CHECK_THROWS_WITH(blockingWait(thrower()), "boom");
}

TEST_CASE("Destroying a Task frees its frame whether or not it ran", "[task]") {
  auto holder = [](coio::test::LifeTracker) -> Task<void> { co_return; };
  REQUIRE(coio::test::LifeTracker::alive == 0);
  {
    Task<void> never = holder(coio::test::LifeTracker{});
    CHECK(coio::test::LifeTracker::alive == 1);  // the copy in the frame
  }
  CHECK(coio::test::LifeTracker::alive == 0);
  {
    Task<void> awaited = holder(coio::test::LifeTracker{});
    blockingWait(std::move(awaited));
  }
  CHECK(coio::test::LifeTracker::alive == 0);
}

TEST_CASE("Task move assignment destroys the frame it replaces", "[task]") {
  auto holder = [](coio::test::LifeTracker) -> Task<int> { co_return 1; };
  Task<int> a = holder(coio::test::LifeTracker{});
  Task<int> b = holder(coio::test::LifeTracker{});
  CHECK(coio::test::LifeTracker::alive == 2);
  a = std::move(b);
  CHECK(coio::test::LifeTracker::alive == 1);
  CHECK_FALSE(b.valid());  // NOLINT(bugprone-use-after-move): checking the moved-from state
  CHECK(blockingWait(std::move(a)) == 1);
}

namespace {

Task<int> syncLeaf(std::uintptr_t& lo, std::uintptr_t& hi) {
  const std::uintptr_t sp = coio::test::stackPointer();
  lo = std::min(lo, sp);
  hi = std::max(hi, sp);
  co_return 1;
}

Task<long> awaitManySync(long n, std::uintptr_t& lo, std::uintptr_t& hi) {
  long sum = 0;
  for (long i = 0; i < n; ++i) sum += co_await syncLeaf(lo, hi);
  co_return sum;
}

Task<long> recurse(int depth, std::uintptr_t& lo, std::uintptr_t& hi) {
  if (depth == 0) co_return co_await syncLeaf(lo, hi);
  co_return 1 + co_await recurse(depth - 1, lo, hi);
}

}  // namespace

// Needs symmetric transfer compiled as real tail calls (optimised builds, no
// sanitizer); CMake filters [deep-stack] out elsewhere.
TEST_CASE("Awaiting 1,000,000 synchronously completing tasks does not grow the stack", "[task][deep-stack]") {
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  CHECK(blockingWait(awaitManySync(1'000'000, lo, hi)) == 1'000'000);
  // Without tail calls every iteration would nest a resume() frame: at least
  // tens of MB over a million iterations (the default stack is 8 MiB).
  CHECK(hi - lo < 4096);
}

TEST_CASE("A 10,000-deep chain of awaiting tasks does not grow the stack", "[task][deep-stack]") {
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  CHECK(blockingWait(recurse(10'000, lo, hi)) == 10'001);
  CHECK(hi - lo < 4096);
}

TEST_CASE("A loop of synchronously completing tasks works in every build", "[task]") {
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  CHECK(blockingWait(awaitManySync(1000, lo, hi)) == 1000);
}

TEST_CASE("Task asserts on awaiting a Task that holds no coroutine", "[task]") {
  CHECK(coio::test::abortsInChild([] {
    Task<int> task = answer();
    Task<int> owner = std::move(task);
    (void)blockingWait(std::move(task));  // moved from: asserted
  }));
  CHECK(coio::test::abortsInChild([] { (void)blockingWait(Task<int>()); }));
}
