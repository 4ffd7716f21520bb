#pragma once
// Coroutine frame recycling. A lazy Task costs one frame allocation, and
// with malloc that is more than half of a create+await+destroy (callgrind,
// a bare promise: 230 instructions per op with malloc, 105 with this pool;
// timings in docs/benchmarks.md).
// Frames are recycled through per-thread free lists keyed by size class: no
// locks, no atomics. A frame freed on another thread than the one that
// allocated it simply joins that thread's list. Each class keeps at most
// kBytesPerClass, so a thread retains at most its recent high-water mark of
// frames, capped at kClasses * kBytesPerClass (1 MiB).
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

  struct Block {
    Block* next;
  };

  // room[c]: blocks class c may still take. Zero until the thread's reaper
  // is armed and again once it has run, so the hot free path tests one
  // counter and the rare cases (first free, full list, dead pool) all take
  // the slow path.
  Block* heads[kClasses];
  std::uint32_t room[kClasses];
  State state;

  static constexpr std::uint32_t capacity(std::size_t c) noexcept {
    return static_cast<std::uint32_t>(kBytesPerClass / ((c + 1) * kGranule));
  }

  void releaseAll() noexcept {
    for (std::size_t c = 0; c < kClasses; ++c) {
      while (Block* b = heads[c]) {
        heads[c] = b->next;
        ::operator delete(b);
      }
      room[c] = 0;
    }
  }

  // The slow path of a free into class c (called on this thread's pool):
  // true if the block may be cached. Arms the reaper on the thread's first
  // free; false for a full list or a pool already torn down.
  [[gnu::noinline]] bool admitSlow(std::size_t c) noexcept {
    struct Reaper {
      FramePool* pool;
      ~Reaper() {
        pool->releaseAll();
        pool->state = State::dead;  // later frees go straight to the heap
      }
    };
    if (state != State::unarmed) return false;
    static thread_local Reaper reaper{this};
    state = State::armed;
    for (std::size_t k = 0; k < kClasses; ++k) room[k] = capacity(k);
    return room[c] != 0;
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
    if (FramePool::Block* b = pool.heads[c]) {
      pool.heads[c] = b->next;
      ++pool.room[c];
      return b;
    }
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
    if (pool.room[c] != 0 || pool.admitSlow(c)) {
      --pool.room[c];
      auto* b = static_cast<FramePool::Block*>(p);
      b->next = pool.heads[c];
      pool.heads[c] = b;
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
