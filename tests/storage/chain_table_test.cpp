#include "cluster/chain_table.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

constexpr const char* kGood = R"(# 3 servers x 2 targets, replication 2
coio-chains 1
chunks 6000      # ids 0..5999
chunk-size 64K
chain 1  127.0.0.1:9101/11  127.0.0.1:9102/21
chain 2  127.0.0.1:9102/22  127.0.0.1:9103/31
chain 3  127.0.0.1:9103/32  [::1]:9101/12
)";

// The error message for `text`, which must be rejected.
std::string rejection(const std::string& text) {
  std::string why;
  const coio::Result<storage::ChainTable> table = storage::ChainTable::parse(text, "chains.txt", &why);
  REQUIRE_FALSE(table);
  CHECK(table.error() == coio::Errc::invalidArgument);
  return why;
}

std::string withHeader(const std::string& body) { return "coio-chains 1\nchunks 100\nchunk-size 4K\n" + body; }

}  // namespace

TEST_CASE("A chain table parses: servers in order of mention, chains in order, chunk size with a suffix",
          "[chainTable]") {
  std::string why;
  const coio::Result<storage::ChainTable> table = storage::ChainTable::parse(kGood, "chains.txt", &why);
  INFO(why);
  REQUIRE(table);
  CHECK(table->chunks() == 6000);
  CHECK(table->chunkSize() == 65536);
  REQUIRE(table->servers().size() == 4);  // [::1]:9101 is not 127.0.0.1:9101
  CHECK(table->servers()[0].toString() == "127.0.0.1:9101");
  CHECK(table->servers()[3].toString() == "[::1]:9101");
  REQUIRE(table->chains().size() == 3);
  CHECK(table->chains()[1].id == 2);
  CHECK(table->chains()[1].replicas == std::vector<storage::Replica>{{1, 22}, {2, 31}});
  CHECK(table->chains()[2].replicas == std::vector<storage::Replica>{{2, 32}, {3, 12}});
}

TEST_CASE("Chunk c is on chain c mod the number of chains; a target's layout holds its chain's chunks",
          "[chainTable]") {
  const storage::ChainTable table = *storage::ChainTable::parse(kGood, "chains.txt");
  CHECK(table.chainIndexOf(0) == 0);
  CHECK(table.chainIndexOf(4) == 1);
  CHECK(table.chainIndexOf(5999) == 2);
  CHECK(table.chainIndexOfTarget(31) == 1u);
  CHECK_FALSE(table.chainIndexOfTarget(99));
  const std::optional<storage::ChunkStoreLayout> layout = table.targetLayout(32, 16);
  REQUIRE(layout);
  CHECK(layout->chunks == 2000);
  CHECK(layout->chunkSize == 65536);
  CHECK(layout->chunksPerFile == 16);
  CHECK(layout->firstChunk == 2);
  CHECK(layout->chunkStride == 3);
  CHECK(layout->holds(5999));
  CHECK_FALSE(layout->holds(5998));
  CHECK_FALSE(table.targetLayout(99, 16));
  // 7 chunks over 3 chains: chain 1 holds 0, 3, 6; chains 2 and 3 two each.
  const storage::ChainTable seven = *storage::ChainTable::parse(
      "coio-chains 1\nchunks 7\nchunk-size 4K\nchain 1 127.0.0.1:1/1\nchain 2 127.0.0.1:1/2\nchain 3 127.0.0.1:1/3\n",
      "seven");
  CHECK(seven.targetLayout(1, 4)->chunks == 3);
  CHECK(seven.targetLayout(2, 4)->chunks == 2);
  CHECK(seven.targetLayout(3, 4)->chunks == 2);
}

TEST_CASE("Chain table rules: each violation is an error naming its line", "[chainTable]") {
  // A target in two chains.
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1/5 127.0.0.1:2/6\nchain 2 127.0.0.1:3/5\n")) ==
        "chains.txt:5: target 5 is already in chain 1 (line 4): a target belongs to at most one chain");
  // ... or twice in one.
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1/5 127.0.0.1:2/5\n")) ==
        "chains.txt:4: target 5 is already in chain 1 (line 4): a target belongs to at most one chain");
  // Two targets of a chain on one server.
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1/5\nchain 2 127.0.0.1:2/6 127.0.0.1:2/7\n")) ==
        "chains.txt:5: chain 2 has targets 6 and 7 on the same server 127.0.0.1:2: a chain's targets must be on "
        "different servers");
  // A chain with no target.
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1/5\nchain 9\n")) ==
        "chains.txt:5: chain 9 has no target: a chain needs at least one");
  // No chain at all.
  CHECK(rejection(withHeader("# nothing\n")) ==
        "chains.txt:4: no chain: at least one \"chain ID HOST:PORT/TARGET...\" line");
  // A chain id twice.
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1/5\n\nchain 1 127.0.0.1:1/6\n")) ==
        "chains.txt:6: chain 1 defined twice (first on line 4)");
  // Fewer chunks than chains.
  CHECK(rejection("coio-chains 1\nchunks 1\nchunk-size 4K\nchain 1 127.0.0.1:1/1\nchain 2 127.0.0.1:1/2\n") ==
        "chains.txt:2: chunks 1 is fewer than the 2 chains: a chain would hold no chunk");
  // More than 32 targets in a chain.
  std::string wide = "chain 1";
  for (int t = 0; t < 33; ++t) wide += " 127.0.0.1:" + std::to_string(1000 + t) + "/" + std::to_string(t);
  CHECK(rejection(withHeader(wide + "\n")) == "chains.txt:4: chain 1 has 33 targets: at most 32");
}

