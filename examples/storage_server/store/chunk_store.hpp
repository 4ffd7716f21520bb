#pragma once
// The on-disk dataset: chunks of one fixed size packed into a few large
// data files (as 3FS keeps chunks in large files), plus a text index with
// a CRC32C per block of every chunk.
//
//   D/index            "coio-chunk-store 3 <chunks> <chunk size> <chunks per file> <first> <stride> <block size>"
//                      then one line per chunk (slot order): the CRC32C of each of its
//                      blocks, in order, 8 hex digits each, separated by one space
//   D/data-<n>         slots [n*K, (n+1)*K) back to back, K = chunks per file
//
// Slot k holds chunk id first + k * stride: first 0, stride 1 for a whole
// dataset, a chain's share of a chain table's dataset otherwise (CHAINS.md:
// the target of chain j of C holds ids j, j + C, ...). A block is the unit
// a read is checked in (PROTOCOL.md, "Checksums"): the server verifies
// every block a read covers before sending its bytes. Indexes of versions
// 1 and 2 (one CRC per chunk) are refused: `init` writes the dataset again.
//
// Content is deterministic (a function of chunk id and offset), so a client
// can check bytes without the index, and a corrupted byte is detectable.
#include "protocol/crc32c.hpp"

#include <coio/core/result.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace storage {

/// Where a chunk lives.
struct ChunkLocation {
  std::uint32_t file;
  std::uint64_t offset;
};

/// The block size `init` uses unless told otherwise: the O_DIRECT alignment
/// already widens every read to 4 KiB, so 4 KiB blocks make no read longer
/// (docs/benchmarks.md, "Block checksums", has the measurement).
inline constexpr std::uint32_t kDefaultBlockSize = 4096;

/// Whether blocks of `blockSize` bytes can checksum chunks of `chunkSize`:
/// a power of two from 512 bytes to the chunk size.
inline bool validBlockSize(std::uint32_t chunkSize, std::uint32_t blockSize) noexcept {
  return blockSize >= 512 && std::has_single_bit(blockSize) && blockSize <= chunkSize && chunkSize % blockSize == 0;
}

/// The shape of a chunk store: `chunks` slots of `chunkSize` bytes,
/// `chunksPerFile` per data file; slot k holds chunk id
/// `firstChunk + k * chunkStride`; each chunk is checksummed in blocks of
/// `blockSize` bytes.
struct ChunkStoreLayout {
  std::uint64_t chunks = 0;
  std::uint32_t chunkSize = 0;
  std::uint32_t chunksPerFile = 0;
  std::uint64_t firstChunk = 0;
  std::uint64_t chunkStride = 1;
  std::uint32_t blockSize = kDefaultBlockSize;

  std::uint32_t blocksPerChunk() const { return chunkSize / blockSize; }
  std::uint32_t files() const { return static_cast<std::uint32_t>((chunks + chunksPerFile - 1) / chunksPerFile); }
  /// Whether the store holds chunk `chunkId`.
  bool holds(std::uint64_t chunkId) const {
    return chunkId >= firstChunk && (chunkId - firstChunk) % chunkStride == 0 &&
           (chunkId - firstChunk) / chunkStride < chunks;
  }
  /// The slot of a chunk it holds.
  std::uint64_t slotOf(std::uint64_t chunkId) const { return (chunkId - firstChunk) / chunkStride; }
  /// The chunk id in slot `slot`.
  std::uint64_t chunkAt(std::uint64_t slot) const { return firstChunk + slot * chunkStride; }
  /// Where a chunk it holds lives.
  ChunkLocation locate(std::uint64_t chunkId) const {
    const std::uint64_t slot = slotOf(chunkId);
    return {static_cast<std::uint32_t>(slot / chunksPerFile), (slot % chunksPerFile) * std::uint64_t{chunkSize}};
  }
  static std::string dataFileName(const std::string& dir, std::uint32_t file) { return dir + "/data-" + std::to_string(file); }
  static std::string indexFileName(const std::string& dir) { return dir + "/index"; }
};

