// The storage server and client end to end over loopback TCP, in one
// process on one reactor (each reactor kind): reads, per-IO errors, bad
// frames, disconnects, transmission control, corruption, shutdown.
#include "storage_client.hpp"
#include "storage_server.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using storage::ReadOp;
using storage::ReadOutcome;
using storage::proto::IoStatus;

namespace {

using Reactors = std::tuple<coio::EpollReactor, coio::UringReactor>;

constexpr std::uint32_t kChunkSize = 64 * 1024;
constexpr std::uint64_t kChunks = 12;
constexpr std::size_t kTransmissionLimit = 3;

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coio-storage-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
    REQUIRE(storage::createChunkStore(path, {kChunks, kChunkSize, 5}));
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// A server on 127.0.0.1 (any port) over a fresh dataset.
template <typename R>
struct Fixture {
  explicit Fixture(storage::ServerOptions options = small(), std::size_t maxTransmissions = 64)
      : limiter(maxTransmissions) {
    auto opened = storage::StorageServer<R>::open(reactor, dir.path, options);
    INFO(opened.error().message());
    REQUIRE(opened);
    server = std::move(*opened);
    auto bound = coio::TcpListener<R>::bind(reactor, *coio::SocketAddress::parse("127.0.0.1:0"));
    REQUIRE(bound);
    listener.emplace(std::move(*bound));
    address = *listener->localAddress();
    server->serve(*listener);
  }
  static storage::ServerOptions small() {
    storage::ServerOptions o;
    o.pieceSize = 16 * 1024;  // several pieces per chunk read
    o.poolBytes = 8u << 20;
    o.maxBatchBytes = 4u << 20;
    o.transmitTimeout = 2s;
    return o;
  }
  // Runs `body(fixture)` and then shuts the server down.
  template <typename Body>
  void run(Body body) {
    reactor.runUntil(withShutdown(body(*this), *server));
  }
  // The server is shut down even when the body fails an assertion.
  static Task<void> withShutdown(Task<void> body, storage::StorageServer<R>& server) {
    std::exception_ptr failure;
    try {
      co_await std::move(body);
    } catch (...) {
      failure = std::current_exception();
    }
    co_await server.shutdown();
    if (failure) std::rethrow_exception(failure);
  }
  Task<std::unique_ptr<storage::StorageClient<R>>> client(storage::ClientOptions options = {.verifyChecksums = true}) {
    Result<std::unique_ptr<storage::StorageClient<R>>> c =
        co_await storage::StorageClient<R>::connect(reactor, address, limiter, options);
    REQUIRE(c);
    co_return std::move(*c);
  }

  TempDir dir;
  R reactor;
  storage::TransmissionLimiter limiter;
  std::optional<coio::TcpListener<R>> listener;
  std::unique_ptr<storage::StorageServer<R>> server;
  coio::SocketAddress address;
};

// Reads `ios` and checks every ok byte against the generator.
template <typename R>
Task<std::vector<ReadOutcome>> readAndCheck(storage::StorageClient<R>& client, std::vector<ReadOp> ios) {
  std::vector<std::vector<std::byte>> buffers;
  for (ReadOp& op : ios) {
    buffers.emplace_back(op.length);
    op.into = buffers.back();
  }
  Result<std::vector<ReadOutcome>> outcomes = co_await client.batchRead(ios);
  INFO(outcomes.error().message());
  REQUIRE(outcomes);
  REQUIRE(outcomes->size() == ios.size());
  for (std::size_t i = 0; i < ios.size(); ++i) {
    const ReadOutcome& o = (*outcomes)[i];
    if (o.status != IoStatus::ok) continue;
    CHECK(o.bytes == ios[i].length);
    CHECK_FALSE(o.checksumMismatch);
    CHECK(storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, std::span(buffers[i]).first(o.bytes)));
  }
  co_return std::move(*outcomes);
}

template <typename R>
Task<coio::TcpStream<R>> rawConnect(Fixture<R>& f) {
  Result<coio::TcpStream<R>> s = co_await coio::TcpStream<R>::connect(f.reactor, f.address);
  REQUIRE(s);
  co_return std::move(*s);
}

std::vector<std::byte> requestFrame(std::uint64_t id, std::vector<storage::proto::ReadIo> ios) {
  std::vector<std::byte> frame;
  storage::proto::encode(frame, id, storage::proto::BatchReadRequest{storage::proto::ChecksumMode::crc32c, std::move(ios)});
  return frame;
}

