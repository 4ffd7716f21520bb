#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/detail/disk_operation.hpp>
#include <coio/disk/direct_io.hpp>
#include <coio/disk/disk.hpp>
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/detail/syscall.hpp>

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stop_token>
#include <string>
#include <memory>
#include <utility>

namespace coio {

class DiskBatch;

/// A file opened for io_uring I/O on a Disk.
///
/// Guarantees:
/// - read/write (plain, vectored, or readFixed/writeFixed from a
///   BufferPool), fsync, fdatasync and fallocate are io_uring operations on
///   the Disk's ring; `co_await` yields Result<std::size_t> (bytes
///   transferred: a read at or past end of file yields fewer bytes, or 0,
///   not an error) or Result<void>, and resumes the coroutine on the Disk's
///   loop thread. The buffer (and, for vectored I/O, the iovecs) must stay
///   valid until the `co_await` returns.
/// - With `OpenOptions::direct` (O_DIRECT), offset, length and buffer address
///   (for vectored I/O: those of every iovec) must be multiples of
///   `alignment()`; a misaligned request fails at once with
///   DiskErrc::misalignedDirectIo (never reaches the kernel). Use
///   alignRange() and an aligned buffer (BufferPool's are 4 KiB-aligned).
/// - A registered file (`registerWithRing()`) is addressed through the
///   ring's file table (IOSQE_FIXED_FILE), which saves a file lookup per I/O.
/// - A stop requested on the loop thread cancels the operation; it then
///   yields std::errc::operation_canceled (or its real result if it won the
///   race), once the kernel has let go of the buffer.
/// - open(), size() and close() are blocking system calls on the calling
///   thread (fine at start-up, before the loop runs). Their io_uring forms,
///   openAsync(), sizeAsync() / stat() and closeAsync(), leave the loop
///   thread free: they are Tasks that resume the awaiting coroutine on the
///   Disk's loop thread. Nothing on the read or write path blocks.
/// - Move-only; used on the Disk's loop thread (or while no loop runs);
///   close it before the Disk.
///
/// Example (with ReadBatch):
/// \snippet api_examples_uring.cpp ReadBatch
class File {
 public:
  /// How File::open opens the file.
  struct OpenOptions {
    bool write = false;     ///< O_RDWR instead of O_RDONLY
    bool create = false;    ///< O_CREAT (mode 0644)
    bool truncate = false;  ///< O_TRUNC
    bool direct = false;    ///< O_DIRECT: bypass the page cache
  };

  /// What read(), readFixed(), write() and writeFixed() return, plain or
  /// vectored. `co_await` it once, on the Disk's loop thread, where it
  /// resumes: it yields Result<std::size_t>, the bytes transferred (see the
  /// class comment for errors and the stop token).
  using TransferAwaitable = detail::DiskOperation<std::size_t>;
  /// What fsync(), fdatasync() and fallocate() return: awaited as a
  /// TransferAwaitable, it yields Result<void>.
  using StatusAwaitable = detail::DiskOperation<void>;

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
  /// Opens `path` with `options`; the error is the open(2) errno. Blocks
  /// the calling thread (open(2), and statx(2) for O_DIRECT's alignment).
  static Result<File> open(Disk& disk, const char* path, OpenOptions options) {
    const long fd = detail::retryOnEintr([&] { return ::open(path, openFlags(options), kCreateMode); });
    if (fd < 0) return systemError(static_cast<int>(-fd));
    File file(disk, static_cast<int>(fd), options.direct);
    if (options.direct) file.alignment_ = directAlignment(file.fd_.get());
    return file;
  }

