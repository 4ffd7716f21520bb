#pragma once
// ReactorBase<Derived>: everything the epoll and io_uring reactors share:
// the loop (run / runUntil / stop), tasks owned by the reactor (spawn),
// hand-over from other threads (schedule, through an eventfd), and timers.
// Derived supplies `poll(timeout)` (wait for I/O and dispatch it; call
// `resumeRemote()` when the wake-up eventfd fired), `armDeadline(t)` (wake
// the loop at time t without a timeout on each wait; false if it cannot),
// `quiesce()` (make sure the kernel holds no reference to any operation,
// without resuming anything), `leaveLoop()` (on the loop thread, as
// run() / runUntil() return: undo what that run of the loop tied to its
// thread) and `unsubmitted()` (operations prepared but not handed to the
// kernel yet, for stats()). Derived counts its operations in `meter_`
// (LoopMeter) where it submits and completes them, and its poll calls
// `woke(timeout)` right after its wait returns, before dispatching.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/detail/outcome.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/detail/fd.hpp>
#include <coio/detail/loop_meter.hpp>
#include <coio/detail/syscall.hpp>
#include <coio/detail/timer_queue.hpp>
#include <coio/reactor/loop_stats.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace coio::detail {

// The wake-up channel of a loop: any thread signals, the loop watches it.
class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (!fd_.valid()) throwSystemError(errno, "coio: eventfd");
  }
  int fd() const noexcept { return fd_.get(); }
  void signal() noexcept {
    const std::uint64_t one = 1;
    // Fails only if the counter would overflow, and then the loop is due to wake anyway.
    (void)retryOnEintr([&] { return ::write(fd_.get(), &one, sizeof one); });
  }
  void drain() noexcept {
    std::uint64_t value;
    (void)retryOnEintr([&] { return ::read(fd_.get(), &value, sizeof value); });
  }

 private:
  FileDescriptor fd_;
};

class LoopCore;

/// A coroutine queued to resume in a later loop iteration without
/// allocating (LoopCore::post): the awaiter that queues it owns the node,
/// so that noexcept paths such as stop callbacks can queue.
struct PostedResume {
  PostedResume* next = nullptr;
  std::coroutine_handle<> handle;
};

// The coroutine that owns a spawned task. It lives in the reactor's list of
// roots until it finishes (then it unlinks and frees itself), until the loop
// stops before it started (then the loop destroys it), or until the reactor
// is destroyed (then the reactor destroys it, and with it the whole chain of
// frames it awaits).
struct RootPromise : PooledFrame {
  struct InitialAwaiter {
    RootPromise& promise;
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<>) const noexcept {}
    void await_resume() const noexcept { promise.started = true; }
  };
  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    void await_suspend(std::coroutine_handle<RootPromise> h) noexcept;
    void await_resume() noexcept {}
  };
  struct Handle {
    using promise_type = RootPromise;
    std::coroutine_handle<RootPromise> h;
  };
  Handle get_return_object() noexcept { return {std::coroutine_handle<RootPromise>::from_promise(*this)}; }
  InitialAwaiter initial_suspend() noexcept { return {*this}; }
  FinalAwaiter final_suspend() noexcept { return {}; }
  void return_void() noexcept {}
  void unhandled_exception() noexcept;

  LoopCore* owner = nullptr;
  RootPromise* prev = nullptr;
  RootPromise* next = nullptr;
  std::exception_ptr failure;  // what escaped the task, handed to the owner at the end
  bool started = false;        // loop thread only: resumed at least once
};

inline RootPromise::Handle makeRoot(Task<void> task) { co_await std::move(task); }

