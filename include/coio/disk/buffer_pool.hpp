#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/sanitizers.hpp>
#include <coio/core/result.hpp>
#include <coio/reactor/detail/syscall.hpp>

#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace coio {

class BufferPool;
class Disk;

/// A view of bytes inside a BufferPool buffer, with what io_uring needs to
/// read into it as a fixed buffer. It owns nothing: the Buffer it came from
/// must outlive every operation that uses it.
struct BufferSlice {
  /// Start of the slice.
  std::byte* data = nullptr;
  /// Bytes in the slice.
  std::size_t size = 0;
  int fixedIndex = -1;  ///< index in the ring's fixed-buffer table, -1 if not registered

  /// The slice as a span.
  std::span<std::byte> span() const noexcept { return {data, size}; }
  /// The part [offset, offset + length) of this slice (clamped to it).
  BufferSlice subslice(std::size_t offset, std::size_t length) const noexcept {
    COIO_ASSERT(offset <= size, "subslice starts past the end of the slice");
    return {data + offset, std::min(length, size - offset), fixedIndex};
  }
};

/// One buffer of a BufferPool, handed back to the pool on destruction.
/// Move-only; used on the pool's thread.
class Buffer {
 public:
  Buffer() noexcept = default;
  /// Takes over `other`'s buffer; `other` becomes empty.
  Buffer(Buffer&& other) noexcept
      : pool_(std::exchange(other.pool_, nullptr)), index_(other.index_) {}
  /// Gives back the buffer held, if any, and takes over `other`'s.
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = std::exchange(other.pool_, nullptr);
      index_ = other.index_;
    }
    return *this;
  }
  ~Buffer() { reset(); }

  /// Whether the Buffer holds a buffer (not moved from or reset).
  bool valid() const noexcept { return pool_ != nullptr; }
  /// The buffer's index in its pool (also its place in the RDMA region).
  std::uint32_t index() const noexcept { return index_; }
  /// Start of the buffer (4 KiB-aligned).
  std::byte* data() const noexcept;
  /// Bytes in the buffer: the pool's bufferSize().
  std::size_t size() const noexcept;
  /// The buffer as a span.
  std::span<std::byte> span() const noexcept { return {data(), size()}; }
  /// The whole buffer, or its part [offset, offset + length), as a slice.
  BufferSlice slice() const noexcept;
  /// The part [offset, offset + length) as a slice (clamped to the buffer).
  BufferSlice slice(std::size_t offset, std::size_t length) const noexcept { return slice().subslice(offset, length); }

  /// Gives the buffer back to the pool now.
  void reset() noexcept;

 private:
  friend class BufferPool;
  Buffer(BufferPool* pool, std::uint32_t index) noexcept : pool_(pool), index_(index) {}
  BufferPool* pool_ = nullptr;
  std::uint32_t index_ = 0;
};

/// Fixed-size buffers carved from one contiguous, 2 MiB-aligned anonymous
/// mapping, allocated once; `Disk::registerBuffers` makes them io_uring
/// fixed buffers, so that reads into them use IORING_OP_READ_FIXED.
///
/// Guarantees:
/// - Every buffer is aligned to 4 KiB (O_DIRECT-ready) and its size is a
///   multiple of 4 KiB; `data()`/`size()` span the whole mapping, so the
///   same memory can also be registered as one RDMA memory region, where
///   buffer i sits at offset i * bufferSize().
/// - tryAcquire() and giving a Buffer back do not allocate. Single-threaded:
///   use the pool on its Disk's loop thread.
/// - Unregistered (never registered, registration failed, or its Disk is
///   gone) the pool still works: slices carry no fixed index and reads fall
///   back to IORING_OP_READ; `registrationNote()` says why.
/// - It does not depend on the reactor: declare it before the reactor, so
///   that it outlives the coroutine frames (holding Buffers) the reactor
///   destroys. When it is destroyed every Buffer must be back and it must
///   be unregistered, e.g. its Disk gone (both asserted).
/// - With Options::poisonOnRelease (a debugging aid) a buffer out of the
///   pool holds kPoisonByte everywhere and, under AddressSanitizer, may not
///   be touched (see there).
class BufferPool {
 public:
  /// How a BufferPool maps its memory.
  struct Options {
    std::size_t bufferSize = 512 * 1024;  ///< a multiple of 4 KiB, at most 1 GiB
    /// Number of buffers.
    std::size_t count = 64;
    bool hugePages = false;  ///< back the mapping with hugetlbfs pages (MAP_HUGETLB)
    /// Ask for transparent huge pages (MADV_HUGEPAGE). Physically contiguous
    /// buffers make large O_DIRECT reads need far fewer device segments.
    bool transparentHugePages = true;
    /// A debugging aid for buffer lifetimes: a buffer given back to the
    /// pool (and every buffer at first) is filled with kPoisonByte and,
    /// under AddressSanitizer, poisoned until tryAcquire() hands it out
    /// again. A use after release by the program is then an ASan report
    /// (or, without ASan, reads the pattern); one by the kernel, which ASan
    /// does not see (a zero-copy send or a write still reading the buffer,
    /// a read still writing it), shows as the pattern in what went out, or
    /// as bytes over it. Costs a fill of the buffer per release.
    bool poisonOnRelease = false;
  };

  /// What Options::poisonOnRelease fills released buffers with.
  static constexpr std::byte kPoisonByte{0xDB};

