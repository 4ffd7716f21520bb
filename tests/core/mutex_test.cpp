#include <coio/core/blocking_wait.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
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

// Queued at once (it starts eagerly) and never resumed: the test destroys it
// while it waits. Cancellable if `stop` can be stopped.
coio::test::Eager lockForever(Mutex& m, std::stop_token stop = {}) {
  if (stop.stop_possible()) {
    const bool got = co_await m.lock(std::move(stop));
    CHECK(false);  // never reached: the frame is destroyed first
    (void)got;
  } else {
    co_await m.lock();
    CHECK(false);
  }
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
  // The engine keeps the waiters it has taken in a list of the holder's and
  // newer ones in a stack it reverses once that list runs out: newcomers
  // queue while older waiters are still in the list, so the order must hold
  // across both.
  ManualExecutor ex;
  Mutex m;
  std::vector<int> order;
  REQUIRE(m.tryLock());
  for (int i = 0; i < 3; ++i) ex.spawn(lockAndRecord(m, order, i));
  ex.drain();
  CHECK(order.empty());

  m.unlock();  // resumes the oldest waiter inside this call; 1 and 2 now in the holder's list
  CHECK(order == std::vector<int>{0});
  CHECK(m.isLocked());  // handed over, never free in between
  CHECK_FALSE(m.tryLock());
  for (int i = 3; i < 5; ++i) ex.spawn(lockAndRecord(m, order, i));  // newcomers queue behind 1 and 2
  ex.drain();
  m.unlock();
  CHECK(order == std::vector<int>{0, 1});
  ex.spawn(lockAndRecord(m, order, 5));
  ex.drain();
  for (int i = 0; i < 4; ++i) m.unlock();
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK_FALSE(m.tryLock());
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

TEST_CASE("Mutex: waiters that give up or die anywhere in the queue are skipped, in order", "[mutex]") {
  // Cancelled and destroyed waiters, both plain and cancellable, in the
  // holder's list and in the stack of newer waiters. Under ASan a node
  // touched after its frame died, or a proxy leaked, is reported.
  ManualExecutor ex;
  Mutex m;
  std::vector<int> order;
  std::stop_source stopA, stopB, neverStopped;
  int resultA = -1, resultB = -1;
  REQUIRE(m.tryLock());
  ex.spawn(lockAndRecord(m, order, 0));
  ex.spawn(coio::test::awaitInto(m.lock(stopA.get_token()), resultA));
  ex.drain();
  auto plain1 = lockForever(m);
  auto cancellable1 = lockForever(m, neverStopped.get_token());
  ex.spawn(lockAndRecord(m, order, 1));
  ex.drain();
  m.unlock();  // to 0: A, plain1, cancellable1 and 1 move to the holder's list
  CHECK(order == std::vector<int>{0});
  ex.spawn(coio::test::awaitInto(m.lock(stopB.get_token()), resultB));
  ex.drain();
  auto plain2 = lockForever(m);
  auto cancellable2 = lockForever(m, neverStopped.get_token());
  ex.spawn(lockAndRecord(m, order, 2));
  ex.drain();  // B, plain2, cancellable2 and 2 in the stack

  stopA.request_stop();  // resumed at once, with false
  CHECK(resultA == 0);
  stopB.request_stop();
  CHECK(resultB == 0);
  plain1.handle.destroy();
  cancellable1.handle.destroy();
  plain2.handle.destroy();
  cancellable2.handle.destroy();
  CHECK(m.isLocked());
  m.unlock();
  CHECK(order == std::vector<int>{0, 1});
  m.unlock();
  CHECK(order == std::vector<int>{0, 1, 2});
  m.unlock();
  CHECK_FALSE(m.isLocked());
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Mutex destroyed while held with a waiter that gave up still queued frees its node", "[mutex]") {
  ManualExecutor ex;
  auto m = std::make_unique<Mutex>();
  REQUIRE(m->tryLock());
  std::stop_source stop;
  int result = -1;
  ex.spawn(coio::test::awaitInto(m->lock(stop.get_token()), result));
  ex.drain();
  stop.request_stop();
  CHECK(result == 0);
  m.reset();  // the holder never passed the cancelled node: the destructor frees it (ASan: no leak)
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
  CHECK(coio::test::abortsInChild([] {
    auto m = std::make_unique<Mutex>();
    std::stop_source stop;
    (void)m->tryLock();
    lockForever(*m, stop.get_token());
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

namespace {
// Stop sources of the stress test's cancellable locks, one slot per
// coroutine, that the canceller thread and lock holders request stop on.
class StopBoard {
 public:
  explicit StopBoard(std::size_t slots) : sources_(slots) {}
  std::size_t size() const noexcept { return sources_.size(); }
  void post(std::size_t slot, std::stop_source source) {
    std::lock_guard lock(mutex_);
    sources_[slot] = std::move(source);
  }
  void stop(std::size_t slot) {
    std::stop_source source;
    {
      std::lock_guard lock(mutex_);
      source = sources_[slot];
    }
    source.request_stop();
  }

 private:
  std::mutex mutex_;
  std::vector<std::stop_source> sources_;
};

// A run queue per thread for the stress test. yield(n) moves the coroutine
// to the back of queue n % threads, so that the coroutines keep changing
// threads (besides being resumed by whichever thread unlocks or requests
// stop) and the threads' turns overlap.
class RunQueues {
 public:
  explicit RunQueues(int threads) : queues_(std::size_t(threads)) {}

  auto yield(std::size_t n) noexcept {
    struct Awaiter {
      Queue& queue;
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) {
        std::lock_guard lock(queue.mutex);
        queue.ready.push_back(h);
      }
      void await_resume() noexcept {}
    };
    return Awaiter{queues_[n % queues_.size()]};
  }

  // Resumes one coroutine of queue `t`; false if it is empty.
  bool runOne(int t) {
    Queue& queue = queues_[std::size_t(t)];
    std::coroutine_handle<> h;
    {
      std::lock_guard lock(queue.mutex);
      if (queue.ready.empty()) return false;
      h = queue.ready.front();
      queue.ready.pop_front();
    }
    h.resume();
    return true;
  }

 private:
  struct Queue {
    std::mutex mutex;
    std::deque<std::coroutine_handle<>> ready;
  };
  std::vector<Queue> queues_;
};

// Every other lock is cancellable (odd coroutines start with one), with a
// token the canceller thread may stop at any moment: while it queues, while
// it waits, or as it is handed the lock; holders stop others' too, which
// likely wait behind them. Holders often yield while holding the lock, so
// the other coroutines queue behind them.
Task<void> lockInALoop(Mutex& m, RunQueues& queues, int& counter, std::atomic<int>& gaveUp, StopBoard& board,
                       std::size_t slot, int iterations) {
  for (int i = 0; i < iterations; ++i) {
    LockGuard<Mutex> guard;
    if ((i + slot) % 2 == 0) {
      guard = co_await m.scopedLock();
    } else {
      std::stop_source stop;
      board.post(slot, stop);
      guard = co_await m.scopedLock(stop.get_token());
    }
    if (!guard) {
      gaveUp.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const int seen = counter;
    if (i % 2 == 0) co_await queues.yield(slot + std::size_t(i));
    counter = seen + 1;  // an increment lost if anyone else got in meanwhile
    if (i % 4 == 0) board.stop((slot * 7 + std::size_t(i)) % board.size());
  }
}

// Runs `task` at once; counts it in `finished` when it is done.
coio::test::Eager runCounted(Task<void> task, std::atomic<int>& finished) {
  co_await std::move(task);
  finished.fetch_add(1, std::memory_order_release);
}
}  // namespace

TEST_CASE("Mutex: threads x coroutines lock, some cancellably, while stop races with hand-overs",
          "[mutex][threads]") {
  // A plain int that only the mutex protects, read before and written after
  // a suspension inside the critical section (TSan also checks each
  // hand-over's ordering). Waiters are resumed by whichever thread unlocks
  // or requests stop, so the coroutines migrate between the threads.
  constexpr int kThreads = 3, kCoroutines = 6, kIterations = 200;
  constexpr int kTasks = kThreads * kCoroutines;
  Mutex m;
  RunQueues queues(kThreads);
  int counter = 0;
  std::atomic<int> gaveUp{0}, finished{0};
  StopBoard board(kTasks);
  std::vector<coio::test::Eager> frames(kTasks);
  std::thread canceller([&] {
    std::uint32_t x = 1;
    while (finished.load(std::memory_order_acquire) < kTasks) {
      x = x * 1103515245u + 12345u;
      board.stop((x >> 8) % board.size());
      std::this_thread::yield();
    }
  });
  coio::test::onThreads(kThreads, [&](int t) {
    for (int c = 0; c < kCoroutines; ++c) {
      const std::size_t slot = std::size_t(t * kCoroutines + c);
      frames[slot] = runCounted(lockInALoop(m, queues, counter, gaveUp, board, slot, kIterations), finished);
    }
    while (finished.load(std::memory_order_acquire) < kTasks) {
      if (!queues.runOne(t)) std::this_thread::yield();
    }
  });
  canceller.join();
  for (auto& frame : frames) frame.handle.destroy();
  CHECK(counter + gaveUp.load() == kTasks * kIterations);
  CHECK(gaveUp.load() > 0);  // the stop requests did reach waiters
  CHECK(counter >= kTasks * kIterations / 2);  // the plain half always gets it
  CHECK_FALSE(m.isLocked());
}
