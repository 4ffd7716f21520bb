#include "chunk_store.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
