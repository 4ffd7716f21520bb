#pragma once
// Where a finished Task goes: the coroutine that awaited it, or, for a
// child of collectAll and its relatives, the latch it reports to. Reporting
// straight from the child's final suspend saves a wrapper coroutine per
// child; the tag costs a Task one test in its final suspend.
#include <coroutine>
#include <cstdint>
#include <exception>

namespace coio::detail {

/// What a Task that is the child of a collect operation reports to.
class FanIn {
 public:
  /// The child whose frame is at `child` finished (threw `*exception`
  /// if not null); called from its final suspend, on the thread that
  /// finished it. Returns the coroutine to run next on that thread.
  virtual std::coroutine_handle<> childDone(void* child, const std::exception_ptr* exception) noexcept = 0;

 protected:
  FanIn() = default;
  FanIn(const FanIn&) = default;
  FanIn& operator=(const FanIn&) = default;
  ~FanIn() = default;
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
