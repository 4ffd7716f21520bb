#pragma once
// Whether a reactor's loop still serves its timers and other fds while one
// coroutine hammers an operation that is ready every time (the fairness
// guarantee of the Reactor concept). Shared by the reactor and disk tests.
#include <coio/core/collect_all.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/file_descriptor.hpp>

#include <catch2/catch.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <span>

namespace coio::testing {

// Lateness is judged in the hammer's completions, not in time: a loaded
// machine can preempt the test for any time, but not make a fair loop run
// the hammer for more than a turn or two before it serves a due timer or a
// ready fd (an unfair loop runs it until the 2 s give-up).
struct LoopService {
  std::size_t operations = 0;      // the hammer's completions
  std::size_t maxPerTurn = 0;      // most of them between two turns of a coroutine that yields every iteration
  std::size_t timerLateOps = 0;    // completions between a 10 ms timer's deadline and its firing
  std::size_t fdLateOps = 0;       // completions between a byte's write and its reader's resumption
  std::chrono::steady_clock::duration timerLate{};  // the same in time (reported, not checked)
  std::chrono::steady_clock::duration fdLate{};
  bool failed = false;             // the hammered operation did not give the expected result
};

/// Runs, on `reactor` until all are done: `step()` (yields whether the
/// operation gave what the case expects) awaited in a loop until the checks
/// below are over (50 ms at least) or 2 s have passed (an unfair loop); a
/// 10 ms timer that then writes a byte to a socket; a reader waiting for
/// that byte; and a coroutine that yields once per loop iteration, counting
/// the hammer's completions between its turns.
template <typename R, typename Step>
LoopService serviceWhileHammered(R& reactor, Step step) {
  using Clock = std::chrono::steady_clock;
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0);
  const FileDescriptor reader(pair[0]), writer(pair[1]);
  LoopService result;
  bool served = false;
  const Clock::time_point start = Clock::now();
  const Clock::time_point giveUp = start + std::chrono::seconds(2);
  const Clock::time_point deadline = start + std::chrono::milliseconds(10);
  Clock::time_point written = Clock::time_point::max();
  constexpr std::size_t kNotYet = static_cast<std::size_t>(-1);
  std::size_t opsAtDeadline = kNotYet;  // the count when the hammer or the watcher first saw the deadline pass
  std::size_t opsAtWrite = 0;
  // The hammer goes on for 50 ms at least: hundreds of budgets' worth.
  const auto over = [&] {
    const Clock::time_point now = Clock::now();
    if (opsAtDeadline == kNotYet && now >= deadline) opsAtDeadline = result.operations;
    return (served && now >= start + std::chrono::milliseconds(50)) || now >= giveUp;
  };

  auto timer = [&]() -> Task<void> {
    co_await reactor.sleepUntil(deadline);
    result.timerLate = Clock::now() - deadline;
    result.timerLateOps = result.operations - std::min(opsAtDeadline, result.operations);
    written = Clock::now();
    opsAtWrite = result.operations;
    REQUIRE(::write(writer.get(), "x", 1) == 1);
  };
  auto otherFd = [&]() -> Task<void> {
    std::byte got[1];
    Result<std::size_t> n = co_await reactor.recv(reader.get(), got);
    CHECK(n.valueOr(0) == 1);
    result.fdLate = Clock::now() - written;
    result.fdLateOps = result.operations - opsAtWrite;
    served = true;
  };
  auto hammer = [&]() -> Task<void> {
    while (!over()) {
      if (!co_await step()) {
        result.failed = true;
        co_return;
      }
      ++result.operations;
    }
  };
  auto watcher = [&]() -> Task<void> {
    while (!over()) {
      const std::size_t before = result.operations;
      co_await reactor.schedule();
      result.maxPerTurn = std::max(result.maxPerTurn, result.operations - before);
    }
  };
  // The waiters first, so that they wait before the hammer starts.
  reactor.runUntil(collectAll(otherFd(), timer(), watcher(), hammer()));
  reactor.forget(reader.get());
  return result;
}

/// The checks every case makes on serviceWhileHammered's result.
inline void checkServed(const LoopService& s, std::size_t inlineTurnsPerIteration) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  INFO(s.operations << " operations, at most " << s.maxPerTurn << " per loop turn; timer late by "
                    << s.timerLateOps << " operations ("
                    << duration_cast<microseconds>(s.timerLate).count() << " us); other fd served after "
                    << s.fdLateOps << " operations (" << duration_cast<microseconds>(s.fdLate).count() << " us)");
  CHECK_FALSE(s.failed);
  // The operation really was hammered past one iteration's budget...
  CHECK(s.operations > 2 * inlineTurnsPerIteration);
  // ...yet the loop turned every budget's worth (a few completions beyond
  // it come from a resumption posted by the previous turn, or a CQE),
  CHECK(s.maxPerTurn <= inlineTurnsPerIteration + 4);
  // and served the timer and the other fd within a few turns' worth of
  // the hammer (a turn or two; an unfair loop hammers on for 2 s).
  const std::size_t fewTurns = 4 * (inlineTurnsPerIteration + 4);
  CHECK(s.timerLateOps <= fewTurns);
  CHECK(s.fdLateOps <= fewTurns);
}

}  // namespace coio::testing
