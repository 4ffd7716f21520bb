#pragma once
// ReactorLoop: the event loop both reactors are, over a backend
// that waits for I/O (ReactorBackend).
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/detail/kernel_sockets.hpp>
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/reactor/detail/root_task.hpp>
#include <coio/reactor/detail/sleep_awaiter.hpp>
#include <coio/reactor/loop_stats.hpp>
#include <coio/reactor/reactor.hpp>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <exception>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>
#include <utility>

namespace coio {

namespace detail {
// The backend of a reactor (see ReactorBackend), specialised beside it.
template <typename Reactor>
struct BackendOf;
}  // namespace detail

/// The event loop of a reactor (EpollReactor, UringReactor: each is a
/// ReactorLoop over its backend plus its I/O operations): run / runUntil /
/// stop, tasks owned by the loop (spawn), hand-over from other threads
/// (schedule, through an eventfd), timers (sleepFor, sleepUntil) and a
/// view into the loop (stats, setLoopTiming, setStallHandler). What every
/// reactor guarantees is listed with the coio::Reactor concept.
///
/// A turn of the loop: resume the ready coroutines, fire the due timers,
/// then the backend's poll (wait for I/O and dispatch it), with a timeout
/// of zero while coroutines are ready. `Reactor` is the reactor deriving
/// from it; its backend (a ReactorBackend) is the one the internal
/// BackendOf<Reactor> names.
template <typename Reactor>
class ReactorLoop : public detail::LoopCore {
  using Backend = typename detail::BackendOf<Reactor>::type;
  static_assert(ReactorBackend<Backend>, "a reactor's backend must model ReactorBackend");
  // A backend in virtual time (coio::sim::SimReactor's) keeps the clock and
  // orders each ready phase; the real ones leave both to steady_clock and
  // FIFO, at no cost (compile-time branches).
  static constexpr bool kVirtualTime = requires { Backend::kVirtualTime; };
  // A backend with sockets of its own (the simulation's) makes them; the
  // real ones leave it to the kernel (KernelSockets: the system calls).
  static constexpr bool kOwnSockets = requires(Backend& b) { b.openSocket(AF_INET); };

 public:
  /// The loop's clock (timers, stats).
  using Clock = std::chrono::steady_clock;
  /// What sleepFor(d) and sleepUntil(deadline) return. `co_await` it once,
  /// on the loop thread: it yields nothing, resumed on the loop thread at the
  /// deadline (in a later iteration if it has passed), or earlier, once the
  /// token the awaiting Task runs under is stopped.
  using SleepAwaitable = detail::SleepAwaiter<false>;
  /// What sleepFor(d, stop) and sleepUntil(deadline, stop) return: like
  /// SleepAwaitable, but yields true if the deadline passed, false if `stop`
  /// was requested first (then resumed on the loop thread in a later
  /// iteration).
  using CancellableSleepAwaitable = detail::SleepAwaiter<true>;

  /// Runs the loop on the calling thread until stop() (or until a spawned
  /// task throws, on whatever thread it then runs: the reactor then stops,
  /// and the first such exception is rethrown here).
  void run() {
    loop([] { return false; }, nullptr);
  }

  /// Runs the loop on the calling thread until `task` (started on this
  /// thread, inside the loop) finishes, and returns its result or rethrows
  /// its exception. Other tasks stay suspended until the loop runs again.
  /// If the reactor is stopped first, the task is destroyed unfinished and
  /// runUntil throws std::system_error(Errc::closed).
  template <typename T>
  T runUntil(Task<T> task) {
    detail::DriverTask<T> driver = detail::makeDriver(std::move(task));
    loop([&] { return driver.done(); }, driver.handle());
    if (!driver.done()) {
      throw std::system_error(make_error_code(Errc::closed), "coio: reactor stopped before runUntil's task finished");
    }
    return driver.result();
  }

