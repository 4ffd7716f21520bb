#pragma once
// CRC32C (Castagnoli), the checksum 3FS stores per chunk. Uses the SSE4.2
// crc32 instruction when the CPU has it (chosen once at run time), else a
// table; both give identical results (tested).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace storage {

namespace detail {

constexpr std::array<std::uint32_t, 256> makeCrc32cTable() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
inline constexpr auto kCrc32cTable = makeCrc32cTable();

inline std::uint32_t crc32cSoftware(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ static_cast<std::uint8_t>(p[i])) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
[[gnu::target("sse4.2")]] inline std::uint32_t crc32cHardware(std::uint32_t crc, const std::byte* p,
                                                             std::size_t n) noexcept {
  std::uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, static_cast<std::uint8_t>(*p));
  return c32;
}
inline bool hasHardwareCrc32c() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#else
inline std::uint32_t crc32cHardware(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return crc32cSoftware(crc, p, n);
}
inline bool hasHardwareCrc32c() noexcept { return false; }
#endif

}  // namespace detail

/// Continues a CRC32C over more bytes: `crc32c(b, crc32c(a))` equals the
/// checksum of a followed by b. The checksum of nothing is 0.
inline std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t previous = 0) noexcept {
  const std::uint32_t crc = ~previous;
  return ~(detail::hasHardwareCrc32c() ? detail::crc32cHardware(crc, data.data(), data.size())
                                       : detail::crc32cSoftware(crc, data.data(), data.size()));
}

}  // namespace storage
