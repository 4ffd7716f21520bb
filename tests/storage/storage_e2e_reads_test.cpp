// The server and client end to end: what a batchRead returns, IO by IO (exact bytes, invalid IOs,
// several targets, chain versions, every chunk size).
#include "storage_e2e_fixture.hpp"

TEMPLATE_LIST_TEST_CASE("batchRead returns exact bytes: single IOs, batches, unaligned and whole chunks",
                        "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    // One IO, unaligned, and a whole chunk (its stored CRC comes back).
    const std::vector<ReadOp> unaligned = {{3, 4097, 5000, {}}};
    std::vector<ReadOutcome> one = co_await readAndCheck(fx, *client, unaligned);
    CHECK(one[0].status == IoStatus::ok);
    const std::vector<ReadOp> wholeChunk = {{7, 0, kChunkSize, {}}};
    std::vector<ReadOutcome> whole = co_await readAndCheck(fx, *client, wholeChunk);
    CHECK(whole[0].bytes == kChunkSize);
    std::mt19937 random(7);
    const std::vector<std::size_t> sizes = {1, 2, 17, 100, 256};
    for (std::size_t size : sizes) {
      std::vector<ReadOp> ios;
      for (std::size_t i = 0; i < size; ++i) {
        const std::uint32_t offset = random() % kChunkSize;
        const std::uint32_t length = static_cast<std::uint32_t>(random() % std::min<std::uint32_t>(kChunkSize - offset, 9000));
        ios.push_back({random() % kChunks, offset, length, {}});
      }
      std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, *client, ios);
      for (const ReadOutcome& o : outcomes) CHECK(o.status == IoStatus::ok);
    }
    // Edges: the last byte of a chunk, an empty read, an aligned full 4 KiB.
    const std::vector<ReadOp> edgeIos = {{11, kChunkSize - 1, 1, {}}, {0, 10, 0, {}}, {4, 8192, 4096, {}}};
    std::vector<ReadOutcome> edges = co_await readAndCheck(fx, *client, edgeIos);
    for (const ReadOutcome& o : edges) CHECK(o.status == IoStatus::ok);
    co_await client->close();
  });
  CHECK(f.server->buffersInUse() == 0);
}

TEMPLATE_LIST_TEST_CASE("invalid IOs get their own status; the rest of the batch is served", "[storage][e2e]",
                        Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    const std::vector<ReadOp> mixedIos = {
        {1, 0, 100, {}}, {kChunks, 0, 10, {}}, {2, kChunkSize - 10, 11, {}}, {2, 5, 10, {}}};
    std::vector<ReadOutcome> mixed = co_await readAndCheck(fx, *client, mixedIos);
    CHECK(mixed[0].status == IoStatus::ok);
    CHECK(mixed[1].status == IoStatus::chunkNotFound);
    CHECK(mixed[2].status == IoStatus::rangeOutsideChunk);
    CHECK(mixed[3].status == IoStatus::ok);
    CHECK(mixed[1].bytes == 0);

    // More IOs than --max-batch, and more bytes than --max-batch-bytes.
    const std::vector<ReadOp> tooMany(257, ReadOp{0, 0, 1, {}});
    const std::vector<ReadOutcome> manyOutcomes = co_await readAndCheck(fx, *client, tooMany);
    for (const ReadOutcome& o : manyOutcomes) CHECK(o.status == IoStatus::batchTooLarge);
    const std::vector<ReadOp> tooBig(65, ReadOp{0, 0, kChunkSize, {}});
    const std::vector<ReadOutcome> bigOutcomes = co_await readAndCheck(fx, *client, tooBig);
    for (const ReadOutcome& o : bigOutcomes) CHECK(o.status == IoStatus::batchTooLarge);
    // The connection is still good.
    const std::vector<ReadOp> small = {{1, 1, 1, {}}};
    const std::vector<ReadOutcome> after = co_await readAndCheck(fx, *client, small);
    CHECK(after[0].status == IoStatus::ok);
    co_await client->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a server serves several targets: each IO reads its own; an unknown target is that IO's error",
                        "[storage][e2e]", Setups) {
  const storage::ChunkStoreLayout seven{3, 8192, 2};  // a second dataset, another shape
  Fixture<TestType> f(Fixture<TestType>::small(), 64, {kChunks, kChunkSize, 5}, {{7, seven}});
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    CHECK(fx.server->targetIds() == std::vector<std::uint32_t>{0, 7});
    auto client = co_await fx.client();
    const std::vector<ReadOp> ios = {
        {1, 100, 5000, {}, 0},   // target 0
        {2, 0, 8192, {}, 7},     // a whole chunk of target 7: its stored CRC
        {5, 0, 100, {}, 7},      // target 7 has 3 chunks
        {1, 0, 100, {}, 99},     // no such target
        {9, 0, kChunkSize, {}, 0},
        {2, 4000, 8192, {}, 7},  // past the end of target 7's 8 KiB chunks
    };
    const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, *client, ios);
    CHECK(outcomes[0].status == IoStatus::ok);
    CHECK(outcomes[1].status == IoStatus::ok);
    CHECK(outcomes[1].bytes == 8192);
    CHECK(outcomes[2].status == IoStatus::chunkNotFound);
    CHECK(outcomes[3].status == IoStatus::targetNotFound);
    CHECK(outcomes[4].status == IoStatus::ok);
    CHECK(outcomes[5].status == IoStatus::rangeOutsideChunk);
    co_await client->close();
  });
}

