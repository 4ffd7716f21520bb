#pragma once
// The targets a StorageServer serves: a chunk store each, its data files
// open on the server's Disk.
#include "server/server_options.hpp"
#include "store/chunk_store.hpp"

#include <coio/core/result.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/reactor/pipe.hpp>

#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace storage {

/// A target a StorageServer serves: its chunk store's index, and its data
/// files open on the server's Disk.
struct ServedTarget {
  std::uint32_t id;
  ChunkStoreIndex index;
  BlockVerifier verifier;  // of its block size
  std::vector<coio::File> files;
  std::uint32_t chainVersion = 0;  // of its chain, as last routed (updateRouting); 0: unknown
  bool splices = false;  // read through the page cache, on a file system that splices (splicesFrom)
};

/// Whether the kernel splices from `fd` (a file opened without O_DIRECT):
/// one byte spliced into a fresh pipe. False for a file system without
/// splice (EINVAL), and when no pipe can be made to find out.
inline bool splicesFrom(int fd) noexcept {
  coio::Result<coio::Pipe> pipe = coio::Pipe::make();
  if (!pipe) return false;
  loff_t offset = 0;
  const ssize_t n = ::splice(fd, &offset, pipe->writeFd(), nullptr, 1, SPLICE_F_NONBLOCK);
  return n == 1;
}

/// The target `id` in `targets`, or null.
inline const ServedTarget* findServedTarget(const std::vector<ServedTarget>& targets, std::uint32_t id) noexcept {
  const auto found = std::find_if(targets.begin(), targets.end(), [id](const ServedTarget& t) { return t.id == id; });
  return found == targets.end() ? nullptr : &*found;
}

/// Loads `spec`'s index and opens its data files on `disk` (O_DIRECT if
/// `options.directIo` and the file system has it; else it turns
/// options.directIo off and says so in `note`), each registered with the
/// ring. Errors: the index's, a file's open error, Errc::invalidArgument
/// for chunks not a multiple of 4K, a block size that does not divide
/// options.pieceSize, or a chunk size the files' alignment does not divide.
inline coio::Result<ServedTarget> openServedTarget(coio::Disk& disk, const TargetSpec& spec, ServerOptions& options,
                                                   std::string& note) {
  coio::Result<ChunkStoreIndex> index = loadChunkStoreIndex(spec.dir);
  if (!index) return index.error();
  if (index->layout.chunkSize % 4096 != 0 || options.pieceSize % index->layout.blockSize != 0) {
    return coio::Errc::invalidArgument;
  }
  const BlockVerifier verifier(index->layout.blockSize);
  ServedTarget target{spec.id, std::move(*index), verifier, {}, 0};
  for (std::uint32_t f = 0; f < target.index.layout.files(); ++f) {
    const std::string path = ChunkStoreLayout::dataFileName(spec.dir, f);
    coio::Result<coio::File> file = coio::File::open(disk, path.c_str(), {.direct = options.directIo});
    if (!file && options.directIo && file.error() == std::errc::invalid_argument) {
      // The file system has no O_DIRECT (tmpfs): read through the page cache.
      note = "O_DIRECT unsupported here; buffered reads. ";
      options.directIo = false;
      file = coio::File::open(disk, path.c_str());
    }
    if (!file) return file.error();
    // The widened range of a read must stay inside its chunk.
    if (target.index.layout.chunkSize % file->alignment() != 0) return coio::Errc::invalidArgument;
    (void)file->registerWithRing();  // a plain fd works too, just with a lookup per read
    target.files.push_back(std::move(*file));
  }
  target.splices = options.dataPath != DataPath::copy && target.files.front().alignment() == 1 &&
                   splicesFrom(target.files.front().fd());
  return target;
}

}  // namespace storage
