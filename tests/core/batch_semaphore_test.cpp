#include <coio/core/batch_semaphore.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <vector>

using coio::BatchSemaphore;
using coio::Task;
using coio::testing::ManualExecutor;

namespace {
Task<void> take(BatchSemaphore& sem, std::size_t n, std::vector<int>& order, int id) {
  co_await sem.acquire(n);
  order.push_back(id);
}
Task<void> takeOrGiveUp(BatchSemaphore& sem, std::size_t n, std::stop_token stop, std::vector<int>& order, int id) {
  // Bound to a variable first: g++ 12 miscompiles `if (co_await ...)`.
  const bool got = co_await sem.acquire(n, stop);
  if (got) order.push_back(id);
}
}  // namespace

TEST_CASE("BatchSemaphore: a small request waits behind a large one at the head", "[batchSemaphore]") {
  ManualExecutor ex;
  BatchSemaphore sem(5);
  std::vector<int> order;
  REQUIRE(sem.tryAcquire(5));
  ex.spawn(take(sem, 5, order, 1));  // big
  ex.spawn(take(sem, 2, order, 2));  // small, behind it
  ex.drain();
  sem.release(3);
  CHECK(order.empty());  // 3 tokens would satisfy the small one: FIFO says no
  CHECK(sem.available() == 3);  // pooled for the head, not offered to anyone else
  CHECK_FALSE(sem.tryAcquire(1));  // no barging, not even tryAcquire
  sem.release(2);
  CHECK(order == std::vector<int>{1});
  sem.release(5);
  CHECK(order == std::vector<int>{1, 2});
  CHECK(sem.available() == 3);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BatchSemaphore: cancelling the head lets the waiters behind it proceed at once", "[batchSemaphore]") {
  ManualExecutor ex;
  BatchSemaphore sem(5);
  std::vector<int> order;
  std::stop_source giveUp;
  REQUIRE(sem.tryAcquire(5));
  ex.spawn(takeOrGiveUp(sem, 5, giveUp.get_token(), order, 1));
  ex.spawn(take(sem, 2, order, 2));
  ex.spawn(take(sem, 1, order, 3));
  ex.spawn(take(sem, 4, order, 4));
  ex.drain();
  sem.release(3);
  CHECK(order.empty());
  giveUp.request_stop();  // no release needed: the grant loop re-runs
  CHECK(order == std::vector<int>{2, 3});
  CHECK(sem.available() == 0);
  sem.release(5);
  CHECK(order == std::vector<int>{2, 3, 4});
  CHECK(sem.available() == 1);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BatchSemaphore: cancelling a waiter in the middle keeps the order of the rest", "[batchSemaphore]") {
  ManualExecutor ex;
  BatchSemaphore sem(4);
  std::vector<int> order;
  std::stop_source giveUp;
  REQUIRE(sem.tryAcquire(4));
  ex.spawn(take(sem, 3, order, 1));
  ex.spawn(takeOrGiveUp(sem, 2, giveUp.get_token(), order, 2));
  ex.spawn(take(sem, 1, order, 3));
  ex.drain();
  giveUp.request_stop();
  CHECK(order.empty());  // the head still cannot be served
  sem.release(4);
  CHECK(order == std::vector<int>{1, 3});
}

TEST_CASE("BatchSemaphore: partial releases accumulate until the head is satisfied", "[batchSemaphore]") {
  ManualExecutor ex;
  BatchSemaphore sem(4);
  std::vector<int> order;
  REQUIRE(sem.tryAcquire(4));
  ex.spawn(take(sem, 4, order, 1));
  ex.drain();
  for (int i = 0; i < 3; ++i) {
    sem.release(1);
    CHECK(order.empty());
  }
  sem.release(1);
  CHECK(order == std::vector<int>{1});
  CHECK(sem.available() == 0);
}

TEST_CASE("BatchSemaphore: one release resumes every waiter it satisfies, in order", "[batchSemaphore]") {
  ManualExecutor ex;
  BatchSemaphore sem(6);
  std::vector<int> order;
  REQUIRE(sem.tryAcquire(6));
  for (int i = 0; i < 3; ++i) ex.spawn(take(sem, 2, order, i));
  ex.drain();
  sem.release(6);
  CHECK(order == std::vector<int>{0, 1, 2});
}

