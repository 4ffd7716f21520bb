#include "protocol/crc32c.hpp"

#include <catch2/catch.hpp>

#include <random>
#include <string_view>
#include <vector>

namespace {
std::span<const std::byte> bytesOf(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }
}  // namespace

TEST_CASE("CRC32C matches the standard check values", "[crc32c]") {
  CHECK(storage::crc32c(bytesOf("123456789")) == 0xE3069283u);  // the CRC catalogue's check value
  std::vector<std::byte> zeros(32, std::byte{0}), ones(32, std::byte{0xFF});
  CHECK(storage::crc32c(zeros) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(storage::crc32c(ones) == 0x62A8AB43u);
  CHECK(storage::crc32c({}) == 0u);
}

TEST_CASE("CRC32C: the instruction, folded and sliced-table paths agree with the bytewise table, and chaining equals one pass", "[crc32c]") {
  std::mt19937 rng(7);
  std::vector<std::byte> data(40000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  // Around the three streams' rounds (768 bytes and 12 KiB), from an odd address too.
  for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 767u, 768u, 769u, 1543u, 4096u, 10000u, 12287u, 12288u, 12289u,
                          13063u, 39999u}) {
    const auto slice = std::span(data).subspan(len % 2, len);
    const std::uint32_t table = storage::detail::crc32cBytewise(~0u, slice.data(), len);
    CHECK(storage::detail::crc32cSoftware(~0u, slice.data(), len) == table);
    if (storage::detail::hasHardwareCrc32c()) CHECK(storage::detail::crc32cHardware(~0u, slice.data(), len) == table);
    if (storage::detail::hasFoldedCrc32c()) CHECK(storage::detail::crc32cFolded(~0u, slice.data(), len) == table);
    for (std::size_t cut : {std::size_t{0}, len / 3, len}) {
      CHECK(storage::crc32c(slice.subspan(cut), storage::crc32c(slice.first(cut))) == storage::crc32c(slice));
    }
  }
}

TEST_CASE("CRC32C at every length to 2 KiB and around larger rounds equals the table, on each path this CPU has",
          "[crc32c]") {
  std::mt19937 rng(13);
  std::vector<std::byte> data(5000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  // The folded path's 256-byte rounds, then its 64- and 16-byte steps, the
  // crc32 instruction's words and single bytes, the tables' 16-byte rounds;
  // from misaligned starts.
  std::vector<std::size_t> lengths;
  for (std::size_t len = 0; len <= 2048; ++len) lengths.push_back(len);
  for (std::size_t len : {4095u, 4096u, 4097u, 4351u, 4352u, 4353u, 4900u}) lengths.push_back(len);
  const bool hardware = storage::detail::hasHardwareCrc32c(), folded = storage::detail::hasFoldedCrc32c();
  INFO("crc32 instruction: " << hardware << ", folded (AVX-512 VPCLMULQDQ): " << folded
                               << ", chosen: " << storage::crc32cImplementation());
  for (const std::size_t len : lengths) {
    const std::size_t start = len % 7;
    const auto bytes = std::span(data).subspan(start, len);
    const auto registerIn = static_cast<std::uint32_t>(rng());
    const std::uint32_t table = storage::detail::crc32cBytewise(registerIn, bytes.data(), len);
    INFO("length " << len << " from byte " << start);
    REQUIRE(storage::crc32c(bytes, ~registerIn) == ~table);  // the path chosen for this CPU
    REQUIRE(storage::detail::crc32cSoftware(registerIn, bytes.data(), len) == table);
    if (hardware) REQUIRE(storage::detail::crc32cHardware(registerIn, bytes.data(), len) == table);
    if (folded) REQUIRE(storage::detail::crc32cFolded(registerIn, bytes.data(), len) == table);
  }
}

TEST_CASE("CRC32C's chosen path is one this CPU has, and is kept", "[crc32c]") {
  using storage::detail::Crc32cPath;
  const Crc32cPath path = storage::detail::crc32cPath();
  INFO("chosen: " << storage::crc32cImplementation());
  if (path == Crc32cPath::instruction) CHECK(storage::detail::hasHardwareCrc32c());
  if (path == Crc32cPath::folded) CHECK(storage::detail::hasFoldedCrc32c());
  CHECK(storage::detail::crc32cPath() == path);
  // Timing picks among real candidates: each the CPU has is one of them.
  for (int i = 0; i < 3; ++i) {
    const Crc32cPath again = storage::detail::chooseCrc32cPath();
    CHECK((again == Crc32cPath::table || (again == Crc32cPath::instruction && storage::detail::hasHardwareCrc32c()) ||
           (again == Crc32cPath::folded && storage::detail::hasFoldedCrc32c())));
  }
}

TEST_CASE("CRC32C combination: crc(A ‖ B) from crc(A), crc(B) and |B|, at random lengths", "[crc32c]") {
  std::mt19937_64 rng(11);
  std::vector<std::byte> data(200000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  const auto check = [&](std::size_t a, std::size_t b) {
    INFO("|A| " << a << ", |B| " << b);
    const std::span<const std::byte> whole = std::span(data).first(a + b);
    const std::uint32_t crcA = storage::crc32c(whole.first(a)), crcB = storage::crc32c(whole.subspan(a));
    CHECK(storage::crc32cCombine(crcA, crcB, b) == storage::crc32c(whole));
    CHECK(storage::Crc32cAppender(b).append(crcA, crcB) == storage::crc32c(whole));
  };
  for (std::size_t a : {0u, 1u, 5u, 4096u}) {
    for (std::size_t b : {0u, 1u, 3u, 8u, 4095u, 4096u, 65536u}) check(a, b);
  }
  for (int i = 0; i < 300; ++i) check(rng() % 100000, rng() % 100000);
  // An appender for one length appends any piece of that length, over and over.
  const storage::Crc32cAppender blocks(4096);
  std::uint32_t crc = 0;
  for (std::size_t at = 0; at + 4096 <= data.size(); at += 4096) {
    crc = blocks.append(crc, storage::crc32c(std::span(data).subspan(at, 4096)));
  }
  CHECK(crc == storage::crc32c(std::span(data).first(data.size() / 4096 * 4096)));
}

TEST_CASE("CRC32C of many blocks at once equals each block's, for any count and block size", "[crc32c]") {
  std::mt19937 rng(5);
  std::vector<std::byte> data(9 * 4096 + 100);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (std::size_t blockSize : {512u, 4096u, 13u, 8u}) {
    for (std::size_t count = 0; count <= 9 && count * blockSize <= data.size(); ++count) {
      INFO("blocks of " << blockSize << ", " << count << " of them");
      std::vector<std::uint32_t> out(count, 0xDEADBEEF);
      storage::crc32cBlocks(std::span(data).first(count * blockSize), blockSize, out);
      for (std::size_t i = 0; i < count; ++i) {
        CHECK(out[i] == storage::crc32c(std::span(data).subspan(i * blockSize, blockSize)));
      }
    }
  }
}
