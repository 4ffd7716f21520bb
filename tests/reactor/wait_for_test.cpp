// waitFor(reactor, event, timeout): an Event or a deadline, on every reactor.
#include "test_reactors.hpp"

#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/event.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/wait_for.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <stop_token>
#include <system_error>

using namespace std::chrono_literals;

namespace {

using WaitClock = std::chrono::steady_clock;

// Sets `event` after `delay`, then marks that set() has returned.
template <typename R>
coio::Task<void> setAfter(R& reactor, std::chrono::milliseconds delay, coio::Event& event, bool& setReturned) {
  co_await reactor.sleepFor(delay);
  event.set();
  setReturned = true;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("waitFor: an event set meanwhile wins, and its waiter resumes after set() returned",
                        "[reactor][wait_for]", coio::testing::TestReactors) {
  TestType reactor;
  coio::Event event;
  bool setReturned = false;
  bool sawSetReturned = false;
  WaitClock::duration took{};
  reactor.runUntil([](TestType& r, coio::Event& e, bool& returned, bool& saw,
                      WaitClock::duration& elapsed) -> coio::Task<void> {
    const WaitClock::time_point start = WaitClock::now();
    auto [waited, unit] = co_await coio::collectAll(coio::waitFor(r, e, 10s), setAfter(r, 20ms, e, returned));
    (void)unit;
    elapsed = WaitClock::now() - start;
    CHECK(waited.hasValue());
    saw = returned;
  }(reactor, event, setReturned, sawSetReturned, took));
  CHECK(sawSetReturned);
  CHECK(took < 5s);  // not the deadline
}

TEMPLATE_LIST_TEST_CASE("waitFor: a set event yields at once; an unset one times out at the deadline",
                        "[reactor][wait_for]", coio::testing::TestReactors) {
  TestType reactor;
  reactor.runUntil([](TestType& r) -> coio::Task<void> {
    coio::Event set(true);
    const coio::Result<void> now = co_await coio::waitFor(r, set, 0ms);
    CHECK(now.hasValue());  // set wins, even over a deadline already past
    coio::Event never;
    const WaitClock::time_point start = WaitClock::now();
    const coio::Result<void> late = co_await coio::waitFor(r, never, 30ms);
    const WaitClock::duration took = WaitClock::now() - start;
    REQUIRE(!late);
    CHECK(late.error() == std::errc::timed_out);
    CHECK(took >= 30ms);
    CHECK(took < 5s);
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("waitFor: a stop of the awaiting task, or of withStopToken's token, ends the wait",
                        "[reactor][wait_for]", coio::testing::TestReactors) {
  TestType reactor;
  reactor.runUntil([](TestType& r) -> coio::Task<void> {
    coio::Event never;
    std::stop_source stop;
    auto stopSoon = [](TestType& rr, std::stop_source& s) -> coio::Task<void> {
      co_await rr.sleepFor(20ms);
      s.request_stop();
    };
    const WaitClock::time_point start = WaitClock::now();
    auto [waited, unit] =
        co_await coio::collectAll(coio::withStopToken(stop.get_token(), coio::waitFor(r, never, 10s)), stopSoon(r, stop));
    (void)unit;
    REQUIRE(!waited);
    CHECK(waited.error() == std::errc::operation_canceled);
    CHECK(WaitClock::now() - start < 5s);
    CHECK_FALSE(never.isSet());
  }(reactor));
}
