#include <coio/core/blocking_wait.hpp>
#include <coio/core/shared_mutex.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

using coio::LockGuard;
using coio::LockKind;
using coio::SharedMutex;
using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {
// Records "r<id>" / "w<id>" once it holds the lock, and keeps it: the test
// releases it.
Task<void> reader(SharedMutex& m, std::vector<std::string>& order, int id) {
  co_await m.lockShared();
  order.push_back("r" + std::to_string(id));
}
Task<void> writer(SharedMutex& m, std::vector<std::string>& order, int id) {
  co_await m.lock();
  order.push_back("w" + std::to_string(id));
}
using Order = std::vector<std::string>;
}  // namespace

TEST_CASE("SharedMutex: readers share, a writer excludes everyone", "[sharedMutex]") {
  SharedMutex m;
  CHECK(m.tryLockShared());
  CHECK(m.tryLockShared());
  CHECK_FALSE(m.tryLock());
  m.unlockShared();
  CHECK_FALSE(m.tryLock());
  m.unlockShared();
  CHECK(m.tryLock());
  CHECK_FALSE(m.tryLockShared());
  CHECK_FALSE(m.tryLock());
  m.unlock();
  auto op = m.lockShared();
  CHECK(op.await_ready());  // free: no suspension
  m.unlockShared();
}

