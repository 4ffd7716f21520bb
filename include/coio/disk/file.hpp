#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/detail/fd.hpp>
#include <coio/detail/syscall.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/detail/disk_operation.hpp>
#include <coio/disk/direct_io.hpp>
#include <coio/disk/disk.hpp>

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stop_token>
#include <utility>

namespace coio {

class DiskBatch;

/// A file opened for io_uring I/O on a Disk.
///
/// Guarantees:
/// - read/write/fsync are io_uring operations on the Disk's ring; `co_await`
///   yields Result<std::size_t> (bytes transferred: a read at or past end of
///   file yields fewer bytes, or 0, not an error) or Result<void>, and
///   resumes the coroutine on the Disk's loop thread. The buffer must stay
///   valid until the `co_await` returns.
/// - With `OpenOptions::direct` (O_DIRECT), offset, length and buffer address
///   must be multiples of `alignment()`; a misaligned request fails at once
///   with DiskErrc::misalignedDirectIo (never reaches the kernel). Use
///   alignRange() and an aligned buffer (BufferPool's are 4 KiB-aligned).
/// - A registered file (`registerWithRing()`) is addressed through the
///   ring's file table (IOSQE_FIXED_FILE), which saves a file lookup per I/O.
/// - A stop requested on the loop thread cancels the operation; it then
///   yields std::errc::operation_canceled (or its real result if it won the
///   race), once the kernel has let go of the buffer.
/// - open/size/close are synchronous system calls. Move-only; used on the
///   Disk's loop thread (or while no loop runs); close it before the Disk.
class File {
 public:
  /// How File::open opens the file.
  struct OpenOptions {
    bool write = false;     ///< O_RDWR instead of O_RDONLY
    bool create = false;    ///< O_CREAT (mode 0644)
    bool truncate = false;  ///< O_TRUNC
    bool direct = false;    ///< O_DIRECT: bypass the page cache
  };

  File() noexcept = default;
  /// Takes over `other`'s file; `other` becomes closed.
  File(File&& other) noexcept { take(other); }
  /// Closes the file held, if any, and takes over `other`'s.
  File& operator=(File&& other) noexcept {
    if (this != &other) {
      close();
      take(other);
    }
    return *this;
  }
  ~File() { close(); }

  /// Opens `path` (read-only unless `options` say otherwise).
  static Result<File> open(Disk& disk, const char* path) { return open(disk, path, OpenOptions{}); }
  /// Opens `path` with `options`; the error is the open(2) errno.
  static Result<File> open(Disk& disk, const char* path, OpenOptions options) {
    int flags = (options.write ? O_RDWR : O_RDONLY) | O_CLOEXEC;
    if (options.create) flags |= O_CREAT;
    if (options.truncate) flags |= O_TRUNC;
    if (options.direct) flags |= O_DIRECT;
    const long fd = detail::retryOnEintr([&] { return ::open(path, flags, 0644); });
    if (fd < 0) return systemError(static_cast<int>(-fd));
    File file;
    file.disk_ = &disk;
    file.fd_.reset(static_cast<int>(fd));
    file.direct_ = options.direct;
    if (options.direct) file.alignment_ = directAlignment(file.fd_.get());
    return file;
  }

  /// Whether a file is open.
  bool isOpen() const noexcept { return fd_.valid(); }
  /// The file descriptor (-1 when closed).
  int fd() const noexcept { return fd_.get(); }
  /// Whether the file was opened with O_DIRECT.
  bool direct() const noexcept { return direct_; }
  /// The O_DIRECT alignment of offsets, lengths and buffer addresses (from
  /// statx STATX_DIOALIGN when the kernel reports it, else 4096); 1 without O_DIRECT.
  std::size_t alignment() const noexcept { return direct_ ? alignment_ : 1; }
  /// Whether it is in the ring's registered-file table.
  bool registered() const noexcept { return slot_ >= 0; }

