// Stop tokens through trees of Tasks: currentStopToken, withStopToken,
// inheritance by awaited Tasks, collectAll children and cancellable waits.
#include <coio/core/blocking_wait.hpp>
#include <coio/core/bounded_queue.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/event.hpp>
#include <coio/core/latch.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/shared_mutex.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include <catch2/catch.hpp>

#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

using coio::Semaphore;
using coio::Task;
using coio::blockingWait;
using coio::currentStopToken;
using coio::withStopToken;
using coio::testing::ManualExecutor;

namespace {

Task<std::stop_token> tokenHere() { co_return co_await currentStopToken(); }

// Three levels of Tasks; the innermost waits on a cancellable acquire given
// no token, so the one it inherits decides whether it gives up.
Task<bool> level3(Semaphore& sem, std::vector<std::stop_token>& seen) {
  seen.push_back(co_await currentStopToken());
  const bool acquired = co_await sem.acquire(std::stop_token{});
  co_return acquired;
}
Task<bool> level2(Semaphore& sem, std::vector<std::stop_token>& seen) {
  seen.push_back(co_await currentStopToken());
  const bool acquired = co_await level3(sem, seen);
  co_return acquired;
}
Task<bool> level1(Semaphore& sem, std::vector<std::stop_token>& seen) {
  seen.push_back(co_await currentStopToken());
  const bool acquired = co_await level2(sem, seen);
  co_return acquired;
}

// Whether a wait gave up: a cancellable wait yields a bool, a scoped lock
// an empty guard, a queue operation operation_canceled.
template <typename Op>
Task<bool> givesUp(Op op) {
  auto result = co_await std::move(op);
  if constexpr (std::is_same_v<decltype(result), bool>) {
    co_return !result;
  } else if constexpr (requires { result.ownsLock(); }) {
    co_return !result.ownsLock();
  } else {
    co_return !result && result.error() == std::errc::operation_canceled;
  }
}

// One waiter on each primitive, each held, unset or full so that it must
// wait, and each given a default token: only the one inherited from the
// Task that awaits it can end the wait.
struct Primitives {
  coio::Mutex mutex;
  coio::SharedMutex shared;
  coio::Event event;
  coio::Latch latch{1};
  coio::BoundedQueue<int> empty{1};
  coio::BoundedQueue<int> full{1};
};

Task<void> waitOnEach(Primitives& p, std::optional<std::vector<bool>>& gaveUp) {
  int item = 2;
  auto [a, b, c, d, e, f, g, h, i] = co_await coio::collectAll(
      givesUp(p.mutex.lock(std::stop_token{})), givesUp(p.mutex.scopedLock(std::stop_token{})),
      givesUp(p.shared.lock(std::stop_token{})), givesUp(p.shared.lockShared(std::stop_token{})),
      givesUp(p.shared.scopedLockShared(std::stop_token{})), givesUp(p.event.wait(std::stop_token{})),
      givesUp(p.latch.wait(std::stop_token{})), givesUp(p.empty.pop(std::stop_token{})),
      givesUp(p.full.push(std::move(item), std::stop_token{})));
  gaveUp = std::vector<bool>{a, b, c, d, e, f, g, h, i};
  CHECK(item == 2);  // a push that gave up leaves the item with its caller
}

// The plain forms never look at a token.
Task<void> plainWaits(Primitives& p, std::vector<std::string>& log) {
  co_await p.mutex.lock();
  log.push_back("locked");
  co_await p.event.wait();
  log.push_back("set");
  coio::Result<int> popped = co_await p.empty.pop();
  log.push_back(popped ? "popped " + std::to_string(*popped) : popped.error().message());
  p.mutex.unlock();
}

}  // namespace

