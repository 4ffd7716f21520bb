#include <coio/core/async_generator.hpp>
#include <coio/core/async_scope.hpp>
#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/event.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_helpers.hpp"

using coio::AsyncGenerator;
using coio::Baton;
using coio::Semaphore;
using coio::Task;
using coio::blockingWait;
using coio::currentStopToken;
using coio::forEach;
using coio::withStopToken;
using coio::test::CopyCounter;
using coio::test::Eager;
using coio::test::LifeTracker;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {

// Sleeps 10 ms of virtual time before each of `n` values; counts its starts.
AsyncGenerator<int> ticks(ManualExecutor& ex, int n, int& started) {
  ++started;
  LifeTracker local;
  for (int i = 0; i < n; ++i) {
    co_await ex.sleepFor(10ms);
    co_yield i;
  }
}

// Yields what the body did to get its value.
AsyncGenerator<std::string> guarded(Baton& gate) {
  LifeTracker local;
  co_yield "first";
  co_await gate;
  co_yield "after gate";
}

// Takes every item, with the virtual time it arrived at.
Task<void> drainInto(AsyncGenerator<int> gen, ManualExecutor& ex, std::vector<std::pair<int, long>>& seen,
                     bool& done) {
  for (;;) {
    int* item = co_await gen.next();
    if (!item) break;
    seen.emplace_back(*item, static_cast<long>(ex.now().time_since_epoch() / 1ms));
  }
  int* after = co_await gen.next();  // ended: nullptr again, at once
  CHECK(after == nullptr);
  done = true;
}

// The body's token in each next(): one item per next().
AsyncGenerator<std::stop_token> tokens() {
  for (;;) co_yield co_await currentStopToken();
}

Task<std::stop_token> nextToken(AsyncGenerator<std::stop_token>& gen) {
  std::stop_token* token = co_await gen.next();
  co_return *token;
}

// Waits on a cancellable acquire given no token, inside a Task the body
// awaits: both inherit the token of the consumer's next().
Task<bool> acquireInherited(Semaphore& sem) {
  const bool acquired = co_await sem.acquire(std::stop_token{});
  co_return acquired;
}

AsyncGenerator<bool> acquisitions(Semaphore& sem) {
  for (;;) co_yield co_await acquireInherited(sem);
}

}  // namespace

TEST_CASE("AsyncGenerator: lazy, in order in virtual time, nullptr at the end", "[asyncGenerator]") {
  ManualExecutor ex;
  int started = 0;
  std::vector<std::pair<int, long>> seen;
  bool done = false;
  {
    auto gen = ticks(ex, 3, started);
    ex.drain();
    CHECK(started == 0);  // nothing before the first next()
    ex.spawn(drainInto(std::move(gen), ex, seen, done));
  }
  ex.drain();
  CHECK(started == 1);
  CHECK(seen.empty());
  ex.advance(15ms);
  CHECK(seen == std::vector<std::pair<int, long>>{{0, 10}});
  ex.advance(100ms);
  CHECK(seen == std::vector<std::pair<int, long>>{{0, 10}, {1, 20}, {2, 30}});
  CHECK(done);
  CHECK(LifeTracker::alive == 0);
}

TEST_CASE("AsyncGenerator: the consumer resumes inline where the body yields", "[asyncGenerator]") {
  // A body that never suspends runs with its consumer inside one step.
  ManualExecutor ex;
  std::vector<int> seen;
  auto counting = []() -> AsyncGenerator<int> {
    for (int i = 0; i < 100; ++i) co_yield i;
  };
  auto consume = [](AsyncGenerator<int> gen, std::vector<int>& seen) -> Task<void> {
    co_await forEach(std::move(gen), [&seen](int x) { seen.push_back(x); });
  };
  ex.spawn(consume(counting(), seen));
  CHECK(ex.step());
  CHECK(seen.size() == 100);
  CHECK_FALSE(ex.step());

  // A body resumed by a post() resumes its consumer inside that post().
  Baton gate;
  std::vector<std::string> log;
  auto twoItems = [](AsyncGenerator<std::string> gen, std::vector<std::string>& log) -> Task<void> {
    for (int i = 0; i < 2; ++i) {
      std::string* item = co_await gen.next();
      log.push_back(*item);
    }
  };
  ex.spawn(twoItems(guarded(gate), log));
  ex.drain();
  CHECK(log == std::vector<std::string>{"first"});
  gate.post();
  CHECK(log == std::vector<std::string>{"first", "after gate"});
  CHECK(ex.outstanding() == 0);
  CHECK(LifeTracker::alive == 0);  // destroyed at its second co_yield
}