// Waits (polling the loop) until `done()` or 3 s pass.
template <typename R, typename Pred>
Task<bool> eventually(R& reactor, Pred done) {
  for (int i = 0; i < 300 && !done(); ++i) co_await reactor.sleepFor(10ms);
  co_return done();
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("batchRead returns exact bytes: single IOs, batches, unaligned and whole chunks",
                        "[storage][e2e]", Reactors) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    // One IO, unaligned, and a whole chunk (its stored CRC comes back).
    const std::vector<ReadOp> unaligned = {{3, 4097, 5000, {}}};
    std::vector<ReadOutcome> one = co_await readAndCheck(*client, unaligned);
    CHECK(one[0].status == IoStatus::ok);
    const std::vector<ReadOp> wholeChunk = {{7, 0, kChunkSize, {}}};
    std::vector<ReadOutcome> whole = co_await readAndCheck(*client, wholeChunk);
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
      std::vector<ReadOutcome> outcomes = co_await readAndCheck(*client, ios);
      for (const ReadOutcome& o : outcomes) CHECK(o.status == IoStatus::ok);
    }
    // Edges: the last byte of a chunk, an empty read, an aligned full 4 KiB.
    const std::vector<ReadOp> edgeIos = {{11, kChunkSize - 1, 1, {}}, {0, 10, 0, {}}, {4, 8192, 4096, {}}};
    std::vector<ReadOutcome> edges = co_await readAndCheck(*client, edgeIos);
    for (const ReadOutcome& o : edges) CHECK(o.status == IoStatus::ok);
    co_await client->close();
  });
  CHECK(f.server->buffersInUse() == 0);
}

TEMPLATE_LIST_TEST_CASE("invalid IOs get their own status; the rest of the batch is served", "[storage][e2e]",
                        Reactors) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    const std::vector<ReadOp> mixedIos = {
        {1, 0, 100, {}}, {kChunks, 0, 10, {}}, {2, kChunkSize - 10, 11, {}}, {2, 5, 10, {}}};
    std::vector<ReadOutcome> mixed = co_await readAndCheck(*client, mixedIos);
    CHECK(mixed[0].status == IoStatus::ok);
    CHECK(mixed[1].status == IoStatus::chunkNotFound);
    CHECK(mixed[2].status == IoStatus::rangeOutsideChunk);
    CHECK(mixed[3].status == IoStatus::ok);
    CHECK(mixed[1].bytes == 0);

    // More IOs than --max-batch, and more bytes than --max-batch-bytes.
    const std::vector<ReadOp> tooMany(257, ReadOp{0, 0, 1, {}});
    const std::vector<ReadOutcome> manyOutcomes = co_await readAndCheck(*client, tooMany);
    for (const ReadOutcome& o : manyOutcomes) CHECK(o.status == IoStatus::batchTooLarge);
    const std::vector<ReadOp> tooBig(65, ReadOp{0, 0, kChunkSize, {}});
    const std::vector<ReadOutcome> bigOutcomes = co_await readAndCheck(*client, tooBig);
    for (const ReadOutcome& o : bigOutcomes) CHECK(o.status == IoStatus::batchTooLarge);
    // The connection is still good.
    const std::vector<ReadOp> small = {{1, 1, 1, {}}};
    const std::vector<ReadOutcome> after = co_await readAndCheck(*client, small);
    CHECK(after[0].status == IoStatus::ok);
    co_await client->close();
  });
}