TEST_CASE("SharedMutex: a queued writer blocks later readers, and is served when the readers leave",
          "[sharedMutex]") {
  ManualExecutor ex;
  SharedMutex m;
  Order order;
  ex.spawn(reader(m, order, 1));
  ex.spawn(reader(m, order, 2));
  ex.drain();
  CHECK(order == Order{"r1", "r2"});  // readers share at once
  ex.spawn(writer(m, order, 1));
  ex.spawn(reader(m, order, 3));  // writer preference: waits behind w1 although readers hold the lock
  ex.drain();
  CHECK(order == Order{"r1", "r2"});
  CHECK_FALSE(m.tryLockShared());  // no barging past the queue either
  m.unlockShared();
  CHECK(order == Order{"r1", "r2"});
  m.unlockShared();  // the last reader out resumes the writer inline
  CHECK(order == Order{"r1", "r2", "w1"});
  m.unlock();
  CHECK(order == Order{"r1", "r2", "w1", "r3"});
  m.unlockShared();
  CHECK(m.tryLock());
  m.unlock();
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("SharedMutex serves one FIFO queue: consecutive readers together, writers alone", "[sharedMutex]") {
  ManualExecutor ex;
  SharedMutex m;
  Order order;
  REQUIRE(m.tryLock());
  ex.spawn(reader(m, order, 1));
  ex.spawn(reader(m, order, 2));
  ex.spawn(writer(m, order, 2));
  ex.spawn(reader(m, order, 3));
  ex.spawn(reader(m, order, 4));
  ex.spawn(writer(m, order, 3));
  ex.drain();
  CHECK(order.empty());
  m.unlock();  // the batch of readers at the head, not the readers behind w2
  CHECK(order == Order{"r1", "r2"});
  m.unlockShared();
  m.unlockShared();
  CHECK(order == Order{"r1", "r2", "w2"});
  m.unlock();
  CHECK(order == Order{"r1", "r2", "w2", "r3", "r4"});
  m.unlockShared();
  m.unlockShared();
  CHECK(order == Order{"r1", "r2", "w2", "r3", "r4", "w3"});
  m.unlock();
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("SharedMutex: readers behind a cancelled writer join the readers holding the lock", "[sharedMutex]") {
  ManualExecutor ex;
  SharedMutex m;
  Order order;
  std::stop_source timeout;
  bool writerGot = true;
  REQUIRE(m.tryLockShared());
  ex.spawn([](SharedMutex& m, std::stop_token stop, bool& got) -> Task<void> {
    auto guard = co_await m.scopedLock(stop);
    got = guard.ownsLock();
  }(m, timeout.get_token(), writerGot));
  ex.spawn(reader(m, order, 1));
  ex.spawn(coio::test::stopAfter(ex, timeout, 5ms));
  ex.drain();
  CHECK(order.empty());
  ex.advance(5ms);
  CHECK_FALSE(writerGot);
  CHECK(order == Order{"r1"});
  m.unlockShared();
  m.unlockShared();
  CHECK(m.tryLock());
  m.unlock();
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("SharedMutex: cancellable acquisitions of either kind", "[sharedMutex]") {
  SharedMutex m;
  const std::stop_token stop = coio::test::stoppedToken();
  // Free: taken even though stop was requested.
  const bool shared = coio::blockingWait(m.lockShared(stop));
  CHECK(shared);
  // Held shared: a writer gives up at once.
  const bool exclusive = coio::blockingWait(m.lock(stop));
  CHECK_FALSE(exclusive);
  m.unlockShared();
  CHECK(coio::blockingWait(m.lock(stop)));
  auto guard = coio::blockingWait(m.scopedLockShared(stop));
  CHECK_FALSE(guard.ownsLock());
  m.unlock();
}

TEST_CASE("SharedMutex guards release the kind of lock they hold", "[sharedMutex]") {
  SharedMutex m;
  {
    LockGuard<SharedMutex, LockKind::shared> a = coio::blockingWait(m.scopedLockShared());
    auto b = coio::blockingWait(m.scopedLockShared());
    CHECK(a.ownsLock());
    CHECK(b.ownsLock());
    CHECK_FALSE(m.tryLock());
    a.unlock();
    CHECK_FALSE(m.tryLock());  // b still reads
  }
  {
    LockGuard<SharedMutex> w = coio::blockingWait(m.scopedLock());
    CHECK_FALSE(m.tryLockShared());
  }
  CHECK(m.tryLock());
  m.unlock();
}

TEST_CASE("SharedMutex asserts on releases of a lock not held", "[sharedMutex]") {
  CHECK(coio::test::abortsInChild([] { SharedMutex().unlock(); }));
  CHECK(coio::test::abortsInChild([] { SharedMutex().unlockShared(); }));
  CHECK(coio::test::abortsInChild([] {
    SharedMutex m;
    (void)m.tryLockShared();
    m.unlock();  // held shared, not exclusively
  }));
}

TEST_CASE("SharedMutex: readers never see a writer inside, and writes are exact, across threads",
          "[sharedMutex][threads]") {
  // Writers update two plain ints that readers check for consistency: TSan
  // reports a race if exclusion or the release -> acquire ordering is
  // missing on any path. Threads 1-3 block for each lock and sometimes
  // sleep holding it, so the others queue; thread 0 runs one coroutine.
  constexpr int kThreads = 4, kIterations = 2000;
  SharedMutex m;
  int a = 0, b = 0;
  std::atomic<int> torn{0};
  auto write = [&] {
    ++a;
    ++b;
  };
  auto read = [&] {
    if (a != b) ++torn;
  };
  coio::test::onThreads(kThreads, [&](int t) {
    if (t == 0) {
      coio::blockingWait([&]() -> Task<void> {
        for (int i = 0; i < kIterations; ++i) {
          if (i % 4 == 0) {
            auto guard = co_await m.scopedLock();
            write();
          } else {
            auto guard = co_await m.scopedLockShared();
            read();
          }
        }
      }());
      return;
    }
    for (int i = 0; i < kIterations; ++i) {
      if ((i + t) % 4 == 0) {
        auto guard = coio::blockingWait(m.scopedLock());
        write();
      } else {
        auto guard = coio::blockingWait(m.scopedLockShared());
        read();
      }
      if (i % 256 == 0) std::this_thread::sleep_for(20us);
    }
  });
  CHECK(torn == 0);
  CHECK(a == kThreads * kIterations / 4);
  CHECK(b == a);
  CHECK(m.tryLock());
  m.unlock();
}
