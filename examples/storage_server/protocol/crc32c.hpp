#pragma once
// CRC32C (Castagnoli), the checksum the chunk store keeps per block. Three
// ways, all giving identical results (tested): carry-less multiplication on
// 512-bit registers (AVX-512 VPCLMULQDQ: the buffer folded 256 bytes at a
// time, about 2.6 times the crc32 instruction's speed on bytes in cache),
// the SSE4.2 crc32 instruction (three streams through a buffer's thirds,
// joined as below), and tables (sixteen bytes a round). Of those the CPU
// has, the fastest is picked once, by timing them: an instruction the CPU
// lists may be emulated (QEMU's TCG runs crc32 bit by bit, at a quarter of
// the tables' speed), so its presence does not say it is fast; Linux picks
// its RAID-6 and XOR routines the same way. Also the algebra that
// combines CRCs: the CRC of A followed by B from the CRCs of
// A and B, and the CRCs of many blocks at once (independent streams that
// the CPU overlaps: the instruction's latency, not its throughput, bounds
// a single stream).
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// Polynomials modulo the CRC's, in its reflected bit order: bit 31 is the
// coefficient of x^0, bit 0 that of x^31.
inline constexpr std::uint32_t kCrc32cOne = 1u << 31;  // x^0

// a * b mod P.
constexpr std::uint32_t crc32cMultiply(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (std::uint32_t bit = kCrc32cOne; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ 0x82F63B78u : b >> 1;  // b * x
  }
  return product;
}

// A byte at a time: the reference the other ways are tested against.
inline std::uint32_t crc32cBytewise(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ static_cast<std::uint8_t>(p[i])) & 0xFF] ^ (crc >> 8);
  return crc;
}

// Slicing by 16: table k holds a byte's register after k more zero bytes
// pass, so sixteen bytes take sixteen independent lookups XORed together
// (16 KiB of tables; 6 times the bytewise loop's speed).
using Crc32cSlices = std::array<std::array<std::uint32_t, 256>, 16>;
constexpr Crc32cSlices makeCrc32cSlices() noexcept {
  Crc32cSlices t{};
  t[0] = kCrc32cTable;
  for (std::size_t k = 1; k < t.size(); ++k) {
    for (std::size_t v = 0; v < 256; ++v) t[k][v] = (t[k - 1][v] >> 8) ^ kCrc32cTable[t[k - 1][v] & 0xFF];
  }
  return t;
}
inline constexpr Crc32cSlices kCrc32cSlices = makeCrc32cSlices();

inline std::uint32_t crc32cSoftware(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  if constexpr (std::endian::native == std::endian::little) {  // the words' bytes in the stream's order
    const auto& t = kCrc32cSlices;
    for (; n >= 16; n -= 16, p += 16) {
      std::uint64_t a, b;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + 8, 8);
      a ^= crc;
      crc = t[15][a & 0xFF] ^ t[14][(a >> 8) & 0xFF] ^ t[13][(a >> 16) & 0xFF] ^ t[12][(a >> 24) & 0xFF] ^
            t[11][(a >> 32) & 0xFF] ^ t[10][(a >> 40) & 0xFF] ^ t[9][(a >> 48) & 0xFF] ^ t[8][a >> 56] ^
            t[7][b & 0xFF] ^ t[6][(b >> 8) & 0xFF] ^ t[5][(b >> 16) & 0xFF] ^ t[4][(b >> 24) & 0xFF] ^
            t[3][(b >> 32) & 0xFF] ^ t[2][(b >> 40) & 0xFF] ^ t[1][(b >> 48) & 0xFF] ^ t[0][b >> 56];
    }
  }
  return crc32cBytewise(crc, p, n);
}

// base^exponent mod P (square and multiply: 2 log2(exponent) products).
constexpr std::uint32_t crc32cPower(std::uint32_t base, std::uint64_t exponent) noexcept {
  std::uint32_t result = kCrc32cOne;
  for (; exponent != 0; exponent >>= 1) {  // base: b, b^2, b^4, ...
    if (exponent & 1) result = crc32cMultiply(result, base);
    base = crc32cMultiply(base, base);
  }
  return result;
}

