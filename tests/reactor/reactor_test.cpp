// The loop itself, on every reactor: run / runUntil / stop, spawn and
// schedule from the loop and from other threads, and what stop() destroys.
#include "test_reactors.hpp"

#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using coio::testing::TestReactors;

static_assert(coio::Reactor<coio::EpollReactor>);

namespace {

// Counts live coroutine frames that hold one.
struct FrameCounter {
  explicit FrameCounter(std::atomic<int>& n) : live(n) { ++live; }
  FrameCounter(const FrameCounter&) = delete;
  ~FrameCounter() { --live; }
  std::atomic<int>& live;
};

template <typename R>
Task<int> answerAfterYield(R& reactor) {
  co_await reactor.schedule();
  co_return 42;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("runUntil returns the task's value and rethrows its exception", "[reactor]", TestReactors) {
  TestType reactor;
  CHECK(reactor.runUntil(answerAfterYield(reactor)) == 42);
  auto throwing = [](TestType& r) -> Task<void> {
    co_await r.schedule();
    throw std::runtime_error("boom");
  };
  CHECK_THROWS_WITH(reactor.runUntil(throwing(reactor)), "boom");
  // The reactor is still usable.
  CHECK(reactor.runUntil(answerAfterYield(reactor)) == 42);
}

TEMPLATE_LIST_TEST_CASE("the loop thread is the one inside runUntil", "[reactor]", TestReactors) {
  TestType reactor;
  CHECK_FALSE(reactor.isInLoopThread());
  auto check = [](TestType& r) -> Task<bool> {
    co_await r.sleepFor(1ms);
    co_return r.isInLoopThread();
  };
  CHECK(reactor.runUntil(check(reactor)));
  CHECK_FALSE(reactor.isInLoopThread());
}

TEMPLATE_LIST_TEST_CASE("spawned tasks start on a later iteration, in order", "[reactor]", TestReactors) {
  TestType reactor;
  std::vector<int> order;
  auto child = [](std::vector<int>& out, int i) -> Task<void> {
    out.push_back(i);
    co_return;
  };
  auto parent = [&](TestType& r) -> Task<void> {
    for (int i = 0; i < 3; ++i) r.spawn(child(order, i));
    CHECK(order.empty());  // not inline
    co_await r.schedule();
    co_await r.schedule();
  };
  reactor.runUntil(parent(reactor));
  CHECK(order == std::vector<int>{0, 1, 2});
}

TEMPLATE_LIST_TEST_CASE("an exception escaping a spawned task stops the reactor and is rethrown",
                        "[reactor]", TestReactors) {
  TestType reactor;
  auto failing = []() -> Task<void> {
    throw std::runtime_error("spawned failure");
    co_return;
  };
  reactor.spawn(failing());
  CHECK_THROWS_WITH(reactor.run(), "spawned failure");
  CHECK(reactor.stopRequested());
}

TEMPLATE_LIST_TEST_CASE("spawn and schedule from another thread wake a sleeping loop", "[reactor][threads]",
                        TestReactors) {
  TestType reactor;
  std::atomic<bool> ranOnLoop{false};
  std::thread loop([&] { reactor.run(); });

  // spawn from a foreign thread: the task runs on the loop thread.
  coio::Baton spawnedRan;
  auto spawned = [&]() -> Task<void> {
    ranOnLoop = reactor.isInLoopThread();
    spawnedRan.post();
    co_return;
  };
  reactor.spawn(spawned());
  coio::blockingWait(spawnedRan);
  CHECK(ranOnLoop);

  // schedule from a foreign thread hops onto the loop thread.
  auto hop = [&]() -> Task<std::thread::id> {
    co_await reactor.schedule();
    co_return std::this_thread::get_id();
  };
  const std::thread::id where = coio::blockingWait(hop());
  CHECK(where == loop.get_id());

  reactor.stop();
  loop.join();
}

TEMPLATE_LIST_TEST_CASE("cross-thread schedule wake-up latency is sane", "[reactor][threads]", TestReactors) {
  TestType reactor;
  std::thread loop([&] { reactor.run(); });
  using Clock = std::chrono::steady_clock;
  // The loop sleeps (nothing to do) each time; each hop must wake it.
  auto hop = [&]() -> Task<Clock::duration> {
    const auto start = Clock::now();
    co_await reactor.schedule();
    co_return Clock::now() - start;
  };
  std::vector<Clock::duration> samples;
  for (int i = 0; i < 200; ++i) {
    samples.push_back(coio::blockingWait(hop()));
    std::this_thread::sleep_for(100us);  // let the loop go back to sleep: not a synchronisation
  }
  std::sort(samples.begin(), samples.end());
  const auto median = samples[samples.size() / 2];
  INFO("median wake-up " << std::chrono::duration_cast<std::chrono::microseconds>(median).count() << " us");
  // Generous bounds (a loaded CI VM, sanitizers): a lost wake-up shows as a
  // hang, a missing wake-up as the loop never waking at all.
  CHECK(median < 20ms);
  CHECK(samples.back() < 1s);
  reactor.stop();
  loop.join();
}

TEMPLATE_LIST_TEST_CASE("stop from another thread ends run", "[reactor][threads]", TestReactors) {
  TestType reactor;
  coio::Baton started;
  auto sleeper = [&]() -> Task<void> {
    started.post();
    co_await reactor.sleepFor(1h);
  };
  reactor.spawn(sleeper());
  std::thread loop([&] { reactor.run(); });
  coio::blockingWait(started);
  reactor.stop();
  loop.join();
  // Final: run returns at once, spawn destroys the task unrun.
  reactor.run();
  std::atomic<int> live{0};
  auto counted = [](std::atomic<int>& n) -> Task<void> {
    FrameCounter c(n);
    co_return;
  };
  reactor.spawn(counted(live));
  CHECK(live == 0);
}

TEMPLATE_LIST_TEST_CASE("stop with operations pending destroys every frame and leaks no fd", "[reactor]",
                        TestReactors) {
  const std::size_t fdsBefore = coio::testing::openFdCount();
  std::atomic<int> live{0};
  {
    int pipeFds[2];
    REQUIRE(::pipe2(pipeFds, O_NONBLOCK | O_CLOEXEC) == 0);
    coio::detail::FileDescriptor readEnd(pipeFds[0]), writeEnd(pipeFds[1]);
    TestType reactor;  // destroyed first: its tasks wait on the pipe

    auto waitReadable = [](TestType& r, int fd, std::atomic<int>& n) -> Task<void> {
      FrameCounter c(n);
      (void)co_await r.readable(fd);
      FAIL("resumed after stop");
    };
    auto nestedSleeper = [](TestType& r, std::atomic<int>& n) -> Task<void> {
      FrameCounter c(n);
      auto inner = [](TestType& rr, std::atomic<int>& nn) -> Task<void> {
        FrameCounter c2(nn);
        co_await rr.sleepFor(1h);
      };
      co_await inner(r, n);
    };
    auto stopper = [](TestType& r) -> Task<void> {
      co_await r.sleepFor(5ms);
      r.stop();
    };
    for (int i = 0; i < 10; ++i) reactor.spawn(nestedSleeper(reactor, live));
    reactor.spawn(waitReadable(reactor, readEnd.get(), live));
    reactor.spawn(stopper(reactor));
    reactor.run();
    CHECK(live == 21);  // suspended, not yet destroyed
  }
  CHECK(live == 0);
  CHECK(coio::testing::openFdCount() == fdsBefore);
}

TEMPLATE_LIST_TEST_CASE("runUntil throws closed if the reactor stops first", "[reactor]", TestReactors) {
  TestType reactor;
  std::atomic<int> live{0};
  auto stopThenSleep = [](TestType& r, std::atomic<int>& n) -> Task<int> {
    FrameCounter c(n);
    r.stop();
    co_await r.sleepFor(1h);
    co_return 1;
  };
  try {
    (void)reactor.runUntil(stopThenSleep(reactor, live));
    FAIL("runUntil returned");
  } catch (const std::system_error& e) {
    CHECK(e.code() == coio::Errc::closed);
  }
  CHECK(live == 0);
}

TEMPLATE_LIST_TEST_CASE("ReactorPool runs tasks round-robin, each on its reactor's thread", "[reactor][pool][threads]",
                        TestReactors) {
  constexpr int kTasks = 100;
  std::atomic<int> onOwnThread{0}, finished{0};
  coio::Baton allDone;
  std::mutex mutex;
  std::vector<std::thread::id> threads;
  {
    coio::ReactorPool<TestType> pool(2);
    CHECK(pool.size() == 2);
    auto task = [&](TestType& r) -> Task<void> {
      co_await r.sleepFor(1ms);
      if (r.isInLoopThread()) ++onOwnThread;
      {
        std::lock_guard lock(mutex);
        threads.push_back(std::this_thread::get_id());
      }
      if (++finished == kTasks) allDone.post();
    };
    for (int i = 0; i < kTasks; ++i) {
      TestType& r = pool.next();
      r.spawn(task(r));
    }
    coio::blockingWait(allDone);
    pool.stop();
  }
  CHECK(onOwnThread == kTasks);
  std::sort(threads.begin(), threads.end());
  CHECK(std::unique(threads.begin(), threads.end()) - threads.begin() == 2);
}

TEMPLATE_LIST_TEST_CASE("ReactorPool::stop rethrows what escaped a spawned task", "[reactor][pool][threads]",
                        TestReactors) {
  coio::ReactorPool<TestType> pool(2);
  auto failing = []() -> Task<void> {
    throw std::runtime_error("pool failure");
    co_return;
  };
  pool.spawn(failing());  // onto reactor 0
  while (!pool.reactor(0).stopRequested()) std::this_thread::yield();  // the failure stopped it
  CHECK_THROWS_WITH(pool.stop(), "pool failure");
}
