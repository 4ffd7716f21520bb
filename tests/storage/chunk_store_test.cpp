#include "store/chunk_store.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
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

std::string firstLine(const std::filesystem::path& dir) {
  std::ifstream in(storage::ChunkStoreLayout::indexFileName(dir));
  std::string line;
  std::getline(in, line);
  return line;
}

// Replaces the index with `text`; what loading it says.
coio::Result<storage::ChunkStoreIndex> loadWritten(const std::filesystem::path& dir, const std::string& text,
                                                  std::string& why) {
  std::ofstream(storage::ChunkStoreLayout::indexFileName(dir), std::ios::trunc) << text;
  why.clear();
  return storage::loadChunkStoreIndex(dir, &why);
}

// The bytes of a chunk's slot in its data file.
std::vector<std::byte> readSlot(const std::filesystem::path& dir, const storage::ChunkStoreLayout& layout,
                                std::uint64_t chunkId) {
  const auto where = layout.locate(chunkId);
  std::vector<std::byte> chunk(layout.chunkSize);
  const int fd = ::open(storage::ChunkStoreLayout::dataFileName(dir, where.file).c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(where.offset)) == layout.chunkSize);
  ::close(fd);
  return chunk;
}
}  // namespace

TEST_CASE("A chunk store is created, indexed per block and read back byte for byte", "[chunkStore]") {
  TempDir dir;
  const storage::ChunkStoreLayout layout{10, 16384, 4};  // blocks of 4 KiB: the default
  auto index = storage::createChunkStore(dir.path, layout);
  REQUIRE(index);
  CHECK(layout.files() == 3);
  CHECK(layout.blocksPerChunk() == 4);
  CHECK(std::filesystem::file_size(storage::ChunkStoreLayout::dataFileName(dir.path, 2)) == 2 * 16384);
  CHECK(firstLine(dir.path) == "coio-chunk-store 3 10 16384 4 0 1 4096");

  auto loaded = storage::loadChunkStoreIndex(dir.path);
  REQUIRE(loaded);
  CHECK(loaded->blockCrcs == index->blockCrcs);
  CHECK(loaded->blockCrcs.size() == 40);
  CHECK(loaded->layout.chunks == 10);
  CHECK(loaded->layout.blockSize == 4096);

  // Chunk 9 lives in data-2 at offset 16384; its bytes match the generator, each block its CRC.
  CHECK(layout.locate(9).file == 2);
  CHECK(layout.locate(9).offset == 16384);
  const std::vector<std::byte> chunk = readSlot(dir.path, layout, 9);
  std::vector<std::byte> expected(16384);
  storage::fillChunkBytes(9, 0, expected);
  CHECK(chunk == expected);
  for (std::size_t b = 0; b < 4; ++b) {
    CHECK(loaded->crcsOf(9)[b] == storage::crc32c(std::span(chunk).subspan(b * 4096, 4096)));
  }
  CHECK(loaded->crcsOf(9)[0] != loaded->crcsOf(8)[0]);  // chunks differ
}

TEST_CASE("init's block size: any power of two from 512 bytes to the chunk size", "[chunkStore]") {
  TempDir dir;
  storage::ChunkStoreLayout layout{3, 65536, 8};
  layout.blockSize = 16384;
  auto index = storage::createChunkStore(dir.path, layout);
  REQUIRE(index);
  CHECK(firstLine(dir.path) == "coio-chunk-store 3 3 65536 8 0 1 16384");
  auto loaded = storage::loadChunkStoreIndex(dir.path);
  REQUIRE(loaded);
  CHECK(loaded->layout.blockSize == 16384);
  CHECK(loaded->crcsOf(2).size() == 4);
  const std::vector<std::byte> chunk = readSlot(dir.path, layout, 2);
  CHECK(loaded->crcsOf(2)[3] == storage::crc32c(std::span(chunk).subspan(3 * 16384)));
  for (const std::uint32_t block : {512u, 65536u}) {
    layout.blockSize = block;
    auto made = storage::createChunkStore(dir.path, layout);
    REQUIRE(made);
    CHECK(storage::loadChunkStoreIndex(dir.path)->blockCrcs == made->blockCrcs);
  }
  for (const std::uint32_t bad : {0u, 256u, 3000u, 12288u, 131072u}) {
    INFO("block size " << bad);
    layout.blockSize = bad;
    CHECK_FALSE(storage::validBlockSize(layout.chunkSize, bad));
    CHECK(storage::createChunkStore(dir.path, layout).error() == coio::Errc::invalidArgument);
  }
}

