// Fairness: connections whose operations always complete at once (an
// always-readable socket) must not keep the loop from its timers.
#include "test_reactors.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using coio::testing::TestReactors;
using Clock = std::chrono::steady_clock;

namespace {

struct Flood {
  bool timerFired = false;
  Clock::time_point giveUp;
  std::size_t reads = 0;
  int failures = 0;
};

// Reads 64 bytes at a time from a socket that holds more, and writes them
// back through the peer: the socket never drains, so every recv can
// complete at once. Stops when the timer fired (or, if the loop is unfair,
// when the test gives up).
template <typename R>
Task<void> floodedReader(R& reactor, int fd, int peer, Flood& flood) {
  std::array<std::byte, 64> buffer{};
  while (!flood.timerFired && Clock::now() < flood.giveUp) {
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
Task<void> timer(R& reactor, Clock::time_point deadline, Flood& flood, Clock::duration& lateness) {
  co_await reactor.sleepUntil(deadline);
  lateness = Clock::now() - deadline;
  flood.timerFired = true;
}

// How late a 20 ms timer fires while `readers` flooded readers run.
template <typename R>
Clock::duration timerLatenessUnderFlood(R& reactor, std::size_t readers) {
  coio::testing::raiseFdLimit();
  std::vector<coio::detail::FileDescriptor> fds;
  Flood flood;
  std::vector<Task<void>> tasks;
  Clock::duration lateness = Clock::duration::max();
  const auto start = Clock::now();
  flood.giveUp = start + 2s;
  // The timer starts first, so that it is set before any reader runs.
  tasks.push_back(timer(reactor, start + 20ms, flood, lateness));
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

}  // namespace

TEMPLATE_LIST_TEST_CASE("an always-readable socket does not starve a timer on the same reactor", "[reactor][fairness]",
                        TestReactors) {
  // Before the fix, EpollReactor's recv completed inline for ever: the timer
  // fired only when the reader gave up, 2 s later.
  TestType reactor;
  const std::size_t readers = GENERATE(1, 300);
  const Clock::duration lateness = timerLatenessUnderFlood(reactor, readers);
  INFO(readers << " reader(s): timer late by " << std::chrono::duration_cast<std::chrono::microseconds>(lateness).count()
               << " us");
  CHECK(lateness < 500ms);  // generous: sanitizers, a loaded VM
}

#if COIO_TEST_URING
TEST_CASE("UringReactor, eager submission: operations that complete at once do not starve a timer",
          "[reactor][fairness][uring]") {
  // Eager: each recv is submitted (and completes) as its coroutine resumes,
  // so every reap round found a full batch of new completions and, before
  // the fix, reap() never returned while 300 readers were flooded.
  coio::UringReactor reactor(coio::UringReactor::Options{.submitPolicy = coio::SubmitPolicy::eager});
  const Clock::duration lateness = timerLatenessUnderFlood(reactor, 300);
  INFO("timer late by " << std::chrono::duration_cast<std::chrono::microseconds>(lateness).count() << " us");
  CHECK(lateness < 500ms);
}
#endif