TEST_CASE("at the root, currentStopToken yields a token that never stops, without suspending",
          "[cancellation]") {
  const std::stop_token root = blockingWait(tokenHere());
  CHECK_FALSE(root.stop_possible());
  CHECK_FALSE(root.stop_requested());

  // Nothing suspends: the whole task runs inline inside the first resume.
  ManualExecutor ex;
  bool done = false;
  auto task = [](bool& done) -> Task<void> {
    for (int i = 0; i < 3; ++i) {
      const std::stop_token t = co_await currentStopToken();
      CHECK_FALSE(t.stop_requested());
    }
    done = true;
  };
  ex.spawn(task(done));
  CHECK(ex.step());  // starts the task: it finishes within this one step
  CHECK(done);
  CHECK_FALSE(ex.step());
}

TEST_CASE("a token reaches three levels of Tasks and cancels a wait at the bottom", "[cancellation]") {
  ManualExecutor ex;
  Semaphore sem(0);
  std::stop_source source;
  std::vector<std::stop_token> seen;
  bool finished = false, acquired = true;
  auto parent = [](Task<bool> child, bool& acquired, bool& finished) -> Task<void> {
    acquired = co_await std::move(child);
    finished = true;
  };
  ex.spawn(parent(withStopToken(source.get_token(), level1(sem, seen)), acquired, finished));
  ex.drain();
  REQUIRE(seen.size() == 3);
  for (const std::stop_token& t : seen) CHECK(t == source.get_token());
  CHECK_FALSE(finished);  // waiting at the bottom

  source.request_stop();  // the wait gives up inline, on this thread
  CHECK(finished);
  CHECK_FALSE(acquired);
  sem.release();
  CHECK(sem.tryAcquire());  // the waiter left the queue
}

TEST_CASE("withStopToken with a default token shields a Task from the enclosing stop", "[cancellation]") {
  ManualExecutor ex;
  Semaphore outerSem(0), cleanupSem(0);
  std::stop_source source;
  std::vector<std::string> log;
  auto cleanup = [](Semaphore& sem, std::vector<std::string>& log) -> Task<void> {
    const std::stop_token t = co_await currentStopToken();
    CHECK_FALSE(t.stop_possible());
    const bool acquired = co_await sem.acquire(std::stop_token{});
    log.push_back(acquired ? "cleanup acquired" : "cleanup cancelled");
  };
  auto body = [](Semaphore& outerSem, std::vector<std::string>& log, Task<void> cleanupTask) -> Task<void> {
    const bool acquired = co_await outerSem.acquire(std::stop_token{});
    log.push_back(acquired ? "body acquired" : "body cancelled");
    const std::stop_token t = co_await currentStopToken();
    CHECK(t.stop_requested());
    co_await withStopToken({}, std::move(cleanupTask));
    log.push_back("done");
  };
  ex.spawn(withStopToken(source.get_token(), body(outerSem, log, cleanup(cleanupSem, log))));
  ex.drain();
  source.request_stop();
  CHECK(log == std::vector<std::string>{"body cancelled"});  // cleanup now waits, unaffected by the stop
  cleanupSem.release();
  CHECK(log == std::vector<std::string>{"body cancelled", "cleanup acquired", "done"});
}

TEST_CASE("withStopToken passes on values, references, void and exceptions", "[cancellation]") {
  std::stop_source source;
  auto value = []() -> Task<int> { co_return 7; };
  CHECK(blockingWait(withStopToken(source.get_token(), value())) == 7);

  int x = 0;
  auto ref = [](int& x) -> Task<int&> { co_return x; };
  int& r = blockingWait(withStopToken(source.get_token(), ref(x)));
  CHECK(&r == &x);

  int ran = 0;
  auto none = [](int& ran) -> Task<void> {
    ++ran;
    co_return;
  };
  blockingWait(withStopToken(source.get_token(), none(ran)));
  CHECK(ran == 1);

  auto fail = []() -> Task<int> {
    throw std::runtime_error("inner");
    co_return 0;
  };
  CHECK_THROWS_WITH(blockingWait(withStopToken(source.get_token(), fail())), "inner");

  // The token given is the one seen, stopped or not.
  source.request_stop();
  const std::stop_token seen = blockingWait(withStopToken(source.get_token(), tokenHere()));
  CHECK(seen.stop_requested());
}

