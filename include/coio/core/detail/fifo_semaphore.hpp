#pragma once
// The engine shared by Semaphore, BatchSemaphore and SharedMutex (Mutex has
// a lock-free one of its own, mutex_core.hpp): a weighted, strictly FIFO
// counting semaphore whose waiters are coroutines.
//
// One atomic word holds `tokens << 1 | kQueued`. While kQueued is clear
// nobody waits, and tryAcquire/release are a single CAS each (no lock).
// kQueued is set and cleared only under `mutex_`, together with the queue
// becoming non-empty / empty; while it is set the word changes only under
// the mutex, so the slow paths see a stable count: releases feed the queue
// head-first and a newcomer cannot barge past a queued waiter, not even
// with tryAcquire.
// Invariant after every locked section: the queue is empty, or its head
// wants more tokens than are left (otherwise it would have been granted).
//
// Waiters are resumed after the lock is dropped, inline, on the thread that
// released tokens (or cancelled a waiter), with the bounded-stack
// trampoline of wait_list.hpp for hand-over chains.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/wait_list.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stop_token>
#include <utility>

namespace coio::detail {

class FifoSemaphore {
 public:
  struct Waiter : WaitNode {
    std::uint64_t wanted = 0;
  };

  explicit FifoSemaphore(std::uint64_t tokens) noexcept : state_(tokens << 1) {
    COIO_ASSERT(tokens < (std::uint64_t{1} << 62), "semaphore token count out of range");
  }
  FifoSemaphore(const FifoSemaphore&) = delete;
  FifoSemaphore& operator=(const FifoSemaphore&) = delete;
  ~FifoSemaphore() { COIO_ASSERT(waiters_.empty(), "semaphore destroyed with waiters"); }

  std::uint64_t available() const noexcept { return state_.load(std::memory_order_acquire) >> 1; }

  bool tryAcquire(std::uint64_t n) noexcept {
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    while ((s & kQueued) == 0 && (s >> 1) >= n) {
      if (state_.compare_exchange_weak(s, s - (n << 1), std::memory_order_acquire, std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }

  void release(std::uint64_t n) noexcept {
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    while ((s & kQueued) == 0) {
      // release: whoever takes these tokens sees what we wrote before.
      if (state_.compare_exchange_weak(s, s + (n << 1), std::memory_order_release, std::memory_order_relaxed)) {
        return;
      }
    }
    WaitNode* granted;
    {
      std::lock_guard lock(mutex_);
      granted = grantLocked(n);
    }
    resumeInline(granted);
  }

  // The WaitOperation protocol (wait_list.hpp).

  bool tryNow(Waiter& w) noexcept {
    if (!tryAcquire(w.wanted)) return false;
    w.state = WaitState::granted;
    return true;
  }

  /// Takes the tokens now, or queues `w`. Returns true if `w` was queued
  /// (the caller suspends; it is resumed once granted or cancelled), false
  /// if it got its tokens or was cancelled before it could queue.
  bool enqueue(Waiter& w) noexcept {
    std::lock_guard lock(mutex_);
    if (w.state == WaitState::cancelled) return false;
    std::uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if ((s & kQueued) != 0) break;  // others wait: join the back of the queue
      if ((s >> 1) >= w.wanted) {
        if (state_.compare_exchange_weak(s, s - (w.wanted << 1), std::memory_order_acquire,
                                         std::memory_order_acquire)) {
          w.state = WaitState::granted;
          return false;
        }
      } else if (state_.compare_exchange_weak(s, s | kQueued, std::memory_order_acquire,
                                              std::memory_order_acquire)) {
        break;
      }
    }
    waiters_.pushBack(w);
    return true;
  }

  /// Removes `w` from the queue without resuming it: its frame is being
  /// destroyed while it waits (e.g. a reactor tearing down its tasks).
  /// Waiters behind it that the tokens now satisfy are granted.
  void forget(Waiter& w) noexcept {
    WaitNode* granted;
    {
      std::lock_guard lock(mutex_);
      if (w.state != WaitState::queued) return;
      granted = withdrawLocked(w);
    }
    resumeInline(granted);
  }

  /// Gives up waiting. If `w` is still queued it leaves the queue and is
  /// resumed (as cancelled) on this thread, and the waiters behind it that
  /// the remaining tokens now satisfy are granted. A waiter that already got
  /// its tokens keeps them. Before `w` queues, marks it so it never does.
  void cancel(Waiter& w) noexcept {
    WaitNode* granted;
    {
      std::lock_guard lock(mutex_);
      if (w.state == WaitState::idle) {
        w.state = WaitState::cancelled;
        return;
      }
      if (w.state != WaitState::queued) return;
      granted = withdrawLocked(w);
    }
    w.next = granted;  // out of the queue: `next` is free to chain it first
    resumeInline(&w);
  }

 private:
  static constexpr std::uint64_t kQueued = 1;

  // Takes a queued waiter out of the queue (it gives up or its frame dies)
  // and grants whatever its leaving unblocks.
  WaitNode* withdrawLocked(Waiter& w) noexcept {
    waiters_.unlink(w);
    w.state = WaitState::cancelled;
    return grantLocked(0);
  }

  // Adds n tokens, pops every head waiter they satisfy (in order) and
  // returns them as a list linked through `next`.
  WaitNode* grantLocked(std::uint64_t n) noexcept {
    const std::uint64_t s = state_.load(std::memory_order_relaxed);
    if ((s & kQueued) == 0) {
      // The queue emptied while we waited for the lock: the lock-free paths
      // are live again, so add atomically instead of owning the word.
      state_.fetch_add(n << 1, std::memory_order_release);
      return nullptr;
    }
    std::uint64_t tokens = (s >> 1) + n;
    WaitNode* first = nullptr;
    WaitNode** last = &first;
    while (!waiters_.empty() && head().wanted <= tokens) {
      Waiter& w = head();
      tokens -= w.wanted;
      waiters_.unlink(w);
      w.state = WaitState::granted;
      *last = &w;
      last = &w.next;
    }
    state_.store((tokens << 1) | (waiters_.empty() ? 0 : kQueued), std::memory_order_release);
    return first;
  }

  Waiter& head() noexcept { return static_cast<Waiter&>(*waiters_.front()); }

  std::atomic<std::uint64_t> state_;
  std::mutex mutex_;
  WaitList waiters_;
};

/// `co_await` of an acquisition. The plain form resumes with nothing; the
/// cancellable form resumes with true (tokens held) or false (gave up
/// because `stop` was requested while queued; no tokens held). Given a
/// default `stop`, the cancellable form uses the awaiting Task's token
/// (WaitOperation).
template <bool Cancellable>
class [[nodiscard]] AcquireOperation : public WaitOperation<FifoSemaphore, FifoSemaphore::Waiter, Cancellable> {
 public:
  template <typename... Stop>
  AcquireOperation(FifoSemaphore& sem, std::uint64_t n, Stop... stop) noexcept
      : WaitOperation<FifoSemaphore, FifoSemaphore::Waiter, Cancellable>(sem, std::move(stop)...) {
    this->wanted = n;
  }
};

}  // namespace coio::detail