  /// The file's size in bytes (fstat).
  Result<std::uint64_t> size() const {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) return systemError(errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// Puts the file in the ring's registered-file table (io_uring_register_files,
  /// Disk::Options::maxRegisteredFiles slots). On failure the file keeps
  /// working unregistered. It leaves the table when it closes or its Disk goes.
  Result<void> registerWithRing() {
    if (slot_ >= 0) return {};
    Result<int> slot = disk_->registerFile(fd_.get(), &slot_);
    if (!slot) return slot.error();
    slot_ = *slot;
    return {};
  }

  /// Closes the file (and takes it out of the registered-file table).
  /// No operation may be pending on it.
  void close() noexcept {
    if (slot_ >= 0) disk_->unregisterFile(std::exchange(slot_, -1));
    fd_.reset();
  }

  /// Reads up to buffer.size() bytes at `offset`.
  detail::DiskOperation<std::size_t> read(std::uint64_t offset, std::span<std::byte> buffer,
                                          std::stop_token stop = {}) {
    return transfer(IORING_OP_READ, offset, buffer.data(), buffer.size(), -1, std::move(stop));
  }
  /// Reads into a BufferPool slice: IORING_OP_READ_FIXED if the pool is
  /// registered, a plain read otherwise.
  detail::DiskOperation<std::size_t> readFixed(std::uint64_t offset, BufferSlice slice, std::stop_token stop = {}) {
    return transfer(IORING_OP_READ, offset, slice.data, slice.size, slice.fixedIndex, std::move(stop));
  }
  /// Writes up to data.size() bytes at `offset`.
  detail::DiskOperation<std::size_t> write(std::uint64_t offset, std::span<const std::byte> data,
                                           std::stop_token stop = {}) {
    return transfer(IORING_OP_WRITE, offset, const_cast<std::byte*>(data.data()), data.size(), -1, std::move(stop));
  }
  /// Flushes the file's data and metadata to the device.
  detail::DiskOperation<void> fsync(std::stop_token stop = {}) {
    return {disk_->queue(), request(IORING_OP_FSYNC, 0, nullptr, 0, -1), std::move(stop)};
  }

  /// The Disk the file was opened on.
  Disk& disk() const noexcept { return *disk_; }

 private:
  friend class DiskBatch;

  /// The SQE contents for one transfer, or the error that keeps it from the
  /// kernel. `opcode` is READ or WRITE; `fixedBuffer` >= 0 makes it
  /// READ_FIXED / WRITE_FIXED.
  detail::DiskRequest request(std::uint8_t opcode, std::uint64_t offset, std::byte* data, std::size_t length,
                              int fixedBuffer) const noexcept {
    COIO_ASSERT(isOpen(), "I/O on a closed coio::File");
    detail::DiskRequest r;
    r.opcode = opcode;
    if (fixedBuffer >= 0) {
      r.opcode = opcode == IORING_OP_READ ? IORING_OP_READ_FIXED : IORING_OP_WRITE_FIXED;
      r.bufferIndex = static_cast<std::uint16_t>(fixedBuffer);
    }
    r.fixedFile = slot_ >= 0;
    r.fd = slot_ >= 0 ? slot_ : fd_.get();
    r.address = data;
    r.length = static_cast<std::uint32_t>(length);
    r.offset = offset;
    return r;
  }
  /// Why a transfer cannot be submitted, or an empty error_code.
  std::error_code check(std::uint64_t offset, const std::byte* data, std::size_t length) const noexcept {
    if (length > std::numeric_limits<std::uint32_t>::max()) return DiskErrc::requestTooLarge;
    if (direct_ && length > 0 && !isAligned(offset, length, data, alignment_)) return DiskErrc::misalignedDirectIo;
    return {};
  }

  detail::DiskOperation<std::size_t> transfer(std::uint8_t opcode, std::uint64_t offset, std::byte* data,
                                              std::size_t length, int fixedBuffer, std::stop_token stop) {
    return {disk_->queue(), request(opcode, offset, data, length, fixedBuffer), std::move(stop),
            check(offset, data, length)};
  }

  void take(File& other) noexcept {
    disk_ = std::exchange(other.disk_, nullptr);
    fd_ = std::move(other.fd_);
    slot_ = std::exchange(other.slot_, -1);
    if (slot_ >= 0) disk_->moveFile(slot_, &slot_);
    direct_ = other.direct_;
    alignment_ = other.alignment_;
  }

  static std::size_t directAlignment(int fd) noexcept {
#ifdef STATX_DIOALIGN
    struct statx st {};
    if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0 && (st.stx_mask & STATX_DIOALIGN) &&
        st.stx_dio_offset_align != 0) {
      return std::max<std::size_t>(st.stx_dio_offset_align, st.stx_dio_mem_align);
    }
#endif
    return 4096;
  }

  Disk* disk_ = nullptr;
  detail::FileDescriptor fd_;
  int slot_ = -1;
  bool direct_ = false;
  std::size_t alignment_ = 4096;
};

}  // namespace coio
