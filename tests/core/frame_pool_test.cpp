#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <thread>
#include <vector>

#include "test_helpers.hpp"

using coio::Task;

// The frame pool is per thread and disabled under ASan; these run in the
// plain and TSan builds, where a broken free list corrupts or races.

namespace {
Task<int> tracked(coio::test::LifeTracker, int v) { co_return v; }
#if COIO_FRAME_POOL  // the pool is off under ASan
// noinline: else clang puts a frame that does not escape on the stack.
[[gnu::noinline]] Task<int> plusOne(int x) { co_return x + 1; }
#endif
}  // namespace

TEST_CASE("A small Task<int> frame takes the pool's 64-byte class", "[framePool]") {
  // The stop token shares the exception's word: three words of promise. One
  // more word and g++ 12's frame for plusOne grows from 64 to 72 bytes, the
  // 128-byte class.
  STATIC_REQUIRE(sizeof(coio::detail::TaskPromise<int>) == 3 * sizeof(void*));
  STATIC_REQUIRE(sizeof(coio::detail::TaskPromise<void>) == 3 * sizeof(void*));
#if COIO_FRAME_POOL
  void* frame = nullptr;
  {
    const Task<int> task = plusOne(1);
    frame = coio::detail::TaskAccess::handle(task).address();
  }
  // Freed to the head of its class's list: the next 64-byte frame reuses it.
  void* next = coio::detail::allocateFrame(64);
  CHECK(next == frame);
  coio::detail::deallocateFrame(next, 64);
#endif
}

TEST_CASE("A class caches its most recent frees, up to its capacity, and hands them back last in first out",
          "[framePool][threads]") {
#if COIO_FRAME_POOL
  // On a thread of its own, so that the pool starts empty. Freed out of
  // address order, as a fan-out's children finish.
  std::thread([] {
    using coio::detail::FramePool;
    constexpr std::size_t kCap = FramePool::capacity(0);
    std::vector<void*> order;
    for (std::size_t i = 0; i < kCap + 10; ++i) order.push_back(::operator new(FramePool::kGranule));
    std::reverse(order.begin() + 1, order.end() - 3);  // any order but the allocation's
    for (void* p : order) coio::detail::deallocateFrame(p, FramePool::kGranule);
    // The first kCap frees are cached, the last 10 went to the heap: the
    // next kCap allocations return those kCap, newest first.
    bool lifo = true;
    for (std::size_t i = kCap; i-- > 0;) {
      if (coio::detail::allocateFrame(FramePool::kGranule) != order[i]) lifo = false;
    }
    // Empty now: the next block comes from the heap, none of those held.
    void* fresh = coio::detail::allocateFrame(FramePool::kGranule);
    const bool cachedOnly = std::find(order.begin(), order.begin() + kCap, fresh) == order.begin() + kCap;
    coio::detail::deallocateFrame(fresh, FramePool::kGranule);
    for (std::size_t i = 0; i < kCap; ++i) coio::detail::deallocateFrame(order[i], FramePool::kGranule);
    CHECK(lifo);  // Catch2 is not thread-safe, but the main thread waits in join()
    CHECK(cachedOnly);
  }).join();
#endif
}

TEST_CASE("Frames allocated on one thread are freed on another", "[framePool][threads]") {
  for (int round = 0; round < 20; ++round) {
    std::vector<Task<int>> tasks;
    for (int i = 0; i < 1000; ++i) tasks.push_back(tracked(coio::test::LifeTracker{}, i));
    // A thread that only frees: its list fills to the cap, the rest goes to the heap.
    std::thread freer([&] { tasks.clear(); });
    freer.join();
    CHECK(coio::test::LifeTracker::alive == 0);
  }
  // Frames are reused on this thread after all that.
  long sum = 0;
  for (int i = 0; i < 1000; ++i) sum += coio::blockingWait(tracked(coio::test::LifeTracker{}, i));
  CHECK(sum == 999 * 1000 / 2);
}

TEST_CASE("Threads that cache frames can exit while others keep allocating", "[framePool][threads]") {
  std::vector<std::thread> threads;
  std::vector<long> sums(4);  // checked on this thread: Catch2 assertions are not thread-safe
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &sums] {
      for (int i = 0; i < 20000; ++i) sums[static_cast<std::size_t>(t)] += coio::blockingWait(tracked(coio::test::LifeTracker{}, t));
    });  // each exit releases that thread's cached frames
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(sums[static_cast<std::size_t>(t)] == 20000L * t);
  CHECK(coio::test::LifeTracker::alive == 0);
}
