#include <coio/core/blocking_wait.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

using coio::LockGuard;
using coio::Mutex;
using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {
// Takes the lock, records `id` and keeps the lock: the test unlocks.
Task<void> lockAndRecord(Mutex& m, std::vector<int>& order, int id) {
  co_await m.lock();
  order.push_back(id);
}
}  // namespace

TEST_CASE("Mutex: uncontended lock, tryLock and unlock", "[mutex]") {
  Mutex m;
  CHECK_FALSE(m.isLocked());
  auto op = m.lock();
  CHECK(op.await_ready());  // free: taken without suspending
  CHECK(m.isLocked());
  CHECK_FALSE(m.tryLock());
  m.unlock();
  CHECK_FALSE(m.isLocked());
  CHECK(m.tryLock());
  m.unlock();
}

TEST_CASE("Mutex hands the lock to waiters in FIFO order, inline, and nobody barges", "[mutex]") {
  ManualExecutor ex;
  Mutex m;
  std::vector<int> order;
  REQUIRE(m.tryLock());
  for (int i = 0; i < 3; ++i) ex.spawn(lockAndRecord(m, order, i));
  ex.drain();
  CHECK(order.empty());

  m.unlock();  // resumes the oldest waiter inside this call
  CHECK(order == std::vector<int>{0});
  CHECK(m.isLocked());  // handed over, never free in between
  CHECK_FALSE(m.tryLock());
  ex.spawn(lockAndRecord(m, order, 99));  // a newcomer queues behind 1 and 2
  ex.drain();
  m.unlock();
  m.unlock();
  CHECK(order == std::vector<int>{0, 1, 2});
  m.unlock();
  CHECK(order == std::vector<int>{0, 1, 2, 99});
  m.unlock();
  CHECK_FALSE(m.isLocked());
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Mutex held across co_await keeps critical sections apart", "[mutex]") {
  // Each task reads the counter, yields to the executor while holding the
  // lock, then writes it back: without mutual exclusion the interleaved
  // tasks would lose increments.
  ManualExecutor ex;
  Mutex m;
  int counter = 0;
  int inside = 0, maxInside = 0;
  for (int t = 0; t < 4; ++t) {
    ex.spawn([](ManualExecutor& ex, Mutex& m, int& counter, int& inside, int& maxInside) -> Task<void> {
      for (int i = 0; i < 50; ++i) {
        auto guard = co_await m.scopedLock();
        maxInside = std::max(maxInside, ++inside);
        const int seen = counter;
        co_await ex.schedule();
        counter = seen + 1;
        --inside;
      }
    }(ex, m, counter, inside, maxInside));
  }
  ex.drain();
  CHECK(counter == 200);
  CHECK(maxInside == 1);
  CHECK_FALSE(m.isLocked());
}

TEST_CASE("Mutex::scopedLock yields a guard that unlocks once, however it ends", "[mutex]") {
  Mutex m;
  SECTION("destruction unlocks") {
    {
      auto guard = coio::blockingWait(m.scopedLock());
      CHECK(guard.ownsLock());
      CHECK(guard.mutex() == &m);
      CHECK(m.isLocked());
    }
    CHECK_FALSE(m.isLocked());
  }
  SECTION("unlock() releases early, and only once") {
    auto guard = coio::blockingWait(m.scopedLock());
    guard.unlock();
    CHECK_FALSE(guard);
    CHECK_FALSE(m.isLocked());
    guard.unlock();  // empty: nothing happens
    CHECK(m.tryLock());
    CHECK_FALSE(m.tryLock());  // a second release would have left a second token
    guard = LockGuard<Mutex>(m, std::adopt_lock);
  }
  SECTION("moving transfers ownership; move-assigning over a guard releases its lock") {
    Mutex other;
    auto a = coio::blockingWait(m.scopedLock());
    LockGuard<Mutex> b(std::move(a));
    CHECK_FALSE(a.ownsLock());
    CHECK(b.ownsLock());
    CHECK(m.isLocked());
    b = coio::blockingWait(other.scopedLock());
    CHECK_FALSE(m.isLocked());
    CHECK(other.isLocked());
    b = LockGuard<Mutex>();
    CHECK_FALSE(other.isLocked());
  }
  SECTION("the guard's release hands the lock to the next waiter") {
    ManualExecutor ex;
    std::vector<int> order;
    auto guard = coio::blockingWait(m.scopedLock());
    ex.spawn(lockAndRecord(m, order, 1));
    ex.drain();
    CHECK(order.empty());
    guard = {};
    CHECK(order == std::vector<int>{1});
    CHECK(m.isLocked());
    m.unlock();
  }
  CHECK_FALSE(m.isLocked());
}