// runUntil's driver: suspends at the end so that the result can be read.
template <typename T>
class DriverTask {
 public:
  struct promise_type : OutcomeReturn<T> {
    DriverTask get_return_object() noexcept {
      return DriverTask{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_always final_suspend() noexcept { return {}; }
  };
  DriverTask(DriverTask&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  DriverTask& operator=(DriverTask&&) = delete;
  ~DriverTask() {
    if (handle_) handle_.destroy();
  }
  std::coroutine_handle<> handle() const noexcept { return handle_; }
  bool done() const noexcept { return handle_.done(); }
  T result() { return handle_.promise().outcome.get(); }

 private:
  explicit DriverTask(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

template <typename T>
DriverTask<T> makeDriver(Task<T> task) {
  co_return co_await std::move(task);
}
template <>
inline DriverTask<void> makeDriver(Task<void> task) {
  co_await std::move(task);
}

/// The state and operations common to every reactor (see ReactorBase).
class LoopCore {
 public:
  using Clock = std::chrono::steady_clock;

  LoopCore() = default;
  LoopCore(const LoopCore&) = delete;
  LoopCore& operator=(const LoopCore&) = delete;
  ~LoopCore() { COIO_ASSERT(roots_ == nullptr, "reactor destroyed without closing its loop"); }

  /// True on the thread currently inside run() / runUntil().
  bool isInLoopThread() const noexcept {
    return loopThread_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

  /// Asks the loop to stop; callable from any thread. Final: afterwards
  /// run() and runUntil() return at once, nothing the reactor holds is
  /// resumed again, and spawn() destroys its task unrun. When the loop
  /// notices the stop it destroys (on the loop thread) the spawned tasks
  /// that had not started yet; tasks that had started stay suspended until
  /// the reactor is destroyed (their frames may be waiting on another
  /// reactor, which only the reactor's destruction may assume is over).
  void stop() noexcept {
    stopRequested_.store(true, std::memory_order_release);
    if (!isInLoopThread()) wake_.signal();
  }

  bool stopRequested() const noexcept { return stopRequested_.load(std::memory_order_acquire); }

  /// Hands `task` to the reactor, which owns it from now on; callable from
  /// any thread. The task starts on the loop thread in a later iteration
  /// (never inline). Once stop() was called the task is destroyed unrun, at
  /// once, on the calling thread (so whoever waits for it, e.g. on a
  /// std::future set by the task, learns it never ran instead of hanging);
  /// a task spawned just before the stop is destroyed unrun by the loop
  /// when it stops (or, if no loop runs again, with the reactor).
  void spawn(Task<void> task) {
    std::coroutine_handle<RootPromise> h = makeRoot(std::move(task)).h;
    h.promise().owner = this;
    const bool local = isInLoopThread();
    bool accepted = false, wake = false;
    {
      std::lock_guard lock(mutex_);
      // Checked under the lock: the loop takes it to collect the unstarted
      // roots after it saw the stop, so a root is either collected or refused.
      if (!closed_ && !stopRequested()) {
        RootPromise& p = h.promise();
        p.next = roots_;
        if (roots_) roots_->prev = &p;
        roots_ = &p;
        if (!local) wake = pushRemoteLocked(h);
        accepted = true;
      }
    }
    if (!accepted) {
      h.destroy();  // outside the lock: the task's destructors may spawn
      return;
    }
    if (local) ready_.push_back(h);
    if (wake) wake_.signal();
  }

  class [[nodiscard]] ScheduleAwaiter {
   public:
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

  template <bool Cancellable>
  class [[nodiscard]] SleepAwaiter : TimerNode {
   public:
    SleepAwaiter(LoopCore& core, Clock::time_point deadline, std::stop_token stop = {}) noexcept
        : core_(core), stop_(std::move(stop)) {
      this->deadline = deadline;
      this->fire = &SleepAwaiter::onFire;
    }
    SleepAwaiter(const SleepAwaiter&) = delete;
    SleepAwaiter& operator=(const SleepAwaiter&) = delete;
    ~SleepAwaiter() {
      if (queued()) core_.timers_.remove(*this);
    }

    bool await_ready() const noexcept { return Cancellable && stop_.stop_requested(); }
    template <typename Promise>
    bool await_suspend(std::coroutine_handle<Promise> h) {
      COIO_ASSERT(core_.ownedByCaller(), "sleep awaited off the reactor's thread");
      if (inheritStopToken(stop_, h) && stop_.stop_requested()) return false;
      handle_ = h;
      core_.timers_.push(*this);
      if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
      return true;
    }
    auto await_resume() noexcept {
      if constexpr (Cancellable) {
        onStop_.reset();
        return fired_;
      }
    }

   private:
    struct OnStop {
      SleepAwaiter* self;
      void operator()() const noexcept {
        COIO_ASSERT(self->core_.isInLoopThread(), "stop requested off the reactor's thread");
        if (!self->queued()) return;
        self->core_.timers_.remove(*self);
        self->core_.post(self->posted_, self->handle_);
      }
    };
    static void onFire(TimerNode* n) noexcept {
      auto* self = static_cast<SleepAwaiter*>(n);
      self->fired_ = true;
      self->handle_.resume();
    }

    LoopCore& core_;
    std::stop_token stop_;
    std::coroutine_handle<> handle_;
    PostedResume posted_;
    bool fired_ = false;
    std::optional<std::stop_callback<OnStop>> onStop_;
  };

  /// Resumes on the loop thread at `deadline` (in a later iteration if it
  /// has passed). Timers with equal deadlines fire in the order they were set.
  /// Awaited from a coio Task, it ends early (as the cancellable form does,
  /// yielding nothing) once the token the Task runs under is stopped: a
  /// loop that only sleeps should check that token.
  SleepAwaiter<false> sleepUntil(Clock::time_point deadline) noexcept { return {*this, deadline}; }
  SleepAwaiter<false> sleepFor(Clock::duration d) noexcept { return {*this, Clock::now() + d}; }
  /// Cancellable: yields true if the deadline passed, false if `stop` was
  /// requested first (the timer is then removed and the coroutine resumes in
  /// a later iteration; at once if it already was). `stop` must be requested
  /// on the loop thread. A default `stop` means the token of the awaiting
  /// Task (see currentStopToken).
  SleepAwaiter<true> sleepUntil(Clock::time_point deadline, std::stop_token stop) noexcept {
    return {*this, deadline, std::move(stop)};
  }
  SleepAwaiter<true> sleepFor(Clock::duration d, std::stop_token stop) noexcept {
    return {*this, Clock::now() + d, std::move(stop)};
  }

  /// Loop thread: resume `h` in a later iteration (after I/O is polled).
  /// Never allocates: `node`, which must live until then (a member of the
  /// awaiter `h` is suspended in), carries it.
  void post(PostedResume& node, std::coroutine_handle<> h) noexcept {
    node.handle = h;
    node.next = nullptr;
    (postedTail_ ? postedTail_->next : postedHead_) = &node;
    postedTail_ = &node;
  }

  /// How many operations per loop iteration may complete inline (without
  /// suspending: a socket with room or data, data a reactor read ahead, an
  /// error known up front). Past that, they still complete but resume their
  /// coroutine in the next iteration, after timers and other fds: a
  /// coroutine whose operations are always ready cannot keep the loop from
  /// the rest of its work. Spent through InlineCompletion only.
  static constexpr unsigned kInlineTurnsPerIteration = 64;

  /// True on the loop thread, or on any thread while no loop runs (the
  /// reactor's structures are then free to touch).
  bool ownedByCaller() const noexcept {
    const std::thread::id t = loopThread_.load(std::memory_order_relaxed);
    return t == std::this_thread::get_id() || t == std::thread::id{};
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
  EventFd& wake() noexcept { return wake_; }

  /// Derived's poll, as soon as its wait returned (before it dispatches
  /// anything): `timeout` is what the wait was given.
  void woke(std::optional<Clock::duration> timeout) noexcept {
    if (meter_.timed()) meter_.woke(!timeout || *timeout != Clock::duration::zero());
  }

  /// Loop thread, after the wake-up eventfd fired (and was drained):
  /// resumes everything other threads handed over.
  void resumeRemote() {
    {
      std::lock_guard lock(mutex_);
      std::swap(remote_, remoteBatch_);
    }
    for (std::coroutine_handle<> h : remoteBatch_) h.resume();
    remoteBatch_.clear();
  }

  /// Destroys every task the reactor owns (after the derived reactor has
  /// quiesced the kernel side), and refuses new ones.
  ///
  /// One root at a time, each unlinked before it is destroyed: destroying a
  /// frame runs destructors that may resume another root (a Baton posted, a
  /// semaphore released), which may then finish and unlink itself, so the
  /// list must stay consistent and hold only live roots throughout.
  void destroyRoots() noexcept {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      remote_.clear();
    }
    clearReady();
    for (;;) {
      RootPromise* p;
      {
        std::lock_guard lock(mutex_);
        p = roots_;
        if (!p) break;
        unlinkLocked(*p);
      }
      std::coroutine_handle<RootPromise>::from_promise(*p).destroy();
    }
    clearReady();  // whatever the destructors scheduled: those frames are gone
  }

  /// Loop thread, once it saw the stop: destroys the spawned tasks that never
  /// started. Nothing resumes after a stop, so they never would; waiting for
  /// the reactor's destruction could leave their owners (e.g. a thread
  /// blocked on a std::future the task sets) waiting for good. Tasks that
  /// started are left alone: their frames may wait on another reactor.
  void destroyUnstartedRoots() noexcept {
    RootPromise* unstarted = nullptr;
    {
      std::lock_guard lock(mutex_);
      remote_.clear();  // never resumed now; may name the roots below
      for (RootPromise* p = roots_; p;) {
        RootPromise* next = p->next;
        if (!p->started) {
          unlinkLocked(*p);
          p->next = unstarted;  // nobody else reaches an unlinked, unstarted root
          unstarted = p;
        }
        p = next;
      }
    }
    clearReady();
    while (unstarted) {
      RootPromise* next = unstarted->next;
      std::coroutine_handle<RootPromise>::from_promise(*unstarted).destroy();
      unstarted = next;
    }
    clearReady();
  }

 protected:
  // Whether it resumed anything. Each coroutine counts as it is resumed.
  bool runReady() {
    std::swap(ready_, running_);
    PostedResume* posted = std::exchange(postedHead_, nullptr);
    postedTail_ = nullptr;
    const bool resumed = !running_.empty() || posted;
    meter_.resumed(running_.size());
    for (std::coroutine_handle<> h : running_) h.resume();
    running_.clear();
    while (posted) {
      PostedResume* next = posted->next;  // the node may be gone once its coroutine resumed
      meter_.resumed(1);
      posted->handle.resume();
      posted = next;
    }
    return resumed;
  }

  /// Coroutines queued for the next ready phase.
  std::size_t readyCount() const noexcept {
    std::size_t n = ready_.size();
    for (const PostedResume* p = postedHead_; p; p = p->next) ++n;
    return n;
  }

  void clearReady() noexcept {
    ready_.clear();
    postedHead_ = postedTail_ = nullptr;
  }

  /// The exception a spawned task let escape (first one wins), or null.
  /// Any thread: a task may fail after hopping to another reactor's thread.
  std::exception_ptr takeFailure() {
    if (!stopRequested()) return nullptr;  // fail() always stops: no lock on the common path
    std::lock_guard lock(mutex_);
    return std::exchange(failure_, nullptr);
  }

  // Loop thread only.
  std::vector<std::coroutine_handle<>> ready_;
  PostedResume* postedHead_ = nullptr;  // post(): resumed after ready_, in order
  PostedResume* postedTail_ = nullptr;
  TimerQueue timers_;
  unsigned inlineTurns_ = kInlineTurnsPerIteration;  // left in this iteration: see InlineCompletion
  std::atomic<std::thread::id> loopThread_{};
  LoopMeter meter_{timers_};

 private:
  friend struct RootPromise;
  friend class InlineCompletion;
  friend class DedicatedRing;  // the Disk's ring of an EpollReactor counts in its meter_

  // Whether an operation that completed at once may go on inline (and
  // counts both). Outside a running loop there is no iteration to yield to.
  bool takeInlineTurn() noexcept {
    meter_.completedInline();
    if (inlineTurns_ == 0) return !isInLoopThread();
    --inlineTurns_;
    return true;
  }

  void enqueue(std::coroutine_handle<> h) {
    if (isInLoopThread()) {
      ready_.push_back(h);
      return;
    }
    bool wake;
    {
      std::lock_guard lock(mutex_);
      wake = pushRemoteLocked(h);
    }
    if (wake) wake_.signal();
  }

  // Only the push onto an empty queue signals: the loop drains the eventfd
  // before it takes the queue, so a later push always finds the queue
  // empty again or is taken along.
  bool pushRemoteLocked(std::coroutine_handle<> h) {
    const bool wasEmpty = remote_.empty();
    remote_.push_back(h);
    return wasEmpty;
  }

  void unlinkRoot(RootPromise& p) noexcept {
    std::lock_guard lock(mutex_);
    unlinkLocked(p);
  }

  void unlinkLocked(RootPromise& p) noexcept {
    (p.prev ? p.prev->next : roots_) = p.next;
    if (p.next) p.next->prev = p.prev;
    p.prev = p.next = nullptr;
  }

  // On whatever thread the task failed: it may have hopped to another
  // reactor, so the slot is guarded and the owning loop is woken.
  void fail(std::exception_ptr e) noexcept {
    {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::move(e);
    }
    stop();
  }

  std::vector<std::coroutine_handle<>> running_;
  std::vector<std::coroutine_handle<>> remoteBatch_;
  std::atomic<bool> stopRequested_{false};
  EventFd wake_;

  std::mutex mutex_;  // guards the members below
  std::vector<std::coroutine_handle<>> remote_;
  RootPromise* roots_ = nullptr;
  bool closed_ = false;
  std::exception_ptr failure_;
};

inline void RootPromise::FinalAwaiter::await_suspend(std::coroutine_handle<RootPromise> h) noexcept {
  LoopCore* owner = h.promise().owner;
  std::exception_ptr failure = std::move(h.promise().failure);
  owner->unlinkRoot(h.promise());
  h.destroy();
  // Last: the frames (and the task's own reference to the exception) are
  // gone, so the thread that rethrows it, maybe another, is its only owner.
  if (failure) owner->fail(std::move(failure));
}

inline void RootPromise::unhandled_exception() noexcept { failure = std::current_exception(); }

/// The one place where the loop's inline budget
/// (LoopCore::kInlineTurnsPerIteration) is spent. Every awaiter whose
/// operation may complete without suspending holds one and does:
///   await_ready():    attempt the operation; `return admit(loop, completed);`
///   await_suspend(h): `if (deferred(loop, h)) return true;` before waiting.
/// (An awaiter that learns only in await_suspend that it is done returns
/// `yieldDone(loop, h)` there instead.) A completed operation goes on
/// inline while the iteration's budget lasts; past it, its coroutine is
/// posted and resumes in the next iteration. The budget counts
/// completions, not attempts: an attempt that would block costs nothing.
class InlineCompletion {
 public:
  bool admit(LoopCore& loop, bool completed) noexcept {
    deferred_ = completed && !loop.takeInlineTurn();
    return completed && !deferred_;
  }
  /// True if the operation completed but must yield: `h` is then posted.
  bool deferred(LoopCore& loop, std::coroutine_handle<> h) noexcept {
    if (!deferred_) return false;
    loop.post(posted_, h);
    return true;
  }
  /// await_suspend's value for an operation it found done: false (go on)
  /// within the budget, else true with `h` posted.
  bool yieldDone(LoopCore& loop, std::coroutine_handle<> h) noexcept {
    return !admit(loop, true) && deferred(loop, h);
  }

 private:
  bool deferred_ = false;
  PostedResume posted_;
};

/// CRTP base of the reactors: the loop over Derived's poll() and quiesce().
template <typename Derived>
class ReactorBase : public LoopCore {
 public:
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
    DriverTask<T> driver = makeDriver(std::move(task));
    loop([&] { return driver.done(); }, driver.handle());
    if (!driver.done()) {
      throw std::system_error(make_error_code(Errc::closed), "coio: reactor stopped before runUntil's task finished");
    }
    return driver.result();
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
    s.unsubmitted = static_cast<const Derived&>(*this).unsubmitted();
    return s;
  }

 protected:
  /// For Derived's destructor: lets go of the kernel side, then destroys
  /// the tasks the reactor still owns (their awaiters deregister).
  void closeLoop() noexcept {
    derived().quiesce();
    destroyRoots();
  }

 private:
  Derived& derived() noexcept { return static_cast<Derived&>(*this); }

  template <typename Done>
  void loop(Done done, std::coroutine_handle<> first) {
    COIO_ASSERT(loopThread_.load(std::memory_order_relaxed) == std::thread::id{}, "reactor run by two threads at once");
    loopThread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    struct LeaveLoop {
      ReactorBase& reactor;
      ~LeaveLoop() {
        reactor.derived().leaveLoop();
        reactor.loopThread_.store(std::thread::id{}, std::memory_order_relaxed);
      }
    } leave{*this};
    if (first && !stopRequested()) ready_.push_back(first);
    if (meter_.timed()) meter_.beginTurn();
    // A turn is the work between two waits: dispatching what the wait
    // returned (in poll), then the ready phase, then the timers. Timed
    // (LoopMeter), each phase that ran something ends with a clock read.
    while (!done() && !stopRequested()) {
      meter_.iteration();
      inlineTurns_ = kInlineTurnsPerIteration;
      const bool resumed = runReady();
      // No clock read without timers, one with (waitTimeout reads it only
      // if no deadline could be armed): where the clock is not in the vDSO
      // (e.g. a TCG guest's), each read is a system call. Timed, that read
      // is the ready phase's end.
      if (meter_.timed() && (resumed || timers_.size() != 0)) meter_.phaseEnded(LoopPhase::ready);
      if (timers_.size() != 0) {
        const bool fired = timers_.fireDue(meter_.timed() ? meter_.mark() : Clock::now());
        if (meter_.timed() && fired) meter_.phaseEnded(LoopPhase::timers);
      }
      if (meter_.timed()) meter_.endTurn();  // before the check: the stall handler may stop the loop
      if (done() || stopRequested()) break;
      derived().poll(waitTimeout());
      if (meter_.timed() && meter_.dispatchedThisTurn()) meter_.phaseEnded(LoopPhase::completions);
    }
    // The last turn, if it ended in its completions phase (after a break,
    // an empty turn: endTurn() has nothing left to account).
    if (meter_.timed()) meter_.endTurn();
    if (stopRequested()) {
      // Final: the kernel lets go of every operation; nothing resumes again.
      derived().quiesce();
      destroyUnstartedRoots();
    }
    if (std::exception_ptr failure = takeFailure()) std::rethrow_exception(failure);
  }

  // How long Derived::poll may wait: not at all with coroutines ready, else
  // until I/O (nullopt) once the next timer's deadline is armed in the
  // reactor (Derived::armDeadline, re-armed only when that deadline changes:
  // a wait with a timeout of its own costs the kernel an hrtimer per wait),
  // or, if that could not be armed, until the deadline.
  std::optional<Clock::duration> waitTimeout() {
    if (!ready_.empty() || postedHead_) return Clock::duration::zero();
    const std::optional<Clock::time_point> next = timers_.nextDeadline();
    if (!next) return std::nullopt;
    if (derived().armDeadline(*next)) return std::nullopt;
    // A fresh reading: fired timers resumed their coroutines since fireDue's.
    return std::max(*next - Clock::now(), Clock::duration::zero());
  }
};

}  // namespace coio::detail
