// A view into the loop, on every reactor: stats() counts operations by kind
// as they start and end, the queue depths and the turns; the stall detector
// reports a turn that ran past its threshold with the phase that took it,
// and nothing else; timing measures waiting and running.
#include "test_reactors.hpp"

#include <coio/core/blocking_wait.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/loop_stats.hpp>
#include <coio/reactor/reactor.hpp>

#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using coio::LoopPhase;
using coio::LoopStall;
using coio::LoopStats;
using coio::OpKind;
using coio::Task;
using coio::FileDescriptor;
using coio::testing::SocketPair;
using coio::testing::TestReactors;

namespace {

// Keeps the loop thread busy (no system call) for `d`.
void busyWait(Clock::duration d) {
  const Clock::time_point until = Clock::now() + d;
  while (Clock::now() < until) {
  }
}

// A non-blocking TCP socket, and one listening on a loopback port.
FileDescriptor tcpSocket() {
  FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  return fd;
}
sockaddr_in listenOnLoopback(const FileDescriptor& fd) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  REQUIRE(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0);
  REQUIRE(::listen(fd.get(), 4) == 0);
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  return address;
}

// What changed in one kind's counters.
struct Moved {
  std::uint64_t submitted, completed;
  bool operator==(const Moved&) const = default;
};
Moved moved(const LoopStats& before, const LoopStats& after, OpKind kind) {
  return {after[kind].submitted - before[kind].submitted, after[kind].completed - before[kind].completed};
}

template <typename R>
constexpr bool kQueuesSubmissions = !std::is_same_v<R, coio::EpollReactor>;  // io_uring: batched SQEs

}  // namespace

TEMPLATE_LIST_TEST_CASE("stats() count operations by kind as they start and end, and what is in flight",
                        "[reactor][stats]", TestReactors) {
  TestType reactor;
  SocketPair pair;
  std::array<std::byte, 16> buffer{};
  LoopStats waiting;  // taken while the recv waits

  auto reader = [&]() -> Task<void> {
    coio::Result<std::size_t> got = co_await reactor.recv(pair.a.get(), buffer);
    CHECK(got.valueOr(0) == 1);
  };
  auto writer = [&]() -> Task<void> {
    waiting = reactor.stats();  // the reader has started its recv
    coio::Result<std::size_t> sent = co_await reactor.send(pair.b.get(), std::as_bytes(std::span("x", 1)));
    CHECK(sent.valueOr(0) == 1);
  };
  auto test = [&]() -> Task<void> {
    co_await reactor.schedule();  // the first wait handed the kernel what the reactor prepared for itself
    const LoopStats start = reactor.stats();
    CHECK(start.inFlight == 0);
    CHECK(start.unsubmitted == 0);

    // A recv that waits (one operation), and a send the socket takes at once (none).
    co_await coio::collectAll(reader(), writer());
    CHECK(moved(start, waiting, OpKind::recv) == Moved{1, 0});
    CHECK(waiting.inFlight == 1);
    CHECK(waiting.unsubmitted == (kQueuesSubmissions<TestType> ? 1u : 0u));
    LoopStats now = reactor.stats();
    CHECK(moved(start, now, OpKind::recv) == Moved{1, 1});
    CHECK(moved(start, now, OpKind::send) == Moved{0, 0});
    CHECK(now.completedInline - start.completedInline == 1);
    CHECK(now.events > start.events);
    CHECK(now.inFlight == 0);

    // A wait for writability: always a wait, on both reactors.
    LoopStats before = reactor.stats();
    coio::Result<void> writable = co_await reactor.writable(pair.b.get());
    CHECK(writable.hasValue());
    now = reactor.stats();
    CHECK(moved(before, now, OpKind::poll) == Moved{1, 1});

    // A recv cancelled while it waits still ends, once.
    before = now;
    std::stop_source source;
    auto cancelled = [&]() -> Task<void> {
      coio::Result<std::size_t> got = co_await reactor.recv(pair.a.get(), buffer, source.get_token());
      CHECK(got.error() == std::errc::operation_canceled);
    };
    auto canceller = [&]() -> Task<void> {
      CHECK(reactor.stats().inFlight == 1);
      source.request_stop();
      co_return;
    };
    co_await coio::collectAll(cancelled(), canceller());
    now = reactor.stats();
    CHECK(moved(before, now, OpKind::recv) == Moved{1, 1});
    CHECK(now.inFlight == 0);

    // Timers: set and fired; set and cancelled.
    before = now;
    co_await reactor.sleepFor(1ms);
    now = reactor.stats();
    CHECK(moved(before, now, OpKind::timer) == Moved{1, 1});
    CHECK(now.timersFired - before.timersFired == 1);
    before = now;
    std::stop_source timerSource;
    auto sleeper = [&]() -> Task<void> {
      const bool fired = co_await reactor.sleepFor(1h, timerSource.get_token());
      CHECK_FALSE(fired);
    };
    auto timerCanceller = [&]() -> Task<void> {
      const LoopStats during = reactor.stats();
      CHECK(during.timers == 1);
      CHECK(during.inFlight == 0);  // timers are not I/O
      timerSource.request_stop();
      co_return;
    };
    co_await coio::collectAll(sleeper(), timerCanceller());
    now = reactor.stats();
    CHECK(moved(before, now, OpKind::timer) == Moved{1, 1});
    CHECK(now.timersFired == before.timersFired);
    CHECK(now.timers == 0);
  };
  reactor.runUntil(test());
  reactor.forget(pair.a.get());
  reactor.forget(pair.b.get());
}

