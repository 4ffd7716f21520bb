#include <coio/core/blocking_wait.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stop_token>
#include <thread>
#include <vector>

using coio::Semaphore;
using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {
Task<void> acquireAndRecord(Semaphore& sem, std::vector<int>& order, int id) {
  co_await sem.acquire();
  order.push_back(id);
}
}  // namespace

TEST_CASE("Semaphore: uncontended acquire takes a token without suspending", "[semaphore]") {
  Semaphore sem(2);
  CHECK(sem.available() == 2);
  auto op = sem.acquire();
  CHECK(op.await_ready());
  CHECK(sem.available() == 1);
  CHECK(sem.tryAcquire());
  CHECK_FALSE(sem.tryAcquire());
  sem.release(2);
  CHECK(sem.available() == 2);
}

TEST_CASE("Semaphore serves waiters FIFO and hands tokens over directly", "[semaphore]") {
  ManualExecutor ex;
  Semaphore sem(0);
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) ex.spawn(acquireAndRecord(sem, order, i));
  ex.drain();
  CHECK(order.empty());

  sem.release();  // resumes the oldest waiter inline
  CHECK(order == std::vector<int>{0});
  CHECK(sem.available() == 0);  // the token went to the waiter, not the pool

  // No barging: while anyone waits, a newcomer cannot take a released token.
  CHECK_FALSE(sem.tryAcquire());
  ex.spawn(acquireAndRecord(sem, order, 99));
  ex.drain();
  sem.release(2);
  CHECK(order == std::vector<int>{0, 1, 2});
  sem.release(2);
  CHECK(order == std::vector<int>{0, 1, 2, 3, 99});
  CHECK(sem.available() == 0);
  sem.release();
  CHECK(sem.available() == 1);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Semaphore: a cancelled waiter leaves the queue and the next one gets the token", "[semaphore]") {
  ManualExecutor ex;
  Semaphore sem(0);
  std::stop_source timeout;
  std::vector<int> order;
  bool firstGotToken = true;
  ex.spawn([](Semaphore& sem, std::stop_token stop, bool& got) -> Task<void> {
    got = co_await sem.acquire(stop);
  }(sem, timeout.get_token(), firstGotToken));
  ex.spawn(acquireAndRecord(sem, order, 2));
  ex.spawn(coio::test::stopAfter(ex, timeout, 10ms));
  ex.drain();
  ex.advance(9ms);
  CHECK(firstGotToken);  // still waiting
  ex.advance(1ms);
  CHECK_FALSE(firstGotToken);
  CHECK(order.empty());
  sem.release();
  CHECK(order == std::vector<int>{2});
  CHECK(sem.available() == 0);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Semaphore: cancellable acquire with a free token or an early stop", "[semaphore]") {
  Semaphore sem(1);
  const std::stop_token stop = coio::test::stoppedToken();
  // A free token is taken even if stop was requested: cancellation only
  // ends waiting.
  CHECK(coio::blockingWait([&]() -> Task<bool> { co_return co_await sem.acquire(stop); }()));
  CHECK(sem.available() == 0);
  // No token and stop already requested: gives up without queueing.
  CHECK_FALSE(coio::blockingWait([&]() -> Task<bool> { co_return co_await sem.acquire(stop); }()));
  sem.release();
  CHECK(sem.available() == 1);
}

TEST_CASE("Semaphore: granted before the stop request keeps its token", "[semaphore]") {
  ManualExecutor ex;
  Semaphore sem(0);
  std::stop_source stop;
  bool got = false;
  ex.spawn([](Semaphore& sem, std::stop_token t, bool& got) -> Task<void> {
    got = co_await sem.acquire(t);
  }(sem, stop.get_token(), got));
  ex.drain();
  sem.release();
  stop.request_stop();
  CHECK(got);
  CHECK(sem.available() == 0);
}

TEST_CASE("Semaphore: holders never exceed tokens under contention", "[semaphore][threads]") {
  constexpr int kTokens = 3, kThreads = 4, kIterations = 20000;
  Semaphore sem(kTokens);
  std::atomic<int> holders{0}, maxHolders{0}, violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      coio::blockingWait([&]() -> Task<void> {
        for (int i = 0; i < kIterations; ++i) {
          co_await sem.acquire();
          const int h = ++holders;
          if (h > kTokens) ++violations;
          int seen = maxHolders.load();
          while (h > seen && !maxHolders.compare_exchange_weak(seen, h)) {
          }
          --holders;
          sem.release();
        }
      }());
    });
  }
  for (auto& t : threads) t.join();
  CHECK(violations == 0);
  CHECK(maxHolders <= kTokens);
  CHECK(sem.available() == kTokens);
}

