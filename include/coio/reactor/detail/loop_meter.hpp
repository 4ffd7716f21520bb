#pragma once
// LoopMeter: the counters behind LoopStats and the turn timing behind the
// stall detector, one per loop (LoopCore). Loop thread only: counting is a
// plain increment where the reactors submit, complete and dispatch.
//
// Timing, while on: a turn is the loop thread's work between two waits for
// I/O, in three phases (LoopPhase). The loop marks the end of each phase
// that ran something (one clock read each; an idle phase's few instructions
// go to the next phase marked), the end of the turn before it waits, and
// the wake-up after a wait that could block (one read; a wait that could not
// block, because work was ready, counts as running). Off, it costs a test of
// one bool per phase.
#include <coio/reactor/detail/timer_queue.hpp>
#include <coio/reactor/loop_stats.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace coio::detail {

// Which counters an operation's submission and completion go to: its
// OpKind, or kUncounted (the reactor's own operations: a slot of its own,
// never reported, so that counting needs no branch).
inline constexpr std::uint8_t kUncounted = kOpKinds;
constexpr std::uint8_t counterOf(OpKind kind) noexcept { return static_cast<std::uint8_t>(kind); }

class LoopMeter {
 public:
  using Clock = std::chrono::steady_clock;

  /// `timers`: the loop's, whose fired() count the turns report.
  explicit LoopMeter(const TimerQueue& timers) noexcept : timers_(timers) {}

  void submitted(std::uint8_t counter) noexcept { ++ops_[counter].submitted; }
  void completed(std::uint8_t counter) noexcept { ++ops_[counter].completed; }
  void completedInline() noexcept { ++completedInline_; }
  void dispatched(std::size_t events) noexcept { events_ += events; }
  void resumed(std::size_t coroutines) noexcept { resumed_ += coroutines; }
  void iteration() noexcept { ++iterations_; }

  /// The counters, the timers and the times; the loop adds its queues'
  /// depths.
  LoopStats snapshot() const noexcept {
    LoopStats s;
    std::copy_n(ops_.begin(), kOpKinds, s.ops.begin());
    for (const LoopStats::Ops& ops : s.ops) s.inFlight += ops.submitted - ops.completed;
    // Timers are the queue's (no count of their own here): set, and fired or cancelled.
    s.ops[counterOf(OpKind::timer)] = {timers_.pushed(), timers_.pushed() - timers_.size()};
    s.timersFired = timers_.fired();
    s.timers = timers_.size();
    s.completedInline = completedInline_;
    s.events = events_;
    s.resumed = resumed_;
    s.iterations = iterations_;
    s.timed = timed_;
    s.waiting = waiting_;
    s.running = running_;
    s.longestTurn = longestTurn_;
    s.stalls = stalls_;
    return s;
  }

  bool timed() const noexcept { return timed_; }
  void setTiming(bool on) noexcept {
    timing_ = on;
    retime();
  }
  void setStallHandler(Clock::duration threshold, StallHandler handler) {
    threshold_ = threshold;
    handler_ = std::move(handler);
    retime();
  }

  // --- The loop's marks, while timed().

  /// A turn starts now: the loop starts, or timing was turned on.
  void beginTurn() noexcept {
    mark_ = Clock::now();
    startTurn();
  }
  /// `p` is over: it ran something, or the next phase needs the time.
  void phaseEnded(LoopPhase p) noexcept {
    const Clock::time_point now = Clock::now();
    phases_[phase(p)] += now - mark_;
    mark_ = now;
  }
  /// Whether the completions phase of this turn dispatched anything.
  bool dispatchedThisTurn() const noexcept { return events_ != ranAtStart_[phase(LoopPhase::completions)]; }
  /// The turn is over (the loop is about to wait, or returns): its time is
  /// accounted, and if it ran past the threshold the stall handler is
  /// called (a copy: it may replace itself). The handler's own time counts
  /// as running, in no turn. Its exceptions propagate.
  void endTurn() {
    const Clock::duration turn = phases_[0] + phases_[1] + phases_[2];
    running_ += turn;
    longestTurn_ = std::max(longestTurn_, turn);
    const bool stalled = handler_ && turn > threshold_;
    LoopStall stall;
    if (stalled) {
      stall.duration = turn;
      const std::array<std::uint64_t, kLoopPhases> ran = ranSoFar();
      for (std::size_t i = 0; i < kLoopPhases; ++i) {
        stall.phases[i] = phases_[i];
        stall.ran[i] = ran[i] - ranAtStart_[i];
        if (phases_[i] > phases_[phase(stall.phase)]) stall.phase = static_cast<LoopPhase>(i);
      }
    }
    startTurn();
    if (!stalled) return;
    ++stalls_;
    const StallHandler handler = handler_;
    handler(stall);
    const Clock::time_point now = Clock::now();
    running_ += now - mark_;
    mark_ = now;
  }
  /// After a wait; `couldBlock`: it was given a timeout other than zero.
  void woke(bool couldBlock) noexcept {
    if (!couldBlock) return;  // no time spent waiting: no reading
    const Clock::time_point now = Clock::now();
    waiting_ += now - mark_;
    mark_ = now;
  }
  /// The latest reading: fresh right after phaseEnded().
  Clock::time_point mark() const noexcept { return mark_; }

 private:
  static constexpr std::size_t phase(LoopPhase p) noexcept { return static_cast<std::size_t>(p); }

  // What the phases ran since the reactor started, by LoopPhase.
  std::array<std::uint64_t, kLoopPhases> ranSoFar() const noexcept { return {events_, resumed_, timers_.fired()}; }
  void startTurn() noexcept {
    phases_ = {};
    ranAtStart_ = ranSoFar();
  }
  void retime() noexcept {
    const bool was = timed_;
    timed_ = timing_ || static_cast<bool>(handler_);
    if (timed_ && !was) beginTurn();
  }

  const TimerQueue& timers_;

  std::array<LoopStats::Ops, kOpKinds + 1> ops_{};  // by counter: the last is kUncounted
  std::uint64_t completedInline_ = 0;
  std::uint64_t events_ = 0;
  std::uint64_t resumed_ = 0;
  std::uint64_t iterations_ = 0;

  bool timing_ = false;  // setTiming
  bool timed_ = false;   // timing_, or a stall handler
  Clock::duration threshold_{};
  StallHandler handler_;
  Clock::time_point mark_{};                         // the latest reading
  std::array<Clock::duration, kLoopPhases> phases_{};  // of the current turn
  std::array<std::uint64_t, kLoopPhases> ranAtStart_{};  // ranSoFar() when it started
  Clock::duration waiting_{};
  Clock::duration running_{};
  Clock::duration longestTurn_{};
  std::uint64_t stalls_ = 0;
};

}  // namespace coio::detail
