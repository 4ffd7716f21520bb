// ClusterClient end to end: storage servers in child processes (3 over
// loopback TCP, each reactor kind; 2 over RDMA with COIO_E2E_RDMA, label
// `rdma`: the Soft-RoCE guest), a chain table of replication 2 over them,
// and every fault the client must survive: a server killed mid-batch, all
// replicas of a chain down, a server stopped (SIGSTOP), a corrupted replica.
#include "cluster_fixture.hpp"

#if !COIO_E2E_RDMA

TEMPLATE_LIST_TEST_CASE("a cluster batchRead: every byte right, in request order, spread over all servers",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    std::mt19937_64 random(7);
    std::vector<ReadOp> ios;
    for (int i = 0; i < 90; ++i) {
      const std::uint64_t chunk = random() % Cluster<TestType>::kChunks;
      const bool whole = i % 3 == 0;
      const auto offset = whole ? 0u : static_cast<std::uint32_t>(random() % (kChunkSize - 100));
      const auto length = whole ? kChunkSize : static_cast<std::uint32_t>(1 + random() % (kChunkSize - offset));
      ios.push_back({chunk, offset, length, {}, 9999});  // the target given is ignored: the table decides
    }
    const std::vector<ClusterOutcome> outcomes = co_await f.readAll(client, ios);
    std::uint64_t served = 0;
    for (std::size_t s = 0; s < Cluster<TestType>::kServers; ++s) {
      CHECK(client.serverStats(s).ios > 0);
      served += client.serverStats(s).ios;
    }
    CHECK(served == ios.size());
    for (const ClusterOutcome& o : outcomes) CHECK(o.attempts == 1);
    CHECK(client.stats().retries == 0);
    CHECK(client.stats().failedIos == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("a cluster batchRead fails what the table says cannot exist, without sending it",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    std::vector<ReadOp> ios = {{Cluster<TestType>::kChunks, 0, 10, f.buffer(10)},  // past the dataset
                               {1, kChunkSize - 5, 10, f.buffer(10)},              // past the chunk
                               {2, 0, 100, f.buffer(10)},                          // a destination too small
                               {3, 5, 10, f.buffer(10)}};
    const std::vector<ClusterOutcome> outcomes = co_await client.batchRead(ios);
    CHECK(outcomes[0].status == IoStatus::chunkNotFound);
    CHECK(outcomes[1].status == IoStatus::rangeOutsideChunk);
    CHECK(outcomes[2].status == IoStatus::bufferTooSmall);
    CHECK(outcomes[3].ok());
    for (std::size_t i = 0; i < 3; ++i) CHECK(outcomes[i].attempts == 0);
    std::uint64_t requests = 0;
    for (std::size_t s = 0; s < Cluster<TestType>::kServers; ++s) requests += client.serverStats(s).requests;
    CHECK(requests == 1);
  });
}

