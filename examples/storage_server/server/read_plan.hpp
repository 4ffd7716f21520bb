#pragma once
// Read planning for a StorageServer's requests: each valid IO's range
// widened to whole blocks and the files' alignment and cut into pieces of
// one pool buffer each; the buffers a request holds; the pieces read into
// them; and which pieces may go out, in order per IO, as reads complete
// and pass their CRCs.
#include "protocol/protocol.hpp"
#include "server/target.hpp"
#include "store/chunk_store.hpp"
#include "transport/channel.hpp"

#include <coio/core/batch_semaphore.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/direct_io.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/disk/read_batch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace storage {

/// One piece of a widened read: at most pieceSize bytes, whole blocks, into one buffer.
struct ReadPiece {
  const coio::File* file;
  std::uint64_t fileOffset;
  std::size_t length;
  std::size_t head;  // where the asked bytes start in the buffer
  std::size_t take;  // how many asked bytes it holds
  std::span<const std::uint32_t> stored;  // its blocks' CRCs in the index
  std::uint32_t blockSize;  // its target's
};
/// Where one IO of a request reads: its pieces, once validated its target.
struct IoPlan {
  std::size_t firstPiece = 0;
  std::size_t pieces = 0;
  const ServedTarget* target = nullptr;  // where the IO reads, once validated
};

/// Splits each valid IO's range, widened to whole blocks and the file's
// alignment (both powers of two, both dividing the chunk size: the range
// stays inside its chunk), into pieces of at most pieceSize (a multiple
// of the block size: whole blocks each).
inline void planReads(const proto::BatchReadRequest& request, const std::vector<proto::IoResult>& results,
                      std::vector<IoPlan>& plans, std::vector<ReadPiece>& pieces, std::size_t pieceSize) {
  for (std::size_t i = 0; i < request.ios.size(); ++i) {
    const proto::ReadIo& io = request.ios[i];
    plans[i].firstPiece = pieces.size();
    if (results[i].status != proto::IoStatus::ok || io.length == 0) continue;
    const ServedTarget& target = *plans[i].target;
    const ChunkStoreLayout& layout = target.index.layout;
    const ChunkLocation where = layout.locate(io.chunkId);
    const coio::File& file = target.files[where.file];
    const std::span<const std::uint32_t> crcs = target.index.crcsOf(layout.slotOf(io.chunkId));
    const coio::AlignedRange range = coio::alignRange(where.offset + io.offset, io.length,
                                                      std::max<std::size_t>(file.alignment(), layout.blockSize));
    std::size_t head = range.head, left = range.requested;
    for (std::size_t at = 0; at < range.length; at += pieceSize) {
      const std::size_t length = std::min(pieceSize, range.length - at);
      const std::size_t firstBlock = (range.offset + at - where.offset) / layout.blockSize;
      ReadPiece p{&file, range.offset + at, length, 0, 0, crcs.subspan(firstBlock, length / layout.blockSize),
                  layout.blockSize};
      p.head = std::min(head, p.length);
      p.take = std::min(left, p.length - p.head);
      head -= p.head;
      left -= p.take;
      pieces.push_back(p);
    }
    plans[i].pieces = pieces.size() - plans[i].firstPiece;
  }
}

/// Pool buffers for one request, and their semaphore tokens: both go back
// on destruction.
class BufferLease {
 public:
  BufferLease() = default;
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { release(); }
  // After `count` tokens were acquired: takes that many buffers (the tokens guarantee they are free).
  void hold(coio::BatchSemaphore& tokens, coio::BufferPool& pool, std::size_t count) {
    holdTokens(tokens, count);
    buffers.reserve(count);
    for (std::size_t i = 0; i < count; ++i) buffers.push_back(*pool.tryAcquire());
  }
  // After `count` tokens were acquired, for pieces that need no buffer
  // (spliced): holds the tokens alone, bounding the pieces in flight.
  void holdTokens(coio::BatchSemaphore& tokens, std::size_t count) noexcept {
    tokens_ = &tokens;
    count_ = count;
  }
  void release() noexcept {
    buffers.clear();  // back to the pool before a waiter is resumed to take them
    if (tokens_) std::exchange(tokens_, nullptr)->release(count_);
  }
  std::vector<coio::Buffer> buffers;

 private:
  coio::BatchSemaphore* tokens_ = nullptr;
  std::size_t count_ = 0;
};

/// A request's pieces read into its pool buffers by one streaming
// ReadBatch: each piece checked against its blocks' stored CRCs, its
// asked bytes sent from its buffer. (The other source of pieces, for
// RequestStream: SplicedPieces, server/spliced_pieces.hpp.)
class CopiedPieces {
 public:
  CopiedPieces(coio::Disk& disk, const std::vector<ReadPiece>& pieces, const BufferLease& lease)
      : pieces_(pieces), lease_(lease), batch_(disk), asked_(pieces.size()) {
    // Pieces complete one by one, so that each goes out while the rest are
    // read: merged back into one request they would complete together.
    batch_.keepApart();
    batch_.reserve(pieces.size());
    for (std::size_t p = 0; p < pieces.size(); ++p) {
      batch_.add(*pieces[p].file, pieces[p].fileOffset, lease.buffers[p].slice(0, pieces[p].length));
      asked_[p] = lease.buffers[p].span().subspan(pieces[p].head, pieces[p].take);
    }
  }
  CopiedPieces(const CopiedPieces&) = delete;
  CopiedPieces& operator=(const CopiedPieces&) = delete;