TEMPLATE_LIST_TEST_CASE("bad frames get an Error frame and a close; other clients keep being served",
                        "[storage][e2e]", Reactors) {
  using storage::proto::ProtocolErrc;
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    auto header = [](std::uint32_t magic, std::uint16_t type, std::uint32_t length) {
      std::vector<std::byte> h;
      storage::proto::detail::Writer w(h);
      w.put(magic);
      w.put(storage::proto::kVersion);
      w.put(type);
      w.put(std::uint64_t{42});
      w.put(length);
      w.put(std::uint32_t{0});
      return h;
    };
    std::vector<std::byte> truncated = requestFrame(9, {{1, 0, 10, {}}, {1, 0, 10, {}}});
    truncated[16] = std::byte{8 + 32};  // payloadLength says one IO; ioCount says two
    truncated.resize(24 + 8 + 32);
    std::vector<std::byte> unexpectedGrant;
    storage::proto::encodeEmpty(unexpectedGrant, storage::proto::MessageType::transmitGrant, 77);
    const std::vector<std::pair<std::vector<std::byte>, ProtocolErrc>> cases = {
        {header(0x12345678, 1, 0), ProtocolErrc::badMagic},
        {header(storage::proto::kMagic, 9, 0), ProtocolErrc::unknownType},
        {header(storage::proto::kMagic, 1, 0xFFFFFFFF), ProtocolErrc::payloadTooLarge},
        {truncated, ProtocolErrc::truncated},
        {unexpectedGrant, ProtocolErrc::unexpectedMessage},
    };
    for (const auto& [bytes, expected] : cases) {
      coio::TcpStream<TestType> raw = co_await rawConnect(fx);
      const Result<void> written = co_await raw.writeAll(bytes);
      REQUIRE(written);
      storage::ReadFailure failure;
      Result<storage::IncomingFrame> frame = co_await storage::readFrame(raw, failure, {});
      REQUIRE(frame);
      REQUIRE(frame->header.type == storage::proto::MessageType::error);
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == expected);
      CHECK(frame->header.requestId == (expected == ProtocolErrc::badMagic ? 0u : expected == ProtocolErrc::truncated ? 9u : expected == ProtocolErrc::unexpectedMessage ? 77u : 42u));
      Result<storage::IncomingFrame> after = co_await storage::readFrame(raw, failure, {});
      CHECK(after.error() == coio::Errc::eof);  // and then it closes
      const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
      const std::vector<ReadOutcome> served = co_await readAndCheck(*good, probe);
      CHECK(served[0].status == IoStatus::ok);
    }
    CHECK(fx.server->stats().protocolErrors == cases.size());
    co_await good->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a client that disconnects mid-request gets every buffer freed", "[storage][e2e]",
                        Reactors) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    {
      coio::TcpStream<TestType> raw = co_await rawConnect(fx);
      const std::vector<std::byte> request = requestFrame(1, {{1, 0, kChunkSize, {}}, {2, 3, 40000, {}}});
      const Result<void> written = co_await raw.writeAll(request);
      REQUIRE(written);
      storage::ReadFailure failure;
      Result<storage::IncomingFrame> frame = co_await storage::readFrame(raw, failure, {});
      REQUIRE(frame);
      CHECK(frame->header.type == storage::proto::MessageType::transmitRequest);
      CHECK(fx.server->buffersInUse() > 0);  // read and waiting for our grant
    }  // closed without granting
    auto& server = *fx.server;
    const bool closed = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(closed);
    CHECK(server.buffersInUse() == 0);
  });
}

TEMPLATE_LIST_TEST_CASE("a client that never grants times out; its buffers are released", "[storage][e2e]",
                        Reactors) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.transmitTimeout = 100ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    coio::TcpStream<TestType> raw = co_await rawConnect(fx);
    const std::vector<std::byte> request = requestFrame(5, {{1, 0, 100, {}}, {2, 0, 200, {}}});
    Result<void> written = co_await raw.writeAll(request);
    REQUIRE(written);
    storage::ReadFailure failure;
    Result<storage::IncomingFrame> ask = co_await storage::readFrame(raw, failure, {});
    REQUIRE(ask);
    CHECK(ask->header.type == storage::proto::MessageType::transmitRequest);
    Result<storage::IncomingFrame> reply = co_await storage::readFrame(raw, failure, {});
    REQUIRE(reply);
    REQUIRE(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 2);
    REQUIRE(response);
    for (const auto& r : response->results) {
      CHECK(r.status == IoStatus::timedOut);
      CHECK(r.bytes == 0);
    }
    CHECK(fx.server->buffersInUse() == 0);
    CHECK(fx.server->stats().transmitTimeouts == 1);
    // A grant that crossed the timedOut response is not an error.
    std::vector<std::byte> late;
    storage::proto::encodeEmpty(late, storage::proto::MessageType::transmitGrant, 5);
    written = co_await raw.writeAll(late);
    REQUIRE(written);
    const std::vector<std::byte> next = requestFrame(6, {{1, 0, 100, {}}});
    written = co_await raw.writeAll(next);
    REQUIRE(written);
    Result<storage::IncomingFrame> again = co_await storage::readFrame(raw, failure, {});
    REQUIRE(again);
    CHECK(again->header.type == storage::proto::MessageType::transmitRequest);
    CHECK(again->header.requestId == 6);
  });
}