TEMPLATE_LIST_TEST_CASE("all replicas of a chain down: its IOs fail at once with per-IO errors, no hang; a server "
                        "that comes back is used again",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    (void)co_await f.readAll(client, wholeChunks(0, 9, Cluster<TestType>::kChunks));  // all up
    // Chain 1 (chunks 0, 3, 6, ...) lives on servers 0 and 1 only.
    f.servers[0].kill();
    f.servers[1].kill();
    std::vector<ReadOp> ios = wholeChunks(0, 9, Cluster<TestType>::kChunks);
    for (ReadOp& op : ios) op.into = f.buffer(op.length);
    const Clock::time_point start = Clock::now();
    const std::vector<ClusterOutcome> outcomes = co_await client.batchRead(ios);
    CHECK(Clock::now() - start < f.options().requestTimeout + kSlack);
    for (std::size_t i = 0; i < ios.size(); ++i) {
      INFO("chunk " << ios[i].chunkId);
      if (ios[i].chunkId % 3 == 0) {
        CHECK_FALSE(outcomes[i].ok());
        CHECK(outcomes[i].status == IoStatus::unavailable);
        CHECK(outcomes[i].error);
      } else {
        CHECK(outcomes[i].ok());  // chains 2 and 3 still have server 2
        CHECK(outcomes[i].server == 2u);
      }
    }
    CHECK(client.stats().failedIos == 3);
    CHECK(client.isDown(0));
    CHECK(client.isDown(1));
    // Again: both marked down, nothing is sent to them, the IOs fail at once.
    const std::vector<ClusterOutcome> again = co_await client.batchRead(std::span(ios).first(1));
    CHECK(again[0].status == IoStatus::unavailable);
    CHECK(again[0].attempts == 0);
    // Server 0 comes back on its port: probed, marked up, read from again,
    // while a caller keeps retrying: batchReads that fail at once must
    // still let the probe run.
    f.start(0, f.servers[0].port());
    const Clock::time_point giveUp = Clock::now() + 5s;
    while (client.isDown(0) && Clock::now() < giveUp) (void)co_await client.batchRead(std::span(ios).first(1));
    REQUIRE_FALSE(client.isDown(0));
    CHECK(client.serverStats(0).ups == 1);
    const std::uint64_t before = client.serverStats(0).ios;
    // Chain 1's chunks (server 1 is still down). Not a braced list in the
    // co_await: g++ 12 would keep its array across the suspension.
    std::vector<ReadOp> chainOne = {{0, 0, kChunkSize, {}}, {3, 0, kChunkSize, {}}, {6, 0, kChunkSize, {}}};
    const std::vector<ClusterOutcome> read = co_await f.readAll(client, std::move(chainOne));
    for (const ClusterOutcome& o : read) CHECK(o.server == 0u);
    CHECK(client.serverStats(0).ios == before + 3);
    CHECK(f.log.size() >= 3);  // two downs, one back
  });
}

TEMPLATE_LIST_TEST_CASE("retryFor: both replicas of a chain stalled past the request deadline (a machine that "
                        "stalls): their IOs go round again after pauses and are read once the servers answer; "
                        "past retryFor they fail",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  storage::ClusterOptions options = f.options();
  options.requestTimeout = 300ms;
  options.retryFor = 3s;
  f.run(options, [&f, options](typename Cluster<TestType>::Client& client) -> Task<void> {
    // Chain 1 (chunks 0, 3, 6, ...) lives on servers 0 and 1 only: stalled
    // for 1.2 s, four request deadlines.
    f.servers[0].signal(SIGSTOP);
    f.servers[1].signal(SIGSTOP);
    auto resume = [&]() -> Task<void> {
      co_await f.reactor.sleepFor(1200ms);
      f.servers[0].signal(SIGCONT);
      f.servers[1].signal(SIGCONT);
    };
    const Clock::time_point start = Clock::now();
    auto [outcomes, unit] =
        co_await coio::collectAll(f.readAll(client, wholeChunks(0, 9, Cluster<TestType>::kChunks)), resume());
    (void)unit;
    const Clock::duration took = Clock::now() - start;
    CHECK(took >= 1200ms);
    CHECK(took < options.retryFor + kSlack);
    CHECK(client.stats().failedIos == 0);  // readAll checked each IO's bytes
    CHECK(client.stats().retryPauses >= 1);
    CHECK(client.serverStats(0).timeouts + client.serverStats(1).timeouts >= 2);
    // A chain down for longer than retryFor: its IOs fail once it passed.
    f.servers[0].kill();
    f.servers[1].kill();
    std::vector<ReadOp> chainOne = wholeChunks(0, 1, Cluster<TestType>::kChunks);
    chainOne[0].into = f.buffer(kChunkSize);
    const Clock::time_point again = Clock::now();
    const std::vector<ClusterOutcome> failed = co_await client.batchRead(chainOne);
    CHECK_FALSE(failed[0].ok());
    CHECK(Clock::now() - again >= options.retryFor);
    CHECK(Clock::now() - again < options.retryFor + options.requestTimeout + kSlack);
  });
}

