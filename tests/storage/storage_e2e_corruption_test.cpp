// The server and client end to end: data corrupted on disk is answered corrupt, block by block.
#include "storage_e2e_fixture.hpp"

TEMPLATE_LIST_TEST_CASE("a byte corrupted on disk: every read of its block is answered corrupt, whole chunk or "
                        "partial, with nothing sent past it; other reads are served", "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  // Chunk 6 is the second chunk of data-1 (5 chunks per file); byte 40000 is in its block 9 (4 KiB
  // blocks), in the third 16 KiB piece of a whole-chunk read.
  storage::testing::flipBits(storage::ChunkStoreLayout::dataFileName(f.dir.path, 1), kChunkSize + 40000,
                             std::byte{0xFF});
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    for (const bool verify : {true, false}) {  // the server checks whatever the client asks
      INFO("client verifies " << verify);
      auto client = co_await fx.client({.verifyChecksums = verify});
      const std::vector<ReadOp> ios = {{6, 0, kChunkSize, {}},  // the whole chunk
                                       {6, 40000, 1, {}},       // the byte itself
                                       {6, 36864, 10, {}},      // its block's first bytes
                                       {6, 30000, 7000, {}},    // across blocks 7 to 9
                                       {6, 36863, 1, {}},       // the byte before its block
                                       {6, 40960, 24576, {}},   // the rest of the chunk after its block
                                       {7, 0, kChunkSize, {}}};
      const std::vector<ReadOutcome> got = co_await readAndCheck(fx, *client, ios);
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK(got[i].status == IoStatus::corrupt);
        CHECK(got[i].bytes == 0);
      }
      for (std::size_t i = 4; i < ios.size(); ++i) CHECK(got[i].status == IoStatus::ok);
      co_await client->close();
    }
    CHECK(fx.server->stats().corruptIos == 8);
    // On the wire: the whole chunk's first two pieces may go (they verified), nothing from the third on.
    auto raw = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(kChunkSize);
    const std::vector<std::byte> request = requestFrame(1, {{6, 0, kChunkSize, remoteOf(*raw, into)}}, true);
    co_await sendRaw(*raw, request);
    std::size_t delivered = 0;
    Result<storage::IncomingFrame> reply = co_await readResponse(*raw, into, delivered);
    REQUIRE(reply);
    REQUIRE(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
    REQUIRE(response);
    CHECK(response->results[0] == storage::proto::IoResult{IoStatus::corrupt, 0, 0});
    CHECK(delivered <= 2 * 16384);
    co_await raw->close();
  });
  CHECK(f.server->buffersInUse() == 0);
}

TEMPLATE_LIST_TEST_CASE("bits flipped at random on disk: an IO is corrupt exactly when its blocks hold a flip, and "
                        "no wrong byte is ever delivered as ok", "[storage][e2e]", Setups) {
  constexpr std::uint32_t kBlock = storage::kDefaultBlockSize;
  const char* given = std::getenv("COIO_TEST_SEED");
  const std::uint64_t seed = given ? std::strtoull(given, nullptr, 10) : std::random_device{}();
  std::printf("bit flips on disk: seed %llu (COIO_TEST_SEED reproduces it)\n", static_cast<unsigned long long>(seed));
  INFO("seed " << seed);
  Fixture<TestType> f;
  std::mt19937_64 random(seed);
  for (int i = 0; i < 12; ++i) {
    const std::uint64_t chunk = random() % kChunks;
    const std::uint32_t offset = random() % kChunkSize;
    const auto where = f.server->layout().locate(chunk);
    storage::testing::flipBits(storage::ChunkStoreLayout::dataFileName(f.dir.path, where.file), where.offset + offset,
                               static_cast<std::byte>(1u << (random() % 8)));
  }
  // The corrupt blocks, from the files (a bit flipped twice is whole again): (chunk, block).
  BlockSet corrupt;
  for (std::uint64_t chunk = 0; chunk < kChunks; ++chunk) {
    const auto where = f.server->layout().locate(chunk);
    std::vector<std::byte> bytes(kChunkSize);
    const int fd = ::open(storage::ChunkStoreLayout::dataFileName(f.dir.path, where.file).c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(where.offset)) == kChunkSize);
    ::close(fd);
    for (std::uint32_t block = 0; block < kChunkSize / kBlock; ++block) {
      if (!storage::matchesChunkBytes(chunk, block * kBlock, std::span(bytes).subspan(block * kBlock, kBlock))) {
        corrupt.insert({chunk, block});
      }
    }
  }
  REQUIRE(!corrupt.empty());
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    std::uint64_t ios = 0, corruptIos = 0, wrongAsOk = 0;
    std::set<std::pair<std::uint64_t, std::uint32_t>> met;  // corrupt blocks some IO was answered corrupt for
    std::span<std::byte> memory = fx.buffer(16 * kChunkSize);
    for (const bool verify : {true, false}) {
      auto client = co_await fx.client({.verifyChecksums = verify});
      for (int batch = 0; batch < 40; ++batch) {
        std::vector<ReadOp> ops;
        for (std::size_t i = 0; i < 16; ++i) {
          ReadOp op{random() % kChunks, 0, 0, memory.subspan(i * kChunkSize, kChunkSize)};
          switch (random() % 5) {
            case 0: op.length = kChunkSize; break;  // the whole chunk
            case 1:                                  // a few bytes anywhere
              op.offset = random() % kChunkSize;
              op.length = std::min<std::uint32_t>(1 + random() % 16, kChunkSize - op.offset);
              break;
            case 2:  // across a block boundary, a little on each side
              op.offset = kBlock * (1 + random() % (kChunkSize / kBlock - 1)) - 1 - random() % 100;
              op.length = 2 + random() % 300;
              break;
            default:  // any range
              op.offset = random() % kChunkSize;
              op.length = random() % (kChunkSize - op.offset + 1);
          }
          ops.push_back(op);
        }
        Result<std::vector<ReadOutcome>> outcomes = co_await client->batchRead(ops);
        REQUIRE(outcomes);
        for (std::size_t i = 0; i < ops.size(); ++i) {
          const ReadOp& op = ops[i];
          const ReadOutcome& o = (*outcomes)[i];
          const std::vector<std::pair<std::uint64_t, std::uint32_t>> covered = blocksRead(op, corrupt, kBlock);
          INFO("chunk " << op.chunkId << ", offset " << op.offset << ", " << op.length << " bytes; status "
                        << storage::proto::toString(o.status));
          ++ios;
          if (o.status == IoStatus::ok) {
            const bool exact = storage::matchesChunkBytes(op.chunkId, op.offset, op.into.first(o.bytes)) &&
                               o.bytes == op.length && !o.checksumMismatch;
            wrongAsOk += !exact;
            CHECK(exact);
            CHECK(covered.empty());
          } else {
            ++corruptIos;
            CHECK(o.status == IoStatus::corrupt);
            CHECK_FALSE(covered.empty());
            met.insert(covered.begin(), covered.end());
          }
        }
      }
      co_await client->close();
    }
    std::printf("  %llu IOs, %llu answered corrupt, %zu of %zu corrupt blocks met, %llu wrong bytes delivered as ok\n",
                static_cast<unsigned long long>(ios), static_cast<unsigned long long>(corruptIos), met.size(),
                corrupt.size(), static_cast<unsigned long long>(wrongAsOk));
    CHECK(wrongAsOk == 0);
    CHECK(corruptIos > 0);
    CHECK(fx.server->stats().corruptIos == corruptIos);
  });
  CHECK(f.server->buffersInUse() == 0);
}
