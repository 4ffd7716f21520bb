#pragma once
// LoopStats and LoopStall: a view into a reactor's loop. The counters and
// queue depths a service exports (reactor.stats()), and what the stall
// detector reports about a turn of the loop that ran too long
// (reactor.setStallHandler()). Both reactors fill them the same way.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace coio {

/// The kinds of operation LoopStats counts.
enum class OpKind : std::uint8_t {
  recv,       ///< recv, recvAll (and a multishot recv kept armed for them)
  send,       ///< send, sendv (and zero-copy sends)
  accept,     ///< accept
  connect,    ///< connect
  poll,       ///< readable, writable
  timer,      ///< sleepFor, sleepUntil (also withTimeout's deadline)
  diskRead,   ///< a File's reads (read, readv, read_fixed)
  diskWrite,  ///< a File's writes (write, writev, write_fixed)
  diskSync,   ///< fsync, fdatasync
  other,      ///< any other: splice, tee, sendfile; io_uring's open, statx, close, fallocate, ...
};

/// How many OpKinds there are: the size of LoopStats::ops.
inline constexpr std::size_t kOpKinds = static_cast<std::size_t>(OpKind::other) + 1;

/// The kind's name, for metric labels and messages ("recv", "diskRead", ...).
constexpr std::string_view toString(OpKind kind) noexcept {
  constexpr std::string_view names[kOpKinds] = {"recv", "send",     "accept",    "connect",  "poll",
                                                "timer", "diskRead", "diskWrite", "diskSync", "other"};
  return static_cast<std::size_t>(kind) < kOpKinds ? names[static_cast<std::size_t>(kind)] : "?";
}

/// The phases of one turn of the loop, in the order they run. A turn is
/// everything the loop thread does between two waits for I/O.
enum class LoopPhase : std::uint8_t {
  /// Dispatching what the wait returned: I/O completions and readiness
  /// (each resumes the coroutine that waited for it, inline), and
  /// coroutines handed over from other threads (schedule, spawn).
  completions,
  /// Resuming the coroutines queued on the loop thread: spawned there,
  /// `co_await schedule()`, operations that yield to the next iteration.
  ready,
  /// Firing the timers that are due (each resumes its sleeper, inline).
  timers,
};

/// How many LoopPhases there are.
inline constexpr std::size_t kLoopPhases = static_cast<std::size_t>(LoopPhase::timers) + 1;

/// The phase's name ("completions", "ready", "timers").
constexpr std::string_view toString(LoopPhase phase) noexcept {
  constexpr std::string_view names[kLoopPhases] = {"completions", "ready", "timers"};
  return static_cast<std::size_t>(phase) < kLoopPhases ? names[static_cast<std::size_t>(phase)] : "?";
}

/// A snapshot of one reactor's loop (`reactor.stats()`), taken on its loop
/// thread. Counters count from the reactor's construction and never go
/// back; depths are as of the snapshot.
///
/// What counts as an operation is what the reactor waits on the kernel for:
/// an SQE (UringReactor; the Disk's SQEs too, on either reactor) or a wait
/// registered for an fd's readiness (EpollReactor). It is `submitted` when
/// that starts and `completed` when it ends, whatever the result (an error
/// or a cancellation included; a multishot recv at its last completion);
/// so submitted - completed is what is in flight. An operation that needs
/// no wait (a send the socket took at once, a recv that found data under
/// epoll, an error known up front) counts only in `completedInline`. The
/// reactor's own operations (its wake-up eventfd, its timer deadline) and
/// cancel requests are not counted. Timers count as operations of kind
/// `timer`: submitted when set, completed when fired or cancelled.
struct LoopStats {
  /// The counters of one kind of operation.
  struct Ops {
    std::uint64_t submitted = 0;  ///< waits started: SQEs, fd waits, timers set
    std::uint64_t completed = 0;  ///< waits ended, whatever the result
  };

  /// By OpKind (see operator[]).
  std::array<Ops, kOpKinds> ops{};
  /// The counters of `kind`.
  const Ops& operator[](OpKind kind) const noexcept { return ops[static_cast<std::size_t>(kind)]; }

  std::uint64_t completedInline = 0;  ///< operations of any kind that completed without a wait
  std::uint64_t timersFired = 0;      ///< timers that fired (the others completed were cancelled)
  std::uint64_t events = 0;           ///< what the reactor's waits returned: epoll events, io_uring CQEs
  std::uint64_t resumed = 0;          ///< coroutines resumed from the ready queue (LoopPhase::ready)
  std::uint64_t iterations = 0;       ///< turns of the loop

  std::size_t inFlight = 0;     ///< operations submitted and not completed (timers aside)
  std::size_t ready = 0;        ///< coroutines queued for the loop's next ready phase (not those other threads handed over)
  std::size_t timers = 0;       ///< timers set and not fired or cancelled yet
  std::size_t unsubmitted = 0;  ///< UringReactor: SQEs prepared, not handed to the kernel yet (0 on epoll)

  /// Whether the loop times its turns (setLoopTiming, setStallHandler):
  /// the durations below only grow while it does.
  bool timed = false;
  /// The loop thread's time inside the reactor's waits for I/O that could
  /// block (with io_uring, that includes the kernel's work on the
  /// submissions the wait hands over).
  std::chrono::nanoseconds waiting{};
  /// Its time in the turns between those waits (the LoopPhases).
  std::chrono::nanoseconds running{};
  /// The longest turn timed.
  std::chrono::nanoseconds longestTurn{};
  /// Turns longer than the stall threshold: the stall handler's calls.
  std::uint64_t stalls = 0;
};

/// One turn of the loop that ran longer than the stall threshold, as the
/// stall handler receives it (see setStallHandler).
struct LoopStall {
  std::chrono::nanoseconds duration{};  ///< the turn: its phases together
  LoopPhase phase = LoopPhase::completions;  ///< the phase that took longest
  /// Each phase's time, by LoopPhase.
  std::array<std::chrono::nanoseconds, kLoopPhases> phases{};
  /// What each phase ran, by LoopPhase: events dispatched (each resumes
  /// the coroutines waiting for it), coroutines resumed, timers fired.
  std::array<std::uint64_t, kLoopPhases> ran{};
};

/// What the stall detector calls, on the loop thread, after a turn that ran
/// longer than the threshold.
using StallHandler = std::function<void(const LoopStall&)>;

}  // namespace coio
