#pragma once
#include <coio/core/async_scope.hpp>
#include <coio/core/task.hpp>

#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <queue>
#include <utility>
#include <vector>

namespace coio::testing {

/// The clock of a ManualExecutor: it only moves when the test says so.
struct VirtualClock {
  /// Nanoseconds of virtual time.
  using duration = std::chrono::nanoseconds;
  /// See std::chrono clocks.
  using rep = duration::rep;
  /// See std::chrono clocks.
  using period = duration::period;
  /// A point in virtual time.
  using time_point = std::chrono::time_point<VirtualClock, duration>;
  /// Virtual time never goes back.
  static constexpr bool is_steady = true;
};

/// A deterministic, single-threaded executor with virtual time, for
/// unit-testing coroutine scheduling (ordering, fairness, timeouts) without
/// threads or real time.
///
/// Guarantees:
/// - Nothing runs except inside `step()`, `drain()` or `advance()`, on the
///   calling thread. Ready coroutines run in FIFO order of being scheduled.
/// - Timers fire in deadline order, ties in the order they were set; time
///   moves only in `advance()`, and each timer sees `now()` equal to its own
///   deadline.
/// - An exception escaping a `spawn`ed task is rethrown from the `step()` /
///   `drain()` / `advance()` call that ran it.
/// - Not thread-safe: every call, and every resumption it causes, belongs to
///   the one thread that drives it.
class ManualExecutor {
 public:
  /// The executor's virtual clock.
  using Clock = VirtualClock;
  /// A span of virtual time.
  using Duration = Clock::duration;
  /// A point in virtual time.
  using TimePoint = Clock::time_point;

  ManualExecutor() : scope_([this](std::exception_ptr e) { failures_.push_back(std::move(e)); }) {}
  ManualExecutor(const ManualExecutor&) = delete;
  ManualExecutor& operator=(const ManualExecutor&) = delete;

  /// Queues a coroutine to be resumed by a later step().
  void add(std::coroutine_handle<> h) { ready_.push_back(h); }

  /// Queues `task` to start at the next step(); the executor owns it.
  void spawn(Task<void> task) { scope_.spawn(startOnExecutor(std::move(task))); }

  /// Spawned tasks that have not finished.
  std::size_t outstanding() const noexcept { return scope_.outstanding(); }

  /// Runs one ready coroutine. Returns false if none was ready.
  bool step() {
    if (ready_.empty()) return false;
    std::coroutine_handle<> h = ready_.front();
    ready_.pop_front();
    h.resume();
    rethrowFailures();
    return true;
  }

  /// Runs ready coroutines until none is left (time does not move).
  /// Returns how many ran.
  std::size_t drain() {
    std::size_t n = 0;
    while (step()) ++n;
    return n;
  }

  /// The current virtual time (starts at zero; moves only in advance()).
  TimePoint now() const noexcept { return now_; }

  /// Moves virtual time forward by `d`, firing due timers in order and
  /// draining after each one.
  void advance(Duration d) {
    const TimePoint target = now_ + d;
    drain();
    while (!timers_.empty() && timers_.top().deadline <= target) {
      now_ = timers_.top().deadline;
      while (!timers_.empty() && timers_.top().deadline == now_) {
        ready_.push_back(timers_.top().handle);
        timers_.pop();
      }
      drain();
    }
    now_ = target;
  }

  /// Timers not yet fired.
  std::size_t pendingTimers() const noexcept { return timers_.size(); }

  /// Awaitable: resume at a later step(), behind everything already ready.
  auto schedule() noexcept {
    struct Awaiter {
      ManualExecutor& ex;
      bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) { ex.add(h); }
      void await_resume() const noexcept {}
    };
    return Awaiter{*this};
  }

  /// Awaitable: resume when virtual time reaches `deadline` (at once, via
  /// the ready queue, if it already has).
  auto sleepUntil(TimePoint deadline) noexcept {
    struct Awaiter {
      ManualExecutor& ex;
      TimePoint deadline;
      bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) {
        if (deadline <= ex.now_) {
          ex.add(h);
        } else {
          ex.timers_.push(Timer{deadline, ex.nextTimerSeq_++, h});
        }
      }
      void await_resume() const noexcept {}
    };
    return Awaiter{*this, deadline};
  }

  /// Awaitable: resumes `d` of virtual time from now, during advance(), on the advancing thread.
  auto sleepFor(Duration d) noexcept { return sleepUntil(now_ + d); }

 private:
  struct Timer {
    TimePoint deadline;
    std::uint64_t seq;
    std::coroutine_handle<> handle;
    bool operator>(const Timer& o) const noexcept {
      return deadline != o.deadline ? deadline > o.deadline : seq > o.seq;
    }
  };

  Task<void> startOnExecutor(Task<void> task) {
    co_await schedule();
    co_await std::move(task);
  }

  void rethrowFailures() {
    if (failures_.empty()) return;
    std::exception_ptr e = std::move(failures_.front());
    failures_.erase(failures_.begin());
    std::rethrow_exception(e);
  }

  TimePoint now_{};
  std::deque<std::coroutine_handle<>> ready_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  std::uint64_t nextTimerSeq_ = 0;
  std::vector<std::exception_ptr> failures_;
  AsyncScope scope_;  // last: its tasks may touch the members above while it is checked
};

}  // namespace coio::testing
