#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

TEST_CASE("ManualExecutor runs nothing until stepped, then FIFO", "[manualExecutor]") {
  ManualExecutor ex;
  std::vector<int> log;
  for (int i = 0; i < 3; ++i) {
    ex.spawn([](ManualExecutor& ex, std::vector<int>& log, int i) -> Task<void> {
      log.push_back(i);
      co_await ex.schedule();  // yield: go behind the others
      log.push_back(10 + i);
    }(ex, log, i));
  }
  CHECK(log.empty());
  CHECK(ex.step());
  CHECK(log == std::vector<int>{0});
  CHECK(ex.drain() == 5);
  CHECK(log == std::vector<int>{0, 1, 2, 10, 11, 12});
  CHECK_FALSE(ex.step());
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("ManualExecutor fires timers in deadline order, ties in arrival order", "[manualExecutor]") {
  ManualExecutor ex;
  std::vector<std::string> log;
  auto sleeper = [](ManualExecutor& ex, std::vector<std::string>& log, std::chrono::milliseconds d,
                    std::string name) -> Task<void> {
    co_await ex.sleepFor(d);
    log.push_back(name + "@" + std::to_string((ex.now().time_since_epoch() / 1ms)));
  };
  ex.spawn(sleeper(ex, log, 30ms, "c"));
  ex.spawn(sleeper(ex, log, 10ms, "a"));
  ex.spawn(sleeper(ex, log, 20ms, "b1"));
  ex.spawn(sleeper(ex, log, 20ms, "b2"));
  ex.drain();
  CHECK(ex.pendingTimers() == 4);
  ex.advance(19ms);
  CHECK(log == std::vector<std::string>{"a@10"});
  CHECK(ex.now().time_since_epoch() == 19ms);
  ex.advance(1h);
  CHECK(log == std::vector<std::string>{"a@10", "b1@20", "b2@20", "c@30"});
  CHECK(ex.pendingTimers() == 0);
}

TEST_CASE("ManualExecutor: timers set by timers fire within the same advance", "[manualExecutor]") {
  ManualExecutor ex;
  int ticks = 0;
  ex.spawn([](ManualExecutor& ex, int& ticks) -> Task<void> {
    for (int i = 0; i < 5; ++i) {
      co_await ex.sleepFor(1ms);
      ++ticks;
    }
  }(ex, ticks));
  ex.advance(3ms);
  CHECK(ticks == 3);
  ex.advance(10ms);
  CHECK(ticks == 5);
  CHECK(ex.now().time_since_epoch() == 13ms);
}

TEST_CASE("ManualExecutor: a deadline already passed resumes at the next step", "[manualExecutor]") {
  ManualExecutor ex;
  ex.advance(5ms);
  bool woke = false;
  ex.spawn([](ManualExecutor& ex, bool& woke) -> Task<void> {
    co_await ex.sleepUntil(ManualExecutor::TimePoint{1ms});
    woke = true;
  }(ex, woke));
  ex.drain();
  CHECK(woke);
}

TEST_CASE("ManualExecutor rethrows a spawned task's exception from the step that ran it", "[manualExecutor]") {
  ManualExecutor ex;
  ex.spawn([](ManualExecutor& ex) -> Task<void> {
    co_await ex.sleepFor(2ms);
    throw std::runtime_error("late failure");
  }(ex));
  CHECK_NOTHROW(ex.drain());
  CHECK_THROWS_WITH(ex.advance(2ms), "late failure");
  CHECK(ex.outstanding() == 0);
}