TEST_CASE("collectAll and collectAllRange children run under the awaiting Task's token", "[cancellation]") {
  std::stop_source source;
  auto [a, b] = blockingWait(withStopToken(source.get_token(), coio::collectAll(tokenHere(), tokenHere())));
  CHECK(a == source.get_token());
  CHECK(b == source.get_token());

  std::vector<Task<std::stop_token>> tasks;
  for (int i = 0; i < 3; ++i) tasks.push_back(tokenHere());
  const std::vector<std::stop_token> seen =
      blockingWait(withStopToken(source.get_token(), coio::collectAllRange(std::move(tasks))));
  REQUIRE(seen.size() == 3);
  for (const std::stop_token& t : seen) CHECK(t == source.get_token());

  // Stopping it cancels the children's waits.
  ManualExecutor ex;
  Semaphore sem(0);
  std::stop_source stopper;
  int cancelled = 0;
  auto waiter = [](Semaphore& sem, int& cancelled) -> Task<void> {
    const bool acquired = co_await sem.acquire(std::stop_token{});
    if (!acquired) ++cancelled;
  };
  auto parent = [](Task<std::tuple<coio::Unit, coio::Unit>> all) -> Task<void> { co_await std::move(all); };
  ex.spawn(withStopToken(stopper.get_token(),
                         parent(coio::collectAll(waiter(sem, cancelled), waiter(sem, cancelled)))));
  ex.drain();
  CHECK(ex.outstanding() == 1);
  stopper.request_stop();
  CHECK(cancelled == 2);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("an explicit token on a cancellable wait wins over the inherited one", "[cancellation]") {
  ManualExecutor ex;
  Semaphore sem(0);
  std::stop_source inherited, explicitSource;
  std::vector<std::string> log;
  auto waiter = [](Semaphore& sem, std::stop_token explicitToken, std::vector<std::string>& log) -> Task<void> {
    const bool acquired = co_await sem.acquire(std::move(explicitToken));
    log.push_back(acquired ? "acquired" : "cancelled");
  };
  ex.spawn(withStopToken(inherited.get_token(), waiter(sem, explicitSource.get_token(), log)));
  ex.drain();
  inherited.request_stop();
  CHECK(log.empty());  // the wait follows its own token only
  explicitSource.request_stop();
  CHECK(log == std::vector<std::string>{"cancelled"});
}

TEST_CASE("the cancellable waits of Mutex, SharedMutex, Event, Latch and BoundedQueue given no token use the Task's",
          "[cancellation]") {
  ManualExecutor ex;
  Primitives p;
  REQUIRE(p.mutex.tryLock());
  REQUIRE(p.shared.tryLock());
  REQUIRE(p.full.tryPush(1));
  std::stop_source stop;
  std::optional<std::vector<bool>> gaveUp;
  ex.spawn(withStopToken(stop.get_token(), waitOnEach(p, gaveUp)));
  ex.drain();
  CHECK_FALSE(gaveUp);  // all nine wait
  stop.request_stop();  // each gives up inline, here
  REQUIRE(gaveUp);
  CHECK(*gaveUp == std::vector<bool>(9, true));
  CHECK(ex.outstanding() == 0);
  CHECK(p.full.size() == 1);
  p.mutex.unlock();
  p.shared.unlock();

  // Under a token already stopped, the plain forms still wait, and get what they wait for.
  REQUIRE(p.mutex.tryLock());
  std::vector<std::string> log;
  ex.spawn(withStopToken(stop.get_token(), plainWaits(p, log)));
  ex.drain();
  CHECK(log.empty());
  p.mutex.unlock();
  CHECK(log == std::vector<std::string>{"locked"});
  p.event.set();
  CHECK(log == std::vector<std::string>{"locked", "set"});
  REQUIRE(p.empty.tryPush(7));
  CHECK(log == std::vector<std::string>{"locked", "set", "popped 7"});
  CHECK(ex.outstanding() == 0);
  CHECK_FALSE(p.mutex.isLocked());
}