  /// Opens `path` read-only through io_uring (see the form with options).
  static Task<Result<File>> openAsync(Disk& disk, std::string path) {
    return openAsync(disk, std::move(path), OpenOptions{});
  }
  /// Opens `path` (copied) with `options` through io_uring
  /// (IORING_OP_OPENAT, then IORING_OP_STATX for O_DIRECT's alignment):
  /// the loop thread does not block. Resumes on the Disk's loop thread. The
  /// error is openat(2)'s errno (ENOENT, EISDIR for a directory opened for
  /// writing, EINVAL for O_DIRECT on tmpfs, ...), or
  /// std::errc::operation_canceled if `stop` was requested before the open
  /// ran (one that already ran yields its file).
  static Task<Result<File>> openAsync(Disk& disk, std::string path, OpenOptions options, std::stop_token stop = {}) {
    detail::DiskRequest r;
    r.opcode = IORING_OP_OPENAT;
    r.fd = AT_FDCWD;
    r.address = path.data();
    r.length = kCreateMode;
    r.opFlags = static_cast<std::uint32_t>(openFlags(options));
    Result<int> fd = co_await detail::DiskOperation<int>{disk.queue(), r, std::move(stop)};
    if (!fd) co_return fd.error();
    File file(disk, *fd, options.direct);
    if (options.direct && kDirectAlignmentMask != 0) {
      Result<struct statx> st = co_await file.stat(kDirectAlignmentMask);
      if (st) file.alignment_ = directAlignment(*st);
    }
    co_return std::move(file);
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

  /// The file's size in bytes (fstat). Blocks the calling thread: on the
  /// loop thread, use sizeAsync().
  Result<std::uint64_t> size() const {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) return systemError(errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// The file's size in bytes, through io_uring (IORING_OP_STATX).
  /// Resumes on the Disk's loop thread; the error is statx(2)'s errno, or
  /// std::errc::operation_canceled.
  Task<Result<std::uint64_t>> sizeAsync(std::stop_token stop = {}) const {
    Result<struct statx> st = co_await stat(STATX_SIZE, std::move(stop));
    if (!st) co_return st.error();
    co_return std::uint64_t{st->stx_size};
  }

  /// statx(2) of the file through io_uring (IORING_OP_STATX), asking for
  /// the fields in `mask` (STATX_* bits; stx_mask says which the file
  /// system filled in). Resumes on the Disk's loop thread; the error is
  /// statx(2)'s errno, or std::errc::operation_canceled.
  Task<Result<struct statx>> stat(unsigned mask = STATX_BASIC_STATS, std::stop_token stop = {}) const {
    COIO_ASSERT(isOpen(), "stat of a closed coio::File");
    struct statx st {};
    detail::DiskRequest r;
    r.opcode = IORING_OP_STATX;
    r.fd = fd_.get();  // STATX takes no registered file
    r.address = &st;
    r.length = mask;
    r.opFlags = AT_EMPTY_PATH;
    Result<void> done = co_await detail::DiskOperation<void>{disk_->queue(), r, std::move(stop)};
    if (!done) co_return done.error();
    co_return st;
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
  /// No operation may be pending on it. Blocks the calling thread in
  /// close(2) (which may write back, e.g. on network file systems): on the
  /// loop thread, use closeAsync().
  void close() noexcept {
    if (slot_ >= 0) disk_->unregisterFile(std::exchange(slot_, -1));
    if (fd_.valid() && ring_) ring_->fileClosing(fd_.get());
    ring_.reset();
    fd_.reset();
  }

  /// Closes the file through io_uring (IORING_OP_CLOSE), and takes it out
  /// of the registered-file table. The result is close(2)'s (EIO: a
  /// write-back failed; the descriptor is gone either way), or
  /// std::errc::operation_canceled if `stop` was requested before the close
  /// ran: the File then stays open. Does nothing for a closed File. Resumes
  /// on the Disk's loop thread. No operation may be pending on it.
  Task<Result<void>> closeAsync(std::stop_token stop = {}) {
    if (!isOpen()) co_return Result<void>{};
    detail::DiskRequest r;
    r.opcode = IORING_OP_CLOSE;
    // The kernel's from here: if this frame dies with the reactor, the
    // descriptor may leak but is never closed twice.
    r.fd = fd_.release();
    Result<void> closed = co_await detail::DiskOperation<void>{disk_->queue(), r, std::move(stop)};
    if (closed.error() == std::errc::operation_canceled) {  // it never ran
      fd_.reset(r.fd);
      co_return closed;
    }
    if (slot_ >= 0) disk_->unregisterFile(std::exchange(slot_, -1));
    co_return closed;
  }

  /// Reads up to buffer.size() bytes at `offset`.
  TransferAwaitable read(std::uint64_t offset, std::span<std::byte> buffer, std::stop_token stop = {}) {
    return transfer(IORING_OP_READ, offset, buffer.data(), buffer.size(), -1, std::move(stop));
  }
  /// Reads into a BufferPool slice: IORING_OP_READ_FIXED if the pool is
  /// registered, a plain read otherwise.
  TransferAwaitable readFixed(std::uint64_t offset, BufferSlice slice, std::stop_token stop = {}) {
    return transfer(IORING_OP_READ, offset, slice.data, slice.size, slice.fixedIndex, std::move(stop));
  }
  /// Writes up to data.size() bytes at `offset`.
  TransferAwaitable write(std::uint64_t offset, std::span<const std::byte> data, std::stop_token stop = {}) {
    return transfer(IORING_OP_WRITE, offset, const_cast<std::byte*>(data.data()), data.size(), -1, std::move(stop));
  }
  /// Writes a BufferPool slice: IORING_OP_WRITE_FIXED if the pool is
  /// registered, a plain write otherwise.
  TransferAwaitable writeFixed(std::uint64_t offset, BufferSlice slice, std::stop_token stop = {}) {
    return transfer(IORING_OP_WRITE, offset, slice.data, slice.size, slice.fixedIndex, std::move(stop));
  }
  /// Flushes the file's data and metadata to the device.
  StatusAwaitable fsync(std::stop_token stop = {}) {
    return {disk_->queue(), request(IORING_OP_FSYNC, 0, nullptr, 0, -1), std::move(stop)};
  }

  /// Reads into `parts`, in order, from `offset` (IORING_OP_READV): bytes
  /// read, short at end of file. At most IOV_MAX parts (else EINVAL before
  /// submission); with O_DIRECT every part must be aligned.
  TransferAwaitable read(std::uint64_t offset, std::span<const iovec> parts, std::stop_token stop = {}) {
    return vectored(IORING_OP_READV, offset, parts, std::move(stop));
  }
  /// Writes `parts`, in order, at `offset` (IORING_OP_WRITEV): bytes
  /// written. At most IOV_MAX parts (else EINVAL before submission); with
  /// O_DIRECT every part must be aligned.
  TransferAwaitable write(std::uint64_t offset, std::span<const iovec> parts, std::stop_token stop = {}) {
    return vectored(IORING_OP_WRITEV, offset, parts, std::move(stop));
  }

  /// Flushes the file's data to the device, and of its metadata only what
  /// reading the data back needs (the size, not the times): fdatasync(2),
  /// as IORING_OP_FSYNC with IORING_FSYNC_DATASYNC.
  StatusAwaitable fdatasync(std::stop_token stop = {}) {
    detail::DiskRequest r = request(IORING_OP_FSYNC, 0, nullptr, 0, -1);
    r.opFlags = IORING_FSYNC_DATASYNC;
    return {disk_->queue(), r, std::move(stop)};
  }

  /// fallocate(2) of [offset, offset + length) (IORING_OP_FALLOCATE): `mode`
  /// 0 allocates and extends the file; FALLOC_FL_KEEP_SIZE allocates without
  /// extending; FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE frees the range,
  /// which then reads as zeros. Errors: fallocate(2)'s (EOPNOTSUPP where the
  /// file system lacks the mode, EINVAL for an empty range, ENOSPC, ...).
  StatusAwaitable fallocate(int mode, std::uint64_t offset, std::uint64_t length, std::stop_token stop = {}) {
    detail::DiskRequest r = request(IORING_OP_FALLOCATE, offset, nullptr, length, -1);
    r.opFlags = static_cast<std::uint32_t>(mode);
    return {disk_->queue(), r, std::move(stop)};
  }

  /// The Disk the file was opened on.
  Disk& disk() const noexcept { return *disk_; }

 private:
  friend class DiskBatch;

  static constexpr mode_t kCreateMode = 0644;
#ifdef STATX_DIOALIGN
  static constexpr unsigned kDirectAlignmentMask = STATX_DIOALIGN;
#else
  static constexpr unsigned kDirectAlignmentMask = 0;  // headers before Linux 6.1: assume 4096
#endif

  File(Disk& disk, int fd, bool direct) noexcept : disk_(&disk), ring_(disk.ring_), fd_(fd), direct_(direct) {
    ring_->fileOpened(fd, direct);
  }

  static int openFlags(OpenOptions options) noexcept {
    int flags = (options.write ? O_RDWR : O_RDONLY) | O_CLOEXEC;
    if (options.create) flags |= O_CREAT;
    if (options.truncate) flags |= O_TRUNC;
    if (options.direct) flags |= O_DIRECT;
    return flags;
  }

  /// The SQE contents for one operation on the file. `opcode` is READ or
  /// WRITE (`fixedBuffer` >= 0 makes it READ_FIXED / WRITE_FIXED), READV,
  /// WRITEV, FSYNC or FALLOCATE.
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
    r.length = length;
    r.offset = offset;
    return r;
  }
  /// Why a transfer cannot be submitted, or an empty error_code.
  std::error_code check(std::uint64_t offset, const std::byte* data, std::size_t length) const noexcept {
    if (length > std::numeric_limits<std::uint32_t>::max()) return DiskErrc::requestTooLarge;
    if (direct_ && length > 0 && !isAligned(offset, length, data, alignment_)) return DiskErrc::misalignedDirectIo;
    return {};
  }

  TransferAwaitable vectored(std::uint8_t opcode, std::uint64_t offset, std::span<const iovec> parts,
                             std::stop_token stop) {
    detail::DiskRequest r = request(opcode, offset, nullptr, parts.size(), -1);
    r.address = const_cast<iovec*>(parts.data());
    return {disk_->queue(), r, std::move(stop), check(offset, parts)};
  }
  /// check() for every part of a vectored transfer.
  std::error_code check(std::uint64_t offset, std::span<const iovec> parts) const noexcept {
    if (parts.size() > IOV_MAX) return std::make_error_code(std::errc::invalid_argument);
    for (const iovec& part : parts) {
      if (part.iov_len == 0) continue;  // the kernel skips empty parts too
      if (const std::error_code e = check(offset, static_cast<const std::byte*>(part.iov_base), part.iov_len)) {
        return e;
      }
    }
    return {};
  }

  TransferAwaitable transfer(std::uint8_t opcode, std::uint64_t offset, std::byte* data,
                             std::size_t length, int fixedBuffer, std::stop_token stop) {
    return {disk_->queue(), request(opcode, offset, data, length, fixedBuffer), std::move(stop),
            check(offset, data, length)};
  }

  void take(File& other) noexcept {
    disk_ = std::exchange(other.disk_, nullptr);
    ring_ = std::move(other.ring_);
    fd_ = std::move(other.fd_);
    slot_ = std::exchange(other.slot_, -1);
    if (slot_ >= 0) disk_->moveFile(slot_, &slot_);
    direct_ = other.direct_;
    alignment_ = other.alignment_;
  }

  static std::size_t directAlignment(int fd) noexcept {
    struct statx st {};
    if (kDirectAlignmentMask != 0) (void)::statx(fd, "", AT_EMPTY_PATH, kDirectAlignmentMask, &st);
    return directAlignment(st);
  }
  // From statx STATX_DIOALIGN when the kernel reports it, else 4096.
  static std::size_t directAlignment(const struct statx& st) noexcept {
#ifdef STATX_DIOALIGN
    if ((st.stx_mask & STATX_DIOALIGN) && st.stx_dio_offset_align != 0) {
      return std::max<std::size_t>(st.stx_dio_offset_align, st.stx_dio_mem_align);
    }
#else
    (void)st;
#endif
    return 4096;
  }

  Disk* disk_ = nullptr;
  // The ring told of the fd's open and close (DiskRing::fileOpened): held,
  // so that a File closed after its Disk went (a frame destroyed with its
  // reactor) still tells a live object, which then knows it is closed.
  std::shared_ptr<detail::DiskRing> ring_;
  FileDescriptor fd_;
  int slot_ = -1;
  bool direct_ = false;
  std::size_t alignment_ = 4096;
};

}  // namespace coio
