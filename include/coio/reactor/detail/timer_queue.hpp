#pragma once
// TimerQueue: an intrusive binary min-heap of timers ordered by (deadline,
// insertion sequence), so that timers with equal deadlines fire in the order
// they were added. Each node knows its heap index: removal is O(log n) with
// no search and no allocation besides the heap's vector.
#include <coio/core/detail/assert.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

namespace coio::detail {

struct TimerNode {
  static constexpr std::size_t kNotQueued = std::numeric_limits<std::size_t>::max();

  std::chrono::steady_clock::time_point deadline;
  void (*fire)(TimerNode*) noexcept = nullptr;
  std::uint64_t seq = 0;
  std::size_t index = kNotQueued;

  bool queued() const noexcept { return index != kNotQueued; }
};

class TimerQueue {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  std::size_t size() const noexcept { return heap_.size(); }
  /// Timers ever pushed (the sequence numbers handed out), and fired.
  std::uint64_t pushed() const noexcept { return nextSeq_; }
  std::uint64_t fired() const noexcept { return fired_; }

  void push(TimerNode& n) {
    COIO_ASSERT(!n.queued(), "timer queued twice");
    n.seq = nextSeq_++;
    n.index = heap_.size();
    heap_.push_back(&n);
    siftUp(n.index);
  }

  void remove(TimerNode& n) noexcept {
    COIO_ASSERT(n.queued() && heap_[n.index] == &n, "removing a timer that is not queued here");
    const std::size_t i = n.index;
    n.index = TimerNode::kNotQueued;
    TimerNode* last = heap_.back();
    heap_.pop_back();
    if (last == &n) return;
    place(last, i);
    siftDown(i);
    siftUp(last->index);
  }

  std::optional<TimePoint> nextDeadline() const noexcept {
    if (heap_.empty()) return std::nullopt;
    return heap_.front()->deadline;
  }
  /// The first deadline (size() != 0), and whether a timer is due at
  /// `now`: without nextDeadline()'s optional, whose copy stalls the CPU
  /// (the simulation asks for every node at every turn).
  TimePoint firstDeadline() const noexcept {
    COIO_ASSERT(!heap_.empty(), "firstDeadline() of no timer");
    return heap_.front()->deadline;
  }
  bool anyDue(TimePoint now) const noexcept { return !heap_.empty() && heap_.front()->deadline <= now; }

  /// Pops and fires every timer due at `now`, in order. A fired callback
  /// may add or remove timers; those due at `now` fire in this call too.
  /// Returns whether any did. Each counts in fired() before it fires.
  bool fireDue(TimePoint now) noexcept {
    const std::uint64_t before = fired_;
    while (!heap_.empty() && heap_.front()->deadline <= now) {
      TimerNode* n = heap_.front();
      remove(*n);
      ++fired_;
      n->fire(n);
    }
    return fired_ != before;
  }

 private:
  static bool before(const TimerNode* a, const TimerNode* b) noexcept {
    return a->deadline != b->deadline ? a->deadline < b->deadline : a->seq < b->seq;
  }
  void place(TimerNode* n, std::size_t i) noexcept {
    heap_[i] = n;
    n->index = i;
  }
  void siftUp(std::size_t i) noexcept {
    TimerNode* n = heap_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!before(n, heap_[parent])) break;
      place(heap_[parent], i);
      i = parent;
    }
    place(n, i);
  }
  void siftDown(std::size_t i) noexcept {
    TimerNode* n = heap_[i];
    for (;;) {
      std::size_t child = 2 * i + 1;
      if (child >= heap_.size()) break;
      if (child + 1 < heap_.size() && before(heap_[child + 1], heap_[child])) ++child;
      if (!before(heap_[child], n)) break;
      place(heap_[child], i);
      i = child;
    }
    place(n, i);
  }

  std::vector<TimerNode*> heap_;
  std::uint64_t nextSeq_ = 0;
  std::uint64_t fired_ = 0;
};

}  // namespace coio::detail
