#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/wait_list.hpp>

#include <atomic>
#include <mutex>
#include <stop_token>
#include <utility>

namespace coio {

/// A manual-reset event that any number of coroutines can await: once set,
/// it stays set (every `wait()` completes at once) until `reset()`.
///
/// Unlike Baton, a wait can be cancelled with a std::stop_token. The flag
/// is one atomic (`isSet()` and waiting on a set Event take no lock); the
/// waiters form a FIFO list under a mutex.
///
/// Guarantees:
/// - `set()` resumes every waiter inline on the calling thread, oldest
///   first, before it returns, after dropping its lock: it touches nothing
///   of the Event while resuming, so a resumed waiter may destroy it. (A
///   resumption more than 32 nested hand-overs deep on one thread is
///   deferred to the outermost one on that thread, as for Semaphore.)
/// - `set()` happens-before the return of every wait it releases, and of
///   every wait that finds the Event set.
/// - `co_await ev.wait()` on a set Event continues on the awaiting thread
///   without suspending. A cancellable wait whose stop is requested while
///   it waits is resumed, yielding false, on the thread that requests stop.
/// - `reset()` only clears the flag: waiters exist only while the Event is
///   not set, so it never affects them.
/// - A waiter whose frame is destroyed while waiting leaves the list.
///   Destroying the Event while coroutines wait is a programming error
///   (asserted). Seeing `isSet()` true does not mean the set() call has
///   returned: a thread that did not wait must not destroy the Event while
///   a set() may still run (it releases a lock after setting the flag).
class Event {
 public:
  /// What wait() returns. `co_await` it once: it yields nothing once the
  /// Event is set; it continues at once if it is, else it is resumed on the
  /// thread that calls set().
  using WaitAwaitable = detail::WaitOperation<Event, detail::WaitNode, false>;
  /// What wait(stop) returns. `co_await` it once: it yields true once the
  /// Event is set, or false if `stop` was requested while it waited (then
  /// resumed on the thread that requested stop); otherwise like WaitAwaitable.
  using CancellableWaitAwaitable = detail::WaitOperation<Event, detail::WaitNode, true>;

  /// An Event not set, or already set if `initiallySet`.
  explicit Event(bool initiallySet = false) noexcept : set_(initiallySet) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { COIO_ASSERT(waiters_.empty(), "coio::Event destroyed with waiters"); }

  /// Whether the Event is set (a snapshot).
  bool isSet() const noexcept { return set_.load(std::memory_order_acquire); }

  /// Sets the Event and resumes every waiter inline on this thread, oldest
  /// first. Does nothing if it is already set.
  void set() noexcept {
    if (isSet()) return;
    detail::WaitNode* waiters;
    {
      std::lock_guard lock(mutex_);
      set_.store(true, std::memory_order_release);
      waiters = waiters_.takeAll(detail::WaitState::granted);
    }
    detail::resumeInline(waiters);
  }

  /// Makes the Event not set; later waits suspend until the next set().
  void reset() noexcept { set_.store(false, std::memory_order_relaxed); }

  /// `co_await ev.wait()` returns once the Event is set: at once if it is,
  /// else resumed on the thread that calls set().
  WaitAwaitable wait() noexcept { return WaitAwaitable(*this); }

  /// Like wait(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true if the Event was set, false if it gave up (on
  /// the thread that requested stop). A set Event yields true even if stop
  /// was requested.
  CancellableWaitAwaitable wait(std::stop_token stop) noexcept {
    return CancellableWaitAwaitable(*this, std::move(stop));
  }

 private:
  friend WaitAwaitable;
  friend CancellableWaitAwaitable;

  bool tryNow(detail::WaitNode& w) noexcept {
    if (!isSet()) return false;
    w.state = detail::WaitState::granted;
    return true;
  }

  bool enqueue(detail::WaitNode& w) noexcept {
    std::lock_guard lock(mutex_);
    if (w.state == detail::WaitState::cancelled) return false;
    if (set_.load(std::memory_order_relaxed)) {  // set() stores under the lock: ordered by it
      w.state = detail::WaitState::granted;
      return false;
    }
    waiters_.pushBack(w);
    return true;
  }

  void cancel(detail::WaitNode& w) noexcept { detail::cancelWait(mutex_, waiters_, w); }
  void forget(detail::WaitNode& w) noexcept { detail::forgetWait(mutex_, waiters_, w); }

  std::atomic<bool> set_;
  std::mutex mutex_;
  detail::WaitList waiters_;
};

}  // namespace coio