// x^(8 * bytes) mod P: what a CRC register is multiplied by when `bytes`
// zero bytes pass through it.
constexpr std::uint32_t crc32cShiftFactor(std::uint64_t bytes) noexcept {
  return crc32cPower(kCrc32cOne >> 8, bytes);  // (x^8)^bytes
}

// A register times x^(8 * bytes) mod P by four table lookups (the product
// is linear in the register: the sum of its bytes' products).
using Crc32cShiftTable = std::array<std::array<std::uint32_t, 256>, 4>;
constexpr Crc32cShiftTable makeCrc32cShiftTable(std::uint64_t bytes) noexcept {
  const std::uint32_t factor = crc32cShiftFactor(bytes);
  Crc32cShiftTable table{};
  for (std::size_t b = 0; b < 4; ++b) {
    for (std::uint32_t v = 0; v < 256; ++v) table[b][v] = crc32cMultiply(v << (8 * b), factor);
  }
  return table;
}
constexpr std::uint32_t crc32cShift(const Crc32cShiftTable& table, std::uint32_t crc) noexcept {
  return table[0][crc & 0xFF] ^ table[1][(crc >> 8) & 0xFF] ^ table[2][(crc >> 16) & 0xFF] ^ table[3][crc >> 24];
}

#if defined(__x86_64__)
[[gnu::target("sse4.2")]] inline std::uint64_t crc32cWords(std::uint64_t c, const std::byte* p, std::size_t words) noexcept {
  for (; words > 0; --words, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  return c;
}
// Three streams over neighbouring thirds of each `3 * third` bytes, the
// second and third from 0, then joined: reg(A ‖ B) = reg(A) x^(8|B|) +
// reg0(B). The crc32 instruction's latency (3 cycles), not its throughput
// (1 a cycle), bounds one stream: three keep it busy.
template <std::size_t Third>
[[gnu::target("sse4.2")]] inline std::uint64_t crc32cThreeStreams(std::uint64_t c, const std::byte*& p,
                                                                  std::size_t& n) noexcept {
  static constexpr Crc32cShiftTable kShift = makeCrc32cShiftTable(Third);
  for (; n >= 3 * Third; n -= 3 * Third, p += 3 * Third) {
    std::uint64_t c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < Third; i += 8) {
      std::uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + Third + i, 8);
      std::memcpy(&w2, p + 2 * Third + i, 8);
      c = __builtin_ia32_crc32di(c, w0);
      c1 = __builtin_ia32_crc32di(c1, w1);
      c2 = __builtin_ia32_crc32di(c2, w2);
    }
    c = crc32cShift(kShift, crc32cShift(kShift, static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c1)) ^
        static_cast<std::uint32_t>(c2);
  }
  return c;
}
[[gnu::target("sse4.2")]] inline std::uint32_t crc32cHardware(std::uint32_t crc, const std::byte* p,
                                                             std::size_t n) noexcept {
  std::uint64_t c = crc32cThreeStreams<4096>(crc, p, n);  // 12 KiB at a time, then 768 bytes
  c = crc32cThreeStreams<256>(c, p, n);
  c = crc32cWords(c, p, n / 8);
  p += n / 8 * 8;
  auto c32 = static_cast<std::uint32_t>(c);
  for (n %= 8; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, static_cast<std::uint8_t>(*p));
  return c32;
}
inline bool hasHardwareCrc32c() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

