#pragma once
// Where a finished Task goes: the coroutine that awaited it, or, for a
// child of collectAll and its relatives, the latch it reports to. Reporting
// straight from the child's final suspend saves a wrapper coroutine per
// child; the tag costs a Task one test in its final suspend.
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

 protected:
  FanIn() = default;
  FanIn(const FanIn&) = default;
  FanIn& operator=(const FanIn&) = default;
  ~FanIn() = default;

  /// childFinished for a child that finished elsewhere than in its start.
  virtual std::coroutine_handle<> childDone(void* child, const std::exception_ptr* exception) noexcept = 0;
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
  std::uintptr_t bits_ = 0;
};

}  // namespace coio::detail