  /// Asks the loop to stop; callable from any thread. Final: afterwards
  /// run() and runUntil() return at once, nothing the reactor holds is
  /// resumed again, and spawn() destroys its task unrun. When the loop
  /// notices the stop it destroys (on the loop thread) the spawned tasks
  /// that had not started yet; tasks that had started stay suspended until
  /// the reactor is destroyed (their frames may be waiting on another
  /// reactor, which only the reactor's destruction may assume is over).
  void stop() noexcept { LoopCore::stop(); }

  /// True on the thread currently inside run() / runUntil().
  bool isInLoopThread() const noexcept { return LoopCore::isInLoopThread(); }

  /// Hands `task` to the reactor, which owns it from now on; callable from
  /// any thread. The task starts on the loop thread in a later iteration
  /// (never inline). Once stop() was called the task is destroyed unrun, at
  /// once, on the calling thread (so whoever waits for it, e.g. on a
  /// std::future set by the task, learns it never ran instead of hanging);
  /// a task spawned just before the stop is destroyed unrun by the loop
  /// when it stops (or, if no loop runs again, with the reactor).
  void spawn(Task<void> task) {
    const std::coroutine_handle<detail::RootPromise> h = detail::makeRoot(std::move(task)).h;
    const bool local = LoopCore::isInLoopThread();
    bool wake = false;
    if (!linkRoot(h.promise(), local, wake)) {
      h.destroy();  // outside the lock: the task's destructors may spawn
      return;
    }
    if (local) ready_.push_back(h);
    if (wake) this->wake().signal();
  }

  /// The awaitable schedule() returns.
  class [[nodiscard]] ScheduleAwaiter {
   public:
    /// For schedule().
    explicit ScheduleAwaiter(LoopCore& core) noexcept : core_(core) {}
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) { core_.enqueue(h); }
    void await_resume() const noexcept {}

   private:
    LoopCore& core_;
  };

  /// `co_await schedule()` continues on the loop thread: from another thread
  /// it hops over (waking the loop); on the loop thread it yields to the
  /// coroutines already ready.
  ScheduleAwaiter schedule() noexcept { return ScheduleAwaiter{*this}; }

  /// Resumes on the loop thread at `deadline` (in a later iteration if it
  /// has passed). Timers with equal deadlines fire in the order they were set.
  /// Awaited from a coio Task, it ends early (as the cancellable form does,
  /// yielding nothing) once the token the Task runs under is stopped: a
  /// loop that only sleeps should check that token.
  SleepAwaitable sleepUntil(Clock::time_point deadline) noexcept { return {*this, deadline}; }
  /// sleepUntil(now + d).
  SleepAwaitable sleepFor(Clock::duration d) noexcept { return {*this, now() + d}; }
  /// Cancellable: yields true if the deadline passed, false if `stop` was
  /// requested first (the timer is then removed and the coroutine resumes in
  /// a later iteration; at once if it already was). `stop` must be requested
  /// on the loop thread. A default `stop` means the token of the awaiting
  /// Task (see currentStopToken).
  CancellableSleepAwaitable sleepUntil(Clock::time_point deadline, std::stop_token stop) noexcept {
    return {*this, deadline, std::move(stop)};
  }
  /// The cancellable sleepUntil(now + d, stop).
  CancellableSleepAwaitable sleepFor(Clock::duration d, std::stop_token stop) noexcept {
    return {*this, now() + d, std::move(stop)};
  }

  /// The loop's clock, which its sleeps and deadlines (withTimeout, waitFor)
  /// measure against: steady_clock's now, or a simulated reactor's virtual
  /// time. Code meant to run on either reads the time here. Any thread.
  Clock::time_point now() const noexcept {
    if constexpr (kVirtualTime) {
      return backend_.now();
    } else {
      return Clock::now();
    }
  }

  // --- Sockets. The net layer (TcpListener, TcpStream) makes, configures
  // and closes its sockets here rather than with the system calls, so that
  // a simulated reactor (coio::sim::SimReactor) can stand in for the
  // kernel; on EpollReactor and UringReactor each is the system call.
  // Errors are errno's values; any thread (the kernel's are thread-safe;
  // the simulation's are loop-thread only, as all of it is).

