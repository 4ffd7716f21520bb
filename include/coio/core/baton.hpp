#pragma once
#include <coio/core/detail/assert.hpp>

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <thread>

namespace coio {

/// A one-shot event that any number of coroutines can await
/// (folly::coro::Baton semantics).
///
/// State is one atomic word: nullptr (not signalled, nobody waiting), `this`
/// (signalled), or the head of an intrusive stack of waiters that live in
/// the awaiting coroutines' frames, with its low bit set while a waiter
/// whose frame is being destroyed unlinks itself. No allocation, no mutex.
///
/// Guarantees:
/// - `co_await baton` does not suspend if the Baton is already signalled.
/// - `post()` resumes every waiter inline on the posting thread, oldest
///   first, and never touches the Baton after its single successful atomic
///   read-modify-write: a resumed waiter may destroy the Baton.
/// - `post()` happens-before the return of every `co_await` it releases.
/// - `reset()` only moves signalled -> not signalled; with waiters pending it
///   does nothing. Destroying a Baton with waiters is a programming error.
/// - A waiting coroutine whose frame is destroyed without being resumed
///   (e.g. with the reactor that owns it) leaves the waiter list; a later
///   post() does not touch it. That destruction must not race with post().
class Baton {
 public:
  /// A Baton not yet signalled, or already signalled if `initiallySignalled`.
  explicit Baton(bool initiallySignalled = false) noexcept
      : state_(initiallySignalled ? static_cast<const void*>(this) : nullptr) {}
  Baton(const Baton&) = delete;
  Baton& operator=(const Baton&) = delete;
  ~Baton() {
    COIO_ASSERT(state_.load(std::memory_order_relaxed) == nullptr || ready(), "Baton destroyed with waiters");
  }

  /// Whether post() has been called (since the last reset()).
  bool ready() const noexcept { return state_.load(std::memory_order_acquire) == signalledState(); }

  /// Signals the Baton and resumes every waiter inline on this thread, oldest first.
  void post() noexcept {
    const void* old = state_.load(std::memory_order_relaxed);
    do {
      while (locked(old)) old = waitUnlocked();
    } while (!state_.compare_exchange_weak(old, signalledState(), std::memory_order_acq_rel,
                                           std::memory_order_relaxed));
    if (old == nullptr || old == signalledState()) return;
    // `this` may be gone from here on. The stack is newest-first: reverse it
    // (waiters stay suspended until resumed, so their links are stable).
    auto* w = static_cast<WaitOperation*>(const_cast<void*>(old));
    WaitOperation* oldestFirst = nullptr;
    while (w) {
      WaitOperation* next = w->next_;
      w->next_ = oldestFirst;
      oldestFirst = w;
      w = next;
    }
    while (oldestFirst) {
      WaitOperation* next = oldestFirst->next_;  // read before resume: the frame may vanish
      oldestFirst->awaiting_.resume();
      oldestFirst = next;
    }
  }

  /// Makes a signalled Baton unsignalled again; does nothing while coroutines wait.
  void reset() noexcept {
    const void* expected = signalledState();
    state_.compare_exchange_strong(expected, nullptr, std::memory_order_relaxed);
  }

  /// The awaitable of `co_await baton`: suspends until the Baton is posted.
  class [[nodiscard]] WaitOperation {
   public:
    /// Awaits `baton`.
    explicit WaitOperation(const Baton& baton) noexcept : baton_(baton) {}
    /// Copyable until it is awaited.
    WaitOperation(const WaitOperation&) = default;  // before it is awaited only
    // Only reached while linked if the awaiting frame is destroyed without
    // being resumed; left linked, a later post() would resume freed memory.
    ~WaitOperation() {
      if (linked_) baton_.unlink(*this);
    }

    bool await_ready() const noexcept { return baton_.ready(); }
    bool await_suspend(std::coroutine_handle<> awaiting) noexcept {
      awaiting_ = awaiting;
      linked_ = true;  // before the push: afterwards we may already be resumed elsewhere
      const void* old = baton_.state_.load(std::memory_order_acquire);
      do {
        while (locked(old)) old = baton_.waitUnlocked();
        if (old == baton_.signalledState()) {  // posted meanwhile: don't suspend
          linked_ = false;
          return false;
        }
        next_ = static_cast<WaitOperation*>(const_cast<void*>(old));
      } while (!baton_.state_.compare_exchange_weak(old, this, std::memory_order_release,
                                                    std::memory_order_acquire));
      return true;
    }
    void await_resume() noexcept { linked_ = false; }

   private:
    friend class Baton;
    const Baton& baton_;
    WaitOperation* next_ = nullptr;
    std::coroutine_handle<> awaiting_;
    bool linked_ = false;  // pushed and not yet resumed
  };

  /// Waits until posted. Resumes on the thread that calls `post()`, or
  /// continues on the awaiting thread if already signalled.
  WaitOperation operator co_await() const noexcept { return WaitOperation{*this}; }

 private:
  static constexpr std::uintptr_t kLocked = 1;  // WaitOperations are aligned: bit 0 is free

  static bool locked(const void* state) noexcept { return (reinterpret_cast<std::uintptr_t>(state) & kLocked) != 0; }

  // Spins while a destroyed waiter unlinks itself (a short list walk).
  const void* waitUnlocked() const noexcept {
    const void* s = state_.load(std::memory_order_acquire);
    while (locked(s)) {
      std::this_thread::yield();
      s = state_.load(std::memory_order_acquire);
    }
    return s;
  }

  // Takes `w` out of the waiter stack: its frame is being destroyed while
  // it waits. The low bit locks the stack meanwhile, so neither a new waiter
  // nor post() changes it under us.
  void unlink(WaitOperation& w) const noexcept {
    const void* s = state_.load(std::memory_order_acquire);
    for (;;) {
      while (locked(s)) s = waitUnlocked();
      // Signalled: post() took the stack; only a post() racing with this
      // destruction (a programming error) can still hold `w`.
      if (s == nullptr || s == signalledState()) return;
      const void* lockedState = reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(s) | kLocked);
      if (state_.compare_exchange_weak(s, lockedState, std::memory_order_acquire, std::memory_order_acquire)) break;
    }
    auto* head = static_cast<WaitOperation*>(const_cast<void*>(s));
    if (head == &w) {
      head = w.next_;
    } else {
      for (WaitOperation* p = head; p; p = p->next_) {
        if (p->next_ == &w) {
          p->next_ = w.next_;
          break;
        }
      }
    }
    w.linked_ = false;
    state_.store(head, std::memory_order_release);  // unlocks
  }

  const void* signalledState() const noexcept { return this; }
  mutable std::atomic<const void*> state_;
};

}  // namespace coio
