#pragma once
// Coroutine frame recycling. A lazy Task costs one frame allocation, and
// with malloc that is more than half of a create+await+destroy (callgrind,
// a bare promise: 230 instructions per op with malloc, 105 with this pool;
// timings in docs/benchmarks.md).
// Frames are recycled through per-thread stacks keyed by size class: no
// locks, no atomics. A frame freed on another thread than the one that
// allocated it simply joins that thread's stack. Each class keeps at most
// kBytesPerClass, so a thread retains at most its recent high-water mark of
// frames, capped at kClasses * kBytesPerClass (1 MiB).
//
// A stack is an array of pointers, not a list threaded through the free
// blocks: taking a block loads nothing from the block itself. With a list,
// each allocation waited for the previous block's next pointer, and once
// frames had been freed out of address order (a fan-out whose children
// finish in any order) that chain of loads missed the cache: 10 % more per
// child of a collectAllRange of 1,000.
//
// Disabled under AddressSanitizer (recycling would hide use-after-free of
// frames) and with COIO_DISABLE_FRAME_POOL.
#include <coio/core/detail/sanitizers.hpp>

#include <cstddef>
#include <cstdint>
#include <new>

#if !defined(COIO_DISABLE_FRAME_POOL) && !defined(COIO_DETAIL_ASAN)
#define COIO_FRAME_POOL 1
#else
#define COIO_FRAME_POOL 0
#endif

namespace coio::detail {

struct FramePool {
  static constexpr std::size_t kGranule = 64;
  static constexpr std::size_t kClasses = 16;  // frames up to 1 KiB are pooled
  // A collectAllRange over 1,000 small children (Task<int> frames of 64
  // bytes) recycles every frame; with 16 KiB, 3 in 4 went to malloc.
  static constexpr std::size_t kBytesPerClass = 64 * 1024;

  enum class State : std::uint8_t { unarmed, armed, dead };

  // Class c's stack: the free blocks in [base[c], top[c]), room up to
  // end[c]. All three null until the class's first free (and again once the
  // thread's reaper ran), so that the hot paths test one pointer against
  // another and every rare case (first free, full stack, dead pool) takes
  // the slow path: an empty stack allocates from the heap, a full one frees
  // to it.
  void** top[kClasses];
  void** base[kClasses];
  void** end[kClasses];
  State state;

  static constexpr std::size_t capacity(std::size_t c) noexcept { return kBytesPerClass / ((c + 1) * kGranule); }

  void releaseAll() noexcept {
    for (std::size_t c = 0; c < kClasses; ++c) {
      while (top[c] != base[c]) ::operator delete(*--top[c]);
      ::operator delete(base[c]);
      top[c] = base[c] = end[c] = nullptr;
    }
  }

  // The slow path of a free into class c (called on this thread's pool):
  // true if the block may be cached. Arms the reaper on the thread's first
  // free and makes the class's stack on its first; false for a full stack,
  // a pool already torn down, or no memory for the stack.
  [[gnu::noinline]] bool admitSlow(std::size_t c) noexcept {
    struct Reaper {
      FramePool* pool;
      ~Reaper() {
        pool->releaseAll();
        pool->state = State::dead;  // later frees go straight to the heap
      }
    };
    if (state == State::dead || base[c] != nullptr) return false;
    if (state == State::unarmed) {
      static thread_local Reaper reaper{this};
      state = State::armed;
    }
    auto** stack = static_cast<void**>(::operator new(capacity(c) * sizeof(void*), std::nothrow));
    if (stack == nullptr) return false;
    top[c] = base[c] = stack;
    end[c] = stack + capacity(c);
    return true;
  }
};

// Trivially constructible and destructible, so access needs no TLS guard;
// the cached blocks are freed by a separate reaper at thread exit.
inline constinit thread_local FramePool tlsFramePool{};

inline void* allocateFrame(std::size_t size) {
#if COIO_FRAME_POOL
  const std::size_t c = (size - 1) / FramePool::kGranule;
  if (c < FramePool::kClasses) {
    FramePool& pool = tlsFramePool;
    if (pool.top[c] != pool.base[c]) return *--pool.top[c];
    return ::operator new((c + 1) * FramePool::kGranule);
  }
#endif
  return ::operator new(size);
}

inline void deallocateFrame(void* p, std::size_t size) noexcept {
#if COIO_FRAME_POOL
  const std::size_t c = (size - 1) / FramePool::kGranule;
  if (c < FramePool::kClasses) {
    FramePool& pool = tlsFramePool;
    if (pool.top[c] != pool.end[c] || pool.admitSlow(c)) {
      *pool.top[c]++ = p;
      return;
    }
  }
#else
  (void)size;
#endif
  ::operator delete(p);
}

/// Mixin for promise types whose frames use the recycling allocator.
struct PooledFrame {
  static void* operator new(std::size_t size) { return allocateFrame(size); }
  static void operator delete(void* p, std::size_t size) noexcept { deallocateFrame(p, size); }
};

}  // namespace coio::detail
