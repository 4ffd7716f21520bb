// The storage server's checksum work per piece (store/chunk_store.hpp's
// BlockVerifier), against the alternatives it was chosen over: what it
// costs to check a piece's blocks against their stored CRCs, and to give
// the response the CRC of the asked bytes by combining the verified block
// CRCs rather than by a second pass over the bytes. Each iteration takes
// the next piece of a 64 MiB region (more than the caches hold), as the
// server takes pieces its disk reads just wrote to memory.
//
//   block_crc_bench [--benchmark_filter=...]   (docs/benchmarks.md, "Block checksums")
#include "store/chunk_store.hpp"
#include "protocol/crc32c.hpp"

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <vector>

namespace {

constexpr std::size_t kRegion = 64u << 20;

// A region of pieces with their blocks' CRCs, walked piece by piece; in
// transparent huge pages, as the server's read buffers are (BufferPool).
struct Pieces {
  Pieces(std::size_t pieceSize, std::size_t blockSize) : piece(pieceSize), block(blockSize), crcs(kRegion / blockSize) {
    void* region = ::mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) std::abort();
    (void)::madvise(region, kRegion, MADV_HUGEPAGE);
    bytes = std::span(static_cast<std::byte*>(region), kRegion);
    std::mt19937_64 random(1);
    for (std::size_t i = 0; i < bytes.size(); i += 8) {
      const std::uint64_t word = random();
      std::memcpy(bytes.data() + i, &word, 8);
    }
    storage::crc32cBlocks(bytes, block, crcs);
  }
  Pieces(const Pieces&) = delete;
  Pieces& operator=(const Pieces&) = delete;
  ~Pieces() { ::munmap(bytes.data(), bytes.size()); }
  std::span<const std::byte> bytesOf(std::size_t p) const { return std::span(bytes).subspan(p * piece, piece); }
  std::span<const std::uint32_t> crcsOf(std::size_t p) const {
    return std::span(crcs).subspan(p * piece / block, piece / block);
  }
  std::size_t count() const { return kRegion / piece; }
  std::size_t piece, block;
  std::span<std::byte> bytes;
  std::vector<std::uint32_t> crcs;
};

enum class Work {
  plainCrc,          // one crc32c stream over the asked bytes (version 4's partial read, no check)
  verify,            // each block against its CRC (checksumMode none)
  verifyCombine,     // ... and the asked bytes' CRC from the block CRCs (checksumMode crc32c)
  verifySecondPass,  // ... and the asked bytes' CRC by a second crc32c pass over them
};

// Arguments: piece size, block size, the asked bytes' offset in the piece
// and their length (the piece's own length: 0).
void pieceWork(benchmark::State& state, Work work) {
  const auto pieceSize = static_cast<std::size_t>(state.range(0)), blockSize = static_cast<std::size_t>(state.range(1));
  const auto head = static_cast<std::size_t>(state.range(2));
  const std::size_t take = state.range(3) == 0 ? pieceSize - head : static_cast<std::size_t>(state.range(3));
  const Pieces pieces(pieceSize, blockSize);
  const storage::BlockVerifier verifier(static_cast<std::uint32_t>(blockSize));
  std::size_t p = 0;
  for (auto _ : state) {
    const std::span<const std::byte> bytes = pieces.bytesOf(p);
    const std::span<const std::uint32_t> crcs = pieces.crcsOf(p);
    std::uint32_t crc = 0;
    switch (work) {
      case Work::plainCrc: crc = storage::crc32c(bytes.subspan(head, take)); break;
      case Work::verify: crc = verifier.matches(bytes, crcs); break;
      case Work::verifyCombine:
        crc = verifier.matches(bytes, crcs) ? verifier.crcOf(bytes, crcs, head, head + take, 0) : 0;
        break;
      case Work::verifySecondPass:
        crc = verifier.matches(bytes, crcs) ? storage::crc32c(bytes.subspan(head, take)) : 0;
        break;
    }
    benchmark::DoNotOptimize(crc);
    p = (p + 1) % pieces.count();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * pieceSize));
}

// A 128 KiB piece (the server's default) asked whole, in blocks of 4, 16 and 64 KiB; and the piece
// of a 4 KiB IO at an unaligned offset: 8 KiB (two 4 KiB blocks), 4 KiB asked from byte 1000.
void pieceShapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t block : {4096, 16384, 65536}) b->Args({128 * 1024, block, 0, 0});
  b->Args({8192, 4096, 1000, 4096});
}

void BM_plainCrc(benchmark::State& s) { pieceWork(s, Work::plainCrc); }
void BM_verify(benchmark::State& s) { pieceWork(s, Work::verify); }
void BM_verifyCombine(benchmark::State& s) { pieceWork(s, Work::verifyCombine); }
void BM_verifySecondPass(benchmark::State& s) { pieceWork(s, Work::verifySecondPass); }
BENCHMARK(BM_plainCrc)->Apply(pieceShapes);
BENCHMARK(BM_verify)->Apply(pieceShapes);
BENCHMARK(BM_verifyCombine)->Apply(pieceShapes);
BENCHMARK(BM_verifySecondPass)->Apply(pieceShapes);

}  // namespace

BENCHMARK_MAIN();
