#include <coio/core/blocking_wait.hpp>
#include <coio/core/latch.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

using coio::Latch;
using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {
Task<void> waitAndRecord(Latch& latch, std::vector<int>& order, int id) {
  co_await latch.wait();
  order.push_back(id);
}
}  // namespace

TEST_CASE("Latch: the countDown that reaches zero resumes every waiter inline, oldest first", "[latch]") {
  ManualExecutor ex;
  Latch latch(3);
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) ex.spawn(waitAndRecord(latch, order, i));
  ex.drain();
  latch.countDown();
  CHECK_FALSE(latch.tryWait());
  latch.countDown();
  CHECK(order.empty());
  latch.countDown();  // reaches zero: resumed inside this call
  CHECK(order == std::vector<int>{0, 1, 2});
  CHECK(latch.tryWait());
  ex.spawn(waitAndRecord(latch, order, 3));  // open: no suspension
  ex.drain();
  CHECK(order.back() == 3);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Latch: countDown(n) and a Latch of zero", "[latch]") {
  Latch open(0);
  CHECK(open.tryWait());
  CHECK(open.wait().await_ready());
  Latch latch(5);
  latch.countDown(4);
  CHECK_FALSE(latch.tryWait());
  CHECK_FALSE(latch.wait().await_ready());
  latch.countDown(1);
  CHECK(latch.tryWait());
  CHECK(coio::test::abortsInChild([] {
    Latch l(2);
    l.countDown(3);  // below zero: asserted
  }));
}

TEST_CASE("Latch: a cancelled wait yields false; the others still open with the Latch", "[latch]") {
  ManualExecutor ex;
  Latch latch(1);
  std::stop_source timeout;
  std::vector<int> order;
  int result = -1;
  ex.spawn(coio::test::awaitInto(latch.wait(timeout.get_token()), result));
  ex.spawn(waitAndRecord(latch, order, 1));
  ex.spawn(coio::test::stopAfter(ex, timeout, 1ms));
  ex.advance(1ms);
  CHECK(result == 0);
  CHECK(order.empty());
  latch.countDown();
  CHECK(order == std::vector<int>{1});
  const bool opened = coio::blockingWait(latch.wait(timeout.get_token()));
  CHECK(opened);  // open: true although stop was requested
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Latch: a waiter may destroy the Latch when resumed", "[latch]") {
  ManualExecutor ex;
  auto latch = std::make_unique<Latch>(1);
  bool resumed = false;
  ex.spawn([](std::unique_ptr<Latch>& latch, bool& resumed) -> Task<void> {
    co_await latch->wait();
    latch.reset();
    resumed = true;
  }(latch, resumed));
  ex.drain();
  latch->countDown();  // under ASan, a use of the freed Latch would be reported
  CHECK(resumed);
}

TEST_CASE("Latch: threads counting down publish their writes to the waiter", "[latch][threads]") {
  constexpr int kThreads = 4;
  for (int round = 0; round < 200; ++round) {
    Latch latch(kThreads);
    int results[kThreads] = {};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        results[t] = t + round;  // plain writes: TSan checks countDown -> wait ordering
        latch.countDown();
      });
    }
    int sum = 0;
    coio::blockingWait([&]() -> Task<void> {
      co_await latch.wait();
      for (int r : results) sum += r;
    }());
    for (auto& t : threads) t.join();
    CHECK(sum == kThreads * round + kThreads * (kThreads - 1) / 2);
  }
}
