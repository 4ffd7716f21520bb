#pragma once
// The engine shared by Semaphore and BatchSemaphore: a weighted, strictly
// FIFO counting semaphore whose waiters are coroutines.
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
// released tokens (or cancelled a waiter). A waiter that releases in turn
// resumes the next one inside its own release(), so a hand-over chain
// nests one stack level per waiter: past kMaxInlineDepth nested
// resumptions on a thread, waiters are queued instead and resumed by the
// outermost resumption on that thread once the inner ones have returned
// (a trampoline). Stack use stays bounded whatever the queue's length.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>

namespace coio::detail {

class FifoSemaphore {
 public:
  enum class WaitState : std::uint8_t { idle, queued, granted, cancelled };

  struct Waiter {
    std::uint64_t wanted = 0;
    std::coroutine_handle<> awaiting;
    Waiter* prev = nullptr;
    Waiter* next = nullptr;
    WaitState state = WaitState::idle;  // guarded by the semaphore's mutex
  };

  explicit FifoSemaphore(std::uint64_t tokens) noexcept : state_(tokens << 1) {
    COIO_ASSERT(tokens < (std::uint64_t{1} << 62), "semaphore token count out of range");
  }
  FifoSemaphore(const FifoSemaphore&) = delete;
  FifoSemaphore& operator=(const FifoSemaphore&) = delete;
  ~FifoSemaphore() { COIO_ASSERT(head_ == nullptr, "semaphore destroyed with waiters"); }

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
    Waiter* granted;
    {
      std::lock_guard lock(mutex_);
      granted = grantLocked(n);
    }
    resumeAll(granted);
  }

  /// Takes the tokens now, or queues `w`. Returns true if `w` was queued
  /// (the caller suspends; it is resumed once granted or cancelled), false
  /// if it got its tokens or was cancelled before it could queue.
  /// Nothing of `w` is touched after the lock is released.
  bool acquireOrEnqueue(Waiter& w) noexcept {
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
    w.state = WaitState::queued;
    w.prev = tail_;
    w.next = nullptr;
    (tail_ ? tail_->next : head_) = &w;
    tail_ = &w;
    return true;
  }

  /// Removes `w` from the queue without resuming it: its frame is being
  /// destroyed while it waits (e.g. a reactor tearing down its tasks).
  /// Waiters behind it that the tokens now satisfy are granted.
  void forget(Waiter& w) noexcept {
    Waiter* granted;
    {
      std::lock_guard lock(mutex_);
      if (w.state != WaitState::queued) return;
      granted = withdrawLocked(w);
    }
    resumeAll(granted);
  }

  /// Gives up waiting. If `w` is still queued it leaves the queue and is
  /// resumed (as cancelled) on this thread, and the waiters behind it that
  /// the remaining tokens now satisfy are granted. A waiter that already got
  /// its tokens keeps them. Before `w` queues, marks it so it never does.
  void cancel(Waiter& w) noexcept {
    Waiter* granted;
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
    resumeAll(&w);
  }

  /// Nested resumptions (see the top of this file) a thread makes inline
  /// before it defers to the outermost one.
  static constexpr unsigned kMaxInlineDepth = 32;

 private:
  static constexpr std::uint64_t kQueued = 1;

  // Per thread: how deep in resumeAll() we are, and the waiters deferred
  // to the outermost call (linked through `next`).
  struct Trampoline {
    unsigned depth = 0;
    Waiter* head = nullptr;
    Waiter* tail = nullptr;
  };
  static Trampoline& trampoline() noexcept {
    static thread_local Trampoline t;
    return t;
  }

  // Takes a queued waiter out of the queue (it gives up or its frame dies)
  // and grants whatever its leaving unblocks.
  Waiter* withdrawLocked(Waiter& w) noexcept {
    unlink(w);
    w.state = WaitState::cancelled;
    return grantLocked(0);
  }