TEMPLATE_LIST_TEST_CASE("a stopped server (SIGSTOP) is found by the request deadline: its IOs go to the other "
                        "replicas; after SIGCONT it is used again",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  storage::ClusterOptions options = f.options();
  options.requestTimeout = 500ms;
  f.run(options, [&f, options](typename Cluster<TestType>::Client& client) -> Task<void> {
    f.servers[1].signal(SIGSTOP);
    for (int round = 0; round < 4; ++round) {
      const Clock::time_point start = Clock::now();
      const std::uint64_t first = static_cast<std::uint64_t>(round) * 9;
      (void)co_await f.readAll(client, wholeChunks(first, 9, Cluster<TestType>::kChunks));
      CHECK(Clock::now() - start < options.requestTimeout + kSlack);
    }
    CHECK(client.isDown(1));
    CHECK(client.serverStats(1).timeouts >= 1);
    CHECK(client.stats().retries >= 1);
    f.servers[1].signal(SIGCONT);
    const bool back = co_await f.eventually([&client] { return !client.isDown(1); });
    CHECK(back);
    const std::uint64_t before = client.serverStats(1).ios;
    (void)co_await f.readAll(client, wholeChunks(0, 30, Cluster<TestType>::kChunks));
    CHECK(client.serverStats(1).ios > before);
  });
}

