#pragma once
// The engine of coio::Mutex: a lock-free FIFO mutex whose waiters are
// coroutines.
//
// One atomic word, `state_`:
//   kUnlocked   free; nobody waits
//   0           held; no waiter has queued since the holder last looked
//   a pointer   held; the newest of the waiters that queued since, a LIFO
//               stack linked through WaitNode::next
// Besides it the holder keeps `head_`, a FIFO of older waiters, touched
// only by whoever holds the lock. lock() pushes onto the stack with one
// CAS (or takes a free lock with one); unlock() pops `head_` with no atomic
// operation at all, and only when `head_` is empty takes the whole stack
// with one exchange and reverses it into `head_` (or frees the lock with
// one CAS). Waiters are handed the lock in arrival order and the word is
// never kUnlocked while anyone waits, so neither lock() nor tryLock() can
// barge.
//
// Nodes live in the awaiting frames, except for cancellable waiters: a stop
// callback may resume one while the holder can still reach its node, so it
// queues a heap-allocated LockProxy instead, whose fate the holder and the
// callback settle with a CAS (see LockProxy). Only that path allocates.
//
// A plain waiter whose frame is destroyed while queued is unlinked by
// forget(); that must not race with an unlock() (which could as well be
// handing that very waiter the lock).
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/detail/wait_list.hpp>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <type_traits>
#include <utility>

namespace coio::detail {

// What a cancellable waiter queues in its place. `awaiting` stays null: that
// marks a proxy for the holder; the coroutine is `waiter`'s, a node in the
// awaiting frame (never queued itself, so its `next` is free for
// resumeInline).
//
// The claim, settled once by CAS:
//   idle      pushed (or about to be) while the waiter is still suspending
//   queued    the waiter is suspended
//   granted   the holder handed it the lock      (from idle or queued)
//   cancelled stop was requested, or its frame died (from idle or queued)
// Whoever moves it out of `queued` resumes the waiter: the holder for
// granted, the stop callback for cancelled. Out of `idle`, neither does:
// the suspending thread sees its idle -> queued CAS fail and carries on.
//
// Two references keep it alive: the queue's, dropped by the holder once it
// has passed the proxy, and the waiter's, dropped once its stop callback is
// deregistered (nothing else touches the proxy after that).
struct LockProxy : WaitNode {
  enum class Claim : std::uint8_t { idle, queued, granted, cancelled };

  explicit LockProxy(WaitNode& w) noexcept : waiter(&w) {}

  // The waiter has suspended; false if it was granted or cancelled first.
  bool suspend() noexcept {
    Claim c = Claim::idle;
    return claim.compare_exchange_strong(c, Claim::queued, std::memory_order_acq_rel, std::memory_order_acquire);
  }

  // Moves an unsettled claim to `to`; returns the claim found (unchanged
  // if already settled). acq_rel: a grant publishes the critical section
  // to the new holder, whichever thread resumes it.
  Claim settle(Claim to) noexcept {
    Claim c = claim.load(std::memory_order_acquire);
    while ((c == Claim::idle || c == Claim::queued) &&
           !claim.compare_exchange_weak(c, to, std::memory_order_acq_rel, std::memory_order_acquire)) {
    }
    return c;
  }

  void release() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  WaitNode* const waiter;
  std::atomic<Claim> claim{Claim::idle};
  std::atomic<std::uint8_t> refs{2};
};

class MutexCore {
 public:
  MutexCore() noexcept = default;
  MutexCore(const MutexCore&) = delete;
  MutexCore& operator=(const MutexCore&) = delete;

  // Only proxies of waiters that gave up may be left: the holder had not
  // passed them yet.
  ~MutexCore() {
    if (state_.load(std::memory_order_acquire) == kUnlocked) return;  // then nothing is queued
    WaitNode* w = head_;
    appendTo(w, takeStack());
    while (w) {
      COIO_ASSERT(w->awaiting == nullptr, "coio::Mutex destroyed with waiters");
      auto* proxy = static_cast<LockProxy*>(w);
      w = w->next;
      COIO_ASSERT(proxy->claim.load(std::memory_order_acquire) == LockProxy::Claim::cancelled,
                  "coio::Mutex destroyed with waiters");
      proxy->release();
    }
  }

  bool isLocked() const noexcept { return state_.load(std::memory_order_acquire) != kUnlocked; }