  /// Maps the memory (populated); throws std::system_error if that fails or
  /// the options are invalid.
  explicit BufferPool(Options options)
      : bufferSize_(options.bufferSize), count_(options.count), poison_(options.poisonOnRelease) {
    if (bufferSize_ == 0 || bufferSize_ % kAlignment != 0 || bufferSize_ > kMaxRegion || count_ == 0 ||
        count_ > UINT32_MAX) {
      throw std::system_error(make_error_code(Errc::invalidArgument),
                              "coio::BufferPool: bufferSize must be a non-zero multiple of 4 KiB up to 1 GiB, "
                              "count non-zero");
    }
    map(options);
    freeList_.reserve(count_);
    for (std::size_t i = count_; i-- > 0;) freeList_.push_back(static_cast<std::uint32_t>(i));
    if (poison_) poison(base_, size());
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool() {
    COIO_ASSERT(freeList_.size() == count_, "BufferPool destroyed while buffers are out");
    COIO_ASSERT(!registered(), "BufferPool destroyed while registered: destroy its Disk first (or unregisterBuffers)");
    // ASan keeps its marks past munmap: memory mapped here later would be off-limits.
    if (poison_) detail::unpoisonMemory(base_, size());
    ::munmap(mapping_, mappingSize_);
  }

  /// The whole mapping (for RDMA memory-region registration).
  std::byte* data() const noexcept { return base_; }
  /// Bytes in all buffers together.
  std::size_t size() const noexcept { return bufferSize_ * count_; }
  /// Bytes in each buffer.
  std::size_t bufferSize() const noexcept { return bufferSize_; }
  /// Number of buffers.
  std::size_t count() const noexcept { return count_; }
  /// Buffers not handed out.
  std::size_t available() const noexcept { return freeList_.size(); }

  /// Whether the buffers are io_uring fixed buffers; if not, why.
  bool registered() const noexcept { return disk_ != nullptr; }
  /// Why the buffers are not registered (empty while they are).
  const std::string& registrationNote() const noexcept { return note_; }

  /// The iovecs to register (each at most 1 GiB of whole buffers): buffer i
  /// is in region i / buffersPerRegion().
  std::vector<iovec> regions() const {
    std::vector<iovec> out;
    for (std::size_t first = 0; first < count_; first += buffersPerRegion()) {
      const std::size_t n = std::min(buffersPerRegion(), count_ - first);
      out.push_back({base_ + first * bufferSize_, n * bufferSize_});
    }
    return out;
  }
  /// Buffers in each region of regions().
  std::size_t buffersPerRegion() const noexcept { return kMaxRegion / bufferSize_; }

  /// A free buffer, or nothing if all are out.
  std::optional<Buffer> tryAcquire() noexcept {
    if (freeList_.empty()) return std::nullopt;
    const std::uint32_t index = freeList_.back();
    freeList_.pop_back();
    if (poison_) detail::unpoisonMemory(bufferData(index), bufferSize_);
    return Buffer{this, index};
  }

 private:
  friend class Buffer;
  static constexpr std::size_t kAlignment = 4096;
  static constexpr std::size_t kHugePage = 2 * 1024 * 1024;
  static constexpr std::size_t kMaxRegion = std::size_t{1} << 30;  // io_uring's limit per fixed buffer

  std::byte* bufferData(std::uint32_t index) const noexcept { return base_ + std::size_t{index} * bufferSize_; }
  // Buffer::reset: back to the free list, poisoned first if asked.
  void giveBack(std::uint32_t index) noexcept {
    if (poison_) poison(bufferData(index), bufferSize_);
    freeList_.push_back(index);
  }
  static void poison(std::byte* data, std::size_t size) noexcept {
    std::memset(data, static_cast<int>(kPoisonByte), size);
    detail::poisonMemory(data, size);
  }

  void map(const Options& options) {
    const std::size_t bytes = (size() + kHugePage - 1) / kHugePage * kHugePage;
    if (options.hugePages) {
      mappingSize_ = bytes;
      mapping_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE,
                        -1, 0);
      if (mapping_ == MAP_FAILED) detail::throwSystemError(errno, "coio::BufferPool: mmap(MAP_HUGETLB)");
      base_ = static_cast<std::byte*>(mapping_);
      return;
    }
    // Over-map by one huge page so that the base can be 2 MiB-aligned: lets
    // transparent huge pages back it.
    mappingSize_ = bytes + kHugePage;
    mapping_ = ::mmap(nullptr, mappingSize_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping_ == MAP_FAILED) detail::throwSystemError(errno, "coio::BufferPool: mmap");
    const auto raw = reinterpret_cast<std::uintptr_t>(mapping_);
    base_ = reinterpret_cast<std::byte*>((raw + kHugePage - 1) & ~(std::uintptr_t{kHugePage} - 1));
    (void)::madvise(base_, bytes, options.transparentHugePages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    (void)::madvise(base_, bytes, MADV_POPULATE_WRITE);  // fault in now, not on the first read
  }

  // Set by Disk::registerBuffers / unregisterBuffers.
  friend class Disk;
  Disk* disk_ = nullptr;  // the Disk whose ring holds the buffers, if any
  std::string note_ = "not registered (Disk::registerBuffers not called)";

  std::size_t bufferSize_;
  std::size_t count_;
  bool poison_;
  void* mapping_ = nullptr;
  std::size_t mappingSize_ = 0;
  std::byte* base_ = nullptr;
  std::vector<std::uint32_t> freeList_;
};

inline std::byte* Buffer::data() const noexcept { return pool_->bufferData(index_); }
inline std::size_t Buffer::size() const noexcept { return pool_->bufferSize_; }
inline BufferSlice Buffer::slice() const noexcept {
  const int fixed = pool_->registered() ? static_cast<int>(index_ / pool_->buffersPerRegion()) : -1;
  return {data(), size(), fixed};
}
inline void Buffer::reset() noexcept {
  if (pool_) std::exchange(pool_, nullptr)->giveBack(index_);
}

}  // namespace coio
