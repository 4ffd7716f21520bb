#pragma once
#include <coio/core/detail/fifo_semaphore.hpp>

#include <cstddef>
#include <stdexcept>
#include <stop_token>
#include <string>

namespace coio {

/// A weighted semaphore: acquisitions take n tokens at once. Strictly FIFO.
///
/// Guarantees:
/// - Queued requests are served in arrival order with head-of-line blocking:
///   a small request waits behind a large one at the head, so large requests
///   cannot starve. `tryAcquire(n)` fails while anyone is queued (unlike
///   folly's BatchSemaphore, whose fast path barges).
/// - `release(n)` resumes, inline on the releasing thread, every waiter at
///   the head that the tokens now satisfy, oldest first. As for Semaphore,
///   a release more than 32 nested hand-overs deep defers the resumption to
///   the outermost release on that thread: bounded stack use.
/// - A cancellable waiter that gives up (stop requested while queued)
///   re-runs the grants, so the waiters behind it proceed at once (folly
///   leaves them asleep until the next release).
/// - A request for more than `capacity()` tokens can never be met: it throws
///   std::invalid_argument instead of hanging.
/// - `release` happens-before the acquisition that takes its tokens.
///
/// Example:
/// \snippet api_examples.cpp BatchSemaphore
class BatchSemaphore {
 public:
  /// What acquire(n) returns. `co_await` it once: it yields nothing, with
  /// the n tokens held; it continues at once if they are free and nobody is
  /// queued, else it is resumed on the thread whose release() satisfies it.
  using AcquireAwaitable = detail::AcquireOperation<false>;
  /// What acquire(n, stop) returns. `co_await` it once: it yields true with
  /// the n tokens held, or false with none if `stop` was requested while it
  /// was queued (then resumed on the thread that requested stop); otherwise
  /// like AcquireAwaitable.
  using CancellableAcquireAwaitable = detail::AcquireOperation<true>;

  /// A semaphore of `capacity` units, all available.
  explicit BatchSemaphore(std::size_t capacity) noexcept : capacity_(capacity), core_(capacity) {}

  /// `co_await sem.acquire(n)` takes n tokens, waiting in FIFO order.
  AcquireAwaitable acquire(std::size_t n) { return {core_, checked(n)}; }

  /// Like acquire(n), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true with the tokens held, false without. A default
  /// `stop` means the token the awaiting Task runs under (see
  /// currentStopToken).
  CancellableAcquireAwaitable acquire(std::size_t n, std::stop_token stop) {
    return {core_, checked(n), std::move(stop)};
  }

  /// Takes n tokens if they are free and nobody is queued.
  bool tryAcquire(std::size_t n) { return core_.tryAcquire(checked(n)); }

  /// Returns `n` units; resumes the waiters they satisfy inline on the calling thread, oldest first.
  void release(std::size_t n) noexcept { core_.release(n); }

  /// Units free right now (a snapshot).
  std::size_t available() const noexcept { return core_.available(); }
  /// The capacity given at construction: the largest request acquire() accepts.
  std::size_t capacity() const noexcept { return capacity_; }

 private:
  std::size_t checked(std::size_t n) const {
    if (n > capacity_) {
      throw std::invalid_argument("coio::BatchSemaphore: request for " + std::to_string(n) +
                                  " tokens exceeds the capacity of " + std::to_string(capacity_));
    }
    return n;
  }

  std::size_t capacity_;
  detail::FifoSemaphore core_;
};

}  // namespace coio
