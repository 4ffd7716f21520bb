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
/// oldest queued items (its own first) to `Batch` (as many as fit in
/// `maxWeight`, or the first alone if heavier) and wakes their callers with
/// the batch's result. When a batch ends, the oldest item still queued
/// leads the next one.
///
/// `maxBatches` (default 1) batches may be under way at once: for work whose
/// batches may overlap, where a batch ends long after it started (a chain
/// of RDMA WRITEs ends when the peer acknowledges it). A leader then hands
/// the lead on as soon as it has taken its items, while fewer than
/// `maxBatches` are under way; the next leader yields once to the loop
/// (the batch before it starts first, and this turn's items queue behind
/// it) and takes what queued meanwhile.
///
/// Guarantees:
/// - Items are carried out in the order submit() was called, each in
///   exactly one batch. Batches start in that order, at most `maxBatches`
///   under way at once (`Batch` calls overlap only when it is above 1) and
///   may end in any order.
/// - Each caller gets its own batch's result.
/// - Cancellation: an item whose `stop` is requested while it is queued
///   leaves the queue and yields std::errc::operation_canceled, nothing of
///   it carried out; once a batch took it, it runs to the end under the
///   leader's stop token, and its caller gets the batch's result.
/// - A batch that fails breaks the commit: every later submit() fails at
///   once with Errc::closed, and so do the items of batches not yet started
///   (a byte stream cut mid-frame, a queue pair in error cannot be used
///   again); broken() tells.
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
  /// per call and at most `maxBatches` (at least 1) calls under way at
  /// once, on `reactor`'s loop thread.
  GroupCommit(R& reactor, std::size_t maxWeight, Batch batch, std::size_t maxBatches = 1)
      : reactor_(reactor), maxWeight_(maxWeight), maxBatches_(std::max<std::size_t>(maxBatches, 1)),
        batch_(std::move(batch)) {}
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  /// Carries out `item` (of `weight` towards a batch's maxWeight) in a batch.
  Task<Result<void>> submit(Item item, std::size_t weight, std::stop_token stop) {
    if (broken_) co_return Errc::closed;
    Caller me{std::move(item), weight};
    // Only an empty queue can be led afresh: queued items are waiting for
    // a batch to end, which hands them the lead.
    const bool lead = !leading_ && underWay_ < maxBatches_ && queue_.empty();
    queue_.push_back(&me);
    if (lead) {
      leading_ = true;
      co_await reactor_.schedule();  // let this turn's other items queue behind
    } else {
      // Carried out by a leader, or handed the lead.
      if (!co_await me.wake.acquire(stop)) {
        if (!me.taken) {
          std::erase(queue_, &me);
          co_return std::errc::operation_canceled;
        }
        co_await me.wake.acquire();  // in a batch under way: the leader's stop governs it
      }
      if (me.done) co_return std::move(me.result);
      // Handed the lead while a batch is under way (maxBatches > 1): that
      // batch starts first, and this turn's items queue behind us.
      if (underWay_ > 0) co_await reactor_.schedule();
    }
    if (stop.stop_requested()) {  // nothing of ours went
      std::erase(queue_, &me);
      handOver();
      co_return std::errc::operation_canceled;
    }
    co_await runBatch(me, stop);  // a leader is the oldest queued item: it is in its batch
    if (!leading_) handOver();
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
  // Hands the lead on once it has taken them, if another batch may start.
  Task<void> runBatch(Caller& leader, std::stop_token stop) {
    std::vector<Caller*> taken;
    std::vector<Item> items;
    std::size_t weight = 0;
    while (!queue_.empty() && (taken.empty() || weight + queue_.front()->weight <= maxWeight_)) {
      Caller* c = queue_.front();
      queue_.pop_front();
      c->taken = true;
      taken.push_back(c);
      items.push_back(c->item);
      weight += c->weight;
    }
    ++underWay_;
    handOver();
    // if/else, not a conditional: g++ 12 miscompiles `c ? x : co_await y`.
    Result<void> result = Errc::closed;
    if (!broken_) result = co_await batch_(std::span<const Item>(items), stop);
    if (!result) broken_ = true;
    for (Caller* c : taken) {
      c->result = result;
      c->done = true;
    }
    for (Caller* c : taken) {
      if (c != &leader) c->wake.release();  // resumes it inline
    }
    --underWay_;  // after the wakes: what they submit queues (or leads a batch beside others)
  }

  // The oldest queued item leads, if a batch may start.
  void handOver() noexcept {
    leading_ = !queue_.empty() && underWay_ < maxBatches_;
    if (leading_) queue_.front()->wake.release();
  }

  R& reactor_;
  std::size_t maxWeight_;
  std::size_t maxBatches_;
  Batch batch_;
  std::deque<Caller*> queue_;  // not yet taken, oldest first
  std::size_t underWay_ = 0;   // batches started, not yet ended
  bool leading_ = false;       // a leader will take the next batch
  bool broken_ = false;
};

}  // namespace coio
