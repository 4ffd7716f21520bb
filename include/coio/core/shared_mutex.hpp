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
  template <LockKind Kind, bool Cancellable>
  using ScopedOperation =
      detail::ScopedLockOperation<LockGuard<SharedMutex, Kind>, detail::AcquireOperation<Cancellable>>;

 public:
  /// An unlocked SharedMutex.
  SharedMutex() noexcept : core_(kAll) {}

  /// `co_await m.lock()` takes the lock exclusively, waiting in FIFO order.
  detail::AcquireOperation<false> lock() noexcept { return {core_, kAll}; }
  /// Like lock(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with the lock held, false without.
  detail::AcquireOperation<true> lock(std::stop_token stop) noexcept { return {core_, kAll, std::move(stop)}; }
  /// Like lock(), yielding a guard that unlocks when destroyed.
  ScopedOperation<LockKind::exclusive, false> scopedLock() noexcept { return {*this, core_, kAll}; }
  /// Like lock(stop), yielding a guard: empty if stop was requested while waiting.
  ScopedOperation<LockKind::exclusive, true> scopedLock(std::stop_token stop) noexcept {
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
  detail::AcquireOperation<false> lockShared() noexcept { return {core_, 1}; }
  /// Like lockShared(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with the lock held, false without.
  detail::AcquireOperation<true> lockShared(std::stop_token stop) noexcept { return {core_, 1, std::move(stop)}; }
  /// Like lockShared(), yielding a guard that unlocks (shared) when destroyed.
  ScopedOperation<LockKind::shared, false> scopedLockShared() noexcept {
    return {*this, core_, 1};
  }
  /// Like lockShared(stop), yielding a guard: empty if stop was requested while waiting.
  ScopedOperation<LockKind::shared, true> scopedLockShared(
      std::stop_token stop) noexcept {
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
