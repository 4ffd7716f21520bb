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

/// N reads submitted together, awaited as one: the storage server's
/// batchRead (3FS's AioReadWorker, as a coroutine).
///
/// Guarantees: those of every DiskBatch (one io_uring_enter, one
/// resumption on the Disk's loop thread, a result per read, cancellation by
/// stop token, streaming with start()/next(), nothing thrown out of the
/// `co_await`), and:
/// - Reads into a registered BufferPool slice use IORING_OP_READ_FIXED,
///   reads of a registered File IOSQE_FIXED_FILE.
/// - `result(i)`: bytes read (short at end of file, 0 past it or for an
///   empty read), or that read's error (EIO, EISDIR,
///   DiskErrc::misalignedDirectIo checked before submission, ...).
/// - keepApart(): each read reaches the device as a request of its own, so
///   each completes on its own. By default the block layer merges reads of
///   adjacent ranges that reach it together into one request, which a
///   streaming reader then sees complete all at once (16 reads of 256 KiB
///   become one 4 MiB request). With keepApart, consecutive reads of the
///   batch alternate between two I/O priorities of the submitting thread's
///   class that differ in level only (its own level and the next), and the
///   block layer never merges requests of different priorities. Schedulers
///   that order by priority order by class (mq-deadline); BFQ also weighs
///   the level, so every other read gets one level's worth less weight.
/// - The destinations must stay valid until the `co_await` returns (when
///   streaming: until next() yielded nullopt). The batch can be reused
///   after clear(). Loop thread only; not movable.
///
/// Example:
/// \snippet api_examples_uring.cpp ReadBatch
class ReadBatch : public DiskBatch {
 public:
  /// An empty batch submitting to `disk`'s ring.
  explicit ReadBatch(Disk& disk) noexcept : DiskBatch(disk) {}

  /// Adds a read of destination.size() bytes at `offset`; returns its index.
  std::size_t add(const File& file, std::uint64_t offset, std::span<std::byte> destination) {
    return addTransfer(IORING_OP_READ, file, offset, destination.data(), destination.size(), -1);
  }
  /// Adds a read into a BufferPool slice (READ_FIXED if the pool is registered).
  std::size_t add(const File& file, std::uint64_t offset, BufferSlice destination) {
    return addTransfer(IORING_OP_READ, file, offset, destination.data, destination.size, destination.fixedIndex);
  }

  /// Keeps every read a request of its own (see the class comment), from
  /// the next submission on.
  void keepApart(bool apart = true) noexcept { keepApart_ = apart; }
};

}  // namespace coio
