#include "chunk_store.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/coio-chunks-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};
}  // namespace

TEST_CASE("A chunk store is created, indexed and read back byte for byte", "[chunkStore]") {
  TempDir dir;
  const storage::ChunkStoreLayout layout{10, 8192, 4};
  auto index = storage::createChunkStore(dir.path, layout);
  REQUIRE(index);
  CHECK(layout.files() == 3);
  CHECK(std::filesystem::file_size(storage::ChunkStoreLayout::dataFileName(dir.path, 2)) == 2 * 8192);

  auto loaded = storage::loadChunkStoreIndex(dir.path);
  REQUIRE(loaded);
  CHECK(loaded->crcs == index->crcs);
  CHECK(loaded->layout.chunks == 10);

  // Chunk 9 lives in data-2 at offset 8192; its bytes match the generator and its CRC.
  const auto where = layout.locate(9);
  CHECK(where.file == 2);
  CHECK(where.offset == 8192);
  std::vector<std::byte> chunk(8192), expected(8192);
  const int fd = ::open(storage::ChunkStoreLayout::dataFileName(dir.path, where.file).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(where.offset)) == 8192);
  ::close(fd);
  storage::fillChunkBytes(9, 0, expected);
  CHECK(chunk == expected);
  CHECK(storage::crc32c(chunk) == index->crcs[9]);
  CHECK(index->crcs[9] != index->crcs[8]);  // chunks differ
}

TEST_CASE("Bad layouts and corrupt indexes are rejected", "[chunkStore]") {
  TempDir dir;
  CHECK(storage::createChunkStore(dir.path, {0, 4096, 1}).error() == coio::Errc::invalidArgument);
  CHECK(storage::createChunkStore(dir.path, {1, 1000, 1}).error() == coio::Errc::invalidArgument);
  CHECK(storage::loadChunkStoreIndex(dir.path).error() == std::errc::no_such_file_or_directory);
  REQUIRE(storage::createChunkStore(dir.path, {3, 4096, 8}));
  {
    std::ofstream out(storage::ChunkStoreLayout::indexFileName(dir.path), std::ios::app);
    out << "deadbeef\n";  // one CRC too many
  }
  CHECK(storage::loadChunkStoreIndex(dir.path).error() == coio::Errc::invalidArgument);
  {
    std::ofstream out(storage::ChunkStoreLayout::indexFileName(dir.path), std::ios::trunc);
    out << "coio-chunk-store 1 1 4096 8\nzzzzzzzz\n";  // not hex
  }
  CHECK(storage::loadChunkStoreIndex(dir.path).error() == coio::Errc::invalidArgument);
}

TEST_CASE("Word-wise chunk content equals the per-byte definition at any offset", "[chunkStore]") {
  for (std::uint64_t offset : {0u, 1u, 7u, 8u, 13u, 4093u}) {
    std::vector<std::byte> filled(37);
    storage::fillChunkBytes(5, offset, filled);
    for (std::size_t i = 0; i < filled.size(); ++i) CHECK(filled[i] == storage::chunkByte(5, offset + i));
    CHECK(storage::matchesChunkBytes(5, offset, filled));
    filled[36] ^= std::byte{1};
    CHECK_FALSE(storage::matchesChunkBytes(5, offset, filled));
  }
}

TEST_CASE("A strided chunk store holds a chain's share: ids first, first + stride, ...", "[chunkStore]") {
  TempDir dir;
  const storage::ChunkStoreLayout layout{4, 4096, 3, 2, 5};  // chunks 2, 7, 12, 17
  auto index = storage::createChunkStore(dir.path, layout);
  REQUIRE(index);
  CHECK(layout.holds(2));
  CHECK(layout.holds(17));
  CHECK_FALSE(layout.holds(0));
  CHECK_FALSE(layout.holds(3));
  CHECK_FALSE(layout.holds(22));  // the fifth: past the end
  CHECK(layout.chunkAt(3) == 17);
  std::ifstream header(storage::ChunkStoreLayout::indexFileName(dir.path));
  std::string first;
  std::getline(header, first);
  CHECK(first == "coio-chunk-store 2 4 4096 3 2 5");
  auto loaded = storage::loadChunkStoreIndex(dir.path);
  REQUIRE(loaded);
  CHECK(loaded->layout.firstChunk == 2);
  CHECK(loaded->layout.chunkStride == 5);
  CHECK(loaded->crcs == index->crcs);
  // Chunk 17 is slot 3: data-1 (3 per file), first in it; its bytes are chunk 17's.
  const auto where = layout.locate(17);
  CHECK(where.file == 1);
  CHECK(where.offset == 0);
  std::vector<std::byte> chunk(4096), expected(4096);
  const int fd = ::open(storage::ChunkStoreLayout::dataFileName(dir.path, 1).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, chunk.data(), chunk.size(), 0) == 4096);
  ::close(fd);
  storage::fillChunkBytes(17, 0, expected);
  CHECK(chunk == expected);
  CHECK(index->crcs[3] == storage::crc32c(expected));
  // Version 1 with stride fields, or a stride of 0, is malformed.
  std::ofstream(storage::ChunkStoreLayout::indexFileName(dir.path), std::ios::trunc)
      << "coio-chunk-store 1 1 4096 3 2 5\n00000000\n";
  CHECK(storage::loadChunkStoreIndex(dir.path).error() == coio::Errc::invalidArgument);
  std::ofstream(storage::ChunkStoreLayout::indexFileName(dir.path), std::ios::trunc)
      << "coio-chunk-store 2 1 4096 3 2 0\n00000000\n";
  CHECK(storage::loadChunkStoreIndex(dir.path).error() == coio::Errc::invalidArgument);
}
