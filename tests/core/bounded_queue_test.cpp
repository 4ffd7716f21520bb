#include <coio/core/blocking_wait.hpp>
#include <coio/core/bounded_queue.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <iterator>
#include <memory>
#include <stop_token>
#include <system_error>
#include <thread>
#include <vector>

using coio::BoundedQueue;
using coio::Errc;
using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {
using Items = std::vector<int>;

// Pops until the queue reports closed; records every item, and the error.
Task<void> drainInto(BoundedQueue<int>& q, Items& got, std::error_code& end) {
  for (;;) {
    auto item = co_await q.pop();
    if (!item) {
      end = item.error();
      co_return;
    }
    got.push_back(*item);
  }
}

Task<void> popOne(BoundedQueue<int>& q, Items& got) {
  auto item = co_await q.pop();
  if (item) got.push_back(*item);
}

Task<void> pushOne(BoundedQueue<int>& q, int value, Items& pushed) {
  auto done = co_await q.push(int{value});
  if (done) pushed.push_back(value);
}
}  // namespace

TEST_CASE("BoundedQueue: tryPush and tryPop, FIFO, within the capacity", "[boundedQueue]") {
  BoundedQueue<int> q(3);
  CHECK(q.capacity() == 3);
  CHECK(q.tryPop().error() == std::errc::operation_would_block);
  for (int i = 0; i < 3; ++i) CHECK(q.tryPush(int{i}));
  CHECK(q.size() == 3);
  const auto full = q.tryPush(3);
  CHECK(full.error() == std::errc::operation_would_block);
  for (int i = 0; i < 3; ++i) {
    auto item = q.tryPop();
    REQUIRE(item);
    CHECK(*item == i);
  }
  CHECK(q.size() == 0);
}

TEST_CASE("BoundedQueue: push and pop that need not wait complete without suspending", "[boundedQueue]") {
  BoundedQueue<int> q(1);
  int v = 7;
  auto push = q.push(std::move(v));
  CHECK(push.await_ready());
  CHECK(push.await_resume());
  auto pop = q.pop();
  CHECK(pop.await_ready());
  auto item = pop.await_resume();
  REQUIRE(item);
  CHECK(*item == 7);
}