  // Adds n tokens, pops every head waiter they satisfy (in order) and
  // returns them as a list linked through `next`.
  Waiter* grantLocked(std::uint64_t n) noexcept {
    const std::uint64_t s = state_.load(std::memory_order_relaxed);
    if ((s & kQueued) == 0) {
      // The queue emptied while we waited for the lock: the lock-free paths
      // are live again, so add atomically instead of owning the word.
      state_.fetch_add(n << 1, std::memory_order_release);
      return nullptr;
    }
    std::uint64_t tokens = (s >> 1) + n;
    Waiter* first = nullptr;
    Waiter** last = &first;
    while (head_ && head_->wanted <= tokens) {
      Waiter* w = head_;
      tokens -= w->wanted;
      unlink(*w);
      w->state = WaitState::granted;
      *last = w;
      last = &w->next;
    }
    *last = nullptr;
    state_.store((tokens << 1) | (head_ ? kQueued : 0), std::memory_order_release);
    return first;
  }

  void unlink(Waiter& w) noexcept {
    (w.prev ? w.prev->next : head_) = w.next;
    (w.next ? w.next->prev : tail_) = w.prev;
    w.prev = w.next = nullptr;
  }

  // Resumes the granted list `w` (linked through `next`), oldest first.
  static void resumeAll(Waiter* w) noexcept {
    if (!w) return;
    Trampoline& t = trampoline();
    if (t.depth >= kMaxInlineDepth) {  // deep in a hand-over chain: the outermost call resumes them
      (t.tail ? t.tail->next : t.head) = w;
      while (w->next) w = w->next;
      t.tail = w;
      return;
    }
    ++t.depth;
    resumeList(w);
    if (t.depth == 1) {
      while (Waiter* deferred = t.head) {
        t.head = t.tail = nullptr;
        resumeList(deferred);  // may defer more: loop until none is left
      }
    }
    --t.depth;
  }

  static void resumeList(Waiter* w) noexcept {
    while (w) {
      Waiter* next = w->next;  // read first: the resumed frame may be gone
      w->awaiting.resume();
      w = next;
    }
  }

  std::atomic<std::uint64_t> state_;
  std::mutex mutex_;
  Waiter* head_ = nullptr;
  Waiter* tail_ = nullptr;
};

/// `co_await` of an acquisition. The plain form resumes with nothing; the
/// cancellable form resumes with true (tokens held) or false (gave up
/// because `stop` was requested while queued; no tokens held). Given a
/// default `stop`, the cancellable form uses the awaiting Task's token.
template <bool Cancellable>
class [[nodiscard]] AcquireOperation : private FifoSemaphore::Waiter {
 public:
  AcquireOperation(FifoSemaphore& sem, std::uint64_t n) noexcept
    requires(!Cancellable)
      : sem_(sem) {
    wanted = n;
  }
  AcquireOperation(FifoSemaphore& sem, std::uint64_t n, std::stop_token stop) noexcept
    requires Cancellable
      : sem_(sem), stop_(std::move(stop)) {
    wanted = n;
  }

  // Only reached while queued if the awaiting frame is destroyed without
  // being resumed; leaving it linked would let a later release resume
  // freed memory.
  ~AcquireOperation() {
    if (state == FifoSemaphore::WaitState::queued) sem_.forget(*this);
  }

  bool await_ready() noexcept {
    if (sem_.tryAcquire(wanted)) {
      state = FifoSemaphore::WaitState::granted;
      return true;
    }
    return false;
  }

  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) noexcept {
    awaiting = h;
    if constexpr (Cancellable) {
      inheritStopToken(stop_, h);  // given none: the awaiting Task's
      // Registered before queueing: after acquireOrEnqueue returns true we
      // may already have been resumed elsewhere and must touch nothing.
      // If stop was already requested this runs cancel() inline, and the
      // waiter never queues.
      onStop_.emplace(stop_, OnStop{this});
    }
    return sem_.acquireOrEnqueue(*this);
  }

  auto await_resume() noexcept {
    if constexpr (Cancellable) {
      onStop_.reset();  // waits if a concurrent cancel() on another thread is still running
      return state == FifoSemaphore::WaitState::granted;
    }
  }

 private:
  struct OnStop {
    AcquireOperation* op;
    void operator()() const noexcept { op->sem_.cancel(*op); }
  };
  struct NoStop {};

  FifoSemaphore& sem_;
  [[no_unique_address]] std::conditional_t<Cancellable, std::stop_token, NoStop> stop_;
  [[no_unique_address]] std::conditional_t<Cancellable, std::optional<std::stop_callback<OnStop>>, NoStop> onStop_;
};

}  // namespace coio::detail
