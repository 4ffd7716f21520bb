#include <coio/core/blocking_wait.hpp>
#include <coio/core/event.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

using coio::Event;
using coio::Task;
using coio::testing::ManualExecutor;
using namespace std::chrono_literals;

namespace {
Task<void> waitAndRecord(Event& ev, std::vector<int>& order, int id) {
  co_await ev.wait();
  order.push_back(id);
}
}  // namespace

TEST_CASE("Event: a set Event lets waits through without suspending until reset", "[event]") {
  Event ev;
  CHECK_FALSE(ev.isSet());
  CHECK_FALSE(ev.wait().await_ready());
  ev.set();
  CHECK(ev.isSet());
  CHECK(ev.wait().await_ready());
  ev.set();  // already set: nothing changes
  CHECK(ev.isSet());
  ev.reset();
  CHECK_FALSE(ev.isSet());
  CHECK_FALSE(ev.wait().await_ready());
  CHECK(Event(true).isSet());
}

TEST_CASE("Event::set resumes every waiter inline, oldest first; later waits pass until reset", "[event]") {
  ManualExecutor ex;
  Event ev;
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) ex.spawn(waitAndRecord(ev, order, i));
  ex.drain();
  CHECK(order.empty());
  ev.set();  // no step() needed: resumed inside set()
  CHECK(order == std::vector<int>{0, 1, 2, 3});
  ex.spawn(waitAndRecord(ev, order, 4));
  ex.drain();
  CHECK(order.back() == 4);
  ev.reset();
  ex.spawn(waitAndRecord(ev, order, 5));
  ex.drain();
  CHECK(order.back() == 4);  // waits again
  ev.set();
  CHECK(order.back() == 5);
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Event: a cancelled wait yields false and leaves the others waiting", "[event]") {
  ManualExecutor ex;
  Event ev;
  std::stop_source timeout;
  std::vector<int> order;
  int result = -1;
  ex.spawn(coio::test::awaitInto(ev.wait(timeout.get_token()), result));
  ex.spawn(waitAndRecord(ev, order, 1));
  ex.spawn(coio::test::stopAfter(ex, timeout, 10ms));
  ex.advance(9ms);
  CHECK(result == -1);
  ex.advance(1ms);
  CHECK(result == 0);
  CHECK(order.empty());
  ev.set();
  CHECK(order == std::vector<int>{1});
  CHECK(ex.outstanding() == 0);
}

TEST_CASE("Event: a cancellable wait on a set Event yields true even after stop; set before stop wins",
          "[event]") {
  Event set(true), unset;
  const bool a = coio::blockingWait(set.wait(coio::test::stoppedToken()));
  CHECK(a);
  const bool b = coio::blockingWait(unset.wait(coio::test::stoppedToken()));
  CHECK_FALSE(b);

  ManualExecutor ex;
  std::stop_source later;
  int result = -1;
  ex.spawn(coio::test::awaitInto(unset.wait(later.get_token()), result));
  ex.drain();
  unset.set();
  later.request_stop();  // too late: the waiter was already released
  CHECK(result == 1);
}

TEST_CASE("Event: a waiter may destroy the Event when set() resumes it", "[event]") {
  // set() must not touch the Event after dropping its lock: under ASan a
  // use of the freed Event would be reported.
  ManualExecutor ex;
  auto ev = std::make_unique<Event>();
  int resumed = 0;
  for (int i = 0; i < 3; ++i) {
    ex.spawn([](std::unique_ptr<Event>& ev, int& resumed) -> Task<void> {
      co_await ev->wait();
      ++resumed;
      ev.reset();  // the first one frees it
    }(ev, resumed));
  }
  ex.drain();
  ev->set();
  CHECK(resumed == 3);
  CHECK(ev == nullptr);
}

TEST_CASE("Event: a waiter whose frame is destroyed leaves the list", "[event]") {
  Event ev;
  bool ran = false;
  auto waiter = [](Event& ev, bool& ran) -> coio::test::Eager {
    co_await ev.wait();
    ran = true;
  }(ev, ran);
  waiter.handle.destroy();
  ev.set();  // under ASan, resuming the freed frame would be reported
  CHECK_FALSE(ran);
  CHECK(coio::test::abortsInChild([] {
    auto doomed = std::make_unique<Event>();
    [](Event& ev) -> coio::test::Eager { co_await ev.wait(); }(*doomed);
    doomed.reset();  // destroyed with a waiter: asserted
  }));
}

namespace {
struct Relay {
  std::vector<std::unique_ptr<Event>> events;
  std::vector<int> order;
  std::uintptr_t deepest = UINTPTR_MAX;
};

// Waits for its event and sets the next one: each set() resumes the next
// waiter inside the previous waiter's set().
coio::test::Eager relay(Relay& r, std::size_t i) {
  co_await r.events[i]->wait();
  r.order.push_back(static_cast<int>(i));
  r.deepest = std::min(r.deepest, coio::test::stackPointer());
  if (i + 1 < r.events.size()) r.events[i + 1]->set();
}
}  // namespace

TEST_CASE("Event: a chain of 20,000 events setting each other runs in bounded stack, in order", "[event]") {
  constexpr std::size_t kLength = 20000;
  Relay r;
  for (std::size_t i = 0; i < kLength; ++i) r.events.push_back(std::make_unique<Event>());
  std::vector<coio::test::Eager> waiters;
  waiters.reserve(kLength);
  for (std::size_t i = 0; i < kLength; ++i) waiters.push_back(relay(r, i));
  const std::uintptr_t top = coio::test::stackPointer();
  r.events[0]->set();
  REQUIRE(r.order.size() == kLength);
  CHECK(std::is_sorted(r.order.begin(), r.order.end()));
  const std::uintptr_t used = top - r.deepest;
  INFO("stack used by the chain: " << used << " bytes");
  CHECK(used < 256 * 1024);  // the shared trampoline caps nesting at 32
  for (auto& w : waiters) w.handle.destroy();
}

TEST_CASE("Event: set from another thread races with waits; every waiter resumes once and sees the data",
          "[event][threads]") {
  for (int round = 0; round < 1000; ++round) {
    Event ev;
    int payload = 0;
    std::thread setter([&] {
      payload = round;
      ev.set();
    });
    int seen = -1;
    coio::blockingWait([&]() -> Task<void> {
      co_await ev.wait();
      seen = payload;  // a plain read: TSan checks set() -> wait ordering
    }());
    setter.join();
    CHECK(seen == round);
  }
}

TEST_CASE("Event: a wait cancelled while another thread sets resumes exactly once", "[event][threads]") {
  // A lost resumption hangs blockingWait (CTest timeout), a double one
  // crashes it; a waiter left in the list trips the destructor's assert.
  for (int round = 0; round < 300; ++round) {
    Event ev;
    std::stop_source stop;
    std::thread canceller([&] { stop.request_stop(); });
    std::thread setter([&] { ev.set(); });
    coio::blockingWait(ev.wait(stop.get_token()));  // true or false: either is right
    canceller.join();
    setter.join();
  }
}
