#pragma once
// Small helpers shared by the core tests.
#include <atomic>
#include <cstdint>

namespace coio::test {

/// Counts live instances, so tests can see when a coroutine frame that owns
/// one is destroyed.
struct LifeTracker {
  static inline std::atomic<int> alive{0};
  LifeTracker() noexcept { ++alive; }
  LifeTracker(const LifeTracker&) noexcept { ++alive; }
  LifeTracker(LifeTracker&&) noexcept { ++alive; }
  ~LifeTracker() { --alive; }
};

/// Approximate native stack pointer of the caller.
[[gnu::noinline]] inline std::uintptr_t stackPointer() noexcept {
  return reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
}

}  // namespace coio::test
