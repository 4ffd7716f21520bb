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
#include <future>
#include <latch>
#include <mutex>
#include <semaphore>
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
  CHECK(samples.back() < 3s);
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
    coio::FileDescriptor readEnd(pipeFds[0]), writeEnd(pipeFds[1]);
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

// --- Teardown order, failures on other threads, spawn after stop. ---

namespace {

// Posts a Baton when the frame holding it is destroyed.
struct PostOnDestroy {
  coio::Baton& baton;
  ~PostOnDestroy() { baton.post(); }
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("destroying a task can finish another spawned task during teardown", "[reactor]",
                        TestReactors) {
  // The reactor destroys its roots newest first: `poster`'s frame posts
  // `baton` as it dies, which resumes `waiter` inline; `waiter` finishes
  // and unlinks itself while the reactor is still tearing down. Before the
  // fix, that unlink wrote into `poster`'s freed frame and `waiter` was then
  // destroyed a second time (ASan: heap-use-after-free; otherwise `live`
  // went negative).
  coio::Baton baton;
  coio::Baton untouched;  // a waiter of it is destroyed with the reactor
  std::atomic<int> live{0};
  bool waiterResumed = false;
  {
    TestType reactor;
    auto waiter = [](coio::Baton& b, std::atomic<int>& n, bool& resumed) -> Task<void> {
      FrameCounter c(n);
      co_await b;
      resumed = true;
    };
    auto poster = [](TestType& r, coio::Baton& b, std::atomic<int>& n) -> Task<void> {
      FrameCounter c(n);
      PostOnDestroy post{b};
      co_await r.sleepFor(1h);
    };
    auto otherWaiter = [](coio::Baton& b, std::atomic<int>& n) -> Task<void> {
      FrameCounter c(n);
      co_await b;
      FAIL("resumed after its frame was destroyed");
    };
    reactor.spawn(otherWaiter(untouched, live));
    reactor.spawn(waiter(baton, live, waiterResumed));
    reactor.spawn(poster(reactor, baton, live));
    auto settle = [](TestType& r) -> Task<void> {
      co_await r.schedule();
      co_await r.schedule();
    };
    reactor.runUntil(settle(reactor));
    CHECK(live == 3);
    CHECK_FALSE(waiterResumed);
  }
  CHECK(waiterResumed);
  CHECK(live == 0);
  // otherWaiter's frame left the Baton's list when it was destroyed: this
  // post resumes nothing (before the fix: it resumed the freed frame).
  untouched.post();
  CHECK(untouched.ready());
}

TEMPLATE_LIST_TEST_CASE("a task that throws after hopping to another reactor stops its own reactor",
                        "[reactor][threads]", TestReactors) {
  // Two tasks of `home` hop to two other reactors' threads and throw there
  // at the same moment: fail() runs on foreign threads, concurrently (TSan
  // saw the unguarded failure slot race), and must wake `home`, whose loop
  // sleeps (before the fix only the watchdog ended it, 3 s later).
  using Clock = std::chrono::steady_clock;
  TestType home, b, c;
  std::thread tb([&] { b.run(); });
  std::thread tc([&] { c.run(); });
  std::latch bothAway(2);
  auto hopAndThrow = [](TestType& to, std::latch& together) -> Task<void> {
    co_await to.schedule();
    together.arrive_and_wait();
    throw std::runtime_error("failed abroad");
  };
  auto watchdog = [](TestType& r) -> Task<void> {
    co_await r.sleepFor(3s);
    r.stop();
  };
  home.spawn(watchdog(home));
  home.spawn(hopAndThrow(b, bothAway));
  home.spawn(hopAndThrow(c, bothAway));
  const auto start = Clock::now();
  CHECK_THROWS_WITH(home.run(), "failed abroad");
  CHECK(Clock::now() - start < 2s);
  CHECK(home.stopRequested());
  b.stop();
  c.stop();
  tb.join();
  tc.join();
}

TEMPLATE_LIST_TEST_CASE("spawn on a stopped reactor destroys the task at once", "[reactor]", TestReactors) {
  // runOn() of the storage server: a thread waits on a future the task sets.
  // Before the fix the task sat in the stopped reactor until its
  // destruction, and the waiting thread hung.
  TestType reactor;
  reactor.stop();
  reactor.run();  // returns at once: stopped
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  reactor.spawn([](std::promise<void> p) -> Task<void> {
    p.set_value();
    co_return;
  }(std::move(done)));
  REQUIRE(finished.wait_for(0s) == std::future_status::ready);
  CHECK_THROWS_AS(finished.get(), std::future_error);  // broken promise: it never ran
}

TEMPLATE_LIST_TEST_CASE("a task spawned just before stop is destroyed unrun when the loop stops",
                        "[reactor][threads]", TestReactors) {
  TestType reactor;
  std::binary_semaphore release{0};
  std::atomic<bool> blocking{false};
  // Holds the loop thread until the spawn and the stop below are done, so
  // that the loop sees the stop before it could start the task.
  auto blocker = [](std::binary_semaphore& go, std::atomic<bool>& started) -> Task<void> {
    started = true;
    go.acquire();
    co_return;
  };
  reactor.spawn(blocker(release, blocking));
  std::thread loop([&] { reactor.run(); });
  while (!blocking) std::this_thread::yield();

  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::atomic<bool> ran{false};
  reactor.spawn([](std::promise<void> p, std::atomic<bool>& r) -> Task<void> {
    r = true;
    p.set_value();
    co_return;
  }(std::move(done), ran));
  reactor.stop();
  release.release();
  const bool settled = finished.wait_for(10s) == std::future_status::ready;
  loop.join();
  REQUIRE(settled);  // before the fix: the task stayed parked until the reactor's destruction
  CHECK_THROWS_AS(finished.get(), std::future_error);
  CHECK_FALSE(ran);
}
