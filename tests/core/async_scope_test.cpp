#include <coio/core/async_scope.hpp>
#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_helpers.hpp"

using coio::AsyncScope;
using coio::Baton;
using coio::Task;
using coio::blockingWait;

TEST_CASE("AsyncScope::spawn runs inline until the first suspension", "[asyncScope]") {
  AsyncScope scope;
  Baton gate;
  std::vector<int> log;
  scope.spawn([](Baton& gate, std::vector<int>& log) -> Task<void> {
    log.push_back(1);
    co_await gate;
    log.push_back(3);
  }(gate, log));
  log.push_back(2);
  CHECK(scope.outstanding() == 1);
  gate.post();
  CHECK(log == std::vector<int>{1, 2, 3});
  CHECK(scope.outstanding() == 0);
  blockingWait(scope.join());
}

TEST_CASE("AsyncScope::join waits for every spawned task", "[asyncScope]") {
  AsyncScope scope;
  Baton gates[3];
  int done = 0;
  for (auto& g : gates) {
    scope.spawn([](Baton& g, int& done) -> Task<void> {
      co_await g;
      ++done;
    }(g, done));
  }
  bool joined = false;
  AsyncScope outer;
  outer.spawn([](AsyncScope& scope, bool& joined) -> Task<void> {
    co_await scope.join();
    joined = true;
  }(scope, joined));
  gates[0].post();
  gates[2].post();
  CHECK_FALSE(joined);
  gates[1].post();  // the last task resumes the joiner
  CHECK(joined);
  CHECK(done == 3);
  blockingWait(outer.join());
}

TEST_CASE("AsyncScope::join with nothing spawned completes at once", "[asyncScope]") {
  AsyncScope scope;
  blockingWait(scope.join());
  CHECK(scope.outstanding() == 0);
}

TEST_CASE("AsyncScope passes escaping exceptions to its handler", "[asyncScope]") {
  std::vector<std::string> seen;
  AsyncScope scope([&](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      seen.emplace_back(ex.what());
    }
  });
  for (int i = 0; i < 3; ++i) {
    scope.spawn([](int i) -> Task<void> {
      if (i != 1) throw std::runtime_error("task " + std::to_string(i));
      co_return;
    }(i));
  }
  blockingWait(scope.join());  // the handler took them: join does not throw
  CHECK(seen == std::vector<std::string>{"task 0", "task 2"});
  CHECK(scope.failedCount() == 2);
}

TEST_CASE("AsyncScope without a handler rethrows the first exception from join", "[asyncScope]") {
  AsyncScope scope;
  scope.spawn([]() -> Task<void> {
    throw std::runtime_error("first");
    co_return;
  }());
  scope.spawn([]() -> Task<void> {
    throw std::runtime_error("second");
    co_return;
  }());
  CHECK_THROWS_WITH(blockingWait(scope.join()), "first");
  CHECK(scope.failedCount() == 2);
}

TEST_CASE("AsyncScope frees the frames of finished tasks", "[asyncScope]") {
  {
    AsyncScope scope;
    Baton gate;
    for (int i = 0; i < 5; ++i) {
      scope.spawn([](coio::test::LifeTracker, Baton& g) -> Task<void> { co_await g; }(coio::test::LifeTracker{}, gate));
    }
    CHECK(coio::test::LifeTracker::alive == 5);
    gate.post();
    CHECK(coio::test::LifeTracker::alive == 0);
    blockingWait(scope.join());
  }
  CHECK(coio::test::LifeTracker::alive == 0);
}

TEST_CASE("AsyncScope: tasks finishing on many threads, joined from another", "[asyncScope][threads]") {
  constexpr int kTasks = 64;
  for (int round = 0; round < 20; ++round) {
    AsyncScope scope;
    std::vector<Baton> gates(kTasks);
    std::atomic<int> done{0};
    for (auto& g : gates) {
      scope.spawn([](Baton& g, std::atomic<int>& done) -> Task<void> {
        co_await g;
        ++done;
      }(g, done));
    }
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&, t] {
        for (int i = t; i < kTasks; i += 4) gates[static_cast<std::size_t>(i)].post();
      });
    }
    blockingWait(scope.join());
    CHECK(done == kTasks);
    for (auto& p : posters) p.join();
  }
}