  /// socket(2): a non-blocking, close-on-exec TCP socket of `family`
  /// (AF_INET or AF_INET6): its fd.
  Result<int> openSocket(int family) { return sockets().openSocket(family); }
  /// bind(2).
  Result<void> bindSocket(int fd, const sockaddr* address, socklen_t length) {
    return sockets().bindSocket(fd, address, length);
  }
  /// listen(2).
  Result<void> listenSocket(int fd, int backlog) { return sockets().listenSocket(fd, backlog); }
  /// setsockopt(2) (the simulation takes every option and ignores it).
  Result<void> setSocketOption(int fd, int level, int name, const void* value, socklen_t length) noexcept {
    return sockets().setSocketOption(fd, level, name, value, length);
  }
  /// getsockname(2), or with `peer` getpeername(2), into `out`: the
  /// address's length.
  Result<socklen_t> socketName(int fd, bool peer, sockaddr_storage& out) noexcept {
    return sockets().socketName(fd, peer, out);
  }
  /// shutdown(2) (`how`: SHUT_RD, SHUT_WR, SHUT_RDWR).
  Result<void> shutdownSocket(int fd, int how) noexcept { return sockets().shutdownSocket(fd, how); }
  /// RFC 793's ABORT: the connection is reset (the peer gets an RST), the
  /// data queued to send dropped; the fd stays open until closeSocket.
  Result<void> resetSocket(int fd) noexcept { return sockets().resetSocket(fd); }
  /// forget(fd), then close(2). No operation may be pending on it.
  void closeSocket(int fd) noexcept {
    static_cast<Reactor&>(*this).forget(fd);
    sockets().closeSocket(fd);
  }

  /// A snapshot of the loop's counters, queue depths and times (see
  /// LoopStats for what each counts). Counting costs a plain increment
  /// where operations are submitted and completed and where the loop turns;
  /// the snapshot itself walks nothing but the queue of posted coroutines.
  /// Loop thread (or while no loop runs): from another thread, hop over
  /// first (`co_await reactor.schedule()`), which also makes the snapshot
  /// consistent (every counter as of one moment of the loop).
  LoopStats stats() const {
    COIO_ASSERT(ownedByCaller(), "stats() read off the reactor's thread");
    LoopStats s = meter_.snapshot();
    s.ready = readyCount();
    s.unsubmitted = backend_.unsubmitted();
    return s;
  }

  /// Turns the timing of the loop's turns on or off (off by default; a
  /// stall handler turns it on too): stats().waiting, running and
  /// longestTurn grow only while it is on. Cost while on: one clock read
  /// per phase of a turn that ran something (LoopPhase: at most three), and
  /// one after each wait that could block; none while off. Loop thread (or
  /// while no loop runs); the turn under way is timed from the call on.
  void setLoopTiming(bool on) noexcept {
    COIO_ASSERT(ownedByCaller(), "loop timing set off the reactor's thread");
    meter_.setTiming(on);
  }

  /// The stall detector: after each turn of the loop (the work between two
  /// waits for I/O: see LoopPhase) that took longer than `threshold`,
  /// calls `handler` with the turn's duration, its phases' durations and
  /// what each ran (LoopStall), on the loop thread, before the loop waits
  /// again. An empty `handler` removes it. Times the loop while set (see
  /// setLoopTiming for the cost). The handler may read stats(), spawn,
  /// stop() or replace itself; its own time is not part of any turn; an
  /// exception it throws propagates out of run() / runUntil(). Loop thread
  /// (or while no loop runs). `threshold` must not be negative.
  void setStallHandler(Clock::duration threshold, StallHandler handler) {
    COIO_ASSERT(ownedByCaller(), "stall handler set off the reactor's thread");
    COIO_ASSERT(threshold >= Clock::duration::zero(), "negative stall threshold");
    meter_.setStallHandler(threshold, std::move(handler));
  }

 protected:
  /// Constructs the backend with this loop and `args`.
  template <typename... Args>
  explicit ReactorLoop(Args&&... args) : backend_(static_cast<detail::LoopCore&>(*this), std::forward<Args>(args)...) {}
  /// Lets go of the kernel side, then destroys the tasks the loop still
  /// owns (their awaiters deregister from the backend, still alive here).
  ~ReactorLoop() {
    backend_.quiesce();
    destroyRoots();
  }

