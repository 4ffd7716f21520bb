#pragma once
// Where a finished Task goes: the coroutine that awaited it, or, for a
// child of collectAll and its relatives, the latch it reports to. Reporting
// straight from the child's final suspend saves a wrapper coroutine per
// child; the tag costs a Task one test in its final suspend.
//
// A child of collectAllRange that finishes in its start (see
// tlsChildStarting), without throwing, while every child before it did
// too, hands its value to the range's results and frees its own frame
// without suspending (FanIn::earlyValues): no destroy() call later, no
// second pass over the frames to collect the values. With g++ 12 that also
// skips the dispatch on the resume index that every destroy() goes through.
#include <coio/core/detail/assert.hpp>

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace coio::detail {

// The frame of the collect child being started on this thread
// (detail/collect.hpp, startChild), until it finishes or its start
// returns; null otherwise.
inline constinit thread_local void* tlsChildStarting = nullptr;

// What tlsChildStarting holds, no frame's address, once the child being
// started handed its value over (FanIn::earlyValues) and frees its own
// frame: handingOverMark() from its final_suspend to its final awaiter's
// await_ready, which alone takes it (no other coroutine can mistake it for
// its own), then handedOverMark() until its start loop goes on.
inline void* handingOverMark() noexcept { return reinterpret_cast<void*>(std::uintptr_t{1}); }
inline void* handedOverMark() noexcept { return reinterpret_cast<void*>(std::uintptr_t{2}); }

/// The values of the first children of a collectAllRange, in input order
/// (for void children, how many there are), in room for every child:
/// adding one is a construction, with no test for room, so that it costs a
/// child's final suspend no code it would keep registers for.
template <typename T>
class RangeValues {
 public:
  explicit RangeValues(std::size_t capacity) : first_(std::allocator<T>().allocate(capacity)), last_(first_), capacity_(capacity) {}
  RangeValues(const RangeValues&) = delete;
  RangeValues& operator=(const RangeValues&) = delete;
  ~RangeValues() {
    std::destroy(first_, last_);
    std::allocator<T>().deallocate(first_, capacity_);
  }

  std::size_t size() const noexcept { return static_cast<std::size_t>(last_ - first_); }
  void add(T&& value) noexcept {
    COIO_ASSERT(size() < capacity_, "more range values than children");
    std::construct_at(last_++, std::move(value));
  }
  /// The values, moved out (a copy of memory for a trivially copyable T).
  std::vector<T> take() { return std::vector<T>(std::make_move_iterator(first_), std::make_move_iterator(last_)); }

 private:
  T* first_;
  T* last_;
  std::size_t capacity_;
};
template <>
class RangeValues<void> {
 public:
  explicit RangeValues(std::size_t /*capacity*/) noexcept {}
  std::size_t size() const noexcept { return count_; }
  void add() noexcept { ++count_; }

 private:
  std::size_t count_ = 0;
};

/// Whether a Task<T> can hand its value over in its final suspend, where
/// nothing may throw.
template <typename T>
inline constexpr bool handsOverValue =
    std::is_void_v<T> || (!std::is_reference_v<T> && std::is_nothrow_move_constructible_v<T>);

/// What a Task that is the child of a collect operation reports to.
class FanIn {
 public:
  /// Called from the final suspend of the child whose frame is at
  /// `child`, on the thread that finished it (`*exception`: what it threw,
  /// if not null). Returns the coroutine to run next on that thread.
  std::coroutine_handle<> childFinished(void* child, const std::exception_ptr* exception) noexcept {
    if (tlsChildStarting == child) {
      // Its start is below us on this stack and takes it from here, without
      // the atomic arrival: back to it.
      tlsChildStarting = nullptr;
      return std::noop_coroutine();
    }
    return childDone(child, exception);
  }

  /// Where the child whose frame is at `child`, finished without throwing,
  /// is to hand its value before freeing its own frame, or null: it
  /// finished in its start, and its start loop takes values early
  /// (AllLatch::startRange, collect.hpp) and every child before it handed
  /// its value over. T is the value type of every child of the range.
  template <typename T>
  RangeValues<T>* earlyValues(void* child) const noexcept {
    return tlsChildStarting == child ? static_cast<RangeValues<T>*>(earlyValues_) : nullptr;
  }

 protected:
  FanIn() = default;
  FanIn(const FanIn&) = default;
  FanIn& operator=(const FanIn&) = default;
  ~FanIn() = default;

  /// childFinished for a child that finished elsewhere than in its start.
  virtual std::coroutine_handle<> childDone(void* child, const std::exception_ptr* exception) noexcept = 0;

  // The RangeValues<T> of the range being started, while children hand
  // their values over; null otherwise. Only the starting thread touches it.
  void* earlyValues_ = nullptr;
};

/// A coroutine handle or a FanIn, in one word (the FanIn tagged in the low
/// bit, free in both: frames and FanIns are at least 2-aligned).
class Continuation {
 public:
  Continuation() noexcept = default;
  explicit Continuation(std::coroutine_handle<> awaiting) noexcept
      : bits_(reinterpret_cast<std::uintptr_t>(awaiting.address())) {}
  explicit Continuation(FanIn& fanIn) noexcept : bits_(reinterpret_cast<std::uintptr_t>(&fanIn) | kFanIn) {}

  /// True if this is a FanIn, false if a coroutine handle.
  bool isFanIn() const noexcept { return (bits_ & kFanIn) != 0; }
  /// The FanIn (when isFanIn()).
  FanIn& fanIn() const noexcept { return *reinterpret_cast<FanIn*>(bits_ & ~kFanIn); }
  /// The coroutine handle (when not isFanIn()).
  std::coroutine_handle<> handle() const noexcept {
    return std::coroutine_handle<>::from_address(reinterpret_cast<void*>(bits_));
  }

 private:
  static constexpr std::uintptr_t kFanIn = 1;
  // Left uninitialised by default: whoever starts the coroutine sets it
  // before its body runs, and creating a Task costs no store for it (one
  // store less in the ramp made a 1,000-child collectAllRange 5-8% faster
  // with g++ 12).
  std::uintptr_t bits_;
};

}  // namespace coio::detail
