#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

using coio::Baton;
using coio::Task;
using coio::testing::ManualExecutor;

TEST_CASE("Baton posted before the await does not suspend", "[baton]") {
  Baton baton;
  baton.post();
  CHECK(baton.ready());
  auto op = baton.operator co_await();
  CHECK(op.await_ready());
  bool done = false;
  coio::blockingWait([&]() -> Task<void> {
    co_await baton;
    done = true;
  }());
  CHECK(done);
}

TEST_CASE("Baton resumes every waiter inline on post, oldest first", "[baton]") {
  ManualExecutor ex;
  Baton baton;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) {
    ex.spawn([](Baton& b, std::vector<int>& order, int i) -> Task<void> {
      co_await b;
      order.push_back(i);
    }(baton, order, i));
  }
  ex.drain();
  CHECK(order.empty());
  CHECK_FALSE(baton.ready());
  baton.post();  // resumes inline: no step() needed
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("A waiter may destroy the Baton when resumed", "[baton]") {
  // post() must not touch the Baton after its exchange: under ASan a read of
  // the freed Baton would be reported.
  ManualExecutor ex;
  auto baton = std::make_unique<Baton>();
  int resumed = 0;
  for (int i = 0; i < 3; ++i) {
    ex.spawn([](std::unique_ptr<Baton>& b, int& resumed) -> Task<void> {
      co_await *b;
      ++resumed;
      b.reset();  // the first resumed waiter frees it; the others see null
    }(baton, resumed));
  }
  ex.drain();
  Baton* raw = baton.get();
  raw->post();
  CHECK(resumed == 3);
  CHECK(baton == nullptr);
}

TEST_CASE("Baton reset only from signalled; with waiters it is a no-op", "[baton]") {
  ManualExecutor ex;
  Baton baton;
  baton.reset();  // not signalled, nobody waiting: stays so
  CHECK_FALSE(baton.ready());
  bool resumed = false;
  ex.spawn([](Baton& b, bool& resumed) -> Task<void> {
    co_await b;
    resumed = true;
  }(baton, resumed));
  ex.drain();
  baton.reset();  // with a waiter: nothing changes
  CHECK_FALSE(resumed);
  baton.post();
  CHECK(resumed);
  CHECK(baton.ready());
  baton.reset();
  CHECK_FALSE(baton.ready());
  Baton initiallySet(true);
  CHECK(initiallySet.ready());
}

TEST_CASE("Baton post from another thread races with the await", "[baton][threads]") {
  // Each round the post may land before, during or after the waiter's push:
  // every case must resume exactly once and publish the poster's write.
  for (int round = 0; round < 2000; ++round) {
    Baton baton;
    int payload = 0;
    std::atomic<int> resumes{0};
    std::thread poster([&] {
      payload = round;
      baton.post();
    });
    coio::blockingWait([&]() -> Task<void> {
      co_await baton;
      CHECK(payload == round);
      ++resumes;
    }());
    poster.join();
    CHECK(resumes == 1);
  }
}

TEST_CASE("Many waiters from several threads are all resumed by one post", "[baton][threads]") {
  constexpr int kThreads = 4;
  Baton baton;
  std::atomic<int> resumed{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kThreads; ++i) {
    waiters.emplace_back([&] {
      coio::blockingWait([&]() -> Task<void> {
        co_await baton;
        ++resumed;
      }());
    });
  }
  baton.post();
  for (auto& t : waiters) t.join();
  CHECK(resumed == kThreads);
}

namespace {
// Runs eagerly until its first suspension and never resumes by itself, so
// the test can destroy its frame while it waits (as a reactor tearing down
// its tasks does).
using Detached = coio::test::Eager;
Detached waitOn(Baton& baton, std::atomic<int>& resumed) {
  co_await baton;
  ++resumed;
}
}  // namespace

TEST_CASE("A waiter whose frame is destroyed leaves the Baton", "[baton]") {
  // Before the fix the destroyed frames stayed linked: post() resumed freed
  // memory, and the Baton's destructor saw waiters.
  std::atomic<int> resumed{0};
  auto baton = std::make_unique<Baton>();
  std::vector<Detached> waiters;
  for (int i = 0; i < 5; ++i) waiters.push_back(waitOn(*baton, resumed));
  // The newest (the stack's head), one in the middle and the oldest (its tail).
  for (int i : {4, 2, 0}) {
    waiters[static_cast<std::size_t>(i)].handle.destroy();
    waiters[static_cast<std::size_t>(i)].handle = nullptr;
  }
  baton->post();
  CHECK(resumed == 2);
  for (auto& w : waiters) {
    if (w.handle) w.handle.destroy();
  }
  // All of them gone before any post: the Baton is left with no waiter.
  Baton other;
  for (int i = 0; i < 3; ++i) waitOn(other, resumed).handle.destroy();
  CHECK_FALSE(other.ready());
  other.post();
  CHECK(resumed == 2);
}

TEST_CASE("Waiters destroyed while others queue and a post comes: each is resumed or unlinked once",
          "[baton][threads]") {
  constexpr int kPerThread = 200;
  for (int round = 0; round < 50; ++round) {
    Baton baton;
    std::atomic<int> resumed{0};
    std::vector<Detached> kept[2];
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          Detached w = waitOn(baton, resumed);
          if (i % 2 == 0) {
            w.handle.destroy();  // unlinks while the other thread pushes
          } else {
            kept[t].push_back(w);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    baton.post();
    CHECK(resumed == kPerThread);  // the kept half, each once
    for (auto& list : kept) {
      for (auto& w : list) w.handle.destroy();
    }
  }
}

TEST_CASE("Baton asserts on destruction with a waiter", "[baton]") {
  CHECK(coio::test::abortsInChild([] {
    auto baton = std::make_unique<Baton>();
    [](Baton& b) -> coio::test::Eager { co_await b; }(*baton);
    baton.reset();
  }));
}
