// coio-storage-server init: writes a dataset (a whole one, or a target's
// share of a chain table's).
#include "cluster/chain_table.hpp"
#include "programs/cli.hpp"
#include "programs/server/commands.hpp"
#include "store/chunk_store.hpp"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

namespace storage::cli {
namespace {

struct InitSettings {
  std::string dir, chains;
  std::optional<std::uint32_t> target;
  std::uint64_t chunks = 0;
  std::uint32_t chunkSize = 0;
  std::uint32_t chunksPerFile = 64;
  std::uint32_t blockSize = kDefaultBlockSize;
};

// init --chains FILE --target ID: the target's share of the table's dataset
// in `layout` (chunks per file kept), or prints why not and returns false.
bool chainLayout(const std::string& chains, std::uint32_t target, ChunkStoreLayout& layout) {
  std::string why;
  coio::Result<ChainTable> table = ChainTable::load(chains, &why);
  if (!table) {
    std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
    return false;
  }
  std::optional<ChunkStoreLayout> shape = table->targetLayout(target, layout.chunksPerFile);
  if (!shape) {
    std::fprintf(stderr, "coio-storage-server: target %u is in no chain of %s\n", target, chains.c_str());
    return false;
  }
  layout = *shape;
  return true;
}

int init(const InitSettings& settings) {
  ChunkStoreLayout layout;
  layout.chunks = settings.chunks;
  layout.chunkSize = settings.chunkSize;
  layout.chunksPerFile = settings.chunksPerFile;
  const auto problem = [](const char* what) { return usageError(kServerProgram, what); };
  if (!settings.chains.empty() || settings.target) {
    if (settings.chains.empty() || !settings.target || settings.dir.empty() || layout.chunks != 0 ||
        layout.chunkSize != 0) {
      return problem("init --chains FILE takes --target ID and --dir D (the table gives the chunks and their size)");
    }
    if (!chainLayout(settings.chains, *settings.target, layout)) return 1;
  }
  if (settings.dir.empty() || layout.chunks == 0 || layout.chunkSize == 0) {
    return problem("init needs --dir, --chunks and --chunk-size");
  }
  if (layout.chunkSize % 4096 != 0) return problem("--chunk-size must be a multiple of 4K (O_DIRECT)");
  layout.blockSize = settings.blockSize;
  if (!validBlockSize(layout.chunkSize, layout.blockSize)) {
    return problem("--block-size must be a power of two from 512 bytes to the chunk size");
  }
  const std::string& dir = settings.dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "coio-storage-server: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  coio::Result<ChunkStoreIndex> index = createChunkStore(dir, layout);
  if (!index) {
    std::fprintf(stderr, "coio-storage-server: cannot write the dataset in %s: %s\n", dir.c_str(),
                 index.error().message().c_str());
    return 1;
  }
  std::printf("created %s: %llu chunks of %u bytes in %u data file(s), a CRC32C per %u bytes", dir.c_str(),
              static_cast<unsigned long long>(layout.chunks), layout.chunkSize, layout.files(), layout.blockSize);
  if (settings.target) {
    std::printf(", target %u: chunk ids %llu, %llu, ...", *settings.target,
                static_cast<unsigned long long>(layout.chunkAt(0)), static_cast<unsigned long long>(layout.chunkAt(1)));
  }
  std::printf("\n");
  return 0;
}

}  // namespace

Command addInit(CLI::App& program) {
  auto settings = std::make_shared<InitSettings>();
  CLI::App* sub = program.add_subcommand("init", "Creates a dataset in D (created if missing).");
  sub->footer(
      "A whole dataset (--chunks N --chunk-size S): N chunks of S bytes (a multiple of 4K; suffixes\n"
      "K, M, G), --chunks-per-file per data file, deterministic content, and D/index with the CRC32C\n"
      "of each block of each chunk. The server checks every block a read covers against it before\n"
      "sending the bytes; --block-size (a power of two from 512 to S; --piece-size of the server must\n"
      "be a multiple of it) is the unit checked.\n"
      "A target's share (--chains FILE --target ID): target ID's dataset for the chain table FILE\n"
      "(CHAINS.md): the chunks of its chain, the same bytes on every replica of the chain.");
  sub->add_option("--dir", settings->dir, "the dataset's directory D")->check(nonEmpty());
  sub->add_option("--chunks", settings->chunks, "chunks in the dataset")->transform(countIn(1, UINT64_MAX));
  sub->add_option("--chunk-size", settings->chunkSize, "bytes per chunk, a multiple of 4K")
      ->transform(sizeIn(4096, UINT32_MAX));
  sub->add_option("--chunks-per-file", settings->chunksPerFile, "chunks per data file")
      ->transform(countIn(1, UINT32_MAX))
      ->capture_default_str();
  sub->add_option("--block-size", settings->blockSize, "the unit a read is checked in (a power of two)")
      ->transform(sizeIn(512, UINT32_MAX))
      ->default_str("4K");
  sub->add_option("--chains", settings->chains, "a chain table (CHAINS.md): write target --target's share")
      ->check(nonEmpty());
  sub->add_option_function<std::uint32_t>(
          "--target", [settings](std::uint32_t id) { settings->target = id; }, "the target ID in --chains")
      ->transform(countIn(0, UINT32_MAX));
  return {sub, [settings] { return storage::cli::init(*settings); }};
}

}  // namespace storage::cli