TEST_CASE("Semaphore: release happens-before the acquire that takes the token", "[semaphore][threads]") {
  // Plain (non-atomic) data handed over through the semaphore only; TSan
  // reports a race if release/acquire ordering is missing on any path.
  for (int round = 0; round < 500; ++round) {
    Semaphore sem(0);
    int data = 0;
    std::thread producer([&] {
      data = round + 1;
      sem.release();
    });
    coio::blockingWait([&]() -> Task<void> {
      co_await sem.acquire();
      CHECK(data == round + 1);
    }());
    producer.join();
  }
}

TEST_CASE("Semaphore: waiters cancelled from another thread never lose tokens", "[semaphore][threads]") {
  constexpr int kRounds = 300;
  for (int round = 0; round < kRounds; ++round) {
    Semaphore sem(0);
    std::stop_source stop;
    std::thread canceller([&] { stop.request_stop(); });
    std::thread releaser([&] { sem.release(); });
    const bool got = coio::blockingWait([&]() -> Task<bool> { co_return co_await sem.acquire(stop.get_token()); }());
    canceller.join();
    releaser.join();
    // Either this waiter got the token, or it is still in the semaphore.
    CHECK(sem.available() + (got ? 1u : 0u) == 1u);
  }
}

TEST_CASE("Semaphore: concurrent releases while waiters come and go lose no token", "[semaphore][threads]") {
  // Two producers release one token at a time while two consumers take
  // them, so the queue keeps emptying and refilling under the releasers'
  // feet. A lost release leaves a consumer waiting forever (CTest timeout).
  constexpr int kPerThread = 20000;
  Semaphore sem(0);
  std::atomic<int> consumed{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 2; ++c) {
    threads.emplace_back([&] {
      coio::blockingWait([&]() -> Task<void> {
        for (int i = 0; i < kPerThread; ++i) {
          co_await sem.acquire();
          ++consumed;
        }
      }());
    });
  }
  for (int p = 0; p < 2; ++p) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) sem.release();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(consumed == 2 * kPerThread);
  CHECK(sem.available() == 0);
}

namespace {
using coio::test::Eager;

struct Chain {
  Semaphore sem{0};
  std::vector<int> order;
  std::uintptr_t deepest = UINTPTR_MAX;  // lowest stack address a waiter ran at
};

// Takes the token and hands it straight on: each release resumes the next
// waiter, inside this one's release().
Eager handOver(Chain& chain, int id) {
  co_await chain.sem.acquire();
  chain.order.push_back(id);
  chain.deepest = std::min(chain.deepest, coio::test::stackPointer());
  chain.sem.release();
}
}  // namespace

TEST_CASE("Semaphore: a hand-over chain through 20,000 waiters runs in bounded stack, in FIFO order",
          "[semaphore]") {
  // Before the fix every hand-over nested one more release() -> resume()
  // on the stack: a reviewer overflowed it with 400k waiters; here the
  // depth is measured.
  constexpr int kWaiters = 20000;
  Chain chain;
  std::vector<Eager> waiters;
  waiters.reserve(kWaiters);
  for (int i = 0; i < kWaiters; ++i) waiters.push_back(handOver(chain, i));
  const std::uintptr_t top = coio::test::stackPointer();
  chain.sem.release();
  REQUIRE(chain.order.size() == static_cast<std::size_t>(kWaiters));
  CHECK(std::is_sorted(chain.order.begin(), chain.order.end()));
  const std::uintptr_t used = top - chain.deepest;
  INFO("stack used by the chain: " << used << " bytes");
  CHECK(used < 256 * 1024);  // inline depth is capped at 32 hand-overs
  CHECK(chain.sem.available() == 1);
  for (auto& w : waiters) w.handle.destroy();
}

TEST_CASE("Semaphore asserts on destruction with waiters", "[semaphore]") {
  CHECK(coio::test::abortsInChild([] {
    auto sem = std::make_unique<Semaphore>(0);
    [](Semaphore& s) -> coio::test::Eager { co_await s.acquire(); }(*sem);
    sem.reset();
  }));
}

TEST_CASE("Semaphore asserts on a token count of 2^62 or more", "[semaphore]") {
  CHECK(coio::test::abortsInChild([] { Semaphore sem(std::size_t{1} << 62); }));
}