  /// What waits for I/O: the reactor's operations submit to it.
  Backend backend_;

  /// A turn of the loop but its wait: the ready phase, then the due
  /// timers. (A simulation's nodes take their turns through it, inside
  /// the loop of the reactor that runs them all.) Inlined: the real
  /// reactors' loop is the same code as before it was a function.
  [[gnu::always_inline]] inline void readyAndTimers() {
    meter_.iteration();
    inlineTurns_ = kInlineTurnsPerIteration;
    if constexpr (kVirtualTime) backend_.order(ready_);
    const bool resumed = runReady();
    // No clock read without timers, one with (waitTimeout reads it only
    // if no deadline could be armed): where the clock is not in the vDSO
    // (e.g. a TCG guest's), each read is a system call. Timed, that read
    // is the ready phase's end.
    if (meter_.timed() && (resumed || timers_.size() != 0)) meter_.phaseEnded(LoopPhase::ready);
    if (timers_.size() != 0) {
      const bool fired = timers_.fireDue(timersNow());
      if (meter_.timed() && fired) meter_.phaseEnded(LoopPhase::timers);
    }
    if (meter_.timed()) meter_.endTurn();  // before the loop's check: the stall handler may stop it
  }

 private:
  template <typename Done>
  void loop(Done done, std::coroutine_handle<> first) {
    COIO_ASSERT(loopThread_.load(std::memory_order_relaxed) == std::thread::id{}, "reactor run by two threads at once");
    loopThread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    struct LeaveLoop {
      ReactorLoop& loop;
      ~LeaveLoop() {
        loop.backend_.leaveLoop();
        loop.loopThread_.store(std::thread::id{}, std::memory_order_relaxed);
      }
    } leave{*this};
    if (first && !stopRequested()) ready_.push_back(first);
    if (meter_.timed()) meter_.beginTurn();
    // A turn is the work between two waits: dispatching what the wait
    // returned (in poll), then the ready phase, then the timers. Timed
    // (LoopMeter), each phase that ran something ends with a clock read.
    while (!done() && !stopRequested()) {
      readyAndTimers();
      if (done() || stopRequested()) break;
      backend_.poll(waitTimeout());
      if (meter_.timed() && meter_.dispatchedThisTurn()) meter_.phaseEnded(LoopPhase::completions);
    }
    // The last turn, if it ended in its completions phase (after a break,
    // an empty turn: endTurn() has nothing left to account).
    if (meter_.timed()) meter_.endTurn();
    if (stopRequested()) {
      // Final: the kernel lets go of every operation; nothing resumes again.
      backend_.quiesce();
      destroyUnstartedRoots();
    }
    if (std::exception_ptr failure = takeFailure()) std::rethrow_exception(failure);
  }

  // Where sockets are made: the backend, or the kernel.
  decltype(auto) sockets() noexcept {
    if constexpr (kOwnSockets) {
      return (backend_);
    } else {
      return detail::KernelSockets{};
    }
  }

  // How long the backend's poll may wait: not at all with coroutines ready, else
  // until I/O (nullopt) once the next timer's deadline is armed in the
  // backend (armDeadline, re-armed only when that deadline changes: a wait
  // with a timeout of its own costs the kernel an hrtimer per wait), or, if
  // that could not be armed, until the deadline.
  std::optional<Clock::duration> waitTimeout() {
    if (!ready_.empty() || postedHead_) return Clock::duration::zero();
    const std::optional<Clock::time_point> next = timers_.nextDeadline();
    if (!next) return std::nullopt;
    if (backend_.armDeadline(*next)) return std::nullopt;
    // A fresh reading: fired timers resumed their coroutines since fireDue's.
    return std::max(*next - now(), Clock::duration::zero());
  }

  // When the due timers are: timed on a real clock, the ready phase's end
  // mark is that clock read too.
  Clock::time_point timersNow() {
    if (!kVirtualTime && meter_.timed()) return meter_.mark();
    return now();
  }
};

}  // namespace coio
