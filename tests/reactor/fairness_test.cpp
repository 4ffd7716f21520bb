// Fairness: connections whose operations always complete at once (an
// always-readable socket) must not keep the loop from its timers.
#include "loop_probe.hpp"
#include "test_reactors.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <stop_token>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using coio::FileDescriptor;
using coio::testing::TcpTestReactors;
using coio::testing::TestReactors;
using Clock = std::chrono::steady_clock;

namespace {

struct Flood {
  bool timerFired = false;
  Clock::time_point deadline;  // the timer's
  Clock::time_point giveUp;
  std::size_t reads = 0;
  std::size_t readsAtDeadline = static_cast<std::size_t>(-1);  // when a reader first saw the deadline pass
  int failures = 0;
};

// How late the timer fired, in reads (what the check judges: a loaded
// machine can preempt the test for any time, but not make a fair loop read
// for more than a turn or two past a due timer) and in time (reported).
struct Lateness {
  std::size_t reads = 0;
  Clock::duration time{};
};

// Reads 64 bytes at a time from a socket that holds more, and writes them
// back through the peer: the socket never drains, so every recv can
// complete at once. Stops when the timer fired (or, if the loop is unfair,
// when the test gives up).
template <typename R>
Task<void> floodedReader(R& reactor, int fd, int peer, Flood& flood) {
  std::array<std::byte, 64> buffer{};
  while (!flood.timerFired) {
    const Clock::time_point now = Clock::now();
    if (now >= flood.giveUp) break;
    if (now >= flood.deadline && flood.reads < flood.readsAtDeadline) flood.readsAtDeadline = flood.reads;
    auto got = co_await reactor.recv(fd, buffer);
    if (!got || *got == 0) {
      ++flood.failures;
      co_return;
    }
    if (::send(peer, buffer.data(), *got, MSG_DONTWAIT) != static_cast<ssize_t>(*got)) {
      ++flood.failures;
      co_return;
    }
    ++flood.reads;
  }
}

template <typename R>
Task<void> timer(R& reactor, Flood& flood, Lateness& lateness) {
  co_await reactor.sleepUntil(flood.deadline);
  lateness.time = Clock::now() - flood.deadline;
  lateness.reads = flood.reads - std::min(flood.reads, flood.readsAtDeadline);
  flood.timerFired = true;
}

// How late a 20 ms timer fires while `readers` flooded readers run.
template <typename R>
Lateness timerLatenessUnderFlood(R& reactor, std::size_t readers) {
  coio::testing::raiseFdLimit();
  std::vector<coio::FileDescriptor> fds;
  Flood flood;
  std::vector<Task<void>> tasks;
  Lateness lateness{.reads = static_cast<std::size_t>(-1), .time = Clock::duration::max()};
  const auto start = Clock::now();
  flood.deadline = start + 20ms;
  flood.giveUp = start + 2s;
  // The timer starts first, so that it is set before any reader runs.
  tasks.push_back(timer(reactor, flood, lateness));
  const std::array<std::byte, 4096> fill{};
  for (std::size_t i = 0; i < readers; ++i) {
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0);
    fds.emplace_back(pair[0]);
    fds.emplace_back(pair[1]);
    REQUIRE(::send(pair[1], fill.data(), fill.size(), 0) == static_cast<ssize_t>(fill.size()));
    tasks.push_back(floodedReader(reactor, pair[0], pair[1], flood));
  }
  reactor.runUntil(coio::collectAllRange(std::move(tasks)));
  for (const auto& fd : fds) reactor.forget(fd.get());
  CHECK(flood.failures == 0);
  CHECK(flood.reads > 0);
  return lateness;
}

