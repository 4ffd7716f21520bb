#pragma once
// Small helpers shared by the core tests.
#include <coio/core/task.hpp>
#include <coio/testing/manual_executor.hpp>

#include <atomic>
#include <coroutine>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fcntl.h>
#include <latch>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

namespace coio::test {

/// Counts live instances, so tests can see when a coroutine frame that owns
/// one is destroyed.
struct LifeTracker {
  static inline std::atomic<int> alive{0};
  LifeTracker() noexcept { ++alive; }
  LifeTracker(const LifeTracker&) noexcept { ++alive; }
  LifeTracker(LifeTracker&&) noexcept { ++alive; }
  ~LifeTracker() { --alive; }
};

/// Counts the copies and moves of its instances: for what must be passed
/// by reference.
struct CopyCounter {
  static inline int copies = 0;
  static inline int moves = 0;
  static void resetCounts() noexcept { copies = moves = 0; }
  int value;
  explicit CopyCounter(int v) noexcept : value(v) {}
  CopyCounter(const CopyCounter& other) noexcept : value(other.value) { ++copies; }
  CopyCounter(CopyCounter&& other) noexcept : value(other.value) { ++moves; }
};

/// Approximate native stack pointer of the caller.
[[gnu::noinline]] inline std::uintptr_t stackPointer() noexcept {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

/// A coroutine that starts at once and stays suspended at its end until
/// the test destroys it: for waiters resumed inline, and for frames
/// destroyed while they wait.
struct Eager {
  struct promise_type {
    Eager get_return_object() { return {std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  std::coroutine_handle<promise_type> handle;
};

/// Requests stop on `source` once `delay` of `ex`'s virtual time has
/// passed: a timeout for a cancellable wait.
inline Task<void> stopAfter(testing::ManualExecutor& ex, std::stop_source& source,
                            testing::ManualExecutor::Duration delay) {
  co_await ex.sleepFor(delay);
  source.request_stop();
}

/// A token whose stop has already been requested.
inline std::stop_token stoppedToken() {
  std::stop_source source;
  source.request_stop();
  return source.get_token();
}

/// Awaits `op` (a cancellable wait: yields bool) and stores the result in
/// `result` (left alone until then, so a sentinel shows it still waits).
template <typename Op>
Task<void> awaitInto(Op op, int& result) {
  const bool got = co_await std::move(op);
  result = got;
}

/// Runs `body(t)` for t in [0, n) on n threads that start together (so
/// they overlap even on a busy machine), and joins them.
template <typename F>
void onThreads(int n, F body) {
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  }
  for (auto& thread : threads) thread.join();
}

/// Runs `f` in a forked child whose output goes to /dev/null (the expected
/// message, and Catch's report of the signal, stay out of the log). True if
/// the child died of SIGABRT, as a failed COIO_ASSERT does (assertions are
/// on in the test builds).
template <typename F>
bool abortsInChild(F&& f) {
  std::fflush(nullptr);  // or the child would print what is still buffered again
  const pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    const int devNull = open("/dev/null", O_WRONLY);
    dup2(devNull, STDOUT_FILENO);
    dup2(devNull, STDERR_FILENO);
    f();
    _exit(0);  // only reached if nothing aborted
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return false;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

}  // namespace coio::test