TEMPLATE_LIST_TEST_CASE("chain versions: an IO routed with an older one is answered staleRouting, unread; 0 never is",
                        "[storage][e2e]", Setups) {
  const storage::ChunkStoreLayout seven{3, 8192, 2};
  Fixture<TestType> f(Fixture<TestType>::small(), 64, {kChunks, kChunkSize, 5}, {{7, seven}});
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    CHECK(fx.server->chainVersion(0) == 0u);  // no routing yet: never stale
    CHECK_FALSE(fx.server->chainVersion(99));
    // Target 7's chain at version 3 (a table whose chain 5 holds it, bumped twice); target 0 in no chain.
    storage::ChainTable routing = *storage::ChainTable::parse(
        "coio-chains 1\nchunks 3\nchunk-size 8K\nchain 5 127.0.0.1:1/7 127.0.0.1:2/8\n", "routing");
    routing = *routing.withChain(storage::markTargetOffline(routing.chainRecord(0), 8));
    routing = *routing.withChain(storage::markTargetServing(routing.chainRecord(0), 8));
    fx.server->updateRouting(routing);
    CHECK(fx.server->chainVersion(7) == 3u);
    CHECK(fx.server->chainVersion(0) == 0u);
    auto client = co_await fx.client();
    std::vector<ReadOp> ios = {
        {1, 0, 100, {}, 7, 2},  // older: stale
        {1, 0, 100, {}, 7, 3},  // the server's
        {1, 0, 100, {}, 7, 4},  // newer (the server lags): served
        {1, 0, 100, {}, 7, 0},  // no routing: served
        {1, 0, 100, {}, 0, 9},  // a target whose chain the server does not know: served
        {1, 0, 100, {}, 99, 1}, // no such target: that comes first
    };
    const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, *client, ios);
    CHECK(outcomes[0].status == IoStatus::staleRouting);
    CHECK(outcomes[0].bytes == 0);
    for (std::size_t i = 1; i < 5; ++i) CHECK(outcomes[i].status == IoStatus::ok);
    CHECK(outcomes[5].status == IoStatus::targetNotFound);
    CHECK(fx.server->stats().staleIos == 1);
    co_await client->close();
  });
}

TEMPLATE_LIST_TEST_CASE("every chunk size 3FS uses: whole chunks and parts across piece boundaries",
                        "[storage][e2e]", Setups) {
  for (const std::uint32_t chunkSize : {64u << 10, 1u << 20, 4u << 20}) {
    INFO("chunk size " << chunkSize);
    Fixture<TestType> f(Fixture<TestType>::small(), 64, {3, chunkSize, 2});
    f.run([](Fixture<TestType>& fx) -> Task<void> {
      const std::uint32_t size = fx.server->layout().chunkSize;
      auto client = co_await fx.client();
      const std::vector<ReadOp> whole = {{2, 0, size, {}}};  // chunk 2 opens the second data file
      std::vector<ReadOutcome> w = co_await readAndCheck(fx, *client, whole);
      CHECK(w[0].status == IoStatus::ok);
      CHECK(w[0].bytes == size);
      // Unaligned parts: the tail, one spanning a 16 KiB piece boundary, and a mixed batch.
      const std::vector<ReadOp> parts = {
          {0, size - 4097, 4097, {}}, {1, 16384 - 3, 7, {}}, {1, 5, size / 2, {}}, {0, size / 3, size / 4 + 1, {}}};
      std::vector<ReadOutcome> p = co_await readAndCheck(fx, *client, parts);
      for (const ReadOutcome& o : p) CHECK(o.status == IoStatus::ok);
      co_await client->close();
    });
    CHECK(f.server->buffersInUse() == 0);
  }
}
