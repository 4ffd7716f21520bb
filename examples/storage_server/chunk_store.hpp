#pragma once
// The on-disk dataset: chunks of one fixed size packed into a few large
// data files (as 3FS keeps chunks in large files), plus a text index with
// each chunk's CRC32C.
//
//   D/index            "coio-chunk-store 1 <chunks> <chunk size> <chunks per file>", or
//                      "coio-chunk-store 2 <chunks> <chunk size> <chunks per file> <first> <stride>"
//                      then one line per chunk: its CRC32C in hex
//   D/data-<n>         slots [n*K, (n+1)*K) back to back, K = chunks per file
//
// Slot k holds chunk id first + k * stride: version 1 is first 0, stride 1
// (a whole dataset); version 2 a chain's share of a chain table's dataset
// (CHAINS.md: the target of chain j of C holds ids j, j + C, ...).
//
// Content is deterministic (a function of chunk id and offset), so a client
// can check bytes without the index, and a corrupted byte is detectable.
#include "crc32c.hpp"

#include <coio/core/result.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace storage {

/// Where a chunk lives.
struct ChunkLocation {
  std::uint32_t file;
  std::uint64_t offset;
};

/// The shape of a chunk store: `chunks` slots of `chunkSize` bytes,
/// `chunksPerFile` per data file; slot k holds chunk id
/// `firstChunk + k * chunkStride`.
struct ChunkStoreLayout {
  std::uint64_t chunks = 0;
  std::uint32_t chunkSize = 0;
  std::uint32_t chunksPerFile = 0;
  std::uint64_t firstChunk = 0;
  std::uint64_t chunkStride = 1;

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

struct ChunkStoreIndex {
  ChunkStoreLayout layout;
  std::vector<std::uint32_t> crcs;  // whole-chunk CRC32C, by slot
};

/// Writes a dataset into `dir` (which must exist). Returns the index.
inline coio::Result<ChunkStoreIndex> createChunkStore(const std::string& dir, ChunkStoreLayout layout) {
  if (layout.chunks == 0 || layout.chunkSize == 0 || layout.chunkSize % 4096 != 0 || layout.chunksPerFile == 0 ||
      layout.chunkStride == 0) {
    return coio::Errc::invalidArgument;
  }
  ChunkStoreIndex index{layout, std::vector<std::uint32_t>(layout.chunks)};
  std::vector<std::byte> chunk(layout.chunkSize);
  for (std::uint32_t f = 0; f < layout.files(); ++f) {
    const int fd = ::open(ChunkStoreLayout::dataFileName(dir, f).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return coio::systemError(errno);
    const std::uint64_t first = std::uint64_t{f} * layout.chunksPerFile;
    for (std::uint64_t slot = first; slot < layout.chunks && slot < first + layout.chunksPerFile; ++slot) {
      const std::uint64_t id = layout.chunkAt(slot);
      fillChunkBytes(id, 0, chunk);
      index.crcs[slot] = crc32c(chunk);
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
  const bool whole = layout.firstChunk == 0 && layout.chunkStride == 1;
  out << "coio-chunk-store " << (whole ? 1 : 2) << ' ' << layout.chunks << ' ' << layout.chunkSize << ' '
      << layout.chunksPerFile;
  if (!whole) out << ' ' << layout.firstChunk << ' ' << layout.chunkStride;
  out << '\n';
  char hex[16];
  for (std::uint32_t crc : index.crcs) {
    std::snprintf(hex, sizeof hex, "%08x\n", crc);
    out << hex;
  }
  out.close();
  if (!out) return coio::systemError(EIO);
  return index;
}

/// Reads and checks the index of a dataset.
inline coio::Result<ChunkStoreIndex> loadChunkStoreIndex(const std::string& dir) {
  std::ifstream in(ChunkStoreLayout::indexFileName(dir));
  if (!in) return coio::systemError(ENOENT);
  std::string line, magic;
  int version = 0;
  ChunkStoreIndex index;
  if (!std::getline(in, line)) return coio::Errc::invalidArgument;
  std::istringstream header(line);
  header >> magic >> version >> index.layout.chunks >> index.layout.chunkSize >> index.layout.chunksPerFile;
  if (version == 2) header >> index.layout.firstChunk >> index.layout.chunkStride;
  std::string rest;
  const ChunkStoreLayout& l = index.layout;
  if (!header || (header >> rest) || magic != "coio-chunk-store" || (version != 1 && version != 2) || l.chunks == 0 ||
      l.chunkSize == 0 || l.chunksPerFile == 0 || l.chunks > (1ull << 32) || l.chunkStride == 0 ||
      l.chunkStride > (1ull << 32) || l.firstChunk > (1ull << 40)) {
    return coio::Errc::invalidArgument;
  }
  index.crcs.reserve(index.layout.chunks);
  while (std::getline(in, line)) {
    char* end = nullptr;
    const unsigned long crc = std::strtoul(line.c_str(), &end, 16);
    if (line.size() != 8 || end != line.c_str() + 8) return coio::Errc::invalidArgument;
    index.crcs.push_back(static_cast<std::uint32_t>(crc));
  }
  if (index.crcs.size() != index.layout.chunks) return coio::Errc::invalidArgument;
  return index;
}

}  // namespace storage