// Folding. A CRC register is the message, as a polynomial M, times x^32
// mod P (the initial register XORed into the first four bytes, then none):
// it depends on M mod P alone. So 16 bytes A, followed by at least d bits
// more, can be dropped for A x^d mod P (under 128 bits) XORed into the 16
// bytes d bits further on: M mod P stays as it was. Four 512-bit
// accumulators (16 such 16-byte lanes) fold 256 bytes at a time, are folded
// into one lane, and the crc32 instruction takes that lane and the last
// bytes. A lane's halves
// (bytes 0-7, 8-15: in this reflected order the higher powers first) are
// multiplied by x^(d+64) and x^d mod P, d the distance folded in bits; a
// carry-less product of two reflected values comes out one power short,
// hence x^(d+63) and x^(d-1) below.
constexpr std::uint32_t crc32cPowerOfX(std::uint64_t d) noexcept { return crc32cPower(kCrc32cOne >> 1, d); }
// The two constants that fold a lane over `bits`, as a lane's halves: the
// products' degree below 32 + 64 + 1 keeps them inside the 128-bit lane.
constexpr std::array<long long, 2> crc32cFoldConstants(std::uint64_t bits) noexcept {
  return {static_cast<long long>(std::uint64_t{crc32cPowerOfX(bits + 63)} << 32),
          static_cast<long long>(std::uint64_t{crc32cPowerOfX(bits - 1)} << 32)};
}
#define COIO_CRC32C_FOLD_TARGET "sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq"
[[gnu::target(COIO_CRC32C_FOLD_TARGET)]] inline __m512i crc32cFold(__m512i lanes, __m512i k, __m512i next) noexcept {
  // lanes.lo * k.lo ^ lanes.hi * k.hi ^ next, in each 128-bit lane (0x96: a three-way XOR)
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(lanes, k, 0x00), _mm512_clmulepi64_epi128(lanes, k, 0x11),
                                   next, 0x96);
}
[[gnu::target(COIO_CRC32C_FOLD_TARGET)]] inline __m128i crc32cFold(__m128i lane, __m128i k, __m128i next) noexcept {
  return _mm_ternarylogic_epi64(_mm_clmulepi64_si128(lane, k, 0x00), _mm_clmulepi64_si128(lane, k, 0x11), next, 0x96);
}
[[gnu::target(COIO_CRC32C_FOLD_TARGET)]] inline __m512i crc32cLoad(const std::byte* p) noexcept {
  return _mm512_loadu_si512(p);
}
template <std::uint64_t Bits>
[[gnu::target(COIO_CRC32C_FOLD_TARGET)]] inline __m128i crc32cConstants() noexcept {
  static constexpr std::array<long long, 2> k = crc32cFoldConstants(Bits);  // made at compile time
  return _mm_set_epi64x(k[1], k[0]);
}
[[gnu::target(COIO_CRC32C_FOLD_TARGET)]] inline std::uint32_t crc32cFolded(std::uint32_t crc, const std::byte* p,
                                                                          std::size_t n) noexcept {
  if (n < 256) return crc32cHardware(crc, p, n);
  __m512i x0 = _mm512_xor_si512(crc32cLoad(p), _mm512_castsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i x1 = crc32cLoad(p + 64), x2 = crc32cLoad(p + 128), x3 = crc32cLoad(p + 192);
  p += 256;
  n -= 256;
  const __m512i k2048 = _mm512_broadcast_i32x4(crc32cConstants<2048>());
  for (; n >= 256; n -= 256, p += 256) {
    x0 = crc32cFold(x0, k2048, crc32cLoad(p));
    x1 = crc32cFold(x1, k2048, crc32cLoad(p + 64));
    x2 = crc32cFold(x2, k2048, crc32cLoad(p + 128));
    x3 = crc32cFold(x3, k2048, crc32cLoad(p + 192));
  }
  const __m512i k512 = _mm512_broadcast_i32x4(crc32cConstants<512>());
  x3 = crc32cFold(crc32cFold(crc32cFold(x0, k512, x1), k512, x2), k512, x3);
  for (; n >= 64; n -= 64, p += 64) x3 = crc32cFold(x3, k512, crc32cLoad(p));
  const __m128i k128 = crc32cConstants<128>();
  __m128i x = _mm512_extracti32x4_epi32(x3, 0);
  x = crc32cFold(x, k128, _mm512_extracti32x4_epi32(x3, 1));
  x = crc32cFold(x, k128, _mm512_extracti32x4_epi32(x3, 2));
  x = crc32cFold(x, k128, _mm512_extracti32x4_epi32(x3, 3));
  for (; n >= 16; n -= 16, p += 16) x = crc32cFold(x, k128, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::uint64_t c = __builtin_ia32_crc32di(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(x)));
  c = __builtin_ia32_crc32di(c, static_cast<std::uint64_t>(_mm_extract_epi64(x, 1)));
  return crc32cHardware(static_cast<std::uint32_t>(c), p, n);
}
#undef COIO_CRC32C_FOLD_TARGET
inline bool hasFoldedCrc32c() noexcept {
  static const bool has = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
                          __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("vpclmulqdq");
  return has;
}
// `Lanes` blocks of `length` bytes, `stride` apart from `data` on, each its
// own CRC32C stream, advanced a word at a time together (the CPU overlaps
// the streams' crc32 instructions); block l's CRC goes to out[l * outStride].
template <std::size_t Lanes>
[[gnu::target("sse4.2")]] inline void crc32cLanesHardware(const std::byte* data, std::size_t stride, std::size_t length,
                                                          std::uint32_t* out, std::size_t outStride) noexcept {
  std::uint64_t crc[Lanes];
  for (std::size_t l = 0; l < Lanes; ++l) crc[l] = 0xFFFFFFFFu;
  std::size_t i = 0;
  for (; i + 8 <= length; i += 8) {
    for (std::size_t l = 0; l < Lanes; ++l) {
      std::uint64_t word;
      std::memcpy(&word, data + l * stride + i, 8);
      crc[l] = __builtin_ia32_crc32di(crc[l], word);
    }
  }
  for (std::size_t l = 0; l < Lanes; ++l) {
    out[l * outStride] = ~crc32cHardware(static_cast<std::uint32_t>(crc[l]), data + l * stride + i, length - i);
  }
}
#else
inline std::uint32_t crc32cHardware(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return crc32cSoftware(crc, p, n);
}
inline bool hasHardwareCrc32c() noexcept { return false; }
inline std::uint32_t crc32cFolded(std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  return crc32cSoftware(crc, p, n);
}
inline bool hasFoldedCrc32c() noexcept { return false; }
template <std::size_t Lanes>
inline void crc32cLanesHardware(const std::byte* data, std::size_t stride, std::size_t length, std::uint32_t* out,
                                std::size_t outStride) noexcept {
  for (std::size_t l = 0; l < Lanes; ++l) out[l * outStride] = ~crc32cSoftware(~0u, data + l * stride, length);
}
#endif

enum class Crc32cPath : std::uint8_t { table, instruction, folded };

inline std::uint32_t crc32cOn(Crc32cPath path, std::uint32_t crc, const std::byte* p, std::size_t n) noexcept {
  switch (path) {
    case Crc32cPath::folded: return crc32cFolded(crc, p, n);
    case Crc32cPath::instruction: return crc32cHardware(crc, p, n);
    case Crc32cPath::table: break;
  }
  return crc32cSoftware(crc, p, n);
}

// Of the paths the CPU lists, the one that takes least time over 16 KiB in
// cache, the best of five rounds each (3.6-4.9 ms in a TCG guest; under
// 0.1 ms on a real CPU, where the order is never close: folded, then the
// instruction, 10 times the tables' speed).
inline Crc32cPath chooseCrc32cPath() noexcept {
  std::array<Crc32cPath, 3> paths{Crc32cPath::table};
  std::size_t count = 1;
  if (hasHardwareCrc32c()) paths[count++] = Crc32cPath::instruction;
  if (hasFoldedCrc32c()) paths[count++] = Crc32cPath::folded;
  if (count == 1) return Crc32cPath::table;
  std::array<std::byte, 16 * 1024> bytes;  // on the stack: nothing allocated
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 131 + (i >> 8));
  std::array<std::chrono::steady_clock::duration, 3> best;
  best.fill(std::chrono::steady_clock::duration::max());
  std::uint32_t sink = 0;
  for (int round = 0; round < 5; ++round) {
    for (std::size_t i = 0; i < count; ++i) {
      const auto start = std::chrono::steady_clock::now();
      sink ^= crc32cOn(paths[i], sink, bytes.data(), bytes.size());
      best[i] = std::min(best[i], std::chrono::steady_clock::now() - start);
    }
  }
  asm volatile("" : : "r"(sink));  // the CRCs are used: not optimised away
  return paths[static_cast<std::size_t>(std::min_element(best.begin(), best.begin() + count) - best.begin())];
}
inline Crc32cPath crc32cPath() noexcept {
  static const Crc32cPath path = chooseCrc32cPath();
  return path;
}

}  // namespace detail