TEMPLATE_LIST_TEST_CASE("a server marked down but still connected (it missed a deadline) is the last resort of the "
                        "IOs no other replica can serve: read from it, not failed unsent; once its connection "
                        "failed they fail at once",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  storage::ClusterOptions options = f.options();
  options.requestTimeout = 500ms;
  options.reconnectMin = options.reconnectMax = 60s;  // no probe brings it back meanwhile
  f.run(options, [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    // Chain 1 (chunks 0, 3, 6, ...): target 1 on server 0, and 12 (server 1), offline: server 0 alone serves it.
    const storage::ChainTable table = client.table();
    co_await client.updateRouting(table.withChain(storage::markTargetOffline(table.chainRecord(0), 12)).value());
    std::vector<ReadOp> one = wholeChunks(0, 1, Cluster<TestType>::kChunks);
    one[0].into = f.buffer(kChunkSize);
    f.servers[0].signal(SIGSTOP);
    const std::vector<ClusterOutcome> hung = co_await client.batchRead(one);
    CHECK(hung[0].status == IoStatus::timedOut);
    REQUIRE(client.isDown(0));
    f.servers[0].signal(SIGCONT);
    std::vector<ReadOp> chainOne = {{0, 0, kChunkSize, {}}, {3, 0, kChunkSize, {}}, {6, 0, kChunkSize, {}}};
    const std::vector<ClusterOutcome> read = co_await f.readAll(client, std::move(chainOne));
    for (const ClusterOutcome& o : read) CHECK(o.server == 0u);
    CHECK(client.isDown(0));  // still: only the probe marks it up
    // Dead: the first request finds its connection gone, the next IO is not sent.
    f.servers[0].kill();
    (void)co_await client.batchRead(one);
    const std::vector<ClusterOutcome> dead = co_await client.batchRead(one);
    CHECK(dead[0].status == IoStatus::unavailable);
    CHECK(dead[0].attempts == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("hedged reads: a stopped server costs the hedge delay, not the deadline; three lost hedges "
                        "mark it down",
                        "[storage][cluster]", Setups) {
  Cluster<TestType> f;
  storage::ClusterOptions options = f.options();
  options.requestTimeout = 20s;  // far beyond the test: only the hedge can end a read early
  options.hedgeAfter = 30ms;
  f.run(options, [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    (void)co_await f.readAll(client, wholeChunks(0, 9, Cluster<TestType>::kChunks));  // connected, no hedge needed
    f.servers[0].signal(SIGSTOP);
    for (int round = 0; round < 4; ++round) {
      const Clock::time_point start = Clock::now();
      const std::uint64_t first = static_cast<std::uint64_t>(round) * 6;
      (void)co_await f.readAll(client, wholeChunks(first, 6, Cluster<TestType>::kChunks));
      CHECK(Clock::now() - start < kSlack);
    }
    CHECK(client.stats().hedges >= 1);
    CHECK(client.stats().hedgeWins >= 3);
    CHECK(client.isDown(0));
    CHECK(client.serverStats(0).timeouts == 0);  // no deadline passed: the hedges ended them
    f.servers[0].signal(SIGCONT);
  });
}

TEMPLATE_LIST_TEST_CASE("a corrupted replica: reported once, its bytes not returned, the other replica read instead",
                        "[storage][cluster]", Setups) {
  // Spliced (TCP): the whole chunk's blocks are never read by the server; the client's CRC check,
  // against the CRC derived from the stored ones, catches the flip instead.
  const bool spliced = GENERATE(false, true);
  INFO((spliced ? "servers splice" : "servers copy"));
  Cluster<TestType> f(nullptr, spliced);
  // Chunk 3 is on chain 1: target 1 on server 0 (position 0) and target 12
  // on server 1 (position 1). With equal loads the router reads position
  // 3 mod 2 = 1 first: corrupt that copy. It is the second chunk of its
  // store (chunks 0, 3, 6, ...), in data-0.
  storage::testing::flipBits(storage::ChunkStoreLayout::dataFileName(f.dirs.at(12)->path, 0), kChunkSize + 777,
                             std::byte{0x10});
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    const std::vector<ReadOp> chunk3 = {{3, 0, kChunkSize, {}}};  // a whole chunk: its stored CRC
    const std::vector<ClusterOutcome> first = co_await f.readAll(client, chunk3);
    CHECK(first[0].attempts == 2);
    CHECK(first[0].server == 0u);
    CHECK(client.stats().corruptReplicas == 1);
    REQUIRE(f.log.size() == 1);
    CHECK(f.log[0].find("chunk 3 of target 12") != std::string::npos);
    // Known now: read from the good copy at once, reported no more.
    const std::vector<ClusterOutcome> second = co_await f.readAll(client, chunk3);
    CHECK(second[0].attempts == 1);
    CHECK(second[0].server == 0u);
    CHECK(client.stats().corruptReplicas == 1);
    CHECK(f.log.size() == 1);
    CHECK_FALSE(client.isDown(1));  // a bad copy is not a bad server
  });
}

TEMPLATE_LIST_TEST_CASE("a replica corrupted on disk under partial reads: every read comes back right from the "
                        "other replica; the corrupt copy is counted and logged once", "[storage][cluster]", Setups) {
  const bool spliced = GENERATE(false, true);
  INFO((spliced ? "servers splice" : "servers copy"));
  Cluster<TestType> f(nullptr, spliced);
  // Chunk 3 (chain 1: target 1 on server 0, target 12 on server 1; the router reads position
  // 3 mod 2 = 1, target 12, first) is the second chunk of target 12's store, in data-0: flip a
  // bit in its block 2 (4 KiB blocks), bytes 8192 to 12287.
  storage::testing::flipBits(storage::ChunkStoreLayout::dataFileName(f.dirs.at(12)->path, 0), kChunkSize + 9000,
                             std::byte{0x04});
  f.run(f.options(), [&f, spliced](typename Cluster<TestType>::Client& client) -> Task<void> {
    // A read outside the corrupt block is served by target 12: its copy is good there.
    const std::vector<ReadOp> outside = {{3, 100, 5000, {}}};  // named: g++ 12 mishandles a braced list in co_await
    const std::vector<ClusterOutcome> clean = co_await f.readAll(client, outside);
    CHECK(clean[0].attempts == 1);
    CHECK(clean[0].target == 12u);
    CHECK(client.stats().corruptReplicas == 0);
    // Partial reads that cover the block (the batch spreads over both replicas): those sent to
    // target 12 are answered corrupt and read again from target 1; target 12 is then not read for
    // chunk 3 any more.
    std::mt19937 random(3);
    std::vector<ReadOp> partial = {{3, 9000, 1, {}}, {3, 8000, 300, {}}, {3, 12000, 4000, {}}};
    for (int i = 0; i < 40; ++i) {
      const std::uint32_t inside = 8192 + random() % 4096;  // a byte of block 2
      const std::uint32_t offset = inside - random() % std::min<std::uint32_t>(inside + 1, 6000);
      const auto end = static_cast<std::uint32_t>(inside + 1 + random() % (kChunkSize - inside));
      partial.push_back({3, offset, end - offset, {}});
    }
    const std::vector<ClusterOutcome> got = co_await f.readAll(client, partial);
    for (const ClusterOutcome& o : got) CHECK(o.target == 1u);  // all from the good copy
    CHECK(client.stats().corruptReplicas == 1);
    CHECK(client.serverStats(1).ios == 1);  // the clean read only
    REQUIRE(f.log.size() == 1);
    CHECK(f.log[0].find("chunk 3 of target 12") != std::string::npos);
    // Spliced over TCP, a read that covers the block whole fails the client's CRC check instead of
    // the server's (the first read of target 12 to come back names the copy).
    const bool byClient = spliced && !TestType::rdma && f.log[0].find("failed the response's checksum") != std::string::npos;
    CHECK((f.log[0].find("is corrupt") != std::string::npos || byClient));
    CHECK_FALSE(client.isDown(1));  // a bad copy is not a bad server
    // Other chunks of the corrupted target are still read from it (chunk 9: chain 1, target 12 first).
    const std::vector<ReadOp> mixed = {{9, 9000, 100, {}}, {3, 9000, 100, {}}};
    const std::vector<ClusterOutcome> other = co_await f.readAll(client, mixed);
    CHECK(other[0].target == 12u);
    CHECK(other[1].target == 1u);
  });
}

TEMPLATE_LIST_TEST_CASE("StorageClient: a batchRead whose task is stopped ends at once; the connection stays usable",
                        "[storage][cluster]", Setups) {
  // What ClusterClient's deadlines and hedges rely on. The only slot of the
  // limiter is held, so the request waits for its grant until stopped.
  using R = typename TestType::R;
  Cluster<TestType> f;
  f.reactor.runUntil([](Cluster<TestType>& fx) -> Task<void> {
    storage::TransmissionLimiter limiter(1);
    REQUIRE(limiter.tryAcquire());
    const coio::SocketAddress server = fx.table.servers()[0];
    Result<std::unique_ptr<storage::StorageClient<R>>> client =
        co_await storage::StorageClient<R>::connect(fx.reactor, server, limiter, {.verifyChecksums = true});
    REQUIRE(client);
    const ReadOp op{0, 0, kChunkSize, fx.buffer(kChunkSize), Cluster<TestType>::firstTarget(0)};
    const Clock::time_point start = Clock::now();
    const Result<std::vector<storage::ReadOutcome>> late =
        co_await coio::withTimeout(fx.reactor, (*client)->batchRead(std::span(&op, 1)), 100ms);
    CHECK(late.error() == std::errc::timed_out);
    auto nap = [&fx]() -> Task<void> { co_await fx.reactor.sleepFor(50ms); };
    auto raced = co_await coio::collectAny((*client)->batchRead(std::span(&op, 1)), nap());
    CHECK(raced.index() == 1);
    CHECK(Clock::now() - start < 150ms + kSlack);  // not the client's 30 s timeout
    CHECK_FALSE((*client)->failure());
    limiter.release();
    const Result<std::vector<storage::ReadOutcome>> served = co_await (*client)->batchRead(std::span(&op, 1));
    REQUIRE(served);
    CHECK((*served)[0].status == IoStatus::ok);
    CHECK(storage::matchesChunkBytes(0, 0, op.into));
    co_await (*client)->close();
  }(f));
}

TEMPLATE_LIST_TEST_CASE("routing: targets marked offline get no IO, their chains read from the others; serving "
                        "again, they are read again; each routing put in use is reported once",
                        "[storage][cluster][routing]", Setups) {
  Cluster<TestType> f;
  std::vector<storage::ChainTable> applied;
  storage::ClusterOptions o = f.options();
  o.routingApplied = [&applied](const storage::ChainTable& table) { applied.push_back(table); };
  f.run(o, [&f, &applied](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    REQUIRE(applied.size() == 1);
    CHECK(applied[0] == f.table);
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(client.iosSentTo(1) > 0);  // target 1: chain 1 on server 0
    CHECK(client.iosSentTo(2) > 0);  // target 2: chain 3 on server 0
    // Both of server 0's targets offline: it has nothing to serve.
    storage::ChainTable offline = client.table();
    offline = offline.withChain(storage::markTargetOffline(offline.chainRecord(0), 1)).value();
    offline = offline.withChain(storage::markTargetOffline(offline.chainRecord(2), 2)).value();
    co_await client.updateRouting(offline);
    CHECK(client.stats().routingUpdates == 1);
    CHECK(client.table().chains()[0].version == 2);
    const std::uint64_t sent1 = client.iosSentTo(1), sent2 = client.iosSentTo(2);
    const std::uint64_t requests0 = client.serverStats(0).requests;
    (void)co_await f.readAll(client, wholeChunks(0, 2 * kChunks, kChunks));
    CHECK(client.iosSentTo(1) == sent1);
    CHECK(client.iosSentTo(2) == sent2);
    CHECK(client.serverStats(0).requests == requests0);
    // The same routing again changes nothing.
    co_await client.updateRouting(offline);
    CHECK(client.stats().routingUpdates == 1);
    storage::ChainTable back = offline.withChain(storage::markTargetServing(offline.chainRecord(0), 1)).value();
    back = back.withChain(storage::markTargetServing(back.chainRecord(2), 2)).value();
    co_await client.updateRouting(back);
    CHECK(client.stats().routingUpdates == 2);
    (void)co_await f.readAll(client, wholeChunks(0, 2 * kChunks, kChunks));
    CHECK(client.iosSentTo(1) > sent1);
    CHECK(client.iosSentTo(2) > sent2);
    CHECK(client.stats().failedIos == 0);
    CHECK(client.stats().retries == 0);
    CHECK(client.stats().offlineIos == 0);
    REQUIRE(applied.size() == 3);  // the first, offline, back: not the repeated one
    CHECK(applied[1] == offline);
    CHECK(applied[2] == back);
  });
}

TEMPLATE_LIST_TEST_CASE("routing: a down server whose targets are all offline gets nothing, not even a probe, once "
                        "it is back; with a target serving again it is probed and read again",
                        "[storage][cluster][routing]", Setups) {
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    // Server 0 (targets 1 and 2) dies: found down by the reads, which go to the other replicas.
    const std::uint16_t port = f.servers[0].port();
    f.servers[0].kill();
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    REQUIRE(client.isDown(0));
    // The manager takes its targets out; then it comes back, before the manager has it serving.
    storage::ChainTable offline = client.table();
    for (const std::uint32_t target : {1u, 2u}) {
      offline = offline.withChain(storage::markTargetOffline(offline.chainRecord(*offline.chainIndexOfTarget(target)),
                                                             target)).value();
    }
    co_await client.updateRouting(offline);
    const std::uint64_t sent1 = client.iosSentTo(1), sent2 = client.iosSentTo(2);
    f.start(0, port);
    co_await f.reactor.sleepFor(20 * f.options().reconnectMin);  // many probe periods
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(client.iosSentTo(1) == sent1);
    CHECK(client.iosSentTo(2) == sent2);
    CHECK(client.stats().offlineIos == 0);
    CHECK(client.isDown(0));
    // Target 1 serving again: the probe finds the server, and its chain reads it again.
    co_await client.updateRouting(
        offline.withChain(storage::markTargetServing(offline.chainRecord(*offline.chainIndexOfTarget(1)), 1)).value());
    const bool back = co_await f.eventually([&client] { return !client.isDown(0); });
    REQUIRE(back);
    for (int round = 0; round < 5; ++round) (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(client.iosSentTo(1) > sent1);
    CHECK(client.iosSentTo(2) == sent2);
    CHECK(client.stats().offlineIos == 0);
    CHECK(client.stats().failedIos == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("routing: a chain with no serving target fails its IOs unsent (noServingTarget); the rest "
                        "are read",
                        "[storage][cluster][routing]", Setups) {
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    storage::ChainTable dead = client.table();  // chain 1: targets 1 and 12
    dead = dead.withChain(storage::markTargetOffline(dead.chainRecord(0), 1)).value();
    dead = dead.withChain(storage::markTargetOffline(dead.chainRecord(0), 12)).value();
    co_await client.updateRouting(dead);
    std::vector<ReadOp> ios = wholeChunks(0, kChunks, kChunks);
    for (ReadOp& op : ios) op.into = f.buffer(op.length);
    const std::vector<ClusterOutcome> outcomes = co_await client.batchRead(ios);
    for (std::size_t i = 0; i < ios.size(); ++i) {
      INFO("chunk " << ios[i].chunkId);
      if (ios[i].chunkId % Cluster<TestType>::kServers == 0) {
        CHECK(outcomes[i].status == IoStatus::unavailable);
        CHECK(outcomes[i].error == storage::ClusterErrc::noServingTarget);
        CHECK(outcomes[i].attempts == 0);
      } else {
        CHECK(outcomes[i].ok());
      }
    }
    CHECK(client.iosSentTo(1) == 0);
    CHECK(client.iosSentTo(12) == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("routing: a server that knows a newer chain version answers staleRouting; the client "
                        "refreshes through its refresher and the batch succeeds",
                        "[storage][cluster][routing]", Setups) {
  // Chain 1 moved on to version 3; server 0 knows it, the client not.
  const storage::ChainTable versions = Cluster<TestType>::chainOneAtVersion3();
  Cluster<TestType> f(&versions);
  storage::ChainTable newer = f.table;
  newer = newer.withChain(storage::markTargetOffline(newer.chainRecord(0), 12)).value();
  newer = newer.withChain(storage::markTargetServing(newer.chainRecord(0), 12)).value();
  REQUIRE(newer.chains()[0].version == 3);
  int fetched = 0;
  storage::ClusterOptions o = f.options();
  o.refreshRouting = [&newer, &fetched]() -> Task<Result<storage::ChainTable>> {
    ++fetched;
    co_return newer;
  };
  f.run(o, [&f, &fetched](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    // Two batches at once: both see chain 1 stale, one refresh serves both.
    auto [first, second] = co_await coio::collectAll(f.readAll(client, wholeChunks(0, kChunks, kChunks)),
                                                     f.readAll(client, wholeChunks(0, kChunks, kChunks)));
    CHECK(first.size() == kChunks);
    CHECK(second.size() == kChunks);
    CHECK(fetched == 1);
    CHECK(client.stats().routingRefreshes == 1);
    CHECK(client.stats().routingUpdates == 1);
    CHECK(client.stats().staleRoutingRetries > 0);
    CHECK(client.serverStats(0).staleIos == client.stats().staleRoutingRetries);
    CHECK(client.table().chains()[0].version == 3);
    CHECK(client.stats().failedIos == 0);
    // On the fresh routing nothing is stale.
    const std::uint64_t stale = client.serverStats(0).staleIos;
    const std::uint64_t sent = client.iosSentTo(1);
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(client.serverStats(0).staleIos == stale);
    CHECK(client.iosSentTo(1) > sent);
    CHECK(fetched == 1);
  });
}

TEMPLATE_LIST_TEST_CASE("routing: a refresher that cannot give a fresh routing costs a bounded number of tries, "
                        "then the other replica is read",
                        "[storage][cluster][routing]", Setups) {
  const storage::ChainTable versions = Cluster<TestType>::chainOneAtVersion3();
  Cluster<TestType> f(&versions);
  int fetched = 0;
  storage::ClusterOptions o = f.options();
  o.maxRoutingRefreshes = 2;
  o.refreshRouting = [&f, &fetched]() -> Task<Result<storage::ChainTable>> {
    ++fetched;
    co_return f.table;  // as stale as before
  };
  f.run(o, [&f, &fetched](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    const std::vector<ClusterOutcome> outcomes = co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(fetched == 2);
    CHECK(client.stats().routingUpdates == 0);
    for (const ClusterOutcome& o : outcomes) {
      if (o.server == 0) CHECK(o.attempts == 1);  // chain 3's IOs: target 2 has no newer version
    }
    CHECK(client.serverStats(0).staleIos > 0);
    CHECK(client.stats().failedIos == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("routing: a refresher that does not answer (a manager unreachable) costs the request "
                        "deadline, then the other replica is read",
                        "[storage][cluster][routing]", Setups) {
  const storage::ChainTable versions = Cluster<TestType>::chainOneAtVersion3();
  Cluster<TestType> f(&versions);
  int fetched = 0;
  storage::ClusterOptions o = f.options();
  o.requestTimeout = 500ms;
  o.refreshRouting = [&f, &fetched]() -> Task<Result<storage::ChainTable>> {
    ++fetched;
    co_await f.reactor.sleepFor(1h);  // stopped by the deadline
    co_return f.table;
  };
  f.run(o, [&f, &fetched](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    const Clock::time_point start = Clock::now();
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(Clock::now() - start < 500ms + kSlack);
    CHECK(fetched == 1);
    CHECK(client.stats().routingRefreshes == 0);
    CHECK(client.stats().failedIos == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("routing: a server no longer named gets no request and its connection closes once idle; "
                        "named again, it is connected and read",
                        "[storage][cluster][routing]", Setups) {
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    // Server 2 leaves: chains 2 and 3 lose its targets (22, 21).
    storage::RoutingRecords records = f.table.records();
    for (storage::ChainRecord& chain : records.chains) {
      std::erase_if(chain.targets, [](const storage::TargetRecord& t) { return t.id == 21 || t.id == 22; });
      ++chain.version;
    }
    records.servers.pop_back();
    std::string why;
    const Result<storage::ChainTable> without = storage::ChainTable::assemble(records, &why);
    INFO(why);
    REQUIRE(without);
    CHECK(client.isConnected(2));
    co_await client.updateRouting(*without);
    CHECK_FALSE(client.isConnected(2));
    const std::uint64_t requests2 = client.serverStats(2).requests;
    (void)co_await f.readAll(client, wholeChunks(0, 2 * kChunks, kChunks));
    CHECK(client.serverStats(2).requests == requests2);
    // Back: the same server number, connected again, read again.
    co_await client.updateRouting(f.table);
    CHECK(client.servers() == Cluster<TestType>::kServers);
    CHECK(client.isConnected(2));
    (void)co_await f.readAll(client, wholeChunks(0, 2 * kChunks, kChunks));
    CHECK(client.serverStats(2).requests > requests2);
    CHECK(client.stats().failedIos == 0);
  });
}

#endif  // !COIO_E2E_RDMA

TEMPLATE_LIST_TEST_CASE("a server killed mid-batch: its IOs fail over to the other replicas, none is lost",
                        "[storage][cluster]", Setups) {
  // Over RDMA (two servers) the client learns of the death from the
  // request deadline; over TCP from the connection's end.
  Cluster<TestType> f;
  f.run(f.options(), [&f](typename Cluster<TestType>::Client& client) -> Task<void> {
    constexpr std::uint64_t kChunks = Cluster<TestType>::kChunks;
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    // Requests on their way to server 0 when it dies: stopped first, they
    // stay outstanding there until the kill.
    f.servers[0].signal(SIGSTOP);
    std::vector<ReadOp> ios = wholeChunks(0, 2 * kChunks, kChunks);
    auto readThenKill = [&]() -> Task<void> {
      co_await f.reactor.sleepFor(100ms);
      CHECK(client.serverStats(0).requests > 1);
      f.servers[0].kill();
    };
    auto [outcomes, unit] = co_await coio::collectAll(f.readAll(client, ios), readThenKill());
    (void)unit;
    CHECK(outcomes.size() == ios.size());
    CHECK(client.serverStats(0).failedRequests >= 1);
    CHECK(client.stats().retries >= 1);
    CHECK(client.isDown(0));
    // And after: all reads go to the survivors.
    (void)co_await f.readAll(client, wholeChunks(0, kChunks, kChunks));
    CHECK(client.stats().failedIos == 0);
  });
}
