#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "test_helpers.hpp"

using coio::Baton;
using coio::Semaphore;
using coio::Task;
using coio::Unit;
using coio::blockingWait;
using coio::collectAny;
using coio::collectAnyRange;
using coio::currentStopToken;
using coio::withStopToken;
using coio::test::LifeTracker;
using coio::testing::ManualExecutor;

namespace {

// Finishes when `gate` is posted, whatever the stop: a loser that ignores it.
Task<int> afterGate(LifeTracker, Baton& gate, int id, std::vector<std::string>& log) {
  co_await gate;
  log.push_back("gate " + std::to_string(id));
  co_return id;
}

// Waits on a cancellable acquire given no token, so it gives up when the
// token it inherits is stopped.
Task<int> acquireOrStop(LifeTracker, Semaphore& sem, int id, std::vector<std::string>& log) {
  const bool acquired = co_await sem.acquire(std::stop_token{});
  log.push_back((acquired ? "acquired " : "stopped ") + std::to_string(id));
  co_return id;
}

// Stop callbacks run in an unspecified order: compare logs as sets.
std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Runs `task` on the executor and keeps its outcome.
template <typename T>
Task<void> keep(Task<T> task, std::optional<T>& out, std::string& error) {
  try {
    out.emplace(co_await std::move(task));
  } catch (const std::exception& e) {
    error = e.what();
  }
}

// What most tests below share: an executor, a semaphore nobody releases
// unless the test says so, a log and the error a kept task threw.
struct Race {
  ManualExecutor ex;
  Semaphore sem{0};
  std::vector<std::string> log;
  std::string error;
};

}  // namespace

TEST_CASE_METHOD(Race, "collectAny yields the first to finish, stops the others and awaits them all",
                 "[collectAny]") {
  Baton winnerGate, stubbornGate;
  std::optional<std::variant<int, int, int>> result;
  {
    ex.spawn(keep(collectAny(acquireOrStop({}, sem, 0, log), afterGate({}, winnerGate, 1, log),
                             afterGate({}, stubbornGate, 2, log)),
                  result, error));
    ex.drain();
    CHECK(LifeTracker::alive == 3);
    winnerGate.post();  // child 1 wins; child 0's wait is stopped inline, here
    CHECK(log == std::vector<std::string>{"gate 1", "stopped 0"});
    CHECK_FALSE(result);  // child 2 ignores the stop: still awaited
    CHECK(LifeTracker::alive == 3);
    stubbornGate.post();  // the last child resumes the parent inline
    REQUIRE(result);
    CHECK(result->index() == 1);
    CHECK(std::get<1>(*result) == 1);
    CHECK(log == std::vector<std::string>{"gate 1", "stopped 0", "gate 2"});
  }
  CHECK(error.empty());
  CHECK(LifeTracker::alive == 0);  // every child frame is gone
  CHECK(ex.outstanding() == 0);
  sem.release();
  CHECK(sem.tryAcquire());  // the stopped waiter left the queue
}

TEST_CASE("collectAny: void children give Unit, and the index tells equal types apart", "[collectAny]") {
  auto now = []() -> Task<void> { co_return; };
  auto never = [](Semaphore& sem) -> Task<void> {
    const bool acquired = co_await sem.acquire(std::stop_token{});
    CHECK_FALSE(acquired);
  };
  Semaphore sem(0);
  const std::variant<Unit, Unit> first = blockingWait(collectAny(never(sem), now()));
  CHECK(first.index() == 1);

  auto value = [](int v) -> Task<std::string> { co_return std::to_string(v); };
  const auto second = blockingWait(collectAny(value(5), value(6)));
  static_assert(std::is_same_v<std::remove_const_t<decltype(second)>, std::variant<std::string, std::string>>);
  CHECK(second.index() == 0);  // finished first: it started first
  CHECK(std::get<0>(second) == "5");
}