TEST_CASE("BoundedQueue serves waiting consumers FIFO, handing items over inline", "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<int> q(2);
  std::vector<Items> each(3);
  for (int i = 0; i < 3; ++i) ex.spawn(popOne(q, each[i]));
  ex.drain();
  CHECK(q.tryPush(10));  // straight to the oldest consumer, resumed inside tryPush
  CHECK(each[0] == Items{10});
  CHECK(q.size() == 0);
  Items pushed;
  ex.spawn(pushOne(q, 11, pushed));
  ex.drain();
  CHECK(each[1] == Items{11});
  CHECK(each[2].empty());
  CHECK(q.tryPop().error() == std::errc::operation_would_block);  // consumers wait: the queue is empty
  CHECK(q.tryPush(12));
  CHECK(each[2] == Items{12});
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BoundedQueue lets waiting producers in FIFO, and nobody barges", "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<int> q(2);
  Items pushed;
  for (int i = 0; i < 5; ++i) ex.spawn(pushOne(q, i, pushed));
  ex.drain();
  CHECK(pushed == Items{0, 1});  // two fit, three wait
  CHECK(q.tryPush(99).error() == std::errc::operation_would_block);  // producers wait: no barging
  Items got;
  for (int i = 0; i < 5; ++i) {
    auto item = q.tryPop();  // each pop lets the oldest waiting producer in, inline
    REQUIRE(item);
    got.push_back(*item);
  }
  CHECK(got == Items{0, 1, 2, 3, 4});
  CHECK(pushed == Items{0, 1, 2, 3, 4});
  CHECK(q.size() == 0);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BoundedQueue::close fails waiting and later pushes with their items untouched", "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<std::unique_ptr<int>> q(1);
  REQUIRE(q.tryPush(std::make_unique<int>(1)));
  auto waiting = std::make_unique<int>(2);
  std::error_code waitingError;
  ex.spawn([](BoundedQueue<std::unique_ptr<int>>& q, std::unique_ptr<int>& item, std::error_code& ec) -> Task<void> {
    auto done = co_await q.push(std::move(item));
    ec = done.error();
  }(q, waiting, waitingError));
  ex.drain();
  CHECK_FALSE(waitingError);
  q.close();  // resumes the waiting producer inline
  CHECK(waitingError == Errc::closed);
  REQUIRE(waiting);  // not moved from: still the caller's
  CHECK(*waiting == 2);
  CHECK(q.isClosed());

  auto late = std::make_unique<int>(3);
  CHECK(q.tryPush(std::move(late)).error() == Errc::closed);
  REQUIRE(late);
  auto lateResult = coio::blockingWait(q.push(std::move(late)));
  CHECK(lateResult.error() == Errc::closed);
  CHECK(late);

  // What was pushed before close is still delivered, then "closed".
  auto first = q.tryPop();
  REQUIRE(first);
  CHECK(**first == 1);
  CHECK(q.tryPop().error() == Errc::closed);
  CHECK(coio::blockingWait(q.pop()).error() == Errc::closed);
  q.close();  // twice: harmless
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BoundedQueue::close wakes waiting consumers with closed", "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<int> q(4);
  std::vector<Items> got(2);
  std::error_code ends[2];
  for (int i = 0; i < 2; ++i) ex.spawn(drainInto(q, got[i], ends[i]));
  ex.drain();
  CHECK(q.tryPush(1));
  CHECK(q.tryPush(2));
  CHECK(got[0] == Items{1});
  CHECK(got[1] == Items{2});
  CHECK_FALSE(ends[0]);
  q.close();
  CHECK(ends[0] == Errc::closed);
  CHECK(ends[1] == Errc::closed);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BoundedQueue: a cancelled pop yields operation_canceled and never gets a later item",
          "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<int> q(2);
  std::stop_source timeout;
  std::error_code cancelledError;
  Items second;
  ex.spawn([](BoundedQueue<int>& q, std::stop_token stop, std::error_code& ec) -> Task<void> {
    auto item = co_await q.pop(stop);
    ec = item.error();
  }(q, timeout.get_token(), cancelledError));
  ex.spawn(popOne(q, second));
  ex.spawn(coio::test::stopAfter(ex, timeout, 10ms));
  ex.advance(10ms);
  CHECK(cancelledError == std::errc::operation_canceled);
  CHECK(q.tryPush(5));
  CHECK(second == Items{5});  // the item skipped the cancelled consumer
  // An item already there is taken even if stop was requested.
  CHECK(q.tryPush(6));
  auto item = coio::blockingWait(q.pop(timeout.get_token()));
  REQUIRE(item);
  CHECK(*item == 6);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BoundedQueue: a cancelled push keeps its item and leaves the queue", "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<std::unique_ptr<int>> q(1);
  REQUIRE(q.tryPush(std::make_unique<int>(1)));
  std::stop_source stop;
  auto item = std::make_unique<int>(2);
  std::error_code ec;
  ex.spawn([](BoundedQueue<std::unique_ptr<int>>& q, std::unique_ptr<int>& item, std::stop_token stop,
              std::error_code& ec) -> Task<void> {
    auto done = co_await q.push(std::move(item), stop);
    ec = done.error();
  }(q, item, stop.get_token(), ec));
  ex.drain();
  stop.request_stop();  // resumes the producer inline, as cancelled
  CHECK(ec == std::errc::operation_canceled);
  REQUIRE(item);
  CHECK(*item == 2);
  auto first = q.tryPop();
  REQUIRE(first);
  CHECK(**first == 1);
  CHECK(q.tryPop().error() == std::errc::operation_would_block);  // the cancelled item never got in
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("BoundedQueue: a pop granted before its stop request keeps the item", "[boundedQueue]") {
  ManualExecutor ex;
  BoundedQueue<int> q(1);
  std::stop_source stop;
  Items got;
  ex.spawn([](BoundedQueue<int>& q, std::stop_token stop, Items& got) -> Task<void> {
    auto item = co_await q.pop(stop);
    if (item) got.push_back(*item);
  }(q, stop.get_token(), got));
  ex.drain();
  CHECK(q.tryPush(3));
  stop.request_stop();
  CHECK(got == Items{3});
  CHECK(q.size() == 0);
}

TEST_CASE("BoundedQueue: waiters whose frames are destroyed leave the queue", "[boundedQueue]") {
  BoundedQueue<int> q(1);
  bool ran = false;
  auto consumer = [](BoundedQueue<int>& q, bool& ran) -> coio::test::Eager {
    (void)co_await q.pop();
    ran = true;
  }(q, ran);
  consumer.handle.destroy();
  CHECK(q.tryPush(1));  // to the ring, not to the freed frame (ASan would report it)
  CHECK(q.size() == 1);
  int value = 2;
  auto producer = [](BoundedQueue<int>& q, int& value, bool& ran) -> coio::test::Eager {
    (void)co_await q.push(std::move(value));
    ran = true;
  }(q, value, ran);
  producer.handle.destroy();
  auto item = q.tryPop();
  REQUIRE(item);
  CHECK(*item == 1);
  CHECK(q.size() == 0);  // the destroyed producer's item did not get in
  CHECK_FALSE(ran);
  CHECK(coio::test::abortsInChild([] {
    auto doomed = std::make_unique<BoundedQueue<int>>(1);
    [](BoundedQueue<int>& q) -> coio::test::Eager { (void)co_await q.pop(); }(*doomed);
    doomed.reset();  // destroyed with a waiter: asserted
  }));
}

TEST_CASE("BoundedQueue: a pop cancelled while an item is pushed loses no item", "[boundedQueue][threads]") {
  // The pusher and the canceller race with the waiting pop: whichever the
  // queue's lock sees first wins, and the item is either returned by the
  // pop or still in the queue.
  for (int round = 0; round < 500; ++round) {
    BoundedQueue<int> q(1);
    std::stop_source stop;
    std::thread canceller([&] { stop.request_stop(); });
    std::thread pusher([&] { (void)q.tryPush(int{round}); });
    auto popped = coio::blockingWait(q.pop(stop.get_token()));
    canceller.join();
    pusher.join();
    if (popped) {
      CHECK(*popped == round);
      CHECK(q.size() == 0);
    } else {
      CHECK(popped.error() == std::errc::operation_canceled);
      auto left = q.tryPop();
      REQUIRE(left);
      CHECK(*left == round);
    }
  }
}

TEST_CASE("BoundedQueue: 4 producers and 4 consumers on threads deliver every item exactly once, in order",
          "[boundedQueue][threads]") {
  constexpr int kThreads = 4, kPerProducer = 5000;
  BoundedQueue<int> q(8);
  std::vector<Items> got(kThreads);
  std::vector<std::error_code> ends(kThreads);
  std::atomic<int> producersLeft{kThreads};
  // Half of each side runs one coroutine (which migrates to the threads
  // that resume it), the other half blocks its own thread for each item.
  coio::test::onThreads(2 * kThreads, [&](int t) {
    const bool coroutine = t % 2 == 0;
    if (t < kThreads) {  // a consumer
      if (coroutine) {
        coio::blockingWait(drainInto(q, got[t], ends[t]));
        return;
      }
      for (;;) {
        auto item = coio::blockingWait(q.pop());
        if (!item) {
          ends[t] = item.error();
          return;
        }
        got[t].push_back(*item);
      }
    }
    const int p = t - kThreads;
    if (coroutine) {
      coio::blockingWait([&]() -> Task<void> {
        for (int i = 0; i < kPerProducer; ++i) {
          auto done = co_await q.push(p * kPerProducer + i);
          if (!done) std::terminate();  // nobody closes before every producer is done
        }
      }());
    } else {
      for (int i = 0; i < kPerProducer; ++i) {
        if (!coio::blockingWait(q.push(p * kPerProducer + i))) std::terminate();
      }
    }
    if (--producersLeft == 0) q.close();
  });
  std::vector<int> seen(kThreads * kPerProducer, 0);
  for (int c = 0; c < kThreads; ++c) {
    CHECK(ends[c] == Errc::closed);
    for (int v : got[c]) ++seen[v];
    // FIFO: a consumer sees each producer's items in the order pushed.
    for (int p = 0; p < kThreads; ++p) {
      Items fromP;
      std::copy_if(got[c].begin(), got[c].end(), std::back_inserter(fromP),
                   [&](int v) { return v / kPerProducer == p; });
      CHECK(std::is_sorted(fromP.begin(), fromP.end()));
    }
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

TEST_CASE("BoundedQueue asserts on a capacity of 0", "[boundedQueue]") {
  CHECK(coio::test::abortsInChild([] { BoundedQueue<int> q(0); }));
}
