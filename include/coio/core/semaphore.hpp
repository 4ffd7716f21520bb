#pragma once
#include <coio/core/detail/fifo_semaphore.hpp>

#include <cstddef>
#include <stop_token>

namespace coio {

/// A counting semaphore for coroutines, FIFO fair.
///
/// Guarantees:
/// - While anyone waits, every released token goes straight to the oldest
///   waiter; a newcomer (including `tryAcquire`) cannot barge ahead.
/// - Uncontended `acquire`/`tryAcquire`/`release` are one CAS each, no lock.
/// - `release()` happens-before the acquisition that takes its token.
/// - A waiter is resumed inline on the thread that calls `release()` (or
///   that requests stop on a cancellable acquire); an acquisition that finds
///   a token free continues on the awaiting thread without suspending.
///   Exception, for bounded stack use: a `release()` made by a coroutine
///   that is itself more than 32 hand-overs deep in such inline resumptions
///   (a waiter releasing to the next, and so on) queues the waiter, which
///   the outermost release on that thread resumes once the inner ones have
///   returned. A chain through any number of waiters uses bounded stack.
class Semaphore {
 public:
  /// What acquire() returns. `co_await` it once: it yields nothing, with a
  /// token held; it continues at once if a token is free and nobody waits,
  /// else it is resumed on the thread whose release() hands it the token.
  using AcquireAwaitable = detail::AcquireOperation<false>;
  /// What acquire(stop) returns. `co_await` it once: it yields true with a
  /// token held, or false without one if `stop` was requested while it
  /// waited (then resumed on the thread that requested stop); otherwise
  /// like AcquireAwaitable.
  using CancellableAcquireAwaitable = detail::AcquireOperation<true>;

  /// A semaphore holding `tokens` tokens.
  explicit Semaphore(std::size_t tokens) noexcept : core_(tokens) {}

  /// `co_await sem.acquire()` takes one token, waiting in FIFO order.
  AcquireAwaitable acquire() noexcept { return {core_, 1}; }

  /// Like acquire(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with a token held, false without. A waiter that
  /// gives up lets the ones behind it proceed. A default `stop` means the
  /// token the awaiting Task runs under (see currentStopToken).
  CancellableAcquireAwaitable acquire(std::stop_token stop) noexcept { return {core_, 1, std::move(stop)}; }

  /// Takes a token if one is free and nobody is waiting.
  bool tryAcquire() noexcept { return core_.tryAcquire(1); }

  /// Returns `n` tokens; while coroutines wait they go to the oldest, resumed inline on this thread.
  void release(std::size_t n = 1) noexcept { core_.release(n); }

  /// Tokens free right now (0 while anyone waits).
  std::size_t available() const noexcept { return core_.available(); }

 private:
  detail::FifoSemaphore core_;
};

}  // namespace coio