TEST_CASE("AsyncGenerator: an exception is rethrown from the next() that resumed the body, and ends it",
          "[asyncGenerator]") {
  auto failing = []() -> AsyncGenerator<int> {
    co_yield 1;
    throw std::runtime_error("body failed");
  };
  auto consume = [](AsyncGenerator<int> gen, std::vector<std::string>& log) -> Task<void> {
    int* first = co_await gen.next();
    log.push_back(std::to_string(*first));
    try {
      co_await gen.next();
    } catch (const std::runtime_error& e) {
      log.push_back(e.what());
    }
    int* after = co_await gen.next();
    log.push_back(after ? "item" : "end");
  };
  std::vector<std::string> log;
  blockingWait(consume(failing(), log));
  CHECK(log == std::vector<std::string>{"1", "body failed", "end"});

  // Through forEach too, from the body or from fn; the generator goes.
  CHECK_THROWS_WITH(blockingWait(forEach(failing(), [](int) {})), "body failed");
  ManualExecutor ex;
  int started = 0;
  auto throwing = [](int x) {
    if (x == 1) throw std::logic_error("fn failed");
  };
  auto endless = []() -> AsyncGenerator<int> {
    LifeTracker local;
    for (int i = 0;; ++i) co_yield i;
  };
  auto twoLoops = [](AsyncGenerator<int> empty, AsyncGenerator<int> endless, auto fn) -> Task<void> {
    co_await forEach(std::move(empty), fn);  // ends at once
    co_await forEach(std::move(endless), fn);
  };
  CHECK_THROWS_WITH(blockingWait(twoLoops(ticks(ex, 0, started), endless(), throwing)), "fn failed");
  CHECK(started == 1);
  CHECK(LifeTracker::alive == 0);
}

TEST_CASE("AsyncGenerator: no copies, move-only values and references", "[asyncGenerator]") {
  CopyCounter::resetCounts();
  auto counters = []() -> AsyncGenerator<CopyCounter> {
    CopyCounter local(1);
    co_yield local;
    co_yield CopyCounter(2);
    const CopyCounter constant(3);
    co_yield constant;  // the consumer gets a CopyCounter*: a copy
  };
  std::vector<int> values;
  blockingWait(forEach(counters(), [&values](CopyCounter& c) { values.push_back(c.value); }));
  CHECK(values == std::vector<int>{1, 2, 3});
  CHECK(CopyCounter::copies == 1);
  CHECK(CopyCounter::moves == 0);

  auto owners = []() -> AsyncGenerator<std::unique_ptr<int>> {
    auto kept = std::make_unique<int>(1);
    co_yield kept;
    CHECK(kept == nullptr);  // the consumer moved it out
    co_yield std::make_unique<int>(2);
  };
  std::vector<std::unique_ptr<int>> taken;
  blockingWait(forEach(owners(), [&taken](std::unique_ptr<int>& p) { taken.push_back(std::move(p)); }));
  REQUIRE(taken.size() == 2);
  CHECK(*taken[0] == 1);
  CHECK(*taken[1] == 2);

  std::array<int, 3> cells{1, 2, 3};
  auto each = [](std::array<int, 3>& cells) -> AsyncGenerator<int&> {
    for (int& c : cells) co_yield c;
  };
  blockingWait(forEach(each(cells), [](int& c) { c *= 10; }));
  CHECK(cells == std::array<int, 3>{10, 20, 30});
  static_assert(std::is_same_v<AsyncGenerator<const std::string&>::pointer, const std::string*>);
}

