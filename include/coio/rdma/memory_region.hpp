#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/rdma/device.hpp>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace coio::rdma {

/// Access rights of a registration (ibv_access_flags), always explicit.
enum class Access : int {
  localWrite = IBV_ACCESS_LOCAL_WRITE,    ///< the NIC may write it locally (RECV, RDMA READ target)
  remoteWrite = IBV_ACCESS_REMOTE_WRITE,  ///< peers may RDMA WRITE into it (needs localWrite)
  remoteRead = IBV_ACCESS_REMOTE_READ,    ///< peers may RDMA READ from it
};
/// Combines access flags.
constexpr Access operator|(Access a, Access b) noexcept { return static_cast<Access>(static_cast<int>(a) | static_cast<int>(b)); }
/// Everything a buffer used for RDMA in both directions needs.
constexpr Access kAccessAll = Access::localWrite | Access::remoteWrite | Access::remoteRead;

/// A registered range as a peer addresses it: what one side sends the other
/// so that it can RDMA READ/WRITE there.
struct RemoteBuffer {
  /// Address in the peer's memory.
  std::uint64_t addr = 0;
  /// Bytes the peer may access from addr.
  std::uint64_t length = 0;
  /// The peer region's remote key.
  std::uint32_t rkey = 0;

  /// The part [offset, offset + n) (clamped to the buffer).
  RemoteBuffer subrange(std::uint64_t offset, std::uint64_t n) const noexcept {
    offset = offset < length ? offset : length;
    return RemoteBuffer{addr + offset, n < length - offset ? n : length - offset, rkey};
  }
};

/// A registered local range, as a work request's scatter/gather element.
struct LocalBuffer {
  /// Start of the local memory.
  std::byte* data = nullptr;
  /// Bytes.
  std::uint32_t length = 0;
  /// The local region's key.
  std::uint32_t lkey = 0;
};

/// A registration (RAII ibv_reg_mr) of any contiguous range with a Device's
/// protection domain. The memory is the caller's and must outlive the
/// MemoryRegion: so a disk BufferPool's single mapping can be registered as a
/// whole and the NIC then reads and writes the very pages io_uring fills.
///
/// Guarantees: deregistered on destruction; move-only. No I/O, no
/// coroutine is resumed; use from one thread at a time.
class MemoryRegion {
 public:
  /// Registers `memory` with `access`. Errors: errno of ibv_reg_mr (e.g.
  /// ENOMEM when RLIMIT_MEMLOCK is too low).
  static Result<MemoryRegion> create(const Device& device, std::span<std::byte> memory, Access access) {
    ibv_mr* mr = ::ibv_reg_mr(device.protectionDomain(), memory.data(), memory.size(), static_cast<int>(access));
    if (!mr) return systemError(errno ? errno : ENOMEM);
    return MemoryRegion(mr, memory);
  }

  /// Takes over `other`'s registration; `other` becomes empty.
  MemoryRegion(MemoryRegion&& other) noexcept
      : mr_(std::exchange(other.mr_, nullptr)), memory_(std::exchange(other.memory_, {})) {}
  /// Deregisters the region held, if any, and takes over `other`'s.
  MemoryRegion& operator=(MemoryRegion&& other) noexcept {
    if (this != &other) {
      reset();
      mr_ = std::exchange(other.mr_, nullptr);
      memory_ = std::exchange(other.memory_, {});
    }
    return *this;
  }
  ~MemoryRegion() { reset(); }

  /// The registered memory.
  std::span<std::byte> memory() const noexcept { return memory_; }
  /// The local key, for scatter/gather elements.
  std::uint32_t lkey() const noexcept { return mr_->lkey; }
  /// The remote key, for the peer's RDMA operations.
  std::uint32_t rkey() const noexcept { return mr_->rkey; }

  /// Whether `part` lies inside the registered memory.
  bool contains(std::span<const std::byte> part) const noexcept {
    return part.data() >= memory_.data() && part.data() + part.size() <= memory_.data() + memory_.size();
  }

  /// `part` (inside this region, < 4 GiB) as a scatter/gather element.
  LocalBuffer local(std::span<std::byte> part) const noexcept {
    COIO_ASSERT(contains(part) && part.size() <= UINT32_MAX, "LocalBuffer outside its MemoryRegion");
    return LocalBuffer{part.data(), static_cast<std::uint32_t>(part.size()), lkey()};
  }
  /// The part [offset, offset + length) of this region as a scatter/gather element.
  LocalBuffer local(std::size_t offset, std::size_t length) const noexcept {
    return local(memory_.subspan(offset, length));
  }

  /// `part` (inside this region) as a peer addresses it.
  RemoteBuffer remote(std::span<const std::byte> part) const noexcept {
    COIO_ASSERT(contains(part), "RemoteBuffer outside its MemoryRegion");
    return RemoteBuffer{reinterpret_cast<std::uintptr_t>(part.data()), part.size(), rkey()};
  }
  /// The whole region as a peer addresses it.
  RemoteBuffer remote() const noexcept { return remote(memory_); }

 private:
  MemoryRegion(ibv_mr* mr, std::span<std::byte> memory) noexcept : mr_(mr), memory_(memory) {}
  void reset() noexcept {
    if (mr_) ::ibv_dereg_mr(std::exchange(mr_, nullptr));
  }

  ibv_mr* mr_;
  std::span<std::byte> memory_;
};

}  // namespace coio::rdma