// A turn of the loop resumes each reader at most once from its wait, and
// completes at most a budget's worth of reads inline: the timer is due
// after a turn or two of that (the check allows four).
void checkTimerServed(const Lateness& lateness, std::size_t readers, std::size_t budget) {
  INFO(readers << " reader(s): timer late by " << lateness.reads << " reads ("
               << std::chrono::duration_cast<std::chrono::microseconds>(lateness.time).count() << " us)");
  CHECK(lateness.reads <= 4 * (readers + budget + 4));
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("an always-readable socket does not starve a timer on the same reactor", "[reactor][fairness]",
                        TestReactors) {
  // Before the fix, EpollReactor's recv completed inline for ever: the timer
  // fired only when the reader gave up, 2 s later.
  TestType reactor;
  const std::size_t readers = GENERATE(1, 300);
  checkTimerServed(timerLatenessUnderFlood(reactor, readers), readers, TestType::kInlineTurnsPerIteration);
}

#if COIO_TEST_URING
TEST_CASE("UringReactor, eager submission: operations that complete at once do not starve a timer",
          "[reactor][fairness][uring]") {
  // Eager: each recv is submitted (and completes) as its coroutine resumes,
  // so every reap round found a full batch of new completions and, before
  // the fix, reap() never returned while 300 readers were flooded.
  coio::UringReactor reactor(coio::UringReactor::Options{.submitPolicy = coio::SubmitPolicy::eager});
  checkTimerServed(timerLatenessUnderFlood(reactor, 300), 300, coio::UringReactor::kInlineTurnsPerIteration);
}
#endif

namespace {

// A connected loopback TCP pair: ours non-blocking (for the reactor), the
// peer blocking (for a plain thread or plain calls).
std::pair<FileDescriptor, FileDescriptor> tcpPair() {
  FileDescriptor listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(listener.valid());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), length) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  FileDescriptor ours(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(::connect(ours.get(), reinterpret_cast<sockaddr*>(&address), length) == 0);
  FileDescriptor peer(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(peer.valid());
  const int flags = ::fcntl(ours.get(), F_GETFL);
  REQUIRE(::fcntl(ours.get(), F_SETFL, flags | O_NONBLOCK) == 0);
  return {std::move(ours), std::move(peer)};
}

}  // namespace

// Every path on which an operation completes without suspending, on every
// reactor (UringReactor in each recv mode): the loop still runs its timers
// and serves other fds, and turns at least once per inline budget. Before
// the fix UringReactor's send completed inline for ever (timer 2 s late,
// the whole test), as did a multishot read of buffered data per CQE's worth
// and a multishot read at end of stream.
TEMPLATE_LIST_TEST_CASE("an operation that is ready every time does not starve the loop", "[reactor][fairness]",
                        TcpTestReactors) {
  TestType reactor;
  constexpr std::size_t budget = TestType::kInlineTurnsPerIteration;
  std::array<std::byte, 16> buffer{};
  // Not a structured binding: clang 14 cannot capture one in a lambda.
  std::pair<FileDescriptor, FileDescriptor> pair = tcpPair();
  const FileDescriptor& peer = pair.second;
  const int fd = pair.first.get();

  SECTION("send to a socket whose peer drains it") {
    std::jthread drain([p = peer.get()] {
      std::array<char, 65536> sink;
      while (::recv(p, sink.data(), sink.size(), 0) > 0) {
      }
    });
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> sent = co_await reactor.send(fd, buffer);
      co_return sent.valueOr(0) > 0;
    };
    const coio::testing::LoopService s = coio::testing::serviceWhileHammered(reactor, step);
    ::shutdown(fd, SHUT_WR);  // the drain thread ends
    coio::testing::checkServed(s, budget);
  }
  SECTION("gather send to a socket whose peer drains it") {
    std::jthread drain([p = peer.get()] {
      std::array<char, 65536> sink;
      while (::recv(p, sink.data(), sink.size(), 0) > 0) {
      }
    });
    const iovec parts[] = {{buffer.data(), 8}, {buffer.data() + 8, 8}};
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> sent = co_await reactor.sendv(fd, parts);
      co_return sent.valueOr(0) > 0;
    };
    const coio::testing::LoopService s = coio::testing::serviceWhileHammered(reactor, step);
    ::shutdown(fd, SHUT_WR);  // the drain thread ends
    coio::testing::checkServed(s, budget);
  }
  SECTION("recv from a socket that always holds data (echoed back by the peer)") {
    const std::array<std::byte, 4096> fill{};
    REQUIRE(::send(peer.get(), fill.data(), fill.size(), 0) == static_cast<ssize_t>(fill.size()));
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> got = co_await reactor.recv(fd, buffer);
      const std::size_t n = got.valueOr(0);
      co_return n > 0 && ::send(peer.get(), buffer.data(), n, 0) == static_cast<ssize_t>(n);
    };
    coio::testing::checkServed(coio::testing::serviceWhileHammered(reactor, step), budget);
  }
  SECTION("recv at end of stream") {
    REQUIRE(::shutdown(peer.get(), SHUT_WR) == 0);
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> n = co_await reactor.recv(fd, buffer);
      co_return n && *n == 0;
    };
    coio::testing::checkServed(coio::testing::serviceWhileHammered(reactor, step), budget);
  }
  SECTION("send and recv whose stop was requested before") {
    std::stop_source stopped;
    stopped.request_stop();
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> sent = co_await reactor.send(fd, buffer, stopped.get_token());
      coio::Result<std::size_t> got = co_await reactor.recv(fd, buffer, stopped.get_token());
      co_return !sent && sent.error() == std::errc::operation_canceled && !got &&
          got.error() == std::errc::operation_canceled;
    };
    coio::testing::checkServed(coio::testing::serviceWhileHammered(reactor, step), budget);
  }
  SECTION("send on no socket (fd -1)") {
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> sent = co_await reactor.send(-1, buffer);
      co_return !sent && sent.error() == std::errc::bad_file_descriptor;
    };
    coio::testing::checkServed(coio::testing::serviceWhileHammered(reactor, step), budget);
  }
  reactor.forget(fd);
}