TEST_CASE_METHOD(Race, "collectAny: a child that finishes while they start wins; later ones start stopped",
                 "[collectAny]") {
  auto startsStopped = [](std::vector<std::string>& log) -> Task<int> {
    const std::stop_token t = co_await currentStopToken();
    log.push_back(t.stop_requested() ? "started stopped" : "started");
    co_return 2;
  };
  auto now = []() -> Task<int> { co_return 1; };
  const auto result = blockingWait(collectAny(acquireOrStop({}, sem, 0, log), now(), startsStopped(log)));
  CHECK(result.index() == 1);
  CHECK(log == std::vector<std::string>{"stopped 0", "started stopped"});
}

TEST_CASE_METHOD(Race, "collectAny rethrows the winner's exception and drops the losers'", "[collectAny]") {
  Baton failGate, laterGate;
  auto failAfter = [](Baton& gate, std::string what) -> Task<int> {
    co_await gate;
    throw std::runtime_error(what);
  };
  std::optional<std::variant<int, int, int>> result;
  {
    ex.spawn(keep(collectAny(failAfter(failGate, "winner"), failAfter(laterGate, "loser"),
                             afterGate({}, laterGate, 2, log)),
                  result, error));
    ex.drain();
    failGate.post();
    CHECK(error.empty());  // still awaiting the others
    laterGate.post();
  }
  CHECK_FALSE(result);
  CHECK(error == "winner");
  CHECK(LifeTracker::alive == 0);

  // A loser's exception is dropped when the winner returned.
  Baton winGate, loseGate;
  std::optional<std::variant<int, int>> won;
  error.clear();
  ex.spawn(keep(collectAny(afterGate({}, winGate, 0, log), failAfter(loseGate, "late")), won, error));
  ex.drain();
  winGate.post();
  loseGate.post();
  REQUIRE(won);
  CHECK(won->index() == 0);
  CHECK(error.empty());
  CHECK(LifeTracker::alive == 0);
}

TEST_CASE_METHOD(Race, "collectAny under a token already stopped: every child starts stopped", "[collectAny]") {
  std::stop_source source;
  source.request_stop();
  const auto result = blockingWait(
      withStopToken(source.get_token(), collectAny(acquireOrStop({}, sem, 0, log), acquireOrStop({}, sem, 1, log))));
  CHECK(result.index() == 0);
  CHECK(log == std::vector<std::string>{"stopped 0", "stopped 1"});
  CHECK(LifeTracker::alive == 0);
}

TEST_CASE_METHOD(Race, "collectAny: the enclosing token's stop reaches the children, and may finish them all inline",
                 "[collectAny]") {
  // The stop cancels both waits inline; the last one resumes the parent
  // inside the stop callback, which frees collectAny's frame (and its stop
  // source) before the callback has returned: ASan checks that is safe.
  std::stop_source source;
  std::optional<std::variant<int, int>> result;
  ex.spawn(withStopToken(source.get_token(), keep(collectAny(acquireOrStop({}, sem, 0, log),
                                                             acquireOrStop({}, sem, 1, log)),
                                                  result, error)));
  ex.drain();
  source.request_stop();
  REQUIRE(result);  // the first child the stop ended won
  CHECK(std::visit([](int v) { return v; }, *result) == static_cast<int>(result->index()));
  CHECK(sorted(log) == std::vector<std::string>{"stopped 0", "stopped 1"});
  CHECK(ex.outstanding() == 0);
  CHECK(LifeTracker::alive == 0);
}

