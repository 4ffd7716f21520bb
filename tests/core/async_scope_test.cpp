#include <coio/core/async_scope.hpp>
#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/detail/sanitizers.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "test_helpers.hpp"

using coio::AsyncScope;
using coio::Baton;
using coio::Semaphore;
using coio::Task;
using coio::blockingWait;

namespace {
// Joins `scope`, then sets `joined`.
Task<void> joinThenSet(AsyncScope& scope, bool& joined) {
  co_await scope.join();
  joined = true;
}
}  // namespace

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
  outer.spawn(joinThenSet(scope, joined));
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

namespace {
// Gives up its cancellable wait (given no token) when the scope is stopped.
Task<void> waitOrStop(Semaphore& sem, std::vector<std::string>& log) {
  const bool acquired = co_await sem.acquire(std::stop_token{});
  log.push_back(acquired ? "acquired" : "stopped");
}
}  // namespace

TEST_CASE("AsyncScope: requestStop then join cancels what the scope owns and waits for all of it",
          "[asyncScope]") {
  AsyncScope scope;
  Semaphore sem(0);
  Baton stubborn;
  std::vector<std::string> log;
  scope.spawn(waitOrStop(sem, log));
  scope.spawn(waitOrStop(sem, log));
  scope.spawn([](Baton& gate, std::vector<std::string>& log) -> Task<void> {
    co_await gate;  // ignores the stop
    const std::stop_token t = co_await coio::currentStopToken();
    log.push_back(t.stop_requested() ? "stubborn saw the stop" : "stubborn");
  }(stubborn, log));
  CHECK_FALSE(scope.stopToken().stop_requested());
  CHECK(scope.outstanding() == 3);

  scope.requestStop();  // the waits give up inline, on this thread
  CHECK(scope.stopToken().stop_requested());
  CHECK(log == std::vector<std::string>{"stopped", "stopped"});
  CHECK(scope.outstanding() == 1);

  // A task spawned after the stop starts under the stopped token.
  scope.spawn(waitOrStop(sem, log));
  CHECK(log.back() == "stopped");

  bool joined = false;
  AsyncScope outer;
  outer.spawn(joinThenSet(scope, joined));
  CHECK_FALSE(joined);  // the stubborn task is still running
  stubborn.post();
  CHECK(joined);
  CHECK(log.back() == "stubborn saw the stop");
  blockingWait(outer.join());
  sem.release();
  CHECK(sem.tryAcquire());  // nobody was left in the queue
}

TEST_CASE("AsyncScope: a requestStop that lets the joiner destroy the scope is safe", "[asyncScope]") {
  // The stop finishes the last task inline, which resumes the joiner inline,
  // which destroys the scope (and its stop source) inside requestStop().
  auto scope = std::make_unique<AsyncScope>();
  Semaphore sem(0);
  std::vector<std::string> log;
  scope->spawn(waitOrStop(sem, log));
  bool joined = false;
  AsyncScope outer;
  outer.spawn([](std::unique_ptr<AsyncScope>& scope, bool& joined) -> Task<void> {
    co_await scope->join();
    scope.reset();
    joined = true;
  }(scope, joined));
  scope->requestStop();
  CHECK(joined);
  CHECK(scope == nullptr);
  CHECK(log == std::vector<std::string>{"stopped"});
  blockingWait(outer.join());
}

TEST_CASE("AsyncScope asserts on spawn after join, a second join, and destruction with tasks running",
          "[asyncScope]") {
  auto nothing = []() -> Task<void> { co_return; };
  CHECK(coio::test::abortsInChild([&] {
    AsyncScope scope;
    blockingWait(scope.join());
    scope.spawn(nothing());
  }));
  CHECK(coio::test::abortsInChild([] {
    AsyncScope scope;
    blockingWait(scope.join());
    blockingWait(scope.join());
  }));
  CHECK(coio::test::abortsInChild([] {
    Baton never;
    {
      AsyncScope scope;
      scope.spawn([](Baton& b) -> Task<void> { co_await b; }(never));
    }  // destroyed, its task waiting: asserted
  }));
}

#if defined(COIO_DETAIL_ASAN)
// docs/lifetimes.md's first mistake, run in a child: a capturing lambda
// coroutine given to spawn() keeps using its closure, a temporary that died at
// the end of the spawn statement. AddressSanitizer must report it (as a
// stack-use-after-scope or, once the string it held was freed, a
// heap-use-after-free: which one depends on the compiler and -O level).
TEST_CASE("AsyncScope: ASan reports a capturing lambda coroutine given to spawn", "[asyncScope]") {
  int report[2];
  REQUIRE(pipe(report) == 0);
  std::fflush(nullptr);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(report[0]);
    dup2(report[1], STDERR_FILENO);
    Baton go;
    std::size_t seen = 0;
    AsyncScope scope;
    scope.spawn([&seen, &go, name = std::string(64, 'x')]() -> Task<void> {
      co_await go;
      seen = name.size() + static_cast<std::size_t>(name[10]);
    }());
    go.post();
    blockingWait(scope.join());
    _exit(seen == 0 ? 2 : 0);  // only reached if nothing was reported
  }
  close(report[1]);
  std::string text;
  char chunk[4096];
  for (ssize_t n; (n = read(report[0], chunk, sizeof chunk)) > 0;) text.append(chunk, static_cast<std::size_t>(n));
  close(report[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(text.find("ERROR: AddressSanitizer: ") != std::string::npos);
  CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}
#endif
