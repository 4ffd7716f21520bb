#pragma once
// Needs liburing: link coio::uring.
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/disk_batch.hpp>
#include <coio/disk/file.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace coio {

/// N writes submitted together, awaited as one: a chunk store's batched
/// writes (the write-side twin of ReadBatch).
///
/// Guarantees: those of every DiskBatch (one io_uring_enter, one
/// resumption on the Disk's loop thread, a result per write, cancellation
/// by stop token, streaming with start()/next(), nothing thrown out of the
/// `co_await`), and:
/// - Writes from a registered BufferPool slice use IORING_OP_WRITE_FIXED,
///   writes to a registered File IOSQE_FIXED_FILE.
/// - `result(i)`: bytes written (0 for an empty write; fewer than asked
///   only if the file system ran out of room or hit a size limit part-way),
///   or that write's error (EBADF for a file opened read-only, EINVAL,
///   ENOSPC, EIO, DiskErrc::misalignedDirectIo checked before submission,
///   ...). A cancelled write yields std::errc::operation_canceled.
/// - A completed write is in the file (with O_DIRECT: handed to the
///   device), not yet durable: follow with File::fdatasync() or fsync().
/// - The writes of one batch are not ordered among themselves: do not
///   overlap their ranges.
/// - The sources must stay valid and unchanged until the `co_await`
///   returns (when streaming: until next() yielded the write). The batch
///   can be reused after clear(). Loop thread only; not movable.
class WriteBatch : public DiskBatch {
 public:
  /// An empty batch submitting to `disk`'s ring.
  explicit WriteBatch(Disk& disk) noexcept : DiskBatch(disk) {}

  /// Adds a write of source.size() bytes at `offset`; returns its index.
  std::size_t add(const File& file, std::uint64_t offset, std::span<const std::byte> source) {
    return addTransfer(IORING_OP_WRITE, file, offset, const_cast<std::byte*>(source.data()), source.size(), -1);
  }
  /// Adds a write from a BufferPool slice (WRITE_FIXED if the pool is registered).
  std::size_t add(const File& file, std::uint64_t offset, BufferSlice source) {
    return addTransfer(IORING_OP_WRITE, file, offset, source.data, source.size, source.fixedIndex);
  }
};

}  // namespace coio