  // Loads first: on a held mutex a failing CAS would still cost a locked
  // instruction, and lock() then pushes with another.
  bool tryLock() noexcept {
    std::uintptr_t s = state_.load(std::memory_order_relaxed);
    return s == kUnlocked &&
           state_.compare_exchange_strong(s, 0, std::memory_order_acquire, std::memory_order_relaxed);
  }

  /// Takes the lock if it is free (false), else pushes `w` (true); nothing
  /// of `w` is touched once it is pushed.
  bool lockOrPush(WaitNode& w) noexcept {
    std::uintptr_t s = state_.load(std::memory_order_relaxed);
    for (;;) {
      if (s == kUnlocked) {
        if (state_.compare_exchange_weak(s, 0, std::memory_order_acquire, std::memory_order_relaxed)) return false;
      } else {
        w.next = reinterpret_cast<WaitNode*>(s);
        // release: the holder that takes the stack sees `w` filled in.
        if (state_.compare_exchange_weak(s, reinterpret_cast<std::uintptr_t>(&w), std::memory_order_release,
                                         std::memory_order_relaxed)) {
          return true;
        }
      }
    }
  }

  /// Hands the lock to the oldest waiter that still wants it and resumes it
  /// here, or frees the lock if there is none. The common free-it case is
  /// inline; the hand-over is not.
  void unlock() noexcept {
    std::uintptr_t s = 0;
    if (head_ || state_.load(std::memory_order_relaxed) != 0 ||
        !state_.compare_exchange_strong(s, kUnlocked, std::memory_order_release, std::memory_order_relaxed)) {
      handOver();
    }
  }

  /// Unlinks plain waiter `w`  /// Unlinks plain waiter `w` (pushed, not yet handed the lock): its frame
  /// is being destroyed. Must not run concurrently with unlock(); forgets
  /// on several threads are serialised by `forgetting_`.
  void forget(WaitNode& w) noexcept {
    while (forgetting_.test_and_set(std::memory_order_acquire)) {
    }
    appendTo(head_, takeStack());
    WaitNode** link = &head_;
    while (*link != &w) {
      COIO_ASSERT(*link != nullptr, "coio::Mutex: a forgotten waiter is not queued");
      link = &(*link)->next;
    }
    *link = w.next;
    w.state = WaitState::cancelled;
    forgetting_.clear(std::memory_order_release);
  }

 private:
  static constexpr std::uintptr_t kUnlocked = 1;

  // unlock() when someone may wait.
  [[gnu::noinline]] void handOver() noexcept {
    for (;;) {
      WaitNode* w = head_;
      if (!w && !(w = takeNewWaiters())) return;  // freed
      head_ = w->next;
      w->next = nullptr;  // out of the queue: resumeInline chains through it
      if (w->awaiting) {
        w->state = WaitState::granted;
        resumeInline(w);
        return;
      }
      auto& proxy = static_cast<LockProxy&>(*w);
      WaitNode* waiter = proxy.waiter;
      const LockProxy::Claim was = proxy.settle(LockProxy::Claim::granted);
      proxy.release();  // the queue's reference; the waiter still holds its own
      if (was == LockProxy::Claim::queued) resumeInline(waiter);
      if (was != LockProxy::Claim::cancelled) return;  // from idle: it resumes itself
    }
  }

  // handOver() with `head_` empty: frees the lock (null) if nobody queued,
  // else takes the stack and returns it oldest first.
  WaitNode* takeNewWaiters() noexcept {
    std::uintptr_t s = state_.load(std::memory_order_relaxed);
    while (s == 0) {
      if (state_.compare_exchange_weak(s, kUnlocked, std::memory_order_release, std::memory_order_relaxed)) {
        return nullptr;
      }
    }
    COIO_ASSERT(s != kUnlocked, "coio::Mutex::unlock while not locked");
    return takeStack();
  }

  // Empties the stack (the lock stays held); returns it oldest first.
  WaitNode* takeStack() noexcept {
    const std::uintptr_t s = state_.exchange(0, std::memory_order_acquire);
    COIO_ASSERT(s != kUnlocked, "coio::Mutex: the queue taken while not locked");
    WaitNode* reversed = nullptr;
    for (auto* w = reinterpret_cast<WaitNode*>(s); w;) {
      WaitNode* next = w->next;
      w->next = reversed;
      reversed = w;
      w = next;
    }
    return reversed;
  }

