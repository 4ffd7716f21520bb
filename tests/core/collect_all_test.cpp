#include <coio/core/async_scope.hpp>
#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "test_helpers.hpp"

using coio::Baton;
using coio::Task;
using coio::Unit;
using coio::blockingWait;
using coio::collectAll;
using coio::collectAllRange;
using coio::collectAllWindowed;

namespace {
Task<int> value(int v) { co_return v; }
Task<void> none() { co_return; }
Task<std::string> str(std::string s) { co_return s; }

// Records when it starts, waits for its baton, records when it finishes.
Task<int> gated(Baton& gate, std::vector<std::string>& log, int id) {
  log.push_back("start " + std::to_string(id));
  co_await gate;
  log.push_back("end " + std::to_string(id));
  co_return id;
}

Task<int> failAfter(Baton& gate, std::string what) {
  co_await gate;
  throw std::runtime_error(what);
}

Task<int> failNow(std::string what) {
  throw std::runtime_error(what);
  co_return 0;
}

Task<int> valueAfter(Baton& gate, int v) {
  co_await gate;
  co_return v;
}

// Awaits `all`; `caught` and `message` tell whether it threw and what.
Task<void> awaitCatching(Task<std::tuple<int, int, int>> all, bool& caught, std::string& message) {
  try {
    co_await std::move(all);
  } catch (const std::runtime_error& e) {
    caught = true;
    message = e.what();
  }
}

// A child with a fan-out of its own: 1 + 2, plus 4 once `gate` is posted
// if there is one.
Task<int> nestedSum(Baton* gate) {
  std::vector<Task<int>> inner;
  inner.push_back(value(1));
  inner.push_back(value(2));
  if (gate) inner.push_back(valueAfter(*gate, 4));
  const std::vector<int> got = co_await collectAllRange(std::move(inner));
  int sum = 0;
  for (int v : got) sum += v;
  co_return sum;
}
}  // namespace

TEST_CASE("collectAll returns a tuple; void children become Unit", "[collectAll]") {
  auto [a, u, s] = blockingWait(collectAll(value(1), none(), str("x")));
  static_assert(std::is_same_v<decltype(u), Unit>);
  CHECK(a == 1);
  CHECK(s == "x");
}

TEST_CASE("collectAll supports reference results", "[collectAll]") {
  int x = 0;
  auto ref = [](int& x) -> Task<int&> { co_return x; };
  auto [r] = blockingWait(collectAll(ref(x)));
  CHECK(&r == &x);
}

TEST_CASE("collectAll starts children in order and lets them interleave", "[collectAll]") {
  Baton g1, g2, g3;
  std::vector<std::string> log;
  bool finished = false;
  std::tuple<int, int, int> result;
  coio::testing::ManualExecutor ex;
  // State goes in as parameters: a capturing lambda's closure would be gone
  // by the time the executor starts the coroutine.
  auto parent = [](Task<std::tuple<int, int, int>> all, std::tuple<int, int, int>& result,
                   bool& finished) -> Task<void> {
    result = co_await std::move(all);
    finished = true;
  };
  ex.spawn(parent(collectAll(gated(g1, log, 1), gated(g2, log, 2), gated(g3, log, 3)), result, finished));
  ex.drain();
  CHECK(log == std::vector<std::string>{"start 1", "start 2", "start 3"});
  g2.post();
  g3.post();
  CHECK_FALSE(finished);
  g1.post();  // the last child to finish resumes the parent inline
  CHECK(finished);
  CHECK(log == std::vector<std::string>{"start 1", "start 2", "start 3", "end 2", "end 3", "end 1"});
  CHECK(result == std::make_tuple(1, 2, 3));
}

