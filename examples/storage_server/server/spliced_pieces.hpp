#pragma once
// The spliced path of a StorageServer's reads: a piece's asked bytes are
// spliced from the file's page cache into a pipe, and from there into the
// socket (TcpChannel), never copied through the server's memory.
#include "protocol/protocol.hpp"
#include "server/read_plan.hpp"
#include "store/chunk_store.hpp"
#include "transport/channel.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/disk/read_batch.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/splice.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stop_token>
#include <vector>

namespace storage {

/// A request's pieces spliced into pipes, one pipe per piece, for a
/// TcpChannel to splice on into its socket: no byte of a piece passes
/// through the server's memory, except the blocks at the two ends of an IO
/// that it asks in part (read, to check them and to compute the response
/// CRC over their asked bytes).
///
/// Guarantees (what RequestStream relies on, as from CopiedPieces):
/// - check(p) is ok only if the pipe holds exactly the piece's asked bytes
///   (a file cut short under the splice: ioError, and nothing of the piece
///   is sent) and each block the piece covers in part matched its stored
///   CRC (else corrupt). The blocks it covers whole are not checked here:
///   their bytes never come to the server. Their stored CRCs go into the
///   response's CRC (crcOf(), by CRC combination), which the client checks
///   against the bytes it received: a block damaged on disk fails there.
///   That is why a server splices only requests that ask for the CRC
///   (checksumMode 1; PROTOCOL.md, "Checksums").
/// - readAll() resumes once every splice and read has ended (each is
///   cancelled by `stop`): nothing is pending on the pipes then.
/// - Loop thread; the pipes (at least pieceSize bytes each) and the pieces
///   outlive it.
template <coio::SpliceReactor R>
class SplicedPieces {
 public:
  SplicedPieces(R& reactor, coio::Disk& disk, const std::vector<ReadPiece>& pieces,
                const std::vector<coio::Pipe>& pipes)
      : reactor_(reactor), disk_(disk), pieces_(pieces), slots_(pieces.size()),
        piped_(pieces.size()) {
    for (std::size_t p = 0; p < pieces.size(); ++p) piped_[p] = {pipes[p].readFd(), pieces[p].take};
    pipes_ = pipes.data();
  }
  SplicedPieces(const SplicedPieces&) = delete;
  SplicedPieces& operator=(const SplicedPieces&) = delete;

  /// Fills every piece's pipe (all at once), calling onRead(p) as each is
  /// done (any order); resumes once all are done.
  template <typename OnRead>
  coio::Task<void> readAll(std::stop_token stop, OnRead& onRead) {
    coio::AsyncScope fills;
    for (std::size_t p = 0; p < pieces_.size(); ++p) fills.spawn(fill(p, stop, onRead));
    co_await fills.join();
  }

  proto::IoStatus check(std::size_t p, const BlockVerifier& verifier) const {
    const Slot& slot = slots_[p];
    if (!slot.moved || *slot.moved != pieces_[p].take || !slot.edgesRead) return proto::IoStatus::ioError;
    for (std::size_t e = 0; e < slot.edges; ++e) {
      const std::span<const std::uint32_t> stored = pieces_[p].stored.subspan(slot.edgeBlock[e], 1);
      if (!verifier.matches(edgeBytes(p, e), stored)) return proto::IoStatus::corrupt;
    }
    return proto::IoStatus::ok;
  }

  std::uint32_t crcOf(std::size_t p, const BlockVerifier& verifier, std::uint32_t crc) const {
    const ReadPiece& piece = pieces_[p];
    const Slot& slot = slots_[p];
    return verifier.crcOfRange(piece.stored, piece.head, piece.head + piece.take, crc, [&](std::size_t block) {
      return edgeBytes(p, block == slot.edgeBlock[0] ? 0 : 1);
    });
  }

  void attach(OutgoingPiece& out, std::size_t first, std::size_t count) const {
    out.piped = std::span(piped_).subspan(first, count);
  }

 private:
  struct Slot {
    coio::Result<std::size_t> moved = std::size_t{0};  // bytes spliced into the pipe, or the error
    std::size_t edges = 0;                             // blocks covered in part, read into `edge`
    std::size_t edgeBlock[2] = {};                     // which (in the piece's blocks)
    std::vector<std::byte> edge;                       // their bytes, one block each
    bool edgesRead = true;
  };

  // The bytes of the piece's e-th block covered in part.
  std::span<const std::byte> edgeBytes(std::size_t p, std::size_t e) const {
    const std::size_t size = pieces_[p].blockSize;
    return std::span(slots_[p].edge).subspan(e * size, size);
  }

  template <typename OnRead>
  coio::Task<void> fill(std::size_t p, std::stop_token stop, OnRead& onRead) {
    const ReadPiece& piece = pieces_[p];
    Slot& slot = slots_[p];
    // The blocks the asked bytes cover in part: the first, the last (the
    // IO's ends; a piece inside an IO covers its blocks whole).
    const std::size_t size = piece.blockSize, end = piece.head + piece.take;
    const std::size_t first = piece.head / size, last = (end - 1) / size;
    if (piece.head % size != 0 || end < (first + 1) * size) slot.edgeBlock[slot.edges++] = first;
    if (last != first && end % size != 0) slot.edgeBlock[slot.edges++] = last;
    if (slot.edges > 0) {
      slot.edge.resize(slot.edges * size);
      coio::ReadBatch reads(disk_);
      for (std::size_t e = 0; e < slot.edges; ++e) {
        reads.add(*piece.file, piece.fileOffset + slot.edgeBlock[e] * size, std::span(slot.edge).subspan(e * size, size));
      }
      co_await reads.submit(stop);
      for (std::size_t e = 0; e < slot.edges; ++e) {
        const coio::Result<std::size_t> n = reads.result(e);
        slot.edgesRead = slot.edgesRead && n && *n == size;
      }
    }
    // The asked bytes into the pipe: its capacity holds them all, so a
    // splice moves them at once unless the file ends first (cut short).
    const int pipe = pipes_[p].writeFd();
    std::size_t moved = 0;
    while (moved < piece.take) {
      const coio::Result<std::size_t> n =
          co_await reactor_.splice(piece.file->fd(), static_cast<std::int64_t>(piece.fileOffset + piece.head + moved),
                                   pipe, coio::kNoOffset, piece.take - moved, stop);
      if (!n) {
        slot.moved = n.error();
        break;
      }
      if (*n == 0) break;
      moved += *n;
    }
    if (slot.moved) slot.moved = moved;
    onRead(p);
  }

  R& reactor_;
  coio::Disk& disk_;
  const std::vector<ReadPiece>& pieces_;
  std::vector<Slot> slots_;
  std::vector<PipedBytes> piped_;  // per piece: its pipe and asked bytes
  const coio::Pipe* pipes_ = nullptr;
};

}  // namespace storage
