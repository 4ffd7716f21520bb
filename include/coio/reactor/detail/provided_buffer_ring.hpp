#pragma once
// Needs liburing. ProvidedBufferRing: equal-sized buffers the kernel picks
// from when data arrives (io_uring "provided buffers", a buffer ring
// registered with IORING_REGISTER_PBUF_RING, Linux 5.19), for operations
// that choose their buffer late, such as a multishot recv.
#include <liburing.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>

namespace coio::detail {

class ProvidedBufferRing {
 public:
  ProvidedBufferRing() = default;
  ProvidedBufferRing(const ProvidedBufferRing&) = delete;
  ProvidedBufferRing& operator=(const ProvidedBufferRing&) = delete;
  /// The kernel may write into the buffers until the io_uring is gone (or
  /// its operations have all completed): destroy this after that.
  ~ProvidedBufferRing() {
    if (entries_) ::munmap(entries_, count_ * sizeof(io_uring_buf));
  }

  /// Registers `count` buffers (a power of two, at most 32768) of `size`
  /// bytes each with `ring` as buffer group `group`, all of them handed to
  /// the kernel. 0 or an errno. Once only.
  int setUp(io_uring& ring, unsigned short group, unsigned count, unsigned size) noexcept {
    // The entries must be page aligned: mmap gives that.
    void* entries = ::mmap(nullptr, count * sizeof(io_uring_buf), PROT_READ | PROT_WRITE,
                           MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (entries == MAP_FAILED) return errno;
    entries_ = static_cast<io_uring_buf_ring*>(entries);
    count_ = count;
    size_ = size;
    group_ = group;
    memory_.reset(new (std::nothrow) std::byte[std::size_t{count} * size]);
    if (!memory_) return ENOMEM;
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<std::uintptr_t>(entries_);
    reg.ring_entries = count;
    reg.bgid = group;
    if (const int r = io_uring_register_buf_ring(&ring, &reg, 0); r < 0) return -r;
    io_uring_buf_ring_init(entries_);
    for (unsigned id = 0; id < count; ++id) add(static_cast<unsigned short>(id), static_cast<int>(id));
    io_uring_buf_ring_advance(entries_, static_cast<int>(count));
    return 0;
  }

  unsigned short group() const noexcept { return group_; }
  /// Bytes in each buffer.
  std::size_t bufferSize() const noexcept { return size_; }

  /// The first `length` bytes of buffer `id` (from a CQE's flags).
  std::span<const std::byte> data(unsigned short id, std::size_t length) const noexcept {
    return {memory_.get() + std::size_t{id} * size_, length};
  }

  /// Hands buffer `id` back to the kernel once its data has been taken.
  void recycle(unsigned short id) noexcept {
    add(id, 0);
    io_uring_buf_ring_advance(entries_, 1);
  }

 private:
  void add(unsigned short id, int offset) noexcept {
    io_uring_buf_ring_add(entries_, memory_.get() + std::size_t{id} * size_, size_, id,
                          io_uring_buf_ring_mask(count_), offset);
  }

  io_uring_buf_ring* entries_ = nullptr;
  std::unique_ptr<std::byte[]> memory_;
  unsigned count_ = 0;
  unsigned size_ = 0;
  unsigned short group_ = 0;
};

}  // namespace coio::detail