/// Which way this process computes CRC32C (chosen once, on first use, by
/// timing those the CPU has): "folded (AVX-512 VPCLMULQDQ)", "crc32
/// instruction" or "tables". For logs and benchmark reports.
inline std::string_view crc32cImplementation() noexcept {
  switch (detail::crc32cPath()) {
    case detail::Crc32cPath::folded: return "folded (AVX-512 VPCLMULQDQ)";
    case detail::Crc32cPath::instruction: return "crc32 instruction";
    case detail::Crc32cPath::table: break;
  }
  return "tables";
}

/// Continues a CRC32C over more bytes: `crc32c(b, crc32c(a))` equals the
/// checksum of a followed by b. The checksum of nothing is 0.
inline std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t previous = 0) noexcept {
  return ~detail::crc32cOn(detail::crc32cPath(), ~previous, data.data(), data.size());
}

/// The CRC32C of A followed by B, from `crcA` = crc32c(A), `crcB` =
/// crc32c(B) and B's length (2 log2(lengthB) multiplications modulo the
/// polynomial: for appending many pieces of one length, Crc32cAppender).
constexpr std::uint32_t crc32cCombine(std::uint32_t crcA, std::uint32_t crcB, std::uint64_t lengthB) noexcept {
  // Linearity: CRC(A ‖ B) = CRC(A) x^(8|B|) + CRC(B) mod P, the initial and
  // final inversions included (they cancel out).
  return detail::crc32cMultiply(crcA, detail::crc32cShiftFactor(lengthB)) ^ crcB;
}

