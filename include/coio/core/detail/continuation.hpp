#pragma once
// Where a finished Task goes: the coroutine that awaited it, or, for a
// child of collectAll and its relatives, the latch it reports to. Reporting
// straight from the child's final suspend saves a wrapper coroutine per
// child; the tag costs a Task one test in its final suspend.
//
// A child that finishes in its start (see tlsChildStarting) may go on to
// start the next child of its range itself, by symmetric transfer, rather
// than return to the start loop, which would resume that next child: one
// jump per child instead of a return, a call and the loop's bookkeeping.
#include <coroutine>
#include <cstdint>
#include <exception>

namespace coio::detail {

// The frame of the collect child being started on this thread
// (detail/collect.hpp, startChild), until it finishes or its start
// returns; null otherwise.
inline constinit thread_local void* tlsChildStarting = nullptr;

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

  /// Whether the child whose frame is at `child`, finished without
  /// throwing, is to start the next child of its range (successor) rather
  /// than report through childFinished: it finished in its start, and its
  /// start loop chains (AllLatch::startChained, collect.hpp) and has
  /// children left to chain. It then counts as finished in its start.
  bool chainsFrom(void* child) const noexcept { return tlsChildStarting == child && chainNext_ != chainLimit_; }
  /// After chainsFrom: the next child, of the same type Child as every
  /// child of its range.
  template <typename Child>
  Child& successor() noexcept {
    auto* const next = static_cast<Child*>(chainNext_);
    chainNext_ = next + 1;
    return *next;
  }

 protected:
  FanIn() = default;
  FanIn(const FanIn&) = default;
  FanIn& operator=(const FanIn&) = default;
  ~FanIn() = default;

  /// childFinished for a child that finished elsewhere than in its start.
  virtual std::coroutine_handle<> childDone(void* child, const std::exception_ptr* exception) noexcept = 0;

  // The children a chaining start loop has not started yet: [chainNext_,
  // chainLimit_) of its range, type-erased (every child of a range has the
  // same type). Only the starting thread touches them, while it starts.
  // Empty (both null) when the loop does not chain.
  void* chainNext_ = nullptr;
  const void* chainLimit_ = nullptr;
};

/// A coroutine handle or a FanIn, in one word (the FanIn tagged in the low
/// bit, free in both: frames and FanIns are at least 2-aligned).
class Continuation {
 public:
  Continuation() noexcept = default;
  explicit Continuation(std::coroutine_handle<> awaiting) noexcept
      : bits_(reinterpret_cast<std::uintptr_t>(awaiting.address())) {}
  explicit Continuation(FanIn& fanIn) noexcept : bits_(reinterpret_cast<std::uintptr_t>(&fanIn) | kFanIn) {}

  /// The FanIn, or null if this is a coroutine handle.
  FanIn* fanIn() const noexcept {
    return (bits_ & kFanIn) != 0 ? reinterpret_cast<FanIn*>(bits_ & ~kFanIn) : nullptr;
  }
  /// The coroutine handle (when fanIn() is null).
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