TEST_CASE("Bad layouts and malformed indexes are refused, saying why in one line", "[chunkStore]") {
  TempDir dir;
  CHECK(storage::createChunkStore(dir.path, {0, 4096, 1}).error() == coio::Errc::invalidArgument);
  CHECK(storage::createChunkStore(dir.path, {1, 1000, 1}).error() == coio::Errc::invalidArgument);
  CHECK(storage::loadChunkStoreIndex(dir.path).error() == std::errc::no_such_file_or_directory);
  REQUIRE(storage::createChunkStore(dir.path, {2, 8192, 8}));
  const std::string header = "coio-chunk-store 3 2 8192 8 0 1 4096\n";
  const std::string good = header + "01234567 89abcdef\nfedcba98 76543210\n";
  std::string why;
  auto loaded = loadWritten(dir.path, good, why);
  REQUIRE(loaded);
  CHECK(loaded->blockCrcs == std::vector<std::uint32_t>{0x01234567, 0x89abcdef, 0xfedcba98, 0x76543210});
  CHECK(loadWritten(dir.path, header + "01234567 89ABCDEF\nFEDCBA98 76543210\n", why));  // either case

  const std::vector<std::pair<std::string, std::string>> malformed = {
      {good + "00000000 00000000\n", "more lines"},                         // a chunk too many
      {header + "01234567 89abcdef\n", "ends after 1 of its 2 chunks"},    // one too few
      {header + "01234567\nfedcba98 76543210\n", "line 2"},                // a block CRC missing
      {header + "01234567 89abcdef\nfedcba98 76543210 00000000\n", "line 3"},  // one too many
      {header + "0123456z 89abcdef\nfedcba98 76543210\n", "line 2"},       // not hex
      {header + "01234567  9abcdef\nfedcba98 76543210\n", "line 2"},       // two spaces
      {header + "01234567 89abcdef \nfedcba98 76543210\n", "line 2"},      // a trailing space
      {header + "1234567 89abcdef0\nfedcba98 76543210\n", "line 2"},       // 7 and 9 digits
      {"coio-chunk-store 3 2 8192 8 0 1 3000\n", "malformed header"},       // not a power of two
      {"coio-chunk-store 3 2 8192 8 0 1 16384\n", "malformed header"},      // larger than a chunk
      {"coio-chunk-store 3 2 8192 8 0 0 4096\n", "malformed header"},       // stride 0
      {"coio-chunk-store 3 2 8192 8 0 1\n", "malformed header"},            // no block size
      {"coio-chunk-store 3 2 8192 8 0 1 4096 7\n", "malformed header"},     // a field too many
      {"coio-chunk-store 4 2 8192 8 0 1 4096\n", "unknown index version 4"},
      {"coio-chunks 3 2 8192 8 0 1 4096\n", "not a chunk store index"},
      {"", "empty"},
  };
  for (const auto& [text, reason] : malformed) {
    INFO(text);
    CHECK(loadWritten(dir.path, text, why).error() == coio::Errc::invalidArgument);
    CHECK(why.find(reason) != std::string::npos);
    CHECK(why.find('\n') == std::string::npos);
  }
}

TEST_CASE("An index of version 1 or 2 (one CRC per chunk) is refused: init must write the dataset again",
          "[chunkStore]") {
  TempDir dir;
  std::string why;
  for (const std::string old :
       {"coio-chunk-store 1 1 4096 8\n00000000\n", "coio-chunk-store 2 1 4096 3 2 5\n00000000\n"}) {
    INFO(old);
    CHECK(loadWritten(dir.path, old, why).error() == coio::Errc::invalidArgument);
    CHECK(why.find("version " + old.substr(17, 1)) != std::string::npos);
    CHECK(why.find("coio-storage-server init") != std::string::npos);
  }
}

TEST_CASE("BlockVerifier: a flipped bit in any block fails it; crcOf equals crc32c of any range", "[chunkStore]") {
  constexpr std::uint32_t kBlock = 4096;
  std::vector<std::byte> blocks(8 * kBlock);
  storage::fillChunkBytes(3, 0, blocks);
  std::vector<std::uint32_t> stored(8);
  storage::crc32cBlocks(blocks, kBlock, stored);
  const storage::BlockVerifier verifier(kBlock);
  CHECK(verifier.matches(blocks, stored));
  CHECK(verifier.matches(std::span(blocks).subspan(2 * kBlock, 3 * kBlock), std::span(stored).subspan(2, 3)));
  for (std::size_t at :
       {std::size_t{0}, std::size_t{4095}, std::size_t{4096}, 5 * std::size_t{kBlock} + 17, blocks.size() - 1}) {
    blocks[at] ^= std::byte{0x20};
    CHECK_FALSE(verifier.matches(blocks, stored));
    blocks[at] ^= std::byte{0x20};
  }
  std::mt19937_64 rng(9);
  for (int i = 0; i < 500; ++i) {
    std::size_t from = rng() % blocks.size(), to = from + rng() % (blocks.size() - from + 1);
    if (i % 5 == 0) from = from / kBlock * kBlock;  // some start on a block boundary
    if (i % 7 == 0) to = (to + kBlock - 1) / kBlock * kBlock;  // some end on one
    const std::uint32_t before = static_cast<std::uint32_t>(rng());  // continuing any CRC
    INFO("bytes " << from << " to " << to);
    CHECK(verifier.crcOf(blocks, stored, from, to, before) ==
          storage::crc32c(std::span(blocks).subspan(from, to - from), before));
  }
  CHECK(verifier.crcOf(blocks, stored, 0, blocks.size(), 0) == storage::crc32c(blocks));
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
  CHECK(firstLine(dir.path) == "coio-chunk-store 3 4 4096 3 2 5 4096");
  auto loaded = storage::loadChunkStoreIndex(dir.path);
  REQUIRE(loaded);
  CHECK(loaded->layout.firstChunk == 2);
  CHECK(loaded->layout.chunkStride == 5);
  CHECK(loaded->blockCrcs == index->blockCrcs);
  // Chunk 17 is slot 3: data-1 (3 per file), first in it; its bytes are chunk 17's.
  const auto where = layout.locate(17);
  CHECK(where.file == 1);
  CHECK(where.offset == 0);
  std::vector<std::byte> expected(4096);
  storage::fillChunkBytes(17, 0, expected);
  CHECK(readSlot(dir.path, layout, 17) == expected);
  CHECK(index->crcsOf(3)[0] == storage::crc32c(expected));
}
