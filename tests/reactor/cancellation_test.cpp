// Reactor operations given no stop token use the awaiting Task's, so that
// cancelling a Task (withStopToken, collectAny, AsyncScope, withTimeout on a
// whole Task) cancels every operation inside it. On every reactor, and on
// the io_uring reactor in each recv mode.
#include "test_reactors.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <stop_token>
#include <system_error>
#include <type_traits>
#include <utility>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using coio::Result;
using coio::Task;
using coio::FileDescriptor;
using coio::testing::SocketPair;
using coio::testing::TcpTestReactors;
using coio::testing::TestReactors;

namespace {

// Requests stop on `source` after `delay`, on the loop thread.
template <typename R>
Task<void> stopAfter(R& reactor, std::chrono::milliseconds delay, std::stop_source& source) {
  co_await reactor.sleepFor(delay, std::stop_token{});  // its own stop is not `source`'s
  source.request_stop();
}

// A task that sleeps `d` (the plain sleep, given no token) and returns 7.
template <typename R>
Task<int> sleepy(R& reactor, Clock::duration d) {
  co_await reactor.sleepFor(d);
  co_return 7;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("withTimeout on a whole Task cancels a sleep inside it and yields timed_out",
                        "[reactor][cancellation]", TestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<void> {
    const auto start = Clock::now();
    Result<int> late = co_await coio::withTimeout(r, sleepy(r, 1h), 20ms);
    CHECK(late.error() == std::errc::timed_out);
    CHECK(Clock::now() - start >= 20ms);

    // Finished in time: its value, and the 1 h timer does not hold anything up.
    Result<int> early = co_await coio::withTimeout(r, sleepy(r, 1ms), 1h);
    REQUIRE(early.hasValue());
    CHECK(*early == 7);

    auto nothing = [](TestType& r) -> Task<void> { co_await r.sleepFor(1h); };
    Result<void> none = co_await coio::withTimeout(r, nothing(r), 5ms);
    CHECK(none.error() == std::errc::timed_out);
  };
  const auto start = Clock::now();
  reactor.runUntil(test(reactor));
  CHECK(Clock::now() - start < 10s);
}

TEMPLATE_LIST_TEST_CASE("withTimeout on a Task returning a Result flattens it; I/O inside is cancelled",
                        "[reactor][cancellation]", TestReactors) {
  FileDescriptor efd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TestType reactor;
  auto waitThenRead = [](TestType& r, int fd) -> Task<Result<std::uint64_t>> {
    Result<void> ready = co_await r.readable(fd);  // no token: the Task's
    if (!ready) co_return ready.error();
    std::uint64_t value = 0;
    if (::read(fd, &value, sizeof value) != sizeof value) co_return coio::systemError(errno);
    co_return value;
  };
  auto test = [&](TestType& r) -> Task<void> {
    using Flat = decltype(coio::withTimeout(r, waitThenRead(r, efd.get()), 1ms));
    static_assert(std::is_same_v<Flat, Task<Result<std::uint64_t>>>);

    Result<std::uint64_t> timedOut = co_await coio::withTimeout(r, waitThenRead(r, efd.get()), 5ms);
    CHECK(timedOut.error() == std::errc::timed_out);

    const std::uint64_t three = 3;
    REQUIRE(::write(efd.get(), &three, sizeof three) == sizeof three);
    Result<std::uint64_t> read = co_await coio::withTimeout(r, waitThenRead(r, efd.get()), 1h);
    REQUIRE(read.hasValue());
    CHECK(*read == 3);
  };
  reactor.runUntil(test(reactor));
  reactor.forget(efd.get());
}

TEMPLATE_LIST_TEST_CASE("withTimeout waits for a task that ignores the stop, then yields timed_out",
                        "[reactor][cancellation]", TestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<void> {
    auto stubborn = [](TestType& r) -> Task<int> {
      // Shielded: the deadline's stop does not reach this sleep.
      const int v = co_await coio::withStopToken({}, sleepy(r, 50ms));
      co_return v;
    };
    const auto start = Clock::now();
    Result<int> result = co_await coio::withTimeout(r, stubborn(r), 5ms);
    CHECK(Clock::now() - start >= 50ms);  // no orphan: it waited for the task
    CHECK(result.error() == std::errc::timed_out);  // the late value is dropped
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("withTimeout rethrows the task's exception, and follows the enclosing token",
                        "[reactor][cancellation]", TestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<void> {
    auto fails = [](TestType& r) -> Task<int> {
      co_await r.sleepFor(1ms);
      throw std::runtime_error("task failed");
    };
    bool caught = false;
    try {
      (void)co_await coio::withTimeout(r, fails(r), 1h);
    } catch (const std::runtime_error&) {
      caught = true;
    }
    CHECK(caught);

    // Stopped from outside before the deadline: the task's own outcome.
    std::stop_source outer;
    r.spawn(stopAfter(r, 2ms, outer));
    auto cancellable = [](TestType& r) -> Task<bool> {
      const bool due = co_await r.sleepFor(1h, std::stop_token{});
      co_return due;
    };
    const auto start = Clock::now();
    Result<bool> stopped = co_await coio::withStopToken(outer.get_token(), coio::withTimeout(r, cancellable(r), 1h));
    REQUIRE(stopped.hasValue());
    CHECK_FALSE(*stopped);
    CHECK(Clock::now() - start < 10s);
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("a Task's token cancels the sleeps, I/O and waits inside it that were given no token",
                        "[reactor][cancellation]", TcpTestReactors) {
  SocketPair pair;
  FileDescriptor efd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TestType reactor;
  coio::Semaphore sem(0);
  std::array<std::byte, 16> buffer{};
  auto recvOne = [](TestType& r, int fd, std::span<std::byte> buffer) -> Task<Result<std::size_t>> {
    co_return co_await r.recv(fd, buffer);
  };
  auto readable = [](TestType& r, int fd) -> Task<Result<void>> { co_return co_await r.readable(fd); };
  auto plainSleep = [](TestType& r) -> Task<Clock::duration> {
    const auto start = Clock::now();
    co_await r.sleepFor(1h);
    co_return Clock::now() - start;
  };
  auto boolSleep = [](TestType& r) -> Task<bool> {
    const bool due = co_await r.sleepUntil(Clock::now() + 1h, std::stop_token{});
    co_return due;
  };
  auto acquire = [](coio::Semaphore& sem) -> Task<bool> {
    const bool acquired = co_await sem.acquire(std::stop_token{});
    co_return acquired;
  };
  auto test = [&](TestType& r) -> Task<void> {
    std::stop_source source;
    r.spawn(stopAfter(r, 5ms, source));
    auto [received, ready, slept, due, acquired] = co_await coio::withStopToken(
        source.get_token(), coio::collectAll(recvOne(r, pair.a.get(), buffer), readable(r, efd.get()),
                                             plainSleep(r), boolSleep(r), acquire(sem)));
    CHECK(received.error() == std::errc::operation_canceled);
    CHECK(ready.error() == std::errc::operation_canceled);
    CHECK(slept < 1h);
    CHECK_FALSE(due);
    CHECK_FALSE(acquired);

    // Under a token already stopped, an operation that could complete at
    // once (data waiting) is cancelled before it touches the socket.
    REQUIRE(::write(pair.b.get(), "x", 1) == 1);
    Result<std::size_t> refused = co_await coio::withStopToken(source.get_token(), recvOne(r, pair.a.get(), buffer));
    CHECK(refused.error() == std::errc::operation_canceled);
    Result<std::size_t> got = co_await recvOne(r, pair.a.get(), buffer);  // the byte is still there
    REQUIRE(got.hasValue());
    CHECK(*got == 1);
  };
  reactor.runUntil(test(reactor));
  reactor.forget(pair.a.get());
  reactor.forget(efd.get());
}

TEMPLATE_LIST_TEST_CASE("TcpStream reads and collectAny losers are cancelled through the Task's token",
                        "[reactor][cancellation]", TcpTestReactors) {
  SocketPair pair;
  TestType reactor;
  coio::TcpStream<TestType> stream(reactor, std::move(pair.a));
  std::array<std::byte, 16> buffer{};
  auto read = [](coio::TcpStream<TestType>& s, std::span<std::byte> buffer) -> Task<Result<std::size_t>> {
    co_return co_await s.read(buffer);
  };
  auto test = [&](TestType& r) -> Task<void> {
    // The sleep wins; the read, given no token, is cancelled and awaited.
    const auto first = co_await coio::collectAny(read(stream, buffer), sleepy(r, 2ms));
    REQUIRE(first.index() == 1);
    CHECK(std::get<1>(first) == 7);

    // The read wins; the sleep is cut short.
    REQUIRE(::write(pair.b.get(), "ab", 2) == 2);
    const auto start = Clock::now();
    const auto second = co_await coio::collectAny(read(stream, buffer), sleepy(r, 1h));
    REQUIRE(second.index() == 0);
    const Result<std::size_t>& got = std::get<0>(second);
    REQUIRE(got.hasValue());
    CHECK(*got == 2);
    CHECK(Clock::now() - start < 10s);

    // An AsyncScope's stop reaches the read of a task it owns.
    coio::AsyncScope scope;
    Result<std::size_t> scoped = std::size_t{0};
    scope.spawn([](coio::TcpStream<TestType>& s, std::span<std::byte> buffer, Result<std::size_t>& out) -> Task<void> {
      out = co_await s.read(buffer);
    }(stream, buffer, scoped));
    co_await r.sleepFor(1ms);
    scope.requestStop();  // on the loop thread, as reactor operations require
    co_await scope.join();
    CHECK(scoped.error() == std::errc::operation_canceled);
  };
  reactor.runUntil(test(reactor));
}
