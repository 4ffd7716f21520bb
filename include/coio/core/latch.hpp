#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/event.hpp>

#include <atomic>
#include <cstddef>
#include <stop_token>
#include <utility>

namespace coio {

/// A single-use countdown for coroutines (std::latch for `co_await`): it
/// opens when `countDown()` has taken its count to zero, and stays open.
///
/// Guarantees:
/// - Waiters are resumed inline on the thread whose `countDown()` reached
///   zero, oldest first, before that call returns; a wait on an open Latch
///   continues on the awaiting thread without suspending. A cancellable
///   wait whose stop is requested first is resumed, yielding false, on the
///   thread that requests stop.
/// - Every `countDown()` happens-before the return of every wait, and of
///   a `tryWait()` that returns true.
/// - The `countDown()` that reaches zero touches nothing of the Latch while
///   it resumes the waiters: a resumed waiter may destroy it. A `tryWait()`
///   that returns true does not mean that call has returned (see Event).
/// - Counting down below zero, and destroying the Latch while coroutines
///   wait, are programming errors (asserted).
class Latch {
 public:
  /// A Latch that opens after `count` units are counted down (open at once if 0).
  explicit Latch(std::size_t count) noexcept : count_(count), open_(count == 0) {}

  /// Counts `n` units down; the call that reaches zero resumes every waiter inline.
  void countDown(std::size_t n = 1) noexcept {
    const std::size_t before = count_.fetch_sub(n, std::memory_order_acq_rel);
    COIO_ASSERT(before >= n, "coio::Latch counted down below zero");
    if (before == n) open_.set();
  }

  /// Whether the Latch is open (the count reached zero and the waiters were released).
  bool tryWait() const noexcept { return open_.isSet(); }

  /// `co_await latch.wait()` returns once the Latch is open.
  auto wait() noexcept { return open_.wait(); }

  /// Like wait(), but gives up if `stop` is requested while waiting:
  /// `co_await` yields true if the Latch opened, false if it gave up.
  auto wait(std::stop_token stop) noexcept { return open_.wait(std::move(stop)); }

 private:
  std::atomic<std::size_t> count_;
  Event open_;
};

}  // namespace coio
