#include "crc32c.hpp"

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

TEST_CASE("CRC32C: hardware and table paths agree, and chaining equals one pass", "[crc32c]") {
  std::mt19937 rng(7);
  std::vector<std::byte> data(10000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (std::size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 4096u, 10000u}) {
    const auto slice = std::span(data).first(len);
    CHECK(storage::detail::crc32cHardware(~0u, slice.data(), len) == storage::detail::crc32cSoftware(~0u, slice.data(), len));
    for (std::size_t cut : {std::size_t{0}, len / 3, len}) {
      CHECK(storage::crc32c(slice.subspan(cut), storage::crc32c(slice.first(cut))) == storage::crc32c(slice));
    }
  }
}
