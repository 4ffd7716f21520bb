#pragma once
// LoopCore: the state of a reactor's loop that does not depend on its
// backend (ReactorLoop runs it): the ready queue, the hand-over
// queue from other threads, the spawned tasks it owns (RootPromise), the
// timers, the inline-completion budget and the counters (LoopMeter).
// Backends and awaiters reach it through the members below; what users
// call is ReactorLoop's.
#include <coio/core/detail/assert.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/detail/event_fd.hpp>
#include <coio/reactor/detail/loop_meter.hpp>
#include <coio/reactor/detail/root_task.hpp>
#include <coio/reactor/detail/timer_queue.hpp>

#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace coio::detail {

/// A coroutine queued to resume in a later loop iteration without
/// allocating (LoopCore::post): the awaiter that queues it owns the node,
/// so that noexcept paths such as stop callbacks can queue.
struct PostedResume {
  PostedResume* next = nullptr;
  std::coroutine_handle<> handle;
};

/// The backend-independent state of a loop (see ReactorLoop).
class LoopCore {
 public:
  using Clock = std::chrono::steady_clock;

  /// How many operations per loop iteration may complete inline (without
  /// suspending: a socket with room or data, data a reactor read ahead, an
  /// error known up front). Past that, they still complete but resume their
  /// coroutine in the next iteration, after timers and other fds: a
  /// coroutine whose operations are always ready cannot keep the loop from
  /// the rest of its work. Spent through InlineCompletion only.
  static constexpr unsigned kInlineTurnsPerIteration = 64;

  LoopCore() = default;
  LoopCore(const LoopCore&) = delete;
  LoopCore& operator=(const LoopCore&) = delete;
  ~LoopCore() { COIO_ASSERT(roots_ == nullptr, "reactor destroyed without closing its loop"); }

  /// True on the thread currently inside run() / runUntil().
  bool isInLoopThread() const noexcept {
    return loopThread_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

  /// True on the loop thread, or on any thread while no loop runs (the
  /// reactor's structures are then free to touch).
  bool ownedByCaller() const noexcept {
    const std::thread::id t = loopThread_.load(std::memory_order_relaxed);
    return t == std::this_thread::get_id() || t == std::thread::id{};
  }

  /// ReactorLoop::stop (here for the roots, which stop the loop they fail).
  void stop() noexcept {
    stopRequested_.store(true, std::memory_order_release);
    if (!isInLoopThread()) wake_.signal();
  }

  bool stopRequested() const noexcept { return stopRequested_.load(std::memory_order_acquire); }

  /// Loop thread: resume `h` in a later iteration (after I/O is polled).
  /// Never allocates: `node`, which must live until then (a member of the
  /// awaiter `h` is suspended in), carries it.
  void post(PostedResume& node, std::coroutine_handle<> h) noexcept {
    node.handle = h;
    node.next = nullptr;
    (postedTail_ ? postedTail_->next : postedHead_) = &node;
    postedTail_ = &node;
  }

  /// Resumes `h` on the loop thread: queued if called there, else handed
  /// over (waking the loop). ReactorLoop::schedule's.
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

  /// Whether an operation that completed at once may go on inline (and
  /// counts both). Outside a running loop there is no iteration to yield
  /// to. InlineCompletion's: nothing else spends the budget.
  bool takeInlineTurn() noexcept {
    meter_.completedInline();
    if (inlineTurns_ == 0) return !isInLoopThread();
    --inlineTurns_;
    return true;
  }

  // --- What a backend (see ReactorBackend) uses. Loop thread.

  /// The timers (sleeps).
  TimerQueue& timers() noexcept { return timers_; }
  /// The counters behind stats(): a backend counts its operations where it
  /// submits and completes them.
  LoopMeter& meter() noexcept { return meter_; }
  /// The wake-up eventfd the backend watches; when it fires, drain it, then
  /// call resumeRemote().
  EventFd& wake() noexcept { return wake_; }

  /// The backend's poll, as soon as its wait returned (before it dispatches
  /// anything): `timeout` is what the wait was given.
  void woke(std::optional<Clock::duration> timeout) noexcept {
    if (meter_.timed()) meter_.woke(!timeout || *timeout != Clock::duration::zero());
  }

  /// After the wake-up eventfd fired (and was drained): resumes everything
  /// other threads handed over. Whether there was anything.
  bool resumeRemote() {
    {
      std::lock_guard lock(mutex_);
      std::swap(remote_, remoteBatch_);
    }
    const bool any = !remoteBatch_.empty();
    for (std::coroutine_handle<> h : remoteBatch_) h.resume();
    remoteBatch_.clear();
    return any;
  }

 protected:
  // Links the root of a spawned task in (false once stopped or closed: the
  // caller destroys it). `local`: on the loop thread; else it is handed
  // over, and `wake` says whether the loop must be signalled.
  bool linkRoot(RootPromise& p, bool local, bool& wake) {
    std::lock_guard lock(mutex_);
    // Checked under the lock: the loop takes it to collect the unstarted
    // roots after it saw the stop, so a root is either collected or refused.
    if (closed_ || stopRequested()) return false;
    p.owner = this;
    p.next = roots_;
    if (roots_) roots_->prev = &p;
    roots_ = &p;
    if (!local) wake = pushRemoteLocked(std::coroutine_handle<RootPromise>::from_promise(p));
    return true;
  }

  /// Destroys every task the loop owns (after the backend has quiesced the
  /// kernel side), and refuses new ones.
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
  unsigned inlineTurns_ = kInlineTurnsPerIteration;  // left in this iteration: see takeInlineTurn
  std::atomic<std::thread::id> loopThread_{};
  LoopMeter meter_{timers_};

 private:
  friend struct RootPromise;

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

}  // namespace coio::detail