TEST_CASE("Mutex: a cancelled lock leaves the queue and the next waiter gets the lock", "[mutex]") {
  ManualExecutor ex;
  Mutex m;
  REQUIRE(m.tryLock());
  std::stop_source timeout;
  std::vector<int> order;
  int firstResult = -1;
  bool guardEmpty = false;
  ex.spawn(coio::test::awaitInto(m.lock(timeout.get_token()), firstResult));
  ex.spawn([](Mutex& m, std::stop_token stop, bool& empty) -> Task<void> {
    auto guard = co_await m.scopedLock(stop);
    empty = !guard;
  }(m, timeout.get_token(), guardEmpty));
  ex.spawn(lockAndRecord(m, order, 3));
  ex.spawn(coio::test::stopAfter(ex, timeout, 10ms));
  ex.advance(9ms);
  CHECK(firstResult == -1);  // still waiting
  ex.advance(1ms);
  CHECK(firstResult == 0);
  CHECK(guardEmpty);
  CHECK(order.empty());
  m.unlock();  // the two cancelled waiters are gone: straight to the third
  CHECK(order == std::vector<int>{3});
  m.unlock();
  CHECK_FALSE(m.isLocked());
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Mutex: a cancellable lock takes a free lock even after stop, and gives up at once if held",
          "[mutex]") {
  Mutex m;
  const bool got = coio::blockingWait(m.lock(coio::test::stoppedToken()));
  CHECK(got);
  const bool again = coio::blockingWait(m.lock(coio::test::stoppedToken()));
  CHECK_FALSE(again);
  auto guard = coio::blockingWait(m.scopedLock(coio::test::stoppedToken()));
  CHECK_FALSE(guard.ownsLock());
  m.unlock();
  CHECK_FALSE(m.isLocked());
}

TEST_CASE("Mutex: a waiter whose frame is destroyed leaves the queue", "[mutex]") {
  Mutex m;
  REQUIRE(m.tryLock());
  bool ran = false;
  auto waiter = [](Mutex& m, bool& ran) -> coio::test::Eager {
    co_await m.lock();
    ran = true;
  }(m, ran);
  waiter.handle.destroy();  // under ASan, a later unlock touching it would be reported
  m.unlock();
  CHECK_FALSE(ran);
  CHECK_FALSE(m.isLocked());
}

TEST_CASE("Mutex asserts on unlock while not locked and on destruction with waiters", "[mutex]") {
  CHECK(coio::test::abortsInChild([] { Mutex().unlock(); }));
  CHECK(coio::test::abortsInChild([] {
    auto m = std::make_unique<Mutex>();
    (void)m->tryLock();
    [](Mutex& m) -> coio::test::Eager { co_await m.lock(); }(*m);
    m.reset();
  }));
}

TEST_CASE("Mutex: a counter incremented under the lock by 4 threads is exact", "[mutex][threads]") {
  // Plain int: TSan reports a race if any path lacks mutual exclusion or
  // the unlock -> lock ordering. Three threads block for each lock (their
  // critical sections stay on their own thread, and an occasional sleep
  // while holding the lock makes the others queue); the fourth runs one
  // coroutine, which migrates to whichever thread unlocks for it.
  constexpr int kThreads = 4, kIterations = 2000;
  Mutex m;
  int counter = 0;
  coio::test::onThreads(kThreads, [&](int t) {
    if (t == 0) {
      coio::blockingWait([&]() -> Task<void> {
        for (int i = 0; i < kIterations; ++i) {
          auto guard = co_await m.scopedLock();
          ++counter;
        }
      }());
      return;
    }
    for (int i = 0; i < kIterations; ++i) {
      if (t == 1 && m.tryLock()) {  // the lock-free path, mixed in
        ++counter;
        m.unlock();
        continue;
      }
      auto guard = coio::blockingWait(m.scopedLock());
      ++counter;
      if (i % 256 == 0) std::this_thread::sleep_for(20us);
    }
  });
  CHECK(counter == kThreads * kIterations);
  CHECK_FALSE(m.isLocked());
}

TEST_CASE("Mutex: a lock cancelled while another thread unlocks neither leaks nor loses the lock",
          "[mutex][threads]") {
  for (int round = 0; round < 300; ++round) {
    Mutex m;
    REQUIRE(m.tryLock());
    std::stop_source stop;
    std::thread canceller([&] { stop.request_stop(); });
    std::thread unlocker([&] { m.unlock(); });
    const bool got = coio::blockingWait(m.lock(stop.get_token()));
    canceller.join();
    unlocker.join();
    CHECK(m.isLocked() == got);  // held exactly when this waiter got it
    if (got) m.unlock();
    CHECK(m.tryLock());
    m.unlock();
  }
}