TEST_CASE("BatchSemaphore rejects a request larger than its capacity", "[batchSemaphore]") {
  BatchSemaphore sem(8);
  CHECK(sem.capacity() == 8);
  CHECK_THROWS_AS(sem.acquire(9), std::invalid_argument);
  CHECK_THROWS_WITH(sem.tryAcquire(100), Catch::Contains("exceeds the capacity of 8"));
  CHECK_THROWS_AS(coio::blockingWait([&]() -> Task<void> { co_await sem.acquire(9); }()), std::invalid_argument);
  CHECK(sem.available() == 8);
  CHECK(sem.tryAcquire(8));
  CHECK(sem.tryAcquire(0));
}

TEST_CASE("BatchSemaphore: weighted holders never exceed capacity under contention", "[batchSemaphore][threads]") {
  constexpr int kCapacity = 10, kThreads = 4, kIterations = 10000;
  BatchSemaphore sem(kCapacity);
  std::atomic<int> held{0}, violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      coio::blockingWait([&]() -> Task<void> {
        std::minstd_rand rng(static_cast<unsigned>(t + 1));
        for (int i = 0; i < kIterations; ++i) {
          const int n = 1 + static_cast<int>(rng() % kCapacity);
          co_await sem.acquire(static_cast<std::size_t>(n));
          if (held.fetch_add(n) + n > kCapacity) ++violations;
          held.fetch_sub(n);
          sem.release(static_cast<std::size_t>(n));
        }
      }());
    });
  }
  for (auto& th : threads) th.join();
  CHECK(violations == 0);
  CHECK(sem.available() == kCapacity);
}

TEST_CASE("BatchSemaphore: release happens-before the acquire that takes its tokens", "[batchSemaphore][threads]") {
  for (int round = 0; round < 500; ++round) {
    BatchSemaphore sem(4);
    REQUIRE(sem.tryAcquire(4));
    int data = 0;
    std::thread producer([&] {
      data = round + 1;
      sem.release(4);
    });
    coio::blockingWait([&]() -> Task<void> {
      co_await sem.acquire(3);
      CHECK(data == round + 1);
    }());
    producer.join();
  }
}

TEST_CASE("BatchSemaphore: cancellation racing with release loses no tokens", "[batchSemaphore][threads]") {
  for (int round = 0; round < 300; ++round) {
    BatchSemaphore sem(3);
    REQUIRE(sem.tryAcquire(3));
    std::stop_source stop;
    std::vector<int> order;
    std::thread canceller([&] { stop.request_stop(); });
    std::thread releaser([&] { sem.release(3); });
    const bool got = coio::blockingWait([&]() -> Task<bool> { co_return co_await sem.acquire(2, stop.get_token()); }());
    canceller.join();
    releaser.join();
    CHECK(sem.available() + (got ? 2u : 0u) == 3u);
  }
}

namespace {
// Runs eagerly until its first suspension and never resumes by itself, so
// the test can destroy its frame while it waits (as a reactor tearing down
// its tasks does).
using Detached = coio::test::Eager;
Detached waitFor(BatchSemaphore& sem, std::size_t n) { co_await sem.acquire(n); }
}  // namespace

TEST_CASE("BatchSemaphore: a waiter whose frame is destroyed leaves the queue", "[batchSemaphore]") {
  ManualExecutor ex;
  BatchSemaphore sem(5);
  std::vector<int> order;
  REQUIRE(sem.tryAcquire(5));
  Detached head = waitFor(sem, 5);
  ex.spawn(take(sem, 2, order, 2));
  ex.drain();
  sem.release(3);
  CHECK(order.empty());
  head.handle.destroy();  // unlinks itself and re-runs the grants
  CHECK(order == std::vector<int>{2});
  sem.release(2);  // under ASan: would touch the freed frame if it were still queued
  CHECK(sem.available() == 3);
}

TEST_CASE("BatchSemaphore asserts on destruction with waiters", "[batchSemaphore]") {
  CHECK(coio::test::abortsInChild([] {
    auto sem = std::make_unique<BatchSemaphore>(4);
    (void)sem->tryAcquire(3);
    [](BatchSemaphore& s) -> coio::test::Eager { co_await s.acquire(2); }(*sem);
    sem.reset();
  }));
}