/// Appends pieces of one fixed length to a CRC32C by their own CRCs:
/// `append(crc32c(A), crc32c(B))` is crc32c(A ‖ B) for any B of `length`
/// bytes, in four table lookups (a table of 4 KiB, made once).
class Crc32cAppender {
 public:
  explicit Crc32cAppender(std::uint64_t length) noexcept : table_(detail::makeCrc32cShiftTable(length)) {}
  std::uint32_t append(std::uint32_t crc, std::uint32_t pieceCrc) const noexcept {
    return detail::crc32cShift(table_, crc) ^ pieceCrc;
  }

 private:
  detail::Crc32cShiftTable table_;
};

/// The CRC32C of each block of `blockSize` bytes of `data` into `out`
/// (`data` holds exactly out.size() blocks). Folded (VPCLMULQDQ) or by
/// tables, one block after another: a block of 256 bytes or more keeps the
/// multipliers busy alone. With the crc32 instruction, as
/// two streams at once, each through one half of the blocks in order: on
/// bytes fresh from the disk (not in any cache) 1.8x the speed of one
/// stream, and of four streams through neighbouring blocks, whose memory
/// reads the prefetchers follow worse (docs/benchmarks.md, "Block
/// checksums").
inline void crc32cBlocks(std::span<const std::byte> data, std::size_t blockSize,
                         std::span<std::uint32_t> out) noexcept {
  const std::size_t n = out.size(), second = n / 2, first = n - second;  // the halves: [0, first), [first, n)
  if (detail::crc32cPath() != detail::Crc32cPath::instruction) {
    for (std::size_t b = 0; b < n; ++b) out[b] = crc32c(data.subspan(b * blockSize, blockSize));
    return;
  }
  for (std::size_t b = 0; b < second; ++b) {
    detail::crc32cLanesHardware<2>(data.data() + b * blockSize, first * blockSize, blockSize, out.data() + b, first);
  }
  if (first != second) {  // an odd count: the first half's last block alone
    detail::crc32cLanesHardware<1>(data.data() + second * blockSize, 0, blockSize, out.data() + second, 0);
  }
}

}  // namespace storage