TEST_CASE("Chain table syntax errors name their line", "[chainTable]") {
  CHECK(rejection("chunks 5\n") == "chains.txt:1: expected the header line \"coio-chains 1\" first");
  CHECK(rejection("\n# a comment\ncoio-chains 2\n") == "chains.txt:3: expected the header line \"coio-chains 1\" first");
  CHECK(rejection("") == "chains.txt:1: empty table: expected the header line \"coio-chains 1\"");
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1\n")) ==
        "chains.txt:4: \"127.0.0.1:1\" is not HOST:PORT/TARGET (e.g. 127.0.0.1:9001/3 or [::1]:9001/3)");
  CHECK(rejection(withHeader("chain 1 localhost:1/2\n")).rfind("chains.txt:4: \"localhost:1/2\" is not", 0) == 0);
  CHECK(rejection(withHeader("chain 1 127.0.0.1:1/x\n")).rfind("chains.txt:4: ", 0) == 0);
  CHECK(rejection(withHeader("chain x 127.0.0.1:1/2\n")) ==
        "chains.txt:4: expected \"chain ID HOST:PORT/TARGET...\" with a numeric chain id");
  CHECK(rejection(withHeader("replicas 3\n")) ==
        "chains.txt:4: unknown keyword \"replicas\" (expected chunks, chunk-size or chain)");
  CHECK(rejection("coio-chains 1\nchunks 10\nchunks 10\n") == "chains.txt:3: chunks given twice (first on line 2)");
  CHECK(rejection("coio-chains 1\nchunks 0\n") == "chains.txt:2: expected \"chunks N\", 1 <= N <= 2^40");
  CHECK(rejection("coio-chains 1\nchunk-size 1000\n") ==
        "chains.txt:2: expected \"chunk-size S\", a multiple of 4K up to 2G (suffixes K, M, G)");
  CHECK(rejection("coio-chains 1\nchunk-size 4K\nchain 1 127.0.0.1:1/1\n") ==
        "chains.txt:3: no \"chunks N\" line: how many chunks the dataset has");
  CHECK(rejection("coio-chains 1\nchunks 4\nchain 1 127.0.0.1:1/1\n") ==
        "chains.txt:3: no \"chunk-size S\" line: how large a chunk is");
}

TEST_CASE("A chain table loads from a file; a missing file says so", "[chainTable]") {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "coio-chain-table-test.txt";
  std::ofstream(path) << kGood;
  std::string why;
  const coio::Result<storage::ChainTable> table = storage::ChainTable::load(path.string(), &why);
  std::filesystem::remove(path);
  INFO(why);
  REQUIRE(table);
  CHECK(table->chains().size() == 3);
  CHECK_FALSE(storage::ChainTable::load(path.string(), &why));
  CHECK(why == path.string() + ": cannot read the chain table");
}

TEST_CASE("The replicas of a chain, created from the table, are byte-identical; other chains differ",
          "[chainTable]") {
  std::string small = kGood;  // 20 chunks of 4 KiB per chain, 8 per file
  small.replace(small.find("chunks 6000"), 11, "chunks 60");
  small.replace(small.find("chunk-size 64K"), 14, "chunk-size 4K");
  const storage::ChainTable table = *storage::ChainTable::parse(small, "chains.txt");
  const auto create = [&table](std::uint32_t target) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coio-replica-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    REQUIRE(storage::createChunkStore(tmpl, *table.targetLayout(target, 8)));
    return std::filesystem::path(tmpl);
  };
  const auto read = [](const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::filesystem::path a = create(22), b = create(31), other = create(11);  // chain 2 twice, chain 1
  for (const char* name : {"index", "data-0", "data-2"}) {
    INFO(name);
    CHECK(read(a / name) == read(b / name));
    CHECK(read(a / name) != read(other / name));
  }
  for (const auto& dir : {a, b, other}) std::filesystem::remove_all(dir);
}
