#pragma once
// Read planning for a StorageServer's requests: each valid IO's range
// widened to whole blocks and the files' alignment and cut into pieces of
// one pool buffer each; the buffers a request holds; and which pieces may
// go out, in order per IO, as reads complete and pass their CRCs.
#include "protocol/protocol.hpp"
#include "server/target.hpp"
#include "store/chunk_store.hpp"
#include "transport/channel.hpp"

#include <coio/core/batch_semaphore.hpp>
#include <coio/core/result.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/direct_io.hpp>
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
      ReadPiece p{&file, range.offset + at, length, 0, 0, crcs.subspan(firstBlock, length / layout.blockSize)};
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
    tokens_ = &tokens;
    count_ = count;
    buffers.reserve(count);
    for (std::size_t i = 0; i < count; ++i) buffers.push_back(*pool.tryAcquire());
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

/// One request's data on its way out: which pieces are read, and per IO
// how far its in-order stream has got, with the CRC of what was sent.
struct RequestStream {
  RequestStream(const proto::BatchReadRequest& r, std::vector<proto::IoResult>& res,
                const std::vector<IoPlan>& pl, const std::vector<ReadPiece>& pi, const BufferLease& le, std::uint64_t requestId)
      : request(r), results(res), plans(pl), pieces(pi), lease(le), id(requestId), done(pi.size(), false),
        ioOf(pi.size()), asked(pi.size()), unread(r.ios.size()), next(r.ios.size(), 0), sent(r.ios.size(), 0),
        crc(r.ios.size(), 0) {
    for (std::size_t io = 0; io < plans.size(); ++io) {
      unread[io] = plans[io].pieces;
      for (std::size_t p = plans[io].firstPiece; p < plans[io].firstPiece + plans[io].pieces; ++p) ioOf[p] = io;
    }
    for (std::size_t p = 0; p < pieces.size(); ++p) {
      asked[p] = lease.buffers[p].span().subspan(pieces[p].head, pieces[p].take);
    }
  }

  // The run of `io`'s pieces that may go now, as one piece of data: read
  // and verified, with every piece before them read and sent (one IoData
  // frame, one gather write or RDMA chain, however many buffers it
  // spans). A piece whose read failed fails its IO (ioError), one whose
  // block fails its CRC fails it `corrupt`: nothing more of it goes.
  std::optional<OutgoingPiece> releasable(std::size_t io, const coio::ReadBatch& batch) {
    const std::size_t first = plans[io].firstPiece + next[io];
    const std::uint32_t offset = sent[io];
    for (; next[io] < plans[io].pieces; ++next[io]) {
      const std::size_t p = plans[io].firstPiece + next[io];
      if (!done[p] || results[io].status != proto::IoStatus::ok) break;
      const coio::Result<std::size_t> n = batch.result(p);
      if (!n || *n != pieces[p].length) {
        results[io].status = proto::IoStatus::ioError;
        break;
      }
      const BlockVerifier& verifier = plans[io].target->verifier;  // a piece's IO is a valid one
      const std::span<const std::byte> read = lease.buffers[p].span().first(pieces[p].length);
      if (!verifier.matches(read, pieces[p].stored)) {
        results[io].status = proto::IoStatus::corrupt;
        break;
      }
      if (request.checksum == proto::ChecksumMode::crc32c) {
        crc[io] = verifier.crcOf(read, pieces[p].stored, pieces[p].head, pieces[p].head + pieces[p].take, crc[io]);
      }
      sent[io] += static_cast<std::uint32_t>(asked[p].size());
    }
    if (sent[io] == offset) return std::nullopt;
    return OutgoingPiece{id, request.ios[io].remote,
                         {static_cast<std::uint32_t>(io), offset, sent[io] - offset},
                         std::span(asked).subspan(first, plans[io].firstPiece + next[io] - first)};
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
  const BufferLease& lease;
  std::uint64_t id;
  std::vector<bool> done;         // per piece: its read completed
  std::vector<std::size_t> ioOf;  // per piece: its IO
  std::vector<std::span<std::byte>> asked;  // per piece: the asked bytes in its buffer
  std::vector<std::size_t> unread;  // per IO: its pieces not read yet
  std::vector<std::size_t> next;  // per IO: its first piece not sent yet
  std::vector<std::uint32_t> sent;    // per IO: bytes sent so far
  std::vector<std::uint32_t> crc;     // per IO: CRC32C of them
  bool transmitting = false;      // a piece went: counted in stats_.transmitting
};

}  // namespace storage
