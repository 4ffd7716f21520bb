// Timers on every reactor: ordering, cancellable sleeps, withTimeout.
#include "test_reactors.hpp"

#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/detail/timer_queue.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <stop_token>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using coio::Task;
using coio::testing::TestReactors;

TEMPLATE_LIST_TEST_CASE("many timers fire in deadline order, ties in the order they were set", "[reactor][timer]",
                        TestReactors) {
  TestType reactor;
  constexpr int kTimers = 2000;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> offsetMs(0, 30);  // few distinct deadlines: many ties
  const Clock::time_point base = Clock::now() + 5ms;
  std::vector<std::pair<Clock::time_point, int>> expected;
  std::vector<int> fired;
  auto sleeper = [](TestType& r, Clock::time_point deadline, int id, std::vector<int>& out) -> Task<void> {
    co_await r.sleepUntil(deadline);
    CHECK(Clock::now() >= deadline);
    out.push_back(id);
  };
  for (int i = 0; i < kTimers; ++i) {
    const Clock::time_point deadline = base + std::chrono::milliseconds(offsetMs(rng));
    expected.emplace_back(deadline, i);
    reactor.spawn(sleeper(reactor, deadline, i, fired));  // spawned tasks start in order
  }
  auto waitAll = [&](TestType& r) -> Task<void> {
    while (fired.size() < kTimers) co_await r.sleepFor(5ms);
  };
  reactor.runUntil(waitAll(reactor));
  std::stable_sort(expected.begin(), expected.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int> expectedOrder;
  for (const auto& e : expected) expectedOrder.push_back(e.second);
  CHECK(fired == expectedOrder);
}

TEMPLATE_LIST_TEST_CASE("sleepFor waits at least the duration", "[reactor][timer]", TestReactors) {
  TestType reactor;
  auto timed = [](TestType& r) -> Task<Clock::duration> {
    const auto start = Clock::now();
    co_await r.sleepFor(20ms);
    co_return Clock::now() - start;
  };
  const Clock::duration slept = reactor.runUntil(timed(reactor));
  CHECK(slept >= 20ms);
  CHECK(slept < 2s);
}

TEMPLATE_LIST_TEST_CASE("a cancellable sleep yields false when stopped and true when due", "[reactor][timer]",
                        TestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<void> {
    std::stop_source source;
    // Bound first: Catch2's CHECK would evaluate a co_await twice under g++ (troubleshooting.md).
    const bool due = co_await r.sleepFor(1ms, source.get_token());
    CHECK(due);
    auto stopLater = [](TestType& rr, std::stop_source& s) -> Task<void> {
      co_await rr.sleepFor(2ms);
      s.request_stop();
    };
    r.spawn(stopLater(r, source));
    const auto start = Clock::now();
    const bool stopped = !co_await r.sleepFor(1h, source.get_token());
    CHECK(stopped);
    CHECK(Clock::now() - start < 10s);
    const bool stillStopped = !co_await r.sleepFor(1h, source.get_token());  // does not suspend
    CHECK(stillStopped);
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("withTimeout cancels a semaphore wait and returns timed_out", "[reactor][timer]",
                        TestReactors) {
  TestType reactor;
  coio::Semaphore sem(0);
  auto acquireAsResult = [&sem](std::stop_token stop) -> Task<coio::Result<void>> {
    const bool acquired = co_await sem.acquire(std::move(stop));
    if (acquired) co_return coio::Result<void>{};
    co_return std::errc::operation_canceled;
  };
  auto test = [&](TestType& r) -> Task<void> {
    const auto start = Clock::now();
    coio::Result<void> timedOut = co_await coio::withTimeout(r, acquireAsResult, 10ms);
    CHECK(timedOut.error() == std::errc::timed_out);
    CHECK(Clock::now() - start >= 10ms);
    // The waiter left the queue: a release is not swallowed by it.
    sem.release();
    CHECK(sem.tryAcquire());

    // A wait that is satisfied in time returns its own result, and the timer goes.
    auto releaseSoon = [](TestType& rr, coio::Semaphore& s) -> Task<void> {
      co_await rr.sleepFor(1ms);
      s.release();
    };
    r.spawn(releaseSoon(r, sem));
    coio::Result<void> acquired = co_await coio::withTimeout(r, acquireAsResult, 10s);
    CHECK(acquired.hasValue());
  };
  const auto start = Clock::now();
  reactor.runUntil(test(reactor));
  CHECK(Clock::now() - start < 5s);  // the 10 s timer did not hold anything up
}

TEST_CASE("TimerQueue removes from anywhere and keeps (deadline, insertion) order", "[reactor][timer]") {
  using coio::detail::TimerNode;
  coio::detail::TimerQueue queue;
  struct Node : TimerNode {
    int id = 0;
    std::vector<int>* fired = nullptr;
  };
  std::vector<int> fired;
  std::vector<Node> nodes(1000);
  std::mt19937 rng(3);
  const Clock::time_point base{};
  for (int i = 0; i < 1000; ++i) {
    Node& n = nodes[static_cast<std::size_t>(i)];
    n.id = i;
    n.fired = &fired;
    n.deadline = base + std::chrono::milliseconds(rng() % 50);
    n.fire = [](TimerNode* t) noexcept {
      auto* self = static_cast<Node*>(t);
      self->fired->push_back(self->id);
    };
    queue.push(n);
  }
  std::vector<int> kept;
  for (int i = 0; i < 1000; ++i) {
    if (rng() % 2) {
      queue.remove(nodes[static_cast<std::size_t>(i)]);
      CHECK_FALSE(nodes[static_cast<std::size_t>(i)].queued());
    } else {
      kept.push_back(i);
    }
  }
  CHECK(queue.size() == kept.size());
  std::stable_sort(kept.begin(), kept.end(), [&](int a, int b) {
    return nodes[static_cast<std::size_t>(a)].deadline < nodes[static_cast<std::size_t>(b)].deadline;
  });
  queue.fireDue(base + std::chrono::milliseconds(25));
  CHECK(fired.size() < kept.size());  // only the due ones
  queue.fireDue(base + std::chrono::milliseconds(50));
  CHECK(fired == kept);
  CHECK(queue.size() == 0);
}