  /// Reads every piece, calling onRead(p) as each read completes (any
  /// order); resumes once all are done, or at `stop`.
  template <typename OnRead>
  coio::Task<void> readAll(std::stop_token stop, OnRead& onRead) {
    batch_.start();
    while (std::optional<std::size_t> p = co_await batch_.next(stop)) onRead(*p);
  }
  /// A read piece: ok, ioError (the read failed or came short), or
  /// corrupt (a block failed its stored CRC).
  proto::IoStatus check(std::size_t p, const BlockVerifier& verifier) const {
    const coio::Result<std::size_t> n = batch_.result(p);
    if (!n || *n != pieces_[p].length) return proto::IoStatus::ioError;
    if (!verifier.matches(read(p), pieces_[p].stored)) return proto::IoStatus::corrupt;
    return proto::IoStatus::ok;
  }
  /// `crc` continued over the asked bytes of a checked piece.
  std::uint32_t crcOf(std::size_t p, const BlockVerifier& verifier, std::uint32_t crc) const {
    const ReadPiece& piece = pieces_[p];
    return verifier.crcOf(read(p), piece.stored, piece.head, piece.head + piece.take, crc);
  }
  /// Makes `out` carry the asked bytes of pieces [first, first + count).
  void attach(OutgoingPiece& out, std::size_t first, std::size_t count) const {
    out.buffers = std::span(asked_).subspan(first, count);
  }

 private:
  std::span<const std::byte> read(std::size_t p) const { return lease_.buffers[p].span().first(pieces_[p].length); }

  const std::vector<ReadPiece>& pieces_;
  const BufferLease& lease_;
  coio::ReadBatch batch_;
  std::vector<std::span<std::byte>> asked_;  // per piece: the asked bytes in its buffer
};

/// One request's data on its way out: which pieces are read, and per IO
// how far its in-order stream has got, with the CRC of what was sent.
// `Pieces` (CopiedPieces, SplicedPieces) holds the pieces' bytes and
// checks them.
template <typename Pieces>
struct RequestStream {
  RequestStream(const proto::BatchReadRequest& r, std::vector<proto::IoResult>& res, const std::vector<IoPlan>& pl,
                const std::vector<ReadPiece>& pi, const Pieces& so, std::uint64_t requestId)
      : request(r), results(res), plans(pl), pieces(pi), source(so), id(requestId), done(pi.size(), false),
        ioOf(pi.size()), unread(r.ios.size()), next(r.ios.size(), 0), sent(r.ios.size(), 0), crc(r.ios.size(), 0) {
    for (std::size_t io = 0; io < plans.size(); ++io) {
      unread[io] = plans[io].pieces;
      for (std::size_t p = plans[io].firstPiece; p < plans[io].firstPiece + plans[io].pieces; ++p) ioOf[p] = io;
    }
  }

  // The run of `io`'s pieces that may go now, as one piece of data: read
  // and checked, with every piece before them read and sent (one IoData
  // frame, one gather write, splice run or RDMA chain, however many
  // pieces it spans). A piece that fails its check fails its IO (ioError,
  // corrupt): nothing more of it goes.
  std::optional<OutgoingPiece> releasable(std::size_t io) {
    const std::size_t first = plans[io].firstPiece + next[io];
    const std::uint32_t offset = sent[io];
    for (; next[io] < plans[io].pieces; ++next[io]) {
      const std::size_t p = plans[io].firstPiece + next[io];
      if (!done[p] || results[io].status != proto::IoStatus::ok) break;
      const BlockVerifier& verifier = plans[io].target->verifier;  // a piece's IO is a valid one
      const proto::IoStatus checked = source.check(p, verifier);
      if (checked != proto::IoStatus::ok) {
        results[io].status = checked;
        break;
      }
      if (request.checksum == proto::ChecksumMode::crc32c) crc[io] = source.crcOf(p, verifier, crc[io]);
      sent[io] += static_cast<std::uint32_t>(pieces[p].take);
    }
    if (sent[io] == offset) return std::nullopt;
    OutgoingPiece out{id, request.ios[io].remote, {static_cast<std::uint32_t>(io), offset, sent[io] - offset}, {}, {}};
    source.attach(out, first, plans[io].firstPiece + next[io] - first);
    return out;
  }

  // The response's byte counts and checksums, once every piece went.
  void finish(std::vector<proto::IoResult>& out) const {
    for (std::size_t io = 0; io < out.size(); ++io) {
      proto::IoResult& r = out[io];
      if (r.status != proto::IoStatus::ok) continue;
      if (next[io] < plans[io].pieces) {  // never read (batch too large for the pool, stopped)
        r.status = proto::IoStatus::ioError;
        continue;
      }
      r.bytes = request.ios[io].length;
      if (request.checksum == proto::ChecksumMode::crc32c) r.checksum = crc[io];
    }
  }

  const proto::BatchReadRequest& request;
  std::vector<proto::IoResult>& results;
  const std::vector<IoPlan>& plans;
  const std::vector<ReadPiece>& pieces;
  const Pieces& source;
  std::uint64_t id;
  std::vector<bool> done;         // per piece: its read completed
  std::vector<std::size_t> ioOf;  // per piece: its IO
  std::vector<std::size_t> unread;  // per IO: its pieces not read yet
  std::vector<std::size_t> next;  // per IO: its first piece not sent yet
  std::vector<std::uint32_t> sent;    // per IO: bytes sent so far
  std::vector<std::uint32_t> crc;     // per IO: CRC32C of them
  bool transmitting = false;      // a piece went: counted in stats_.transmitting
};

}  // namespace storage
