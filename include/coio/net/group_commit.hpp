#pragma once
#include <coio/core/result.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <span>
#include <stop_token>
#include <system_error>
#include <utility>
#include <vector>

namespace coio {

/// Group commit: concurrent callers' items carried out in batches by one
/// leader at a time, so that many small sends become one system call (a
/// gather write of many frames, a chain of RDMA work requests). The
/// storage example's TCP frame writer and RDMA writes are built on it.
///
/// A submit() that finds no batch under way leads: it yields once to the
/// coroutines already ready on the loop (reactor.schedule(): a burst of
/// read completions, say, queues its items behind it), then hands the
/// oldest queued items to `Batch` (as many as fit in `maxWeight`, or the
/// first alone if heavier), wakes their callers with the batch's result,
/// and repeats until its own item is done; then it hands leadership to the
/// oldest item still queued.
///
/// Guarantees:
/// - Items are carried out in the order submit() was called, each in
///   exactly one batch, batches one at a time (never two `Batch` calls at
///   once).
/// - Each caller gets its own batch's result.
/// - Cancellation: an item whose `stop` is requested while it is queued
///   leaves the queue and yields std::errc::operation_canceled, nothing of
///   it carried out; once a batch took it, it runs to the end under the
///   leader's stop token, and its caller gets the batch's result.
/// - A batch that fails breaks the commit: every later submit() fails at
///   once with Errc::closed (a byte stream cut mid-frame, a queue pair in
///   error cannot be used again); broken() tells.
/// - Threads: used on the loop thread of `reactor` only. Every caller
///   resumes there: the leader after its own batch, the others inline when
///   the leader wakes them (in submit order), or when their stop is
///   requested (on the loop thread that requests it).
///
/// `Batch` is called as `co_await batch(std::span<const Item> items,
/// std::stop_token)` and yields Result<void>; `items` is valid until
/// it returns.
template <Reactor R, typename Item, typename Batch>
class GroupCommit {
 public:
  /// Items go out through `batch`, at most `maxWeight` of them (by weight)
  /// per call, on `reactor`'s loop thread.
  GroupCommit(R& reactor, std::size_t maxWeight, Batch batch)
      : reactor_(reactor), maxWeight_(maxWeight), batch_(std::move(batch)) {}
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  /// Carries out `item` (of `weight` towards a batch's maxWeight) in a batch.
  Task<Result<void>> submit(Item item, std::size_t weight, std::stop_token stop) {
    if (broken_) co_return Errc::closed;
    Caller me{std::move(item), weight};
    queue_.push_back(&me);
    if (leading_) {
      // Carried out by the leader, or handed the lead.
      if (!co_await me.wake.acquire(stop)) {
        if (!me.taken) {
          std::erase(queue_, &me);
          co_return std::errc::operation_canceled;
        }
        co_await me.wake.acquire();  // in a batch under way: the leader's stop governs it
      }
      if (me.done) co_return std::move(me.result);
    } else {
      leading_ = true;
      co_await reactor_.schedule();  // let this turn's other items queue behind
    }
    if (stop.stop_requested()) {  // nothing of ours went
      std::erase(queue_, &me);
      handOver();
      co_return std::errc::operation_canceled;
    }
    while (!me.done) co_await runBatch(me, stop);
    handOver();
    co_return std::move(me.result);
  }

  /// Whether a batch failed: then every submit() fails with Errc::closed.
  bool broken() const noexcept { return broken_; }

 private:
  struct Caller {
    Caller(Item i, std::size_t w) noexcept : item(std::move(i)), weight(w) {}
    Item item;
    std::size_t weight;
    Semaphore wake{0};  // released when done, or when handed the lead
    Result<void> result = Errc::closed;
    bool taken = false;  // in a batch under way
    bool done = false;   // `result` is final
  };

  // Carries out the oldest queued items (whole ones, up to maxWeight, or
  // the first alone if heavier) in one batch, then wakes the ones it took.
  Task<void> runBatch(Caller& leader, std::stop_token stop) {
    std::vector<Caller*> taken;
    items_.clear();
    std::size_t weight = 0;
    while (!queue_.empty() && (taken.empty() || weight + queue_.front()->weight <= maxWeight_)) {
      Caller* c = queue_.front();
      queue_.pop_front();
      c->taken = true;
      taken.push_back(c);
      items_.push_back(c->item);
      weight += c->weight;
    }
    // if/else, not a conditional: g++ 12 miscompiles `c ? x : co_await y`.
    Result<void> result = Errc::closed;
    if (!broken_) result = co_await batch_(std::span<const Item>(items_), stop);
    if (!result) broken_ = true;
    for (Caller* c : taken) {
      c->result = result;
      c->done = true;
    }
    for (Caller* c : taken) {
      if (c != &leader) c->wake.release();  // resumes it inline
    }
  }

  void handOver() noexcept {
    leading_ = !queue_.empty();
    if (leading_) queue_.front()->wake.release();
  }

  R& reactor_;
  std::size_t maxWeight_;
  Batch batch_;
  std::deque<Caller*> queue_;  // not yet taken, oldest first
  std::vector<Item> items_;    // the batch under way
  bool leading_ = false;       // a leader is running batches
  bool broken_ = false;
};

}  // namespace coio