TEST_CASE("AsyncGenerator: forEach awaits what fn returns before the next item", "[asyncGenerator]") {
  ManualExecutor ex;
  int started = 0;
  std::vector<std::pair<int, long>> seen;
  auto slowConsumer = [](ManualExecutor& ex, std::vector<std::pair<int, long>>& seen, int x) -> Task<void> {
    co_await ex.sleepFor(5ms);
    seen.emplace_back(x, static_cast<long>(ex.now().time_since_epoch() / 1ms));
  };
  ex.spawn(forEach(ticks(ex, 3, started), [&](int x) { return slowConsumer(ex, seen, x); }));
  ex.advance(1s);
  // Each item: 10 ms in the body, then 5 ms in fn, before the body resumes.
  CHECK(seen == std::vector<std::pair<int, long>>{{0, 15}, {1, 30}, {2, 45}});
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("AsyncGenerator: the body runs under the token of the coroutine awaiting next()", "[asyncGenerator]") {
  // The token is the caller's, next() by next().
  auto gen = tokens();
  std::stop_source a, b;
  const std::stop_token first = blockingWait(withStopToken(a.get_token(), nextToken(gen)));
  const std::stop_token second = blockingWait(withStopToken(b.get_token(), nextToken(gen)));
  const std::stop_token root = blockingWait(nextToken(gen));
  CHECK(first == a.get_token());
  CHECK(second == b.get_token());
  CHECK_FALSE(root.stop_possible());

  // A stopped consumer cancels what the body awaits, through a Task the
  // body awaits; the next consumer's token is not stopped.
  ManualExecutor ex;
  Semaphore sem(0);
  std::stop_source stop;
  std::vector<std::string> log;
  auto consumeOne = [](AsyncGenerator<bool>& gen, std::vector<std::string>& log) -> Task<void> {
    bool* acquired = co_await gen.next();
    log.push_back(*acquired ? "acquired" : "cancelled");
  };
  auto acquiring = acquisitions(sem);
  ex.spawn(withStopToken(stop.get_token(), consumeOne(acquiring, log)));
  ex.drain();
  CHECK(log.empty());
  stop.request_stop();  // the wait gives up inline: the body yields, the consumer resumes, on this thread
  CHECK(log == std::vector<std::string>{"cancelled"});
  CHECK(ex.outstanding() == 0);

  ex.spawn(consumeOne(acquiring, log));
  ex.drain();
  CHECK(log.size() == 1);  // waits again, under a token that is not stopped
  sem.release();
  CHECK(log == std::vector<std::string>{"cancelled", "acquired"});
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("AsyncGenerator: destroyed at a co_yield, or with its consumer while the body waits", "[asyncGenerator]") {
  REQUIRE(LifeTracker::alive == 0);
  Baton gate;
  {
    auto gen = guarded(gate);
    const std::string first = blockingWait([](AsyncGenerator<std::string>& gen) -> Task<std::string> {
      std::string* item = co_await gen.next();
      co_return *item;
    }(gen));
    CHECK(first == "first");
    CHECK(LifeTracker::alive == 1);
  }
  CHECK(LifeTracker::alive == 0);

  // The consumer's frame owns the generator; the body waits in a Task on a
  // semaphore when the consumer is destroyed (as a reactor destroys its
  // suspended coroutines): everything goes, the wait leaves the queue, and
  // a release later resumes nothing (ASan would see a freed frame).
  Semaphore sem(0);
  auto consumer = [](AsyncGenerator<bool> gen, LifeTracker) -> Eager {
    LifeTracker local;
    co_await gen.next();
    FAIL("resumed after its destruction");
  };
  auto waiting = [](Semaphore& sem) -> AsyncGenerator<bool> {
    LifeTracker local;
    co_yield co_await acquireInherited(sem);
  };
  Eager eager = consumer(waiting(sem), LifeTracker{});
  CHECK(LifeTracker::alive == 3);  // the consumer's parameter and local, the body's local
  eager.handle.destroy();
  CHECK(LifeTracker::alive == 0);
  sem.release();
  CHECK(sem.tryAcquire());

  // Also while it waits on a Baton, directly in the body.
  Baton never;
  auto onBaton = [](Baton& b) -> AsyncGenerator<int> {
    LifeTracker local;
    co_await b;
    co_yield 1;
  };
  auto consumeOne = [](AsyncGenerator<int> gen) -> Eager { co_await gen.next(); };
  Eager other = consumeOne(onBaton(never));
  CHECK(LifeTracker::alive == 1);
  other.handle.destroy();
  CHECK(LifeTracker::alive == 0);
  never.post();  // nothing left waiting
}

TEST_CASE("AsyncGenerator: a second next() while one is pending is asserted", "[asyncGenerator]") {
  CHECK(coio::test::abortsInChild([] {
    Baton gate;
    auto gen = guarded(gate);
    auto consumeTwo = [](AsyncGenerator<std::string>& gen) -> Eager {
      co_await gen.next();  // "first"
      co_await gen.next();  // waits on the gate
    };
    auto consumeOne = [](AsyncGenerator<std::string>& gen) -> Eager { co_await gen.next(); };
    Eager a = consumeTwo(gen);
    Eager b = consumeOne(gen);  // aborts
    a.handle.destroy();
    b.handle.destroy();
  }));
}

TEST_CASE("AsyncGenerator: the body hops threads; the consumer resumes on the thread that resumed the body",
          "[asyncGenerator][threads]") {
  constexpr int kItems = 4;
  std::array<Baton, kItems> batons;
  std::array<int, kItems> payload{};  // written by each posting thread, read after the hop
  std::array<std::thread::id, kItems> posters{}, resumedOn{};
  std::vector<int> seen;
  auto hopping = [](std::array<Baton, kItems>& batons, std::array<int, kItems>& payload) -> AsyncGenerator<int> {
    for (int i = 0; i < kItems; ++i) {
      co_await batons[i];
      co_yield payload[i];
    }
  };
  auto consume = [](AsyncGenerator<int> gen, std::vector<int>& seen,
                    std::array<std::thread::id, kItems>& resumedOn) -> Task<void> {
    for (int i = 0;; ++i) {
      int* item = co_await gen.next();
      if (!item) break;
      resumedOn[i] = std::this_thread::get_id();
      seen.push_back(*item);
    }
  };
  coio::AsyncScope scope;
  scope.spawn(consume(hopping(batons, payload), seen, resumedOn));  // runs to the first Baton, here
  for (int i = 0; i < kItems; ++i) {
    std::thread poster([&, i] {
      payload[i] = 100 + i;
      posters[i] = std::this_thread::get_id();
      batons[i].post();  // the body, then the consumer, run inside this call
    });
    poster.join();
  }
  blockingWait(scope.join());
  CHECK(seen == std::vector<int>{100, 101, 102, 103});
  CHECK(resumedOn == posters);

  // Racing: the producer posts while the consumer may or may not wait yet.
  std::array<Baton, kItems> raceBatons;
  std::array<int, kItems> racePayload{};
  std::vector<int> raceSeen;
  std::array<std::thread::id, kItems> raceResumedOn{};
  std::thread producer([&] {
    for (int i = 0; i < kItems; ++i) {
      racePayload[i] = 200 + i;
      raceBatons[i].post();
    }
  });
  blockingWait(consume(hopping(raceBatons, racePayload), raceSeen, raceResumedOn));
  const std::thread::id producerId = producer.get_id();
  producer.join();
  CHECK(raceSeen == std::vector<int>{200, 201, 202, 203});
  for (const std::thread::id& id : raceResumedOn) {
    const bool known = id == producerId || id == std::this_thread::get_id();
    CHECK(known);
  }
}

TEST_CASE("AsyncGenerator asserts on next() on a moved-from generator", "[asyncGenerator]") {
  CHECK(coio::test::abortsInChild([] {
    auto gen = []() -> AsyncGenerator<int> { co_yield 1; }();
    auto owner = std::move(gen);
    (void)blockingWait(gen.next());
  }));
}