TEMPLATE_LIST_TEST_CASE("stats() count accept and connect", "[reactor][stats]", TestReactors) {
  TestType reactor;
  const FileDescriptor listener = tcpSocket();
  const sockaddr_in address = listenOnLoopback(listener);
  const FileDescriptor client = tcpSocket();
  FileDescriptor accepted;
  auto acceptor = [&]() -> Task<void> {
    coio::Result<int> fd = co_await reactor.accept(listener.get());
    REQUIRE(fd.hasValue());
    accepted = FileDescriptor(*fd);
  };
  auto connector = [&]() -> Task<void> {
    coio::Result<void> connected =
        co_await reactor.connect(client.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
    CHECK(connected.hasValue());
  };
  const LoopStats before = reactor.stats();
  // The accept starts first, with no connection queued: it waits on both
  // reactors. The connect may complete at once under epoll.
  reactor.runUntil(coio::collectAll(acceptor(), connector()));
  const LoopStats after = reactor.stats();
  CHECK(moved(before, after, OpKind::accept) == Moved{1, 1});
  const Moved connect = moved(before, after, OpKind::connect);
  CHECK(connect.submitted == connect.completed);
  CHECK(connect.submitted + (after.completedInline - before.completedInline) == 1);
  CHECK(after.inFlight == 0);
  reactor.forget(listener.get());
  reactor.forget(client.get());
}

TEMPLATE_LIST_TEST_CASE("stats() count the loop's turns and its ready coroutines", "[reactor][stats]",
                        TestReactors) {
  TestType reactor;
  auto nothing = []() -> Task<void> { co_return; };
  auto test = [&]() -> Task<void> {
    const LoopStats start = reactor.stats();
    for (int i = 0; i < 10; ++i) co_await reactor.schedule();
    const LoopStats after = reactor.stats();
    CHECK(after.iterations - start.iterations == 10);
    CHECK(after.resumed - start.resumed == 10);
    CHECK(after.ready == 0);
    for (int i = 0; i < 3; ++i) reactor.spawn(nothing());
    CHECK(reactor.stats().ready == 3);
    co_await reactor.schedule();  // behind them
    CHECK(reactor.stats().ready == 0);
    CHECK(reactor.stats().resumed - after.resumed == 4);
  };
  reactor.runUntil(test());
  // Off the loop (no loop runs): the same snapshot.
  CHECK(reactor.stats().iterations > 10);
  CHECK_FALSE(reactor.stats().timed);
}

TEMPLATE_LIST_TEST_CASE("the stall handler names the phase of a turn that ran past the threshold",
                        "[reactor][stats][stall]", TestReactors) {
  TestType reactor;
  std::vector<LoopStall> stalls;
  reactor.setStallHandler(5ms, [&](const LoopStall& stall) {
    CHECK(reactor.isInLoopThread());
    stalls.push_back(stall);
  });
  SocketPair pair;
  const LoopPhase phase = GENERATE(LoopPhase::ready, LoopPhase::timers, LoopPhase::completions);
  auto stall = [&]() -> Task<void> {
    switch (phase) {
      case LoopPhase::ready: co_await reactor.schedule(); break;
      case LoopPhase::timers: co_await reactor.sleepFor(1ms); break;
      case LoopPhase::completions: {
        std::array<std::byte, 1> byte{};
        coio::Result<std::size_t> got = co_await reactor.recv(pair.a.get(), byte);  // resumed by its completion
        CHECK(got.valueOr(0) == 1);
        break;
      }
    }
    busyWait(20ms);
  };
  auto peer = [&]() -> Task<void> {
    CHECK(::write(pair.b.get(), "x", 1) == 1);  // once the recv waits
    co_return;
  };
  auto test = [&]() -> Task<void> {
    co_await coio::collectAll(stall(), peer());
    co_await reactor.schedule();  // the stalled turn ends before the loop waits again
  };
  reactor.runUntil(test());
  reactor.forget(pair.a.get());
  INFO("phase " << coio::toString(phase));
  // Other turns may stall too on a loaded machine: the busy one is there.
  const LoopStall* busy = nullptr;
  for (const LoopStall& s : stalls) {
    if (s.phases[static_cast<std::size_t>(phase)] >= 20ms) busy = &s;
  }
  REQUIRE(busy != nullptr);
  CHECK(busy->phase == phase);
  CHECK(busy->duration >= 20ms);
  CHECK(busy->duration == busy->phases[0] + busy->phases[1] + busy->phases[2]);
  CHECK(busy->ran[static_cast<std::size_t>(phase)] >= 1);
  const LoopStats stats = reactor.stats();
  CHECK(stats.stalls == stalls.size());
  CHECK(stats.longestTurn >= 20ms);
  CHECK(stats.running >= 20ms);
}

TEMPLATE_LIST_TEST_CASE("quick turns between long waits are no stall", "[reactor][stats][stall]", TestReactors) {
  // The waits are longer than the threshold: counted as running, they
  // would stall every time. A quick turn can still be preempted past it on
  // a loaded machine, so the case passes if one of three runs saw no stall
  // (a loop that counts its waits fails all three).
  struct Run {
    int calls = 0;
    LoopStats stats;
  };
  auto once = [] {
    TestType reactor;
    Run run;
    reactor.setStallHandler(50ms, [&](const LoopStall&) { ++run.calls; });
    SocketPair pair;
    auto test = [&]() -> Task<void> {
      for (int i = 0; i < 100; ++i) co_await reactor.schedule();
      for (int i = 0; i < 2; ++i) co_await reactor.sleepFor(80ms);
      for (int i = 0; i < 20; ++i) {
        CHECK(::write(pair.b.get(), "x", 1) == 1);
        std::array<std::byte, 1> byte{};
        coio::Result<std::size_t> got = co_await reactor.recv(pair.a.get(), byte);
        CHECK(got.valueOr(0) == 1);
      }
    };
    reactor.runUntil(test());
    reactor.forget(pair.a.get());
    run.stats = reactor.stats();
    return run;
  };
  Run run;
  for (int attempt = 0; attempt < 3; ++attempt) {
    run = once();
    CHECK(run.stats.timed);
    CHECK(run.stats.waiting >= 150ms);
    CHECK(run.stats.stalls == static_cast<std::uint64_t>(run.calls));
    if (run.calls == 0) break;
  }
  INFO("longest turn " << std::chrono::duration_cast<std::chrono::microseconds>(run.stats.longestTurn).count()
                       << " us");
  CHECK(run.calls == 0);
  CHECK(run.stats.longestTurn < 50ms);
}

TEMPLATE_LIST_TEST_CASE("no stall handler, no call and no timing", "[reactor][stats][stall]", TestReactors) {
  TestType reactor;
  int calls = 0;
  const bool everSet = GENERATE(false, true);
  if (everSet) {
    reactor.setStallHandler(5ms, [&](const LoopStall&) { ++calls; });
    reactor.setStallHandler(5ms, {});  // removed
  }
  auto test = [&]() -> Task<void> {
    co_await reactor.schedule();
    busyWait(20ms);
    co_await reactor.sleepFor(1ms);
  };
  reactor.runUntil(test());
  const LoopStats stats = reactor.stats();
  CHECK(calls == 0);
  CHECK(stats.stalls == 0);
  CHECK_FALSE(stats.timed);
  CHECK(stats.running == 0ns);
  CHECK(stats.waiting == 0ns);
}

TEMPLATE_LIST_TEST_CASE("a stall handler may remove itself and read the stats", "[reactor][stats][stall]",
                        TestReactors) {
  TestType reactor;
  int calls = 0;
  reactor.setStallHandler(5ms, [&](const LoopStall&) {
    ++calls;
    CHECK(reactor.stats().stalls == 1);
    reactor.setStallHandler(5ms, {});  // destroys the handler's original while it runs
  });
  auto test = [&]() -> Task<void> {
    for (int i = 0; i < 2; ++i) {
      co_await reactor.schedule();
      busyWait(10ms);
    }
  };
  reactor.runUntil(test());
  CHECK(calls == 1);
  CHECK_FALSE(reactor.stats().timed);
}

TEMPLATE_LIST_TEST_CASE("loop timing splits waiting from running, while on", "[reactor][stats]", TestReactors) {
  TestType reactor;
  reactor.setLoopTiming(true);
  auto test = [&]() -> Task<void> {
    co_await reactor.sleepFor(30ms);  // the loop waits
    busyWait(20ms);                   // the loop runs
    co_await reactor.schedule();
  };
  reactor.runUntil(test());
  LoopStats stats = reactor.stats();
  CHECK(stats.timed);
  CHECK(stats.waiting >= 25ms);  // from the turn's end, just after the timer was set
  CHECK(stats.running >= 20ms);
  CHECK(stats.longestTurn >= 20ms);
  CHECK(stats.stalls == 0);  // no handler
  reactor.setLoopTiming(false);
  const LoopStats off = reactor.stats();
  auto busy = [&]() -> Task<void> {
    co_await reactor.sleepFor(1ms);
    busyWait(10ms);
  };
  reactor.runUntil(busy());
  stats = reactor.stats();
  CHECK_FALSE(stats.timed);
  CHECK(stats.running == off.running);
  CHECK(stats.waiting == off.waiting);
}

TEMPLATE_LIST_TEST_CASE("another thread reads the stats by hopping onto the loop", "[reactor][stats][threads]",
                        TestReactors) {
  TestType reactor;
  std::thread loop([&] { reactor.run(); });
  auto read = [&]() -> Task<LoopStats> {
    co_await reactor.schedule();
    co_return reactor.stats();
  };
  const LoopStats first = coio::blockingWait(read());
  const LoopStats second = coio::blockingWait(read());
  CHECK(second.iterations > first.iterations);
  CHECK(second.events > first.events);  // each hop woke the loop
  reactor.stop();
  loop.join();
}
