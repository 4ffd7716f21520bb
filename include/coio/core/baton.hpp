#pragma once
#include <coio/core/detail/assert.hpp>

#include <atomic>
#include <coroutine>

namespace coio {

/// A one-shot event that any number of coroutines can await
/// (folly::coro::Baton semantics).
///
/// State is one atomic word: nullptr (not signalled, nobody waiting), `this`
/// (signalled), or the head of an intrusive stack of waiters that live in
/// the awaiting coroutines' frames. No allocation, no lock.
///
/// Guarantees:
/// - `co_await baton` does not suspend if the Baton is already signalled.
/// - `post()` resumes every waiter inline on the posting thread, oldest
///   first, and never touches the Baton after its single atomic exchange:
///   a resumed waiter may destroy the Baton.
/// - `post()` happens-before the return of every `co_await` it releases.
/// - `reset()` only moves signalled -> not signalled; with waiters pending it
///   does nothing. Destroying a Baton with waiters is a programming error.
class Baton {
 public:
  explicit Baton(bool initiallySignalled = false) noexcept
      : state_(initiallySignalled ? static_cast<const void*>(this) : nullptr) {}
  Baton(const Baton&) = delete;
  Baton& operator=(const Baton&) = delete;
  ~Baton() {
    COIO_ASSERT(state_.load(std::memory_order_relaxed) == nullptr || ready(), "Baton destroyed with waiters");
  }

  bool ready() const noexcept { return state_.load(std::memory_order_acquire) == signalledState(); }

  void post() noexcept {
    const void* old = state_.exchange(signalledState(), std::memory_order_acq_rel);
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

  void reset() noexcept {
    const void* expected = signalledState();
    state_.compare_exchange_strong(expected, nullptr, std::memory_order_relaxed);
  }

  class [[nodiscard]] WaitOperation {
   public:
    explicit WaitOperation(const Baton& baton) noexcept : baton_(baton) {}
    bool await_ready() const noexcept { return baton_.ready(); }
    bool await_suspend(std::coroutine_handle<> awaiting) noexcept {
      awaiting_ = awaiting;
      const void* old = baton_.state_.load(std::memory_order_acquire);
      do {
        if (old == baton_.signalledState()) return false;  // posted meanwhile: don't suspend
        next_ = static_cast<WaitOperation*>(const_cast<void*>(old));
      } while (!baton_.state_.compare_exchange_weak(old, this, std::memory_order_release,
                                                    std::memory_order_acquire));
      return true;
    }
    void await_resume() const noexcept {}

   private:
    friend class Baton;
    const Baton& baton_;
    WaitOperation* next_ = nullptr;
    std::coroutine_handle<> awaiting_;
  };

  /// Waits until posted. Resumes on the thread that calls `post()`, or
  /// continues on the awaiting thread if already signalled.
  WaitOperation operator co_await() const noexcept { return WaitOperation{*this}; }

 private:
  const void* signalledState() const noexcept { return this; }
  mutable std::atomic<const void*> state_;
};

}  // namespace coio