  static void appendTo(WaitNode*& list, WaitNode* tail) noexcept {
    WaitNode** link = &list;
    while (*link) link = &(*link)->next;
    *link = tail;
  }

  std::atomic<std::uintptr_t> state_{kUnlocked};
  WaitNode* head_ = nullptr;
  std::atomic_flag forgetting_;
};

/// `co_await` of Mutex::lock(). The plain form resumes with nothing; the
/// cancellable one with true (lock held) or false (stop was requested while
/// it waited). Given a default `stop`, the cancellable form uses the
/// awaiting Task's token; with a token that can never stop it waits as the
/// plain form does (no allocation).
template <bool Cancellable>
class [[nodiscard]] LockOperation {
 public:
  explicit LockOperation(MutexCore& core) noexcept
    requires(!Cancellable)
      : core_(core) {}
  LockOperation(MutexCore& core, std::stop_token stop) noexcept
    requires Cancellable
      : core_(core), stop_(std::move(stop)) {}
  // Movable until awaited (g++ moves an awaiter co_awaited as an xvalue).
  LockOperation(LockOperation&& other) noexcept : core_(other.core_), stop_(std::move(other.stop_)) {
    COIO_ASSERT(other.node_.state == WaitState::idle, "a lock operation moved after it was awaited");
  }
  LockOperation& operator=(LockOperation&&) = delete;

  // Only reached while queued if the awaiting frame is destroyed without
  // being resumed: it must leave the queue.
  ~LockOperation() {
    if constexpr (Cancellable) {
      if (proxy_) {
        onStop_.reset();
        proxy_->settle(LockProxy::Claim::cancelled);  // the holder drops it when it passes it
        proxy_->release();
        return;
      }
    }
    if (node_.state == WaitState::queued) core_.forget(node_);
  }

  bool await_ready() noexcept {
    if (!core_.tryLock()) return false;
    node_.state = WaitState::granted;
    return true;
  }

  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) noexcept {
    node_.awaiting = h;
    if constexpr (Cancellable) {
      inheritStopToken(stop_, h);  // given none: the awaiting Task's
      if (stop_.stop_possible()) return suspendCancellable();
    }
    node_.state = WaitState::queued;  // before it is pushed: it may be resumed at once
    if (core_.lockOrPush(node_)) return true;
    node_.state = WaitState::granted;
    return false;
  }

  auto await_resume() noexcept {
    if constexpr (Cancellable) {
      if (proxy_) {
        onStop_.reset();  // waits for a stop callback running elsewhere
        const bool granted = proxy_->claim.load(std::memory_order_acquire) == LockProxy::Claim::granted;
        node_.state = granted ? WaitState::granted : WaitState::cancelled;
        std::exchange(proxy_, nullptr)->release();
      }
      return node_.state == WaitState::granted;
    }
  }

 private:
  struct OnStop {
    LockOperation* op;
    void operator()() const noexcept {
      if (op->proxy_->settle(LockProxy::Claim::cancelled) == LockProxy::Claim::queued) resumeInline(&op->node_);
    }
  };
  struct NoStop {};

  // The callback is registered before the proxy is pushed: once suspend()
  // succeeds the waiter may be resumed elsewhere and this frame must not be
  // touched. If stop is already requested, the callback cancels the proxy
  // inline and it is never pushed.
  bool suspendCancellable() noexcept {
    proxy_ = new LockProxy(node_);
    onStop_.emplace(stop_, OnStop{this});
    if (proxy_->claim.load(std::memory_order_acquire) == LockProxy::Claim::idle) {
      node_.state = WaitState::queued;
      if (core_.lockOrPush(*proxy_)) return proxy_->suspend();  // false: settled first, resume now
      node_.state = WaitState::granted;  // the lock was free after all: stop or not, take it
    } else {
      node_.state = WaitState::cancelled;
    }
    onStop_.reset();
    delete std::exchange(proxy_, nullptr);  // never pushed: nobody else holds it
    return false;
  }

  MutexCore& core_;
  WaitNode node_;
  [[no_unique_address]] std::conditional_t<Cancellable, std::stop_token, NoStop> stop_;
  [[no_unique_address]] std::conditional_t<Cancellable, std::optional<std::stop_callback<OnStop>>, NoStop> onStop_;
  [[no_unique_address]] std::conditional_t<Cancellable, LockProxy*, NoStop> proxy_{};
};

}  // namespace coio::detail