TEST_CASE("collectAll rethrows the first exception after every child finished", "[collectAll]") {
  Baton gFail1, gFail2, gSlow;
  std::vector<std::string> log;
  bool caught = false;
  std::string message;
  coio::testing::ManualExecutor ex;
  ex.spawn(awaitCatching(collectAll(failAfter(gFail1, "first"), failAfter(gFail2, "second"), gated(gSlow, log, 7)),
                         caught, message));
  ex.drain();
  gFail2.post();  // fails first in time
  gFail1.post();
  CHECK_FALSE(caught);  // still waiting for the slow child
  gSlow.post();
  CHECK(caught);
  CHECK(message == "second");
  CHECK(log.back() == "end 7");
}

TEST_CASE("collectAll rethrows an exception thrown as its child started, once the others finished", "[collectAll]") {
  Baton gLater, gSlow;
  std::vector<std::string> log;
  bool caught = false;
  std::string message;
  coio::testing::ManualExecutor ex;
  // The second child throws inside its start; the third throws later.
  ex.spawn(
      awaitCatching(collectAll(gated(gSlow, log, 1), failNow("now"), failAfter(gLater, "later")), caught, message));
  ex.drain();
  gLater.post();
  CHECK_FALSE(caught);
  gSlow.post();
  CHECK(caught);
  CHECK(message == "now");
}

TEST_CASE("collectAllRange mixes children that finish as they start, nested fan-outs and waiting children",
          "[collectAll]") {
  Baton gate, innerGate;
  std::vector<std::string> log;
  std::vector<int> result;
  bool finished = false;
  coio::testing::ManualExecutor ex;
  auto parent = [](Task<std::vector<int>> all, std::vector<int>& result, bool& finished) -> Task<void> {
    result = co_await std::move(all);
    finished = true;
  };
  std::vector<Task<int>> tasks;
  tasks.push_back(value(10));               // finishes as it starts
  tasks.push_back(nestedSum(nullptr));      // so does its own fan-out, inside its start
  tasks.push_back(gated(gate, log, 20));    // waits
  tasks.push_back(nestedSum(&innerGate));   // its fan-out waits
  tasks.push_back(value(30));
  ex.spawn(parent(collectAllRange(std::move(tasks)), result, finished));
  ex.drain();
  CHECK_FALSE(finished);
  innerGate.post();  // finishes the fourth child, inline
  CHECK_FALSE(finished);
  gate.post();
  CHECK(finished);
  CHECK(result == std::vector<int>{10, 3, 20, 7, 30});

  // All of it synchronous: the parent never suspends.
  std::vector<Task<int>> sync;
  for (int i = 0; i < 3; ++i) sync.push_back(nestedSum(nullptr));
  CHECK(blockingWait(collectAllRange(std::move(sync))) == std::vector<int>{3, 3, 3});
}

TEST_CASE("collectAllRange: long runs of children that finish as they start, broken by waiting and throwing ones",
          "[collectAll]") {
  // Children that finish as they start hand their values over and free
  // their frames, up to the first that waits or throws; the values of the
  // rest stay in their frames until the parent collects them.
  constexpr int kChildren = 1000;
  std::vector<Baton> gates(kChildren);
  auto child = [](coio::test::LifeTracker, Baton* gate, bool fail, int i) -> Task<int> {
    if (gate) co_await *gate;
    if (fail) throw std::runtime_error("child " + std::to_string(i));
    co_return i;
  };
  for (const bool failing : {false, true}) {
    std::vector<Task<int>> tasks;
    for (int i = 0; i < kChildren; ++i) {
      Baton* gate = i % 97 == 5 ? &gates[static_cast<std::size_t>(i)] : nullptr;
      tasks.push_back(child(coio::test::LifeTracker{}, gate, failing && (i == 300 || i == 301), i));
    }
    bool done = false;
    std::vector<int> results;
    std::string message;
    coio::testing::ManualExecutor ex;
    auto parent = [](Task<std::vector<int>> all, std::vector<int>& results, std::string& message,
                     bool& done) -> Task<void> {
      try {
        results = co_await std::move(all);
      } catch (const std::runtime_error& e) {
        message = e.what();
      }
      done = true;
    };
    ex.spawn(parent(collectAllRange(std::move(tasks)), results, message, done));
    ex.drain();
    CHECK_FALSE(done);
    for (int i = 5; i < kChildren; i += 97) gates[static_cast<std::size_t>(i)].post();
    CHECK(done);
    CHECK(coio::test::LifeTracker::alive == 0);
    if (failing) {
      CHECK(message == "child 300");
    } else {
      REQUIRE(results.size() == static_cast<std::size_t>(kChildren));
      for (int i = 0; i < kChildren; ++i) CHECK(results[static_cast<std::size_t>(i)] == i);
    }
    for (Baton& gate : gates) gate.reset();
  }
}

