#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/fifo_semaphore.hpp>
#include <coio/core/lock_guard.hpp>

#include <cstdint>
#include <stop_token>
#include <utility>

namespace coio {

/// A readers/writer lock for coroutines, strictly FIFO so that neither
/// readers nor writers starve.
///
/// Guarantees:
/// - One queue for both kinds, served in arrival order: a queued writer
///   blocks every later reader, even while readers hold the lock, so
///   writers cannot starve; when the lock frees up, the readers queued
///   consecutively at the head get it together, so readers cannot starve
///   either. `tryLock`/`tryLockShared` fail while anyone waits (no barging).
/// - Uncontended acquisitions and releases are one CAS each, no lock.
/// - A release happens-before the acquisitions it lets proceed.
/// - Waiters are resumed inline on the thread whose `unlock()` /
///   `unlockShared()` lets them proceed (the last reader out resumes a
///   waiting writer; a writer's unlock resumes the next writer or the batch
///   of readers, oldest first), or, for a cancellable acquisition, on the
///   thread that requests stop. An acquisition that can proceed at once
///   continues on the awaiting thread without suspending. Hand-overs more
///   than 32 nested resumptions deep on one thread are deferred to the
///   outermost one on that thread (bounded stack), as for Semaphore.
/// - A waiter that gives up (stop requested) leaves the queue, and the ones
///   behind it proceed if they now can: readers queued behind a cancelled
///   writer join the readers holding the lock at once.
/// - A waiter whose frame is destroyed while queued leaves the queue.
///   Destroying the SharedMutex while coroutines wait, and releasing a lock
///   not held, are programming errors (asserted).
class SharedMutex {
 public:
  /// What lock() and lockShared() return. `co_await` it once: it yields
  /// nothing, with the lock held (exclusive or shared, as asked); it
  /// continues at once if the lock can be taken, else it is resumed on the
  /// thread whose unlock() / unlockShared() lets it proceed.
  using LockAwaitable = detail::AcquireOperation<false>;
  /// What lock(stop) and lockShared(stop) return. `co_await` it once: it
  /// yields true with the lock held, or false without it if `stop` was
  /// requested while it waited (then resumed on the thread that requested
  /// stop); otherwise like LockAwaitable.
  using CancellableLockAwaitable = detail::AcquireOperation<true>;
  /// What scopedLock() returns: like LockAwaitable, but `co_await` yields a
  /// LockGuard that unlocks when destroyed.
  using ScopedLockAwaitable = detail::ScopedLockOperation<LockGuard<SharedMutex>, LockAwaitable>;
  /// What scopedLock(stop) returns: like CancellableLockAwaitable, but
  /// `co_await` yields a LockGuard, empty (`ownsLock()` false) if it gave up.
  using CancellableScopedLockAwaitable = detail::ScopedLockOperation<LockGuard<SharedMutex>, CancellableLockAwaitable>;
  /// What scopedLockShared() returns: like LockAwaitable, but `co_await`
  /// yields a shared LockGuard that unlocks (shared) when destroyed.
  using ScopedLockSharedAwaitable =
      detail::ScopedLockOperation<LockGuard<SharedMutex, LockKind::shared>, LockAwaitable>;
  /// What scopedLockShared(stop) returns: like CancellableLockAwaitable, but
  /// `co_await` yields a shared LockGuard, empty if it gave up.
  using CancellableScopedLockSharedAwaitable =
      detail::ScopedLockOperation<LockGuard<SharedMutex, LockKind::shared>, CancellableLockAwaitable>;

  /// An unlocked SharedMutex.
  SharedMutex() noexcept : core_(kAll) {}

  /// `co_await m.lock()` takes the lock exclusively, waiting in FIFO order.
  LockAwaitable lock() noexcept { return {core_, kAll}; }
  /// Like lock(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with the lock held, false without.
  CancellableLockAwaitable lock(std::stop_token stop) noexcept { return {core_, kAll, std::move(stop)}; }
  /// Like lock(), yielding a guard that unlocks when destroyed.
  ScopedLockAwaitable scopedLock() noexcept { return {*this, core_, kAll}; }
  /// Like lock(stop), yielding a guard: empty if stop was requested while waiting.
  CancellableScopedLockAwaitable scopedLock(std::stop_token stop) noexcept {
    return {*this, core_, kAll, std::move(stop)};
  }
  /// Takes the lock exclusively if nobody holds or waits for it.
  bool tryLock() noexcept { return core_.tryAcquire(kAll); }
  /// Releases the exclusive lock; resumes the next waiters inline on this thread.
  void unlock() noexcept {
    COIO_ASSERT(core_.available() == 0, "coio::SharedMutex::unlock while not locked exclusively");
    core_.release(kAll);
  }

  /// `co_await m.lockShared()` takes the lock shared, waiting in FIFO order
  /// (behind any queued writer).
  LockAwaitable lockShared() noexcept { return {core_, 1}; }
  /// Like lockShared(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with the lock held, false without.
  CancellableLockAwaitable lockShared(std::stop_token stop) noexcept { return {core_, 1, std::move(stop)}; }
  /// Like lockShared(), yielding a guard that unlocks (shared) when destroyed.
  ScopedLockSharedAwaitable scopedLockShared() noexcept { return {*this, core_, 1}; }
  /// Like lockShared(stop), yielding a guard: empty if stop was requested while waiting.
  CancellableScopedLockSharedAwaitable scopedLockShared(std::stop_token stop) noexcept {
    return {*this, core_, 1, std::move(stop)};
  }
  /// Takes the lock shared if no writer holds it and nobody waits.
  bool tryLockShared() noexcept { return core_.tryAcquire(1); }
  /// Releases a shared lock; if it was the last, resumes the next waiters inline on this thread.
  void unlockShared() noexcept {
    COIO_ASSERT(core_.available() < kAll, "coio::SharedMutex::unlockShared while not locked shared");
    core_.release(1);
  }

 private:
  // A reader takes one token, a writer all of them: the FIFO engine's
  // head-of-line blocking is exactly the fairness wanted.
  static constexpr std::uint64_t kAll = (std::uint64_t{1} << 62) - 1;

  detail::FifoSemaphore core_;
};

}  // namespace coio