TEMPLATE_LIST_TEST_CASE("the transmission limit is never exceeded, across 64 concurrent clients",
                        "[storage][e2e]", Reactors) {
  Fixture<TestType> f(Fixture<TestType>::small(), kTransmissionLimit);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    std::vector<std::unique_ptr<storage::StorageClient<TestType>>> clients;
    for (int c = 0; c < 64; ++c) clients.push_back(co_await fx.client());
    std::vector<Task<std::vector<ReadOutcome>>> reads;
    for (std::size_t c = 0; c < clients.size(); ++c) {
      for (std::uint32_t r = 0; r < 3; ++r) {
        std::vector<ReadOp> ios = {{(c + r) % kChunks, r * 1000, 20000, {}}, {c % kChunks, 7, 3, {}}};
        reads.push_back(readAndCheck(*clients[c], std::move(ios)));
      }
    }
    const std::vector<std::vector<ReadOutcome>> all = co_await coio::collectAllRange(std::move(reads));
    for (const auto& outcomes : all) {
      for (const ReadOutcome& o : outcomes) CHECK(o.status == IoStatus::ok);
    }
    CHECK(fx.server->stats().maxTransmitting <= kTransmissionLimit);
    CHECK(fx.server->stats().maxTransmitting >= 1);
    for (auto& c : clients) co_await c->close();
  });
  CHECK(f.server->buffersInUse() == 0);
}

TEMPLATE_LIST_TEST_CASE("a byte corrupted on disk shows as a checksum mismatch", "[storage][e2e]", Reactors) {
  Fixture<TestType> f;
  // Chunk 6 is the second chunk of data-1 (5 chunks per file).
  const int fd = ::open(storage::ChunkStoreLayout::dataFileName(f.dir.path, 1).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  const std::byte flipped = ~storage::chunkByte(6, 1234);
  REQUIRE(::pwrite(fd, &flipped, 1, kChunkSize + 1234) == 1);
  ::close(fd);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    std::vector<std::byte> a(kChunkSize), b(kChunkSize);
    std::vector<ReadOp> ios = {{6, 0, kChunkSize, a}, {7, 0, kChunkSize, b}};
    Result<std::vector<ReadOutcome>> outcomes = co_await client->batchRead(ios);
    REQUIRE(outcomes);
    CHECK((*outcomes)[0].status == IoStatus::ok);
    CHECK((*outcomes)[0].checksumMismatch);
    CHECK_FALSE((*outcomes)[1].checksumMismatch);
    CHECK_FALSE(storage::matchesChunkBytes(6, 0, a));
    co_await client->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a server shut down under load fails its clients' requests, no hang", "[storage][e2e]",
                        Reactors) {
  Fixture<TestType> f;
  f.reactor.runUntil([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    std::vector<std::vector<std::byte>> buffers(32, std::vector<std::byte>(kChunkSize));
    auto reader = [](storage::StorageClient<TestType>& c, std::span<std::byte> into) -> Task<Result<std::size_t>> {
      std::size_t done = 0;
      for (;;) {
        const ReadOp op{1, 0, kChunkSize, into};
        Result<std::vector<ReadOutcome>> r = co_await c.batchRead(std::span(&op, 1));
        if (!r) co_return r.error();
        ++done;
      }
    };
    auto stopLater = [](Fixture<TestType>& self) -> Task<Result<std::size_t>> {
      co_await self.reactor.sleepFor(50ms);
      co_await self.server->shutdown();
      co_return std::size_t{0};
    };
    std::vector<Task<Result<std::size_t>>> tasks;
    for (auto& b : buffers) tasks.push_back(reader(*client, b));
    tasks.push_back(stopLater(fx));
    std::vector<Result<std::size_t>> results = co_await coio::collectAllRange(std::move(tasks));
    for (std::size_t i = 0; i + 1 < results.size(); ++i) CHECK_FALSE(results[i]);
    CHECK(client->failure());
    CHECK(fx.server->buffersInUse() == 0);
    co_await client->close();
  }(f));
}