/// Word `wordIndex` (bytes 8*wordIndex .. +7, little-endian) of chunk
/// `chunkId`: a mixing function, so every chunk and every position differ.
inline std::uint64_t chunkWord(std::uint64_t chunkId, std::uint64_t wordIndex) {
  std::uint64_t z = (chunkId << 40) ^ wordIndex ^ 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The byte at `offset` of chunk `chunkId`.
inline std::byte chunkByte(std::uint64_t chunkId, std::uint64_t offset) {
  return static_cast<std::byte>(chunkWord(chunkId, offset >> 3) >> (8 * (offset & 7)));
}

/// Calls `f(i, byte)` for the `n` bytes of chunk `chunkId` from `offset`,
/// mixing once per 8-byte word rather than once per byte; stops early when
/// `f` returns false. Returns false if it stopped early.
template <typename F>
bool forEachChunkByte(std::uint64_t chunkId, std::uint64_t offset, std::size_t n, F&& f) {
  std::size_t i = 0;
  while (i < n) {
    const std::uint64_t pos = offset + i;
    const std::uint64_t word = chunkWord(chunkId, pos >> 3);
    for (std::uint64_t b = pos & 7; b < 8 && i < n; ++b, ++i) {
      if (!f(i, static_cast<std::byte>(word >> (8 * b)))) return false;
    }
  }
  return true;
}

inline void fillChunkBytes(std::uint64_t chunkId, std::uint64_t offset, std::span<std::byte> out) {
  forEachChunkByte(chunkId, offset, out.size(), [&](std::size_t i, std::byte b) {
    out[i] = b;
    return true;
  });
}

/// True if `bytes` are exactly chunk `chunkId`'s bytes from `offset`.
inline bool matchesChunkBytes(std::uint64_t chunkId, std::uint64_t offset, std::span<const std::byte> bytes) {
  return forEachChunkByte(chunkId, offset, bytes.size(), [&](std::size_t i, std::byte b) { return bytes[i] == b; });
}

/// A chunk store's index: its layout and the CRC32C of every block.
struct ChunkStoreIndex {
  ChunkStoreLayout layout;
  std::vector<std::uint32_t> blockCrcs;  // by slot, then block: layout.blocksPerChunk() per slot

  /// The block CRCs of the chunk in `slot`.
  std::span<const std::uint32_t> crcsOf(std::uint64_t slot) const {
    const std::size_t n = layout.blocksPerChunk();
    return std::span(blockCrcs).subspan(slot * n, n);
  }
};

/// Checks bytes read from a chunk store against the CRCs of its blocks, and
/// derives the CRC32C of any part of checked bytes from them.
///
/// Guarantees: matches() computes each block's CRC32C (four blocks at a
/// time, crc32cBlocks) and compares it with the stored one; crcOf() gives
/// exactly crc32c() of the bytes asked for, computing only the parts of
/// blocks it does not cover whole (the whole ones come from their stored
/// CRCs, appended in four table lookups each).
class BlockVerifier {
 public:
  explicit BlockVerifier(std::uint32_t blockSize) : blockSize_(blockSize), appender_(blockSize) {}

  std::uint32_t blockSize() const noexcept { return blockSize_; }

  /// True if each block of `blocks` (whole blocks) has its CRC in `stored`
  /// (one per block, in order).
  bool matches(std::span<const std::byte> blocks, std::span<const std::uint32_t> stored) const noexcept {
    std::array<std::uint32_t, 64> computed;
    for (std::size_t first = 0; first < stored.size(); first += computed.size()) {
      const std::size_t n = std::min(computed.size(), stored.size() - first);
      crc32cBlocks(blocks.subspan(first * blockSize_, n * blockSize_), blockSize_, std::span(computed).first(n));
      if (!std::equal(computed.begin(), computed.begin() + n, stored.begin() + first)) return false;
    }
    return true;
  }

  /// Continues `crc` over bytes [from, to) of `blocks`, whose blocks have
  /// the CRCs `stored` (as matches() checked): the blocks inside the range
  /// from their stored CRCs, the range's parts of the others read.
  std::uint32_t crcOf(std::span<const std::byte> blocks, std::span<const std::uint32_t> stored, std::size_t from,
                      std::size_t to, std::uint32_t crc) const noexcept {
    return crcOfRange(stored, from, to, crc,
                      [&](std::size_t block) { return blocks.subspan(block * blockSize_, blockSize_); });
  }

  /// crcOf() for blocks that are not in memory (spliced, never read):
  /// `blockBytes(b)` yields block b's bytes, and is called only for a block
  /// the range covers in part (its first and last at most); the blocks it
  /// covers whole come from `stored` alone, without their bytes.
  template <typename BlockBytes>
  std::uint32_t crcOfRange(std::span<const std::uint32_t> stored, std::size_t from, std::size_t to, std::uint32_t crc,
                           BlockBytes&& blockBytes) const {
    while (from < to) {
      const std::size_t block = from / blockSize_;
      const std::size_t end = std::min(to, (block + 1) * blockSize_);
      if (end - from == blockSize_) {
        crc = appender_.append(crc, stored[block]);
      } else {
        const std::span<const std::byte> bytes = blockBytes(block);
        crc = crc32c(bytes.subspan(from - block * blockSize_, end - from), crc);
      }
      from = end;
    }
    return crc;
  }

 private:
  std::uint32_t blockSize_;
  Crc32cAppender appender_;
};

/// Writes a dataset into `dir` (which must exist). Returns the index.
/// Errors: Errc::invalidArgument for an unusable layout (no chunk, a chunk
/// size not a multiple of 4 KiB, a block size validBlockSize() refuses),
/// the file system's.
inline coio::Result<ChunkStoreIndex> createChunkStore(const std::string& dir, ChunkStoreLayout layout) {
  if (layout.chunks == 0 || layout.chunkSize == 0 || layout.chunkSize % 4096 != 0 || layout.chunksPerFile == 0 ||
      layout.chunkStride == 0 || !validBlockSize(layout.chunkSize, layout.blockSize)) {
    return coio::Errc::invalidArgument;
  }
  const std::size_t blocks = layout.blocksPerChunk();
  ChunkStoreIndex index{layout, std::vector<std::uint32_t>(layout.chunks * blocks)};
  std::vector<std::byte> chunk(layout.chunkSize);
  for (std::uint32_t f = 0; f < layout.files(); ++f) {
    const int fd = ::open(ChunkStoreLayout::dataFileName(dir, f).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return coio::systemError(errno);
    const std::uint64_t first = std::uint64_t{f} * layout.chunksPerFile;
    for (std::uint64_t slot = first; slot < layout.chunks && slot < first + layout.chunksPerFile; ++slot) {
      const std::uint64_t id = layout.chunkAt(slot);
      fillChunkBytes(id, 0, chunk);
      crc32cBlocks(chunk, layout.blockSize, std::span(index.blockCrcs).subspan(slot * blocks, blocks));
      const auto where = layout.locate(id);
      std::size_t done = 0;
      while (done < chunk.size()) {
        const ssize_t n = ::pwrite(fd, chunk.data() + done, chunk.size() - done, static_cast<off_t>(where.offset + done));
        if (n < 0) {
          if (errno == EINTR) continue;
          const int err = errno;
          ::close(fd);
          return coio::systemError(err);
        }
        done += static_cast<std::size_t>(n);
      }
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) return coio::systemError(errno);
  }
  std::ofstream out(ChunkStoreLayout::indexFileName(dir), std::ios::trunc);
  out << "coio-chunk-store 3 " << layout.chunks << ' ' << layout.chunkSize << ' ' << layout.chunksPerFile << ' '
      << layout.firstChunk << ' ' << layout.chunkStride << ' ' << layout.blockSize << '\n';
  std::string line(blocks * 9, ' ');  // "xxxxxxxx " per block, the last space a newline
  for (std::uint64_t slot = 0; slot < layout.chunks; ++slot) {
    const std::span<const std::uint32_t> crcs = index.crcsOf(slot);
    for (std::size_t b = 0; b < blocks; ++b) {
      for (std::size_t d = 0; d < 8; ++d) line[b * 9 + d] = "0123456789abcdef"[(crcs[b] >> (28 - 4 * d)) & 0xF];
    }
    line.back() = '\n';
    out << line;
  }
  out.close();
  if (!out) return coio::systemError(EIO);
  return index;
}

namespace detail {

// The value of 8 hex digits at `p`, or -1.
inline std::int64_t parseHex32(const char* p) noexcept {
  std::uint32_t v = 0;
  for (std::size_t d = 0; d < 8; ++d) {
    const char c = p[d];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                    : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return -1;
    v = v << 4 | static_cast<std::uint32_t>(digit);
  }
  return v;
}

}  // namespace detail

/// Reads and checks the index of a dataset. Errors: ENOENT (no index),
/// Errc::invalidArgument for an index that is malformed, or of a version
/// before 3 (one CRC per chunk: `init` must write the dataset again); `why`
/// (if given) then says which, in one line.
inline coio::Result<ChunkStoreIndex> loadChunkStoreIndex(const std::string& dir, std::string* why = nullptr) {
  const std::string path = ChunkStoreLayout::indexFileName(dir);
  const auto refuse = [&](const std::string& reason) -> coio::Result<ChunkStoreIndex> {
    if (why) *why = path + ": " + reason;
    return coio::Errc::invalidArgument;
  };
  std::ifstream in(path);
  if (!in) return coio::systemError(ENOENT);
  std::string line, magic;
  int version = 0;
  ChunkStoreIndex index;
  if (!std::getline(in, line)) return refuse("empty");
  std::istringstream header(line);
  header >> magic >> version;
  if (magic != "coio-chunk-store") return refuse("not a chunk store index");
  if (version == 1 || version == 2) {
    return refuse("an index of version " + std::to_string(version) +
                  " (one CRC per chunk); reads are now checked per block: write the dataset again with "
                  "coio-storage-server init");
  }
  if (version != 3) return refuse("unknown index version " + std::to_string(version));
  ChunkStoreLayout& l = index.layout;
  header >> l.chunks >> l.chunkSize >> l.chunksPerFile >> l.firstChunk >> l.chunkStride >> l.blockSize;
  std::string rest;
  if (!header || (header >> rest) || l.chunks == 0 || l.chunkSize == 0 || l.chunksPerFile == 0 ||
      l.chunks > (1ull << 32) || l.chunkStride == 0 || l.chunkStride > (1ull << 32) || l.firstChunk > (1ull << 40) ||
      !validBlockSize(l.chunkSize, l.blockSize)) {
    return refuse("malformed header: " + line);
  }
  const std::size_t blocks = l.blocksPerChunk();
  for (std::uint64_t slot = 0; slot < l.chunks; ++slot) {
    if (!std::getline(in, line)) return refuse("ends after " + std::to_string(slot) + " of its " +
                                               std::to_string(l.chunks) + " chunks");
    bool ok = line.size() == blocks * 9 - 1;
    for (std::size_t b = 0; ok && b < blocks; ++b) {
      const std::int64_t crc = detail::parseHex32(line.data() + b * 9);
      ok = crc >= 0 && (b + 1 == blocks || line[b * 9 + 8] == ' ');
      index.blockCrcs.push_back(static_cast<std::uint32_t>(crc));
    }
    if (!ok) {
      return refuse("line " + std::to_string(slot + 2) + ": not " + std::to_string(blocks) +
                    " block CRCs (8 hex digits each, one space apart)");
    }
  }
  if (std::getline(in, line)) return refuse("more lines than its " + std::to_string(l.chunks) + " chunks");
  return index;
}

}  // namespace storage
