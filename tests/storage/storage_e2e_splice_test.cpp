// The server and client end to end: the spliced data path of targets read through the page cache
// (ServerOptions::dataPath): the same bytes and checksums as the copying path, corruption still
// caught, and the failures of a splice (a file cut short or replaced, no pipe to be had, a client
// that stops reading or goes away mid-splice) answered per IO or by the connection's end, with
// nothing leaked.
#include "storage_e2e_fixture.hpp"

#include <sys/eventfd.h>

namespace {

template <typename S>
storage::ServerOptions spliceOptions(storage::DataPath path = storage::DataPath::splice) {
  storage::ServerOptions o = Fixture<S>::small();
  o.directIo = false;  // through the page cache: the path that splices
  o.dataPath = path;
  o.splicePieceSize = 2 * o.pieceSize;  // two per chunk: an IO's pieces go in runs of several pipes
  return o;
}

// Both paths' IOs: whole chunks, ranges with partial blocks at one end, both or neither, inside one
// block, across pieces, empty, and invalid ones among them.
std::vector<ReadOp> mixedReads() {
  return {{0, 0, kChunkSize, {}},         {1, 4096, 8192, {}},  {2, 100, 50, {}},      {3, 4000, 200, {}},
          {4, 16384 - 7, 16384 + 14, {}}, {5, 1, kChunkSize - 2, {}}, {6, 0, 0, {}}, {99, 0, 10, {}},
          {7, 60000, 5536, {}},           {8, 12288, 40960, {}}, {9, 32768, 32768, {}}};
}

// The pieces every request holds are back: no buffer, no pipe, no transfer in flight.
template <typename S>
void checkNothingHeld(const Fixture<S>& f) {
  CHECK(f.server->buffersInUse() == 0);
  CHECK(f.server->pipesInUse() == 0);
  CHECK(f.server->stats().transmitting == 0);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("spliced reads deliver exactly the bytes and checksums of copied ones, over TCP only",
                        "[storage][e2e][splice]", Setups) {
  for (const storage::DataPath path : {storage::DataPath::splice, storage::DataPath::copy}) {
    INFO((path == storage::DataPath::splice ? "--data-path splice" : "--data-path copy"));
    Fixture<TestType> f(spliceOptions<TestType>(path));
    f.run([path](Fixture<TestType>& fx) -> Task<void> {
      for (const bool verify : {true, false}) {
        auto client = co_await fx.client({.verifyChecksums = verify});
        const std::uint64_t before = fx.server->stats().splicedRequests;
        const std::vector<ReadOutcome> got = co_await readAndCheck(fx, *client, mixedReads());
        for (std::size_t i = 0; i < got.size(); ++i) {
          INFO("IO " << i);
          CHECK(got[i].status == (i == 7 ? IoStatus::chunkNotFound : IoStatus::ok));
        }
        // Spliced only what asks for the response CRC (that checks the blocks the server never
        // sees), over TCP, on a reactor that splices.
        const bool splices = path == storage::DataPath::splice && verify && !TestType::rdma;
        CHECK(fx.server->stats().splicedRequests - before == (splices ? 1u : 0u));
        co_await client->close();
      }
      CHECK(fx.server->stats().spliceFallbacks == 0);
    });
    checkNothingHeld(f);
  }
}

TEMPLATE_LIST_TEST_CASE("--data-path auto splices requests of IOs of 64 KiB and more, copies smaller ones; "
                        "both interleave on one connection without a torn frame",
                        "[storage][e2e][splice]", Setups) {
  Fixture<TestType> f(spliceOptions<TestType>(storage::DataPath::automatic));
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client({.verifyChecksums = true});
    // Many requests at once on one connection: whole chunks (spliced: a frame, then pipes spliced
    // into the socket) between small reads (copied: frames and bytes gathered), all through one
    // group-committed writer.
    coio::AsyncScope reads;
    std::size_t exact = 0;
    for (std::uint64_t r = 0; r < 24; ++r) {
      reads.spawn([](Fixture<TestType>& fx, storage::StorageClient<typename TestType::R>& client, std::uint64_t r,
                     std::size_t& exact) -> Task<void> {
        std::vector<ReadOp> ios;
        if (r % 2 == 0) {
          ios = {{r % kChunks, 0, kChunkSize, {}}, {(r + 1) % kChunks, 0, kChunkSize, {}}};
        } else {
          ios = {{r % kChunks, 777, 3000, {}}, {(r + 5) % kChunks, 8192, 4096, {}}};
        }
        const std::vector<ReadOutcome> got = co_await readAndCheck(fx, client, ios);
        exact += static_cast<std::size_t>(std::count_if(got.begin(), got.end(), [](const ReadOutcome& o) {
          return o.status == IoStatus::ok && !o.checksumMismatch;
        }));
      }(fx, *client, r, exact));
    }
    co_await reads.join();
    CHECK(exact == 48);
    CHECK(fx.server->stats().splicedRequests == (TestType::rdma ? 0u : 12u));
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEMPLATE_LIST_TEST_CASE("spliced: a byte corrupted on disk fails the IO on the server where its block is read "
                        "in part, and the client's CRC check where it is spliced whole; no wrong byte is ok",
                        "[storage][e2e][splice]", Setups) {
  Fixture<TestType> f(spliceOptions<TestType>());
  // As in the copying path's test: chunk 6, byte 40000, in its block 9 (36864 to 40959).
  storage::testing::flipBits(storage::ChunkStoreLayout::dataFileName(f.dir.path, 1), kChunkSize + 40000,
                             std::byte{0xFF});
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client({.verifyChecksums = true});
    const std::vector<ReadOp> ios = {{6, 0, kChunkSize, {}},   // block 9 whole, spliced: the client's check
                                     {6, 32768, 8192, {}},     // blocks 8 and 9 whole: the client's check
                                     {6, 40000, 1, {}},        // the byte itself: block 9 in part, read
                                     {6, 36864, 10, {}},       // its block's first bytes: read
                                     {6, 30000, 7000, {}},     // blocks 7 to 9, 9 in part: read
                                     {6, 36863, 1, {}},        // the byte before its block
                                     {6, 40960, 24576, {}},    // the rest of the chunk after its block
                                     {7, 0, kChunkSize, {}}};
    std::vector<std::span<std::byte>> into;
    std::vector<ReadOp> ops = ios;
    for (ReadOp& op : ops) op.into = into.emplace_back(fx.buffer(op.length));
    Result<std::vector<ReadOutcome>> got = co_await client->batchRead(ops);
    REQUIRE(got);
    if constexpr (!TestType::rdma) {
      for (std::size_t i = 0; i < 2; ++i) {
        INFO("IO " << i);
        CHECK((*got)[i].status == IoStatus::ok);  // as the server sent it: it never saw those bytes
        CHECK((*got)[i].checksumMismatch);        // the CRC from the stored ones does not match them
      }
    } else {
      for (std::size_t i = 0; i < 2; ++i) CHECK((*got)[i].status == IoStatus::corrupt);  // copied: checked
    }
    for (std::size_t i = 2; i < 5; ++i) {
      INFO("IO " << i);
      CHECK((*got)[i].status == IoStatus::corrupt);
      CHECK((*got)[i].bytes == 0);
    }
    for (std::size_t i = 5; i < ios.size(); ++i) {
      INFO("IO " << i);
      CHECK((*got)[i].status == IoStatus::ok);
      CHECK_FALSE((*got)[i].checksumMismatch);
      CHECK(storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, into[i]));
    }
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEMPLATE_LIST_TEST_CASE("spliced: bits flipped at random on disk are never delivered as ok and matching",
                        "[storage][e2e][splice]", Setups) {
  constexpr std::uint32_t kBlock = storage::kDefaultBlockSize;
  const char* given = std::getenv("COIO_TEST_SEED");
  const std::uint64_t seed = given ? std::strtoull(given, nullptr, 10) : std::random_device{}();
  std::printf("spliced, bit flips on disk: seed %llu (COIO_TEST_SEED reproduces it)\n",
              static_cast<unsigned long long>(seed));
  INFO("seed " << seed);
  Fixture<TestType> f(spliceOptions<TestType>());
  std::mt19937_64 random(seed);
  BlockSet flipped;  // flipped once each
  while (flipped.size() < 12) {
    const std::uint64_t chunk = random() % kChunks;
    const std::uint32_t offset = random() % kChunkSize;
    if (!flipped.insert({chunk, offset / kBlock}).second) continue;
    const auto where = f.server->layout().locate(chunk);
    storage::testing::flipBits(storage::ChunkStoreLayout::dataFileName(f.dir.path, where.file), where.offset + offset,
                               static_cast<std::byte>(1u << (random() % 8)));
  }
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    std::uint64_t caughtByServer = 0, caughtByClient = 0, clean = 0;
    std::span<std::byte> memory = fx.buffer(16 * kChunkSize);
    auto client = co_await fx.client({.verifyChecksums = true});
    for (int batch = 0; batch < 40; ++batch) {
      std::vector<ReadOp> ops;
      for (std::size_t i = 0; i < 16; ++i) {
        ReadOp op{random() % kChunks, 0, kChunkSize, memory.subspan(i * kChunkSize, kChunkSize)};
        if (random() % 2 == 0) {
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
        const bool covers = !blocksRead(op, flipped, kBlock).empty();
        INFO("chunk " << op.chunkId << ", offset " << op.offset << ", " << op.length << " bytes");
        if (o.status == IoStatus::ok && !o.checksumMismatch) {
          ++clean;
          CHECK_FALSE(covers);
          CHECK(storage::matchesChunkBytes(op.chunkId, op.offset, op.into.first(o.bytes)));
        } else {
          CHECK(covers);
          CHECK((o.status == IoStatus::corrupt || (o.status == IoStatus::ok && o.checksumMismatch)));
          (o.status == IoStatus::corrupt ? caughtByServer : caughtByClient) += 1;
        }
      }
    }
    std::printf("  %llu clean IOs, %llu corrupt caught by the server (blocks read in part), %llu by the client\n",
                static_cast<unsigned long long>(clean), static_cast<unsigned long long>(caughtByServer),
                static_cast<unsigned long long>(caughtByClient));
    CHECK(caughtByServer + caughtByClient > 0);
    if (!TestType::rdma) CHECK(caughtByClient > 0);  // whole chunks covering a flip: spliced
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEMPLATE_LIST_TEST_CASE("spliced: a data file cut short fails the IOs past its end (ioError), serves the others, "
                        "and keeps the connection; one replaced keeps serving the file opened",
                        "[storage][e2e][splice]", Setups) {
  Fixture<TestType> f(spliceOptions<TestType>());
  const std::filesystem::path data1 = storage::ChunkStoreLayout::dataFileName(f.dir.path, 1);  // chunks 5 to 9
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client({.verifyChecksums = true});
    const std::vector<ReadOp> warm = {{6, 0, kChunkSize, {}}, {7, 0, kChunkSize, {}}};
    const std::vector<ReadOutcome> warmed = co_await readAndCheck(fx, *client, warm);
    for (const ReadOutcome& o : warmed) CHECK(o.status == IoStatus::ok);
    // Cut inside chunk 6 (the second of data-1), 20000 bytes in: its first piece (16 KiB) is whole.
    REQUIRE(::truncate(data1.c_str(), kChunkSize + 20000) == 0);
    const std::vector<ReadOp> ios = {{5, 0, kChunkSize, {}},   // before the cut
                                     {6, 0, kChunkSize, {}},   // across it
                                     {6, 100, 10000, {}},      // before it, in the cut chunk
                                     {7, 0, kChunkSize, {}},   // past the end
                                     {7, 5000, 10, {}},        // past the end, blocks in part
                                     {0, 0, kChunkSize, {}}};  // another file
    const std::vector<ReadOutcome> got = co_await readAndCheck(fx, *client, ios);
    CHECK(got[0].status == IoStatus::ok);
    CHECK(got[1].status == IoStatus::ioError);
    CHECK(got[2].status == IoStatus::ok);
    CHECK(got[3].status == IoStatus::ioError);
    CHECK(got[4].status == IoStatus::ioError);
    CHECK(got[5].status == IoStatus::ok);
    if (!TestType::rdma) CHECK(fx.server->stats().splicedRequests >= 2);
    // Replaced: a new file renamed over the path. The server reads the file it opened, whole as it
    // was before the cut only up to the cut: what it serves is never the new file's bytes.
    const std::filesystem::path fresh = f.dir.path / "replacement";
    {
      const int fd = ::open(fresh.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      REQUIRE(fd >= 0);
      const std::vector<std::byte> garbage(5 * kChunkSize, std::byte{0x5A});
      REQUIRE(::pwrite(fd, garbage.data(), garbage.size(), 0) == static_cast<ssize_t>(garbage.size()));
      ::close(fd);
    }
    REQUIRE(::rename(fresh.c_str(), data1.c_str()) == 0);
    const std::vector<ReadOp> again = {{5, 0, kChunkSize, {}}, {6, 0, 16384, {}}, {9, 0, kChunkSize, {}}};
    const std::vector<ReadOutcome> after = co_await readAndCheck(fx, *client, again);  // exact bytes if ok
    CHECK(after[0].status == IoStatus::ok);
    CHECK(after[1].status == IoStatus::ok);
    CHECK(after[2].status == IoStatus::ioError);
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEMPLATE_LIST_TEST_CASE("spliced: with no fd left for a pipe, requests are copied instead, exactly",
                        "[storage][e2e][splice]", Setups) {
  Fixture<TestType> f(spliceOptions<TestType>());
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client({.verifyChecksums = true});
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    // The lowest free fd as the limit: every fd below it is taken, so no new one can be made.
    const int lowest = ::dup(0);
    REQUIRE(lowest >= 0);
    ::close(lowest);
    rlimit tight = saved;
    tight.rlim_cur = static_cast<rlim_t>(lowest);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
    const std::vector<ReadOutcome> got = co_await readAndCheck(fx, *client, mixedReads());
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].status == (i == 7 ? IoStatus::chunkNotFound : IoStatus::ok));
    CHECK(fx.server->stats().splicedRequests == 0);
    CHECK(fx.server->stats().spliceFallbacks == (TestType::rdma ? 0u : 1u));
    CHECK(fx.server->pipesOpen() == 0);
    // With fds again: spliced.
    const std::vector<ReadOutcome> again = co_await readAndCheck(fx, *client, mixedReads());
    for (const ReadOutcome& o : again) CHECK((o.status == IoStatus::ok || o.status == IoStatus::chunkNotFound));
    CHECK(fx.server->stats().splicedRequests == (TestType::rdma ? 0u : 1u));
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEMPLATE_LIST_TEST_CASE("spliced: a client that stops reading is dropped after the send timeout, one that goes "
                        "away mid-splice is let go; pipes come back and carry no stale byte",
                        "[storage][e2e][splice]", Setups) {
  storage::ServerOptions options = spliceOptions<TestType>();
  options.sendTimeout = 200ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto& server = *fx.server;
    if constexpr (!TestType::rdma) {
      // Stops reading: two granted requests of 64 whole chunks (4 MiB each) fill the socket buffers.
      auto raw = co_await fx.channel();
      const std::vector<storage::proto::ReadIo> whole(64, storage::proto::ReadIo{1, 0, kChunkSize, {}});
      co_await sendRaw(*raw, requestFrame(1, whole, true));
      co_await sendRaw(*raw, requestFrame(2, whole, true));
      const bool dropped = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
      CHECK(dropped);
      CHECK(server.stats().sendTimeouts == 1);
      CHECK(server.stats().splicedRequests == 2);
      co_await raw->close();
      // Goes away with a piece half spliced: read the start of the data, then close.
      auto leaving = co_await fx.channel();
      co_await sendRaw(*leaving, requestFrame(3, whole, true));
      Result<storage::IncomingFrame> first = co_await readRaw(*leaving);
      REQUIRE(first);
      CHECK(first->header.type == storage::proto::MessageType::ioData);
      std::vector<std::byte> some(1000);
      REQUIRE(co_await leaving->receiveData(some, {}));
      co_await leaving->close();
      const bool gone = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
      CHECK(gone);
    }
    const bool released = co_await eventually(fx.reactor, [&server] { return server.pipesInUse() == 0; });
    CHECK(released);
    // The pipes those requests left part full are used again: only this request's bytes come out.
    auto client = co_await fx.client({.verifyChecksums = true});
    for (int round = 0; round < 3; ++round) {
      const std::vector<ReadOutcome> got = co_await readAndCheck(fx, *client, mixedReads());
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i].status == (i == 7 ? IoStatus::chunkNotFound : IoStatus::ok));
    }
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEMPLATE_LIST_TEST_CASE("spliced: requests that wait for their grant are spliced once granted, or time out with "
                        "nothing read", "[storage][e2e][splice]", Setups) {
  storage::ServerOptions options = spliceOptions<TestType>();
  options.transmitTimeout = 100ms;
  Fixture<TestType> f(options, 1);  // the client grants one request at a time: the others are asked for
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client({.verifyChecksums = true});
    coio::AsyncScope reads;
    std::size_t exact = 0;
    for (std::uint64_t r = 0; r < 6; ++r) {
      reads.spawn([](Fixture<TestType>& fx, storage::StorageClient<typename TestType::R>& client, std::uint64_t r,
                     std::size_t& exact) -> Task<void> {
        const std::vector<ReadOp> ios = {{r, 0, kChunkSize, {}}, {r + 1, 5, kChunkSize - 10, {}}};
        const std::vector<ReadOutcome> got = co_await readAndCheck(fx, client, ios);
        exact += static_cast<std::size_t>(
            std::count_if(got.begin(), got.end(), [](const ReadOutcome& o) { return o.status == IoStatus::ok; }));
      }(fx, *client, r, exact));
    }
    co_await reads.join();
    CHECK(exact == 12);
    if (!TestType::rdma) CHECK(fx.server->stats().splicedRequests == 6);
    // Never granted: timedOut, and no pipe was taken for it.
    auto raw = co_await fx.channel();
    const std::vector<std::byte> ungranted = requestFrame(7, {{2, 0, kChunkSize, remoteOf(*raw, fx.buffer(kChunkSize))}});
    co_await sendRaw(*raw, ungranted);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    CHECK(ask->header.type == storage::proto::MessageType::transmitRequest);
    CHECK(fx.server->pipesInUse() == 0);
    std::size_t delivered = 0;
    Result<storage::IncomingFrame> reply = co_await readResponse(*raw, fx.buffer(kChunkSize), delivered);
    REQUIRE(reply);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
    REQUIRE(response);
    CHECK(response->results[0].status == IoStatus::timedOut);
    CHECK(delivered == 0);
    co_await raw->close();
    co_await client->close();
  });
  checkNothingHeld(f);
}

TEST_CASE("a target is spliced only through the page cache of a file system that splices", "[storage][splice]") {
  // The probe: a regular file splices; an eventfd (no splice_read) does not.
  TempDir dir(storage::ChunkStoreLayout{2, kChunkSize, 2});
  const int file = ::open(storage::ChunkStoreLayout::dataFileName(dir.path, 0).c_str(), O_RDONLY);
  REQUIRE(file >= 0);
  CHECK(storage::splicesFrom(file));
  ::close(file);
  const int event = ::eventfd(1, EFD_NONBLOCK);
  REQUIRE(event >= 0);
  CHECK_FALSE(storage::splicesFrom(event));
  ::close(event);
  // A target opened O_DIRECT (where the file system has it) is copied, whatever the data path.
  coio::UringReactor reactor;
  storage::ServerOptions options = spliceOptions<std::tuple_element_t<1, Setups>>();
  options.directIo = true;
  auto direct = storage::StorageServer<coio::UringReactor>::open(reactor, dir.path.string(), options);
  REQUIRE(direct);
  const bool odirect = options.directIo && (*direct)->note().find("O_DIRECT unsupported") == std::string::npos;
  INFO((*direct)->note());
  if (odirect) CHECK((*direct)->note().find("data copied") != std::string::npos);
  reactor.runUntil(shutdownServer(**direct));
  options.directIo = false;
  auto buffered = storage::StorageServer<coio::UringReactor>::open(reactor, dir.path.string(), options);
  REQUIRE(buffered);
  INFO((*buffered)->note());
  CHECK((*buffered)->note().find("spliced from the page cache") != std::string::npos);
  reactor.runUntil(shutdownServer(**buffered));
}