namespace {
// A value whose move may throw: such children keep their values in their
// frames (the final suspend, where they would hand them over, must not throw).
struct MayThrowOnMove {
  int v;
  explicit MayThrowOnMove(int value) : v(value) {}
  MayThrowOnMove(MayThrowOnMove&& other) noexcept(false) : v(other.v) {}
};
// Throws from its destructor once the body returned: after the value is set.
struct ThrowsOnExit {
  bool armed;
  ~ThrowsOnExit() noexcept(false) {
    if (armed) throw std::runtime_error("on exit");
  }
};
}  // namespace

TEST_CASE("collectAllRange: values handed over as children finish, then kept in frames", "[collectAll]") {
  using Tracked = std::unique_ptr<coio::test::LifeTracker>;
  auto tracked = [](Baton* gate) -> Task<Tracked> {
    if (gate) co_await *gate;
    co_return std::make_unique<coio::test::LifeTracker>();
  };
  {
    // Handed over (the first two), kept in frames (from the waiting one on).
    Baton gate;
    std::vector<Task<Tracked>> tasks;
    tasks.push_back(tracked(nullptr));
    tasks.push_back(tracked(nullptr));
    tasks.push_back(tracked(&gate));
    tasks.push_back(tracked(nullptr));
    std::vector<Tracked> results;
    bool done = false;
    coio::testing::ManualExecutor ex;
    auto parent = [](Task<std::vector<Tracked>> all, std::vector<Tracked>& results, bool& done) -> Task<void> {
      results = co_await std::move(all);
      done = true;
    };
    ex.spawn(parent(collectAllRange(std::move(tasks)), results, done));
    ex.drain();
    CHECK_FALSE(done);
    CHECK(coio::test::LifeTracker::alive == 3);
    gate.post();
    REQUIRE(done);
    REQUIRE(results.size() == 4);
    for (const Tracked& r : results) CHECK(r != nullptr);
    CHECK(coio::test::LifeTracker::alive == 4);
  }
  CHECK(coio::test::LifeTracker::alive == 0);

  // The frames of the children that finished as they started, all before
  // them too, are freed at once; the others wait for the parent.
  {
    auto framed = [](coio::test::LifeTracker, Baton* gate) -> Task<int> {
      if (gate) co_await *gate;
      co_return 1;
    };
    Baton gate;
    std::vector<Task<int>> tasks;
    tasks.push_back(framed(coio::test::LifeTracker{}, nullptr));
    tasks.push_back(framed(coio::test::LifeTracker{}, nullptr));
    tasks.push_back(framed(coio::test::LifeTracker{}, &gate));
    tasks.push_back(framed(coio::test::LifeTracker{}, nullptr));
    std::vector<int> results;
    coio::testing::ManualExecutor ex;
    ex.spawn([](Task<std::vector<int>> all, std::vector<int>& results) -> Task<void> {
      results = co_await std::move(all);
    }(collectAllRange(std::move(tasks)), results));
    ex.drain();
    CHECK(coio::test::LifeTracker::alive == 2);
    gate.post();
    CHECK(results == std::vector<int>{1, 1, 1, 1});
    CHECK(coio::test::LifeTracker::alive == 0);
  }

  // A child that throws after its value is set (a local's destructor), as
  // it starts: its exception, and no value leaks, handed over or not.
  {
    auto throwsOnExit = [](bool armed) -> Task<Tracked> {
      const ThrowsOnExit exit{armed};
      co_return std::make_unique<coio::test::LifeTracker>();
    };
    std::vector<Task<Tracked>> tasks;
    tasks.push_back(tracked(nullptr));
    tasks.push_back(throwsOnExit(false));
    tasks.push_back(throwsOnExit(true));
    tasks.push_back(tracked(nullptr));
    CHECK_THROWS_WITH(blockingWait(collectAllRange(std::move(tasks))), "on exit");
  }
  CHECK(coio::test::LifeTracker::alive == 0);

  // Values whose move may throw stay in the frames, in order.
  auto mayThrow = [](int v) -> Task<MayThrowOnMove> { co_return MayThrowOnMove(v); };
  std::vector<Task<MayThrowOnMove>> tasks;
  for (int i = 0; i < 5; ++i) tasks.push_back(mayThrow(i));
  const std::vector<MayThrowOnMove> got = blockingWait(collectAllRange(std::move(tasks)));
  REQUIRE(got.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(got[static_cast<std::size_t>(i)].v == i);

  // Void children: those that finish as they start free their frames, the
  // parent still waits for the rest.
  Baton gate;
  int ran = 0;
  auto counted = [](Baton* gate, int& ran) -> Task<void> {
    if (gate) co_await *gate;
    ++ran;
  };
  std::vector<Task<void>> voids;
  voids.push_back(counted(nullptr, ran));
  voids.push_back(counted(&gate, ran));
  voids.push_back(counted(nullptr, ran));
  bool done = false;
  coio::testing::ManualExecutor ex;
  ex.spawn([](Task<void> all, bool& done) -> Task<void> {
    co_await std::move(all);
    done = true;
  }(collectAllRange(std::move(voids)), done));
  ex.drain();
  CHECK(ran == 2);
  CHECK_FALSE(done);
  gate.post();
  CHECK(ran == 3);
  CHECK(done);
}

TEST_CASE("collectAllRange keeps input order and handles empty and void ranges", "[collectAll]") {
  std::vector<Task<int>> tasks;
  for (int i = 0; i < 100; ++i) tasks.push_back(value(i));
  auto results = blockingWait(collectAllRange(std::move(tasks)));
  REQUIRE(results.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(results[static_cast<std::size_t>(i)] == i);

  CHECK(blockingWait(collectAllRange(std::vector<Task<int>>{})).empty());

  int ran = 0;
  std::vector<Task<void>> voids;
  for (int i = 0; i < 3; ++i) voids.push_back([](int& ran) -> Task<void> { ++ran; co_return; }(ran));
  blockingWait(collectAllRange(std::move(voids)));
  CHECK(ran == 3);
}

TEST_CASE("collectAllRange frees every child frame, also on failure", "[collectAll]") {
  auto child = [](coio::test::LifeTracker, bool fail) -> Task<int> {
    if (fail) throw std::runtime_error("child");
    co_return 1;
  };
  {
    std::vector<Task<int>> tasks;
    for (int i = 0; i < 10; ++i) tasks.push_back(child(coio::test::LifeTracker{}, i == 4));
    CHECK(coio::test::LifeTracker::alive == 10);
    CHECK_THROWS_WITH(blockingWait(collectAllRange(std::move(tasks))), "child");
  }
  CHECK(coio::test::LifeTracker::alive == 0);
}

TEST_CASE("collectAllRange with children finished on other threads", "[collectAll][threads]") {
  constexpr int kChildren = 8;
  for (int round = 0; round < 50; ++round) {
    std::vector<Baton> gates(kChildren);
    std::vector<Task<int>> tasks;
    for (int i = 0; i < kChildren; ++i) {
      tasks.push_back([](Baton& g, int i) -> Task<int> {
        co_await g;
        co_return i * i;
      }(gates[static_cast<std::size_t>(i)], i));
    }
    std::vector<std::thread> posters;
    auto parent = [&]() -> Task<std::vector<int>> {
      auto all = collectAllRange(std::move(tasks));
      for (auto& g : gates) posters.emplace_back([&g] { g.post(); });
      co_return co_await std::move(all);
    };
    auto results = blockingWait(parent());
    for (auto& t : posters) t.join();
    for (int i = 0; i < kChildren; ++i) CHECK(results[static_cast<std::size_t>(i)] == i * i);
  }
}

TEST_CASE("collectAllRange: children finish on another thread while later ones still start", "[collectAll][threads]") {
  constexpr int kChildren = 64;
  for (int round = 0; round < 50; ++round) {
    std::vector<Baton> gates(kChildren);
    std::atomic<int> waiting{0};  // odd children that have started
    std::vector<Task<int>> tasks;
    for (int i = 0; i < kChildren; ++i) {
      if (i % 2 == 0) {
        tasks.push_back(value(i));  // finishes as it starts
      } else {
        tasks.push_back([](Baton& g, std::atomic<int>& waiting, int i) -> Task<int> {
          waiting.fetch_add(1, std::memory_order_relaxed);
          co_await g;  // resumed on the poster's thread, unless posted already
          co_return i;
        }(gates[static_cast<std::size_t>(i)], waiting, i));
      }
    }
    // Posts each odd child's gate as soon as that child has started.
    std::thread poster([&] {
      for (int k = 0; k < kChildren / 2; ++k) {
        while (waiting.load(std::memory_order_relaxed) <= k) std::this_thread::yield();
        gates[static_cast<std::size_t>(2 * k + 1)].post();
      }
    });
    const std::vector<int> results = blockingWait(collectAllRange(std::move(tasks)));
    poster.join();
    REQUIRE(results.size() == static_cast<std::size_t>(kChildren));
    for (int i = 0; i < kChildren; ++i) CHECK(results[static_cast<std::size_t>(i)] == i);
  }
}

TEST_CASE("collectAllWindowed runs at most `window` children at once and keeps input order", "[collectAll]") {
  for (const std::size_t window : {std::size_t{1}, std::size_t{3}, std::size_t{20}}) {
    coio::testing::ManualExecutor ex;
    int running = 0, maxRunning = 0;
    std::vector<int> started;
    std::vector<Task<int>> tasks;
    for (int i = 0; i < 10; ++i) {
      // Different lengths, so children finish out of order.
      tasks.push_back([](coio::testing::ManualExecutor& ex, int i, int& running, int& maxRunning,
                         std::vector<int>& started) -> Task<int> {
        started.push_back(i);
        maxRunning = std::max(maxRunning, ++running);
        for (int k = 0; k <= (i * 7) % 4; ++k) co_await ex.schedule();
        --running;
        co_return i * 10;
      }(ex, i, running, maxRunning, started));
    }
    std::vector<int> results;
    auto parent = [](Task<std::vector<int>> all, std::vector<int>& results) -> Task<void> {
      results = co_await std::move(all);
    };
    ex.spawn(parent(collectAllWindowed(std::move(tasks), window), results));
    ex.drain();
    INFO("window " << window);
    CHECK(maxRunning == static_cast<int>(std::min<std::size_t>(window, 10)));
    CHECK(running == 0);
    CHECK(started == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});  // started in input order
    REQUIRE(results.size() == 10);
    for (int i = 0; i < 10; ++i) CHECK(results[static_cast<std::size_t>(i)] == i * 10);
  }
}

TEST_CASE("collectAllWindowed: synchronous, empty and void ranges; a child starts when one finishes",
          "[collectAll]") {
  std::vector<Task<int>> tasks;
  for (int i = 0; i < 1000; ++i) tasks.push_back(value(i));  // all synchronous: constant stack
  const std::vector<int> results = blockingWait(collectAllWindowed(std::move(tasks), 2));
  REQUIRE(results.size() == 1000);
  CHECK(results[999] == 999);

  CHECK(blockingWait(collectAllWindowed(std::vector<Task<int>>{}, 4)).empty());

  // Window 2 over gated children: the third starts only once one of the
  // first two finished, on the thread (here: inline) that finished it.
  Baton g0, g1, g2;
  std::vector<std::string> log;
  std::vector<Task<void>> voids;
  voids.push_back([](Baton& g, std::vector<std::string>& log) -> Task<void> {
    co_await gated(g, log, 0);
  }(g0, log));
  voids.push_back([](Baton& g, std::vector<std::string>& log) -> Task<void> {
    co_await gated(g, log, 1);
  }(g1, log));
  voids.push_back([](Baton& g, std::vector<std::string>& log) -> Task<void> {
    co_await gated(g, log, 2);
  }(g2, log));
  bool finished = false;
  coio::AsyncScope scope;
  scope.spawn([](Task<void> all, bool& finished) -> Task<void> {
    co_await std::move(all);
    finished = true;
  }(collectAllWindowed(std::move(voids), 2), finished));
  CHECK(log == std::vector<std::string>{"start 0", "start 1"});
  g1.post();
  CHECK(log == std::vector<std::string>{"start 0", "start 1", "end 1", "start 2"});
  g2.post();
  g0.post();
  CHECK(finished);
  blockingWait(scope.join());
}

TEST_CASE("collectAllWindowed rethrows the first exception after every child ran", "[collectAll]") {
  int ran = 0;
  std::vector<Task<int>> tasks;
  for (int i = 0; i < 6; ++i) {
    tasks.push_back([](int i, int& ran) -> Task<int> {
      ++ran;
      if (i == 1 || i == 4) throw std::runtime_error("child " + std::to_string(i));
      co_return i;
    }(i, ran));
  }
  CHECK_THROWS_WITH(blockingWait(collectAllWindowed(std::move(tasks), 2)), "child 1");
  CHECK(ran == 6);
}

TEST_CASE("collectAllWindowed with children finished on other threads", "[collectAll][threads]") {
  constexpr int kChildren = 8;
  for (int round = 0; round < 50; ++round) {
    std::vector<Baton> gates(kChildren);
    std::atomic<int> running{0}, maxRunning{0};
    std::vector<Task<int>> tasks;
    for (int i = 0; i < kChildren; ++i) {
      tasks.push_back([](Baton& g, int i, std::atomic<int>& running, std::atomic<int>& maxRunning) -> Task<int> {
        const int now = ++running;
        int seen = maxRunning.load();
        while (now > seen && !maxRunning.compare_exchange_weak(seen, now)) {
        }
        co_await g;
        --running;
        co_return i * i;
      }(gates[static_cast<std::size_t>(i)], i, running, maxRunning));
    }
    std::vector<std::thread> posters;
    auto parent = [&]() -> Task<std::vector<int>> {
      auto all = collectAllWindowed(std::move(tasks), 3);
      for (auto& g : gates) posters.emplace_back([&g] { g.post(); });
      co_return co_await std::move(all);
    };
    auto results = blockingWait(parent());
    for (auto& t : posters) t.join();
    CHECK(maxRunning.load() <= 3);
    for (int i = 0; i < kChildren; ++i) CHECK(results[static_cast<std::size_t>(i)] == i * i);
  }
}

TEST_CASE("collectAll asserts on an empty Task and collectAllWindowed on a window of 0", "[collectAll]") {
  CHECK(coio::test::abortsInChild([] { (void)blockingWait(collectAll(Task<int>())); }));
  CHECK(coio::test::abortsInChild([] {
    std::vector<Task<int>> tasks(1);
    (void)blockingWait(collectAllRange(std::move(tasks)));
  }));
  CHECK(coio::test::abortsInChild([] {
    std::vector<Task<void>> tasks;
    tasks.push_back([]() -> Task<void> { co_return; }());
    (void)blockingWait(collectAllWindowed(std::move(tasks), 0));
  }));
}