TEST_CASE_METHOD(Race, "nested collectAny: the outer winner stops the inner race too", "[collectAny]") {
  Baton outerGate;
  auto inner = [](Semaphore& sem, std::vector<std::string>& log) -> Task<int> {
    const auto r = co_await collectAny(acquireOrStop({}, sem, 10, log), acquireOrStop({}, sem, 11, log));
    log.push_back("inner " + std::to_string(r.index()));
    co_return 100;
  };
  std::optional<std::variant<int, int>> result;
  ex.spawn(keep(collectAny(inner(sem, log), afterGate({}, outerGate, 1, log)), result, error));
  ex.drain();
  CHECK(log.empty());
  outerGate.post();
  REQUIRE(log.size() == 4);
  CHECK(log[0] == "gate 1");
  CHECK(sorted({log[1], log[2]}) == std::vector<std::string>{"stopped 10", "stopped 11"});
  CHECK(log[3].rfind("inner ", 0) == 0);
  REQUIRE(result);
  CHECK(result->index() == 1);
  CHECK(LifeTracker::alive == 0);

  // And the inner race ends on its own: its winner stops its sibling only
  // until the inner task wins the outer race and stops the outer loser.
  log.clear();
  result.reset();
  Baton lateOuter;
  ex.spawn(keep(collectAny(inner(sem, log), afterGate({}, lateOuter, 1, log)), result, error));
  ex.drain();
  sem.release();  // child 10 acquires and wins the inner race
  CHECK(log == std::vector<std::string>{"acquired 10", "stopped 11", "inner 0"});
  CHECK_FALSE(result);  // the outer loser ignores the stop: still awaited
  lateOuter.post();
  REQUIRE(result);
  CHECK(result->index() == 0);
  CHECK(std::get<0>(*result) == 100);
  CHECK(ex.outstanding() == 0);
  CHECK(LifeTracker::alive == 0);
}

TEST_CASE_METHOD(Race, "collectAnyRange yields the winner's index and value and awaits the others",
                 "[collectAny]") {
  Baton gate;
  std::vector<Task<int>> tasks;
  for (int i = 0; i < 4; ++i) {
    tasks.push_back(i == 2 ? afterGate({}, gate, i, log) : acquireOrStop({}, sem, i, log));
  }
  std::optional<std::pair<std::size_t, int>> result;
  ex.spawn(keep(collectAnyRange(std::move(tasks)), result, error));
  ex.drain();
  gate.post();
  REQUIRE(result);
  CHECK(result->first == 2);
  CHECK(result->second == 2);
  REQUIRE(log.size() == 4);
  CHECK(log[0] == "gate 2");
  CHECK(sorted({log[1], log[2], log[3]}) == std::vector<std::string>{"stopped 0", "stopped 1", "stopped 3"});
  CHECK(LifeTracker::alive == 0);

  std::vector<Task<void>> voids;
  auto now = []() -> Task<void> { co_return; };
  voids.push_back(now());
  const std::pair<std::size_t, Unit> v = blockingWait(collectAnyRange(std::move(voids)));
  CHECK(v.first == 0);
}

TEST_CASE("collectAnyRange with children finishing on other threads", "[collectAny][threads]") {
  constexpr int kChildren = 6;
  for (int round = 0; round < 50; ++round) {
    std::vector<Baton> gates(kChildren);
    Semaphore sem(0);
    std::vector<Task<int>> tasks;
    for (int i = 0; i < kChildren; ++i) {
      tasks.push_back([](Baton& g, int i) -> Task<int> {
        co_await g;
        co_return i;
      }(gates[static_cast<std::size_t>(i)], i));
    }
    // A loser parked on a semaphore: only the stop can end it, on whichever
    // thread finished the winner.
    bool stopped = false;
    tasks.push_back([](Semaphore& sem, bool& stopped) -> Task<int> {
      const bool acquired = co_await sem.acquire(std::stop_token{});
      stopped = !acquired;
      co_return -1;
    }(sem, stopped));
    std::vector<std::thread> posters;
    auto parent = [&]() -> Task<std::pair<std::size_t, int>> {
      auto any = collectAnyRange(std::move(tasks));
      for (auto& g : gates) posters.emplace_back([&g] { g.post(); });
      co_return co_await std::move(any);
    };
    const auto [index, value] = blockingWait(parent());
    for (auto& t : posters) t.join();
    CHECK(index < static_cast<std::size_t>(kChildren));
    CHECK(value == static_cast<int>(index));
    CHECK(stopped);
  }
}

TEST_CASE("collectAnyRange asserts on an empty range", "[collectAny]") {
  CHECK(coio::test::abortsInChild([] { (void)blockingWait(collectAnyRange(std::vector<Task<int>>{})); }));
}
