#pragma once
#include <coio/core/detail/mutex_core.hpp>
#include <coio/core/lock_guard.hpp>

#include <stop_token>
#include <utility>

namespace coio {

/// A mutex for coroutines, FIFO fair: a coroutine that finds it held
/// suspends instead of blocking its thread, so it may be held across
/// `co_await` (unlike a std::mutex).
///
/// Guarantees:
/// - FIFO: waiters get the lock in the order they queued. `unlock()` hands
///   it straight to the oldest waiter (it is never free in between), so
///   neither a newcomer's `lock()` nor `tryLock()` can barge ahead.
/// - No internal lock: uncontended `lock`/`tryLock`/`unlock` are one CAS
///   each. A waiter queues with one CAS; `unlock()` hands the lock over
///   with no atomic operation, plus one exchange per batch of waiters that
///   queued since the previous batch. A cancellable lock that has to wait
///   costs a CAS more and one small heap node (it may outlive the waiter
///   until the holder has passed it).
/// - `unlock()` happens-before the acquisition it hands the lock to: the
///   next holder sees everything the previous one wrote.
/// - A waiter is resumed inline on the thread that calls `unlock()` (inside
///   that call), or, for a cancellable lock, on the thread that requests
///   stop; a lock that is free continues on the awaiting thread without
///   suspending. As for Semaphore, a hand-over more than 32 nested
///   resumptions deep on one thread is deferred to the outermost one on
///   that thread: a chain through any number of waiters uses bounded stack.
///   A cancellable waiter handed the lock while it is still suspending (an
///   unlock() on another thread in that instant) continues on its own
///   thread instead.
/// - A waiter whose frame is destroyed while queued leaves the queue. For a
///   plain lock() that must not race with an unlock() (which might be
///   handing that very waiter the lock); a cancellable one may.
///   Destroying the Mutex while coroutines wait, and `unlock()` while it is
///   not held, are programming errors (asserted).
/// - Not recursive, and not owned by a thread: a coroutine may lock on one
///   thread and unlock on another.
class Mutex {
 public:
  /// What lock() returns. `co_await` it once: it yields nothing, with the
  /// lock held; it continues at once if the lock is free, else it is
  /// resumed on the thread whose unlock() hands it the lock.
  using LockAwaitable = detail::LockOperation<false>;
  /// What lock(stop) returns. `co_await` it once: it yields true with the
  /// lock held, or false without it if `stop` was requested while it waited
  /// (then resumed on the thread that requested stop); otherwise like
  /// LockAwaitable.
  using CancellableLockAwaitable = detail::LockOperation<true>;
  /// What scopedLock() returns: like LockAwaitable, but `co_await` yields a
  /// LockGuard that holds the lock and unlocks it when destroyed.
  using ScopedLockAwaitable = detail::ScopedLockOperation<LockGuard<Mutex>, LockAwaitable>;
  /// What scopedLock(stop) returns: like CancellableLockAwaitable, but
  /// `co_await` yields a LockGuard, empty (`ownsLock()` false) if it gave up.
  using CancellableScopedLockAwaitable = detail::ScopedLockOperation<LockGuard<Mutex>, CancellableLockAwaitable>;

  /// An unlocked mutex.
  Mutex() noexcept = default;

  /// `co_await m.lock()` takes the lock, waiting in FIFO order.
  LockAwaitable lock() noexcept { return LockAwaitable(core_); }

  /// Like lock(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with the lock held, false without. A waiter that
  /// gives up leaves the queue.
  CancellableLockAwaitable lock(std::stop_token stop) noexcept { return {core_, std::move(stop)}; }

  /// `co_await m.scopedLock()` takes the lock like lock() and yields a guard
  /// that unlocks when destroyed.
  ScopedLockAwaitable scopedLock() noexcept { return {*this, core_}; }

  /// Like scopedLock(), but gives up if `stop` is requested while waiting:
  /// the guard yielded is then empty (`ownsLock()` false).
  CancellableScopedLockAwaitable scopedLock(std::stop_token stop) noexcept {
    return {*this, core_, std::move(stop)};
  }

  /// Takes the lock if it is free and nobody waits.
  bool tryLock() noexcept { return core_.tryLock(); }

  /// Releases the lock; the oldest waiter, if any, gets it and is resumed
  /// inline on this thread before unlock() returns.
  void unlock() noexcept { core_.unlock(); }

  /// Whether the mutex is held right now (a snapshot).
  bool isLocked() const noexcept { return core_.isLocked(); }

 private:
  detail::MutexCore core_;
};

}  // namespace coio
