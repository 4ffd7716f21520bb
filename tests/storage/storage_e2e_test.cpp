// The storage server and client end to end, in one process on one reactor
// (each reactor kind): reads, per-IO errors, bad frames, disconnects,
// transmission control, limits, corruption, shutdown. Built twice: over
// loopback TCP (host suite) and, with COIO_E2E_RDMA, over RDMA (label
// `rdma`: runs where a device exists, e.g. the Soft-RoCE guest).
#include "e2e_support.hpp"
#include "client/storage_client.hpp"
#include "server/storage_server.hpp"
#if COIO_E2E_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include "../killed_at_end.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <catch2/catch.hpp>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using storage::ReadOp;
using storage::ReadOutcome;
using storage::proto::IoStatus;

namespace {

using storage::testing::Setups;
using storage::testing::TempDir;

constexpr std::uint32_t kChunkSize = 64 * 1024;
constexpr std::uint64_t kChunks = 12;
constexpr std::size_t kTransmissionLimit = 3;

// A server on 127.0.0.1 (any port) over a fresh dataset, serving over the
// setup's transport. Clients' IOs land in `arena` (registered by every
// RDMA client; buffer() hands out pieces of it).
template <typename S>
struct Fixture {
  using R = typename S::R;
  // Serves `layout` as target 0, and each of `moreTargets` (an id and a
  // layout) from a directory of its own.
  explicit Fixture(storage::ServerOptions options = small(), std::size_t maxTransmissions = 64,
                   storage::ChunkStoreLayout layout = {kChunks, kChunkSize, 5},
                   const std::vector<std::pair<std::uint32_t, storage::ChunkStoreLayout>>& moreTargets = {})
      : dir(layout), arena(8u << 20), limiter(maxTransmissions) {
    std::vector<storage::TargetSpec> targets = {{0, dir.path.string()}};
    for (const auto& [id, shape] : moreTargets) {
      moreDirs.push_back(std::make_unique<TempDir>(shape));
      targets.push_back({id, moreDirs.back()->path.string()});
    }
    auto opened = storage::StorageServer<R>::open(reactor, targets, options);
    INFO(opened.error().message());
    REQUIRE(opened);
    server = std::move(*opened);
#if COIO_E2E_RDMA
    std::string why;
    auto dev = coio::rdma::Device::open({.name = deviceName()}, &why);
    INFO(dev.error().message() << ": " << why);
    REQUIRE(dev);  // no device is a failure here, never a skip
    device = std::move(*dev);
    auto transport = storage::RdmaTransport<R>::create(reactor, *device, server->bufferMemory(), 256);
    REQUIRE(transport);
    server->useTransport(std::move(*transport));
#endif
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
  // A channel of the setup's transport connected to `to`, its memory registered.
  Task<Result<std::unique_ptr<storage::Channel<R>>>> connectChannel(coio::SocketAddress to, std::stop_token stop = {}) {
    Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, to, stop);
    if (!stream) co_return stream.error();
#if COIO_E2E_RDMA
    Result<std::unique_ptr<storage::Channel<R>>> c =
        co_await storage::RdmaChannel<R>::connect(reactor, *device, std::move(*stream), std::move(stop), 10s);
    if (!c) co_return c.error();
    const Result<void> registered = (*c)->registerMemory(arena);
    if (!registered) {
      co_await (*c)->close();
      co_return registered.error();
    }
    co_return std::move(*c);
#else
    co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)));
#endif
  }
  // The server's end of a channel over an accepted stream (a stand-in server's).
  Task<Result<std::unique_ptr<storage::Channel<R>>>> acceptChannel(coio::TcpStream<R> stream) {
#if COIO_E2E_RDMA
    co_return co_await storage::RdmaChannel<R>::connect(reactor, *device, std::move(stream), {}, 10s);
#else
    co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<storage::TcpChannel<R>>(std::move(stream)));
#endif
  }
  // A connected channel to the server.
  Task<std::unique_ptr<storage::Channel<R>>> channel() {
    Result<std::unique_ptr<storage::Channel<R>>> c = co_await connectChannel(address);
    INFO(c.error().message());
    REQUIRE(c);
    co_return std::move(*c);
  }
  // A client that reconnects after an idle close, to the server (or to `to`).
  Task<std::unique_ptr<storage::StorageClient<R>>> client(storage::ClientOptions options = {.verifyChecksums = true},
                                                          std::optional<coio::SocketAddress> to = {}) {
    const coio::SocketAddress target = to.value_or(address);
    Result<std::unique_ptr<storage::StorageClient<R>>> c = co_await storage::StorageClient<R>::connect(
        [this, target](std::stop_token stop) { return connectChannel(target, std::move(stop)); }, limiter, options);
    INFO(c.error().message());
    REQUIRE(c);
    co_return std::move(*c);
  }
  // `n` bytes of the arena, 64-byte aligned.
  std::span<std::byte> buffer(std::size_t n) {
    const std::size_t at = (used + 63) / 64 * 64;
    REQUIRE(at + n <= arena.size());
    used = at + n;
    return std::span(arena).subspan(at, n);
  }
#if COIO_E2E_RDMA
  static std::string deviceName() {
    const char* name = std::getenv("COIO_RDMA_DEVICE");
    return name ? name : "";
  }
#endif

  TempDir dir;
  std::vector<std::unique_ptr<TempDir>> moreDirs;
  std::vector<std::byte> arena;  // before the reactor: registrations of it die with the channels
  std::size_t used = 0;
#if COIO_E2E_RDMA
  std::unique_ptr<coio::rdma::Device> device;  // outlives the reactor's queue pairs
#endif
  R reactor;
  storage::TransmissionLimiter limiter;
  std::optional<coio::TcpListener<R>> listener;
  std::unique_ptr<storage::StorageServer<R>> server;
  coio::SocketAddress address;
};

// Reads `ios` (into the fixture's arena) and checks every ok byte against the generator.
template <typename S, typename Client>
Task<std::vector<ReadOutcome>> readAndCheck(Fixture<S>& fx, Client& client, std::vector<ReadOp> ios) {
  std::vector<std::span<std::byte>> buffers;
  for (ReadOp& op : ios) {
    buffers.push_back(fx.buffer(op.length));
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
    CHECK(storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, buffers[i].first(o.bytes)));
  }
  co_return std::move(*outcomes);
}

// Sends raw frames on a channel (no client logic in between).
template <typename Channel>
Task<void> sendRaw(Channel& channel, std::span<const std::byte> frame) {
  const Result<void> sent = co_await channel.send(frame, {});
  REQUIRE(sent);
}

template <typename Channel>
Task<Result<storage::IncomingFrame>> readRaw(Channel& channel) {
  storage::ReadFailure failure;
  co_return co_await channel.readFrame(failure, {});
}

// The next BatchReadResponse on `channel`; before it, IoData pieces (TCP)
// of a one-IO request are read into `into` (checked in order), `delivered`
// counting their bytes.
template <typename Channel>
Task<Result<storage::IncomingFrame>> readResponse(Channel& channel, std::span<std::byte> into, std::size_t& delivered) {
  for (;;) {
    Result<storage::IncomingFrame> frame = co_await readRaw(channel);
    if (!frame || frame->header.type != storage::proto::MessageType::ioData) co_return frame;
    auto piece = storage::proto::decodeIoData(frame->payload);
    REQUIRE(piece);
    REQUIRE(piece->ioIndex == 0);
    REQUIRE(piece->offset == delivered);
    REQUIRE(delivered + piece->length <= into.size());
    const Result<void> got = co_await channel.receiveData(into.subspan(delivered, piece->length), {});
    REQUIRE(got);
    delivered += piece->length;
  }
}

// The ReadIo::remote field for `into` on `channel` (zero over TCP).
template <typename Channel>
storage::proto::RemoteBuffer remoteOf(Channel& channel, std::span<std::byte> into) {
  Result<storage::proto::RemoteBuffer> remote = channel.remoteBuffer(into);
  REQUIRE(remote);
  return *remote;
}

// Not granted unless asked: most of these tests drive the TransmitRequest /
// TransmitGrant exchange themselves.
std::vector<std::byte> requestFrame(std::uint64_t id, std::vector<storage::proto::ReadIo> ios, bool granted = false) {
  std::vector<std::byte> frame;
  storage::proto::encode(frame, id,
                         storage::proto::BatchReadRequest{storage::proto::ChecksumMode::crc32c, granted, std::move(ios)});
  return frame;
}

// Waits (polling the loop) until `done()` or 3 s pass.
template <typename R, typename Pred>
Task<bool> eventually(R& reactor, Pred done) {
  for (int i = 0; i < 300 && !done(); ++i) co_await reactor.sleepFor(10ms);
  co_return done();
}

template <typename R>
Task<void> shutdownServer(storage::StorageServer<R>& server) {
  co_await server.shutdown();
}

// Runs while the server drains: request 2 must be answered unavailable,
// granted request 1 must deliver its data, then the server closes.
template <typename S>
Task<void> grantWhileDraining(Fixture<S>& fx, storage::Channel<typename S::R>& channel, std::span<std::byte> data) {
  co_await fx.reactor.sleepFor(20ms);
  const std::vector<std::byte> request = requestFrame(2, {{4, 0, 10, remoteOf(channel, fx.buffer(10))}});
  co_await sendRaw(channel, request);
  std::vector<std::byte> grant;
  storage::proto::encodeEmpty(grant, storage::proto::MessageType::transmitGrant, 1);
  co_await sendRaw(channel, grant);
  bool sawUnavailable = false, sawData = false;
  std::size_t delivered = 0;  // of request 1 (request 2 has no data)
  for (int responses = 0; responses < 2; ++responses) {
    Result<storage::IncomingFrame> reply = co_await readResponse(channel, data, delivered);
    REQUIRE(reply);
    REQUIRE(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
    REQUIRE(response);
    const storage::proto::IoResult result = response->results.at(0);
    if (reply->header.requestId == 2) {
      sawUnavailable = result.status == IoStatus::unavailable;
    } else {
      REQUIRE(result.status == IoStatus::ok);
      REQUIRE(result.bytes == data.size());
      if (!S::rdma) REQUIRE(delivered == data.size());
      sawData = storage::matchesChunkBytes(3, 100, data) && storage::crc32c(data) == result.checksum;
    }
  }
  CHECK(sawUnavailable);
  CHECK(sawData);
  Result<storage::IncomingFrame> end = co_await readRaw(channel);
  CHECK(end.error() == coio::Errc::eof);  // drained: the server closes
}

}  // namespace

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

TEMPLATE_LIST_TEST_CASE("bad frames get an Error frame and a close; other clients keep being served",
                        "[storage][e2e]", Setups) {
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
    truncated[16] = std::byte{8 + storage::proto::kIoSize};  // payloadLength says one IO; ioCount says two
    truncated.resize(storage::proto::kHeaderSize + 8 + storage::proto::kIoSize);
    std::vector<std::byte> unexpectedGrant;
    storage::proto::encodeEmpty(unexpectedGrant, storage::proto::MessageType::transmitGrant, 77);
    std::vector<std::byte> versionThree = requestFrame(5, {{1, 0, 10, {}}});
    versionThree[4] = std::byte{3};  // a version 3 peer: its IOs carry no chain version
    // An ioCount no payload could hold (over 26,214; 408 over RDMA), with a
    // payload far shorter than it implies: the count is checked first.
    std::vector<std::byte> tooMany = requestFrame(12, {});
    tooMany[storage::proto::kHeaderSize + 4] = std::byte{0xFF};
    tooMany[storage::proto::kHeaderSize + 5] = std::byte{0xFF};
    tooMany[storage::proto::kHeaderSize + 6] = std::byte{0xFF};
    std::vector<std::byte> reservedHeader = header(storage::proto::kMagic, 1, 0);
    reservedHeader[20] = std::byte{1};
    // TransmitRequest (a server's) and TransmitGrant carry nothing.
    std::vector<std::byte> grantWithPayload = header(storage::proto::kMagic, 3, 4);
    grantWithPayload.resize(grantWithPayload.size() + 4);
    std::vector<std::byte> askWithPayload = header(storage::proto::kMagic, 2, 4);
    askWithPayload.resize(askWithPayload.size() + 4);
    std::vector<std::byte> serverAsk;  // a valid frame in the wrong direction
    storage::proto::encodeEmpty(serverAsk, storage::proto::MessageType::transmitRequest, 13);
    // Each frame, the error it gets, and the requestId the Error frame carries.
    const std::vector<std::tuple<std::vector<std::byte>, ProtocolErrc, std::uint64_t>> cases = {
        {header(0x12345678, 1, 0), ProtocolErrc::badMagic, 0},
        {header(storage::proto::kMagic, 9, 0), ProtocolErrc::unknownType, 42},
        {header(storage::proto::kMagic, 1, 0xFFFFFFFF), ProtocolErrc::payloadTooLarge, 42},
        {truncated, ProtocolErrc::truncated, 9},
        {unexpectedGrant, ProtocolErrc::unexpectedMessage, 77},
        {versionThree, ProtocolErrc::unsupportedVersion, 5},
        {tooMany, ProtocolErrc::tooManyIos, 12},
        {reservedHeader, ProtocolErrc::reservedNotZero, 42},
        {grantWithPayload, ProtocolErrc::trailingBytes, 42},
        {askWithPayload, ProtocolErrc::trailingBytes, 42},
        {serverAsk, ProtocolErrc::unexpectedMessage, 13},
    };
    for (const auto& [bytes, expected, id] : cases) {
      auto raw = co_await fx.channel();
      co_await sendRaw(*raw, bytes);
      Result<storage::IncomingFrame> frame = co_await readRaw(*raw);
      REQUIRE(frame);
      REQUIRE(frame->header.type == storage::proto::MessageType::error);
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == expected);
      CHECK(frame->header.requestId == id);
      Result<storage::IncomingFrame> after = co_await readRaw(*raw);
      CHECK(after.error() == coio::Errc::eof);  // and then it closes
      co_await raw->close();
      const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
      const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *good, probe);
      CHECK(served[0].status == IoStatus::ok);
    }
    CHECK(fx.server->stats().protocolErrors == cases.size());
    co_await good->close();
  });
}

// PROTOCOL.md, "Rules a receiver enforces": each rule, as the server keeps it.
TEMPLATE_LIST_TEST_CASE("protocol rules: a requestId already in flight, a grant for a granted request, an Error "
                        "from the client",
                        "[storage][e2e]", Setups) {
  using storage::proto::MessageType;
  using storage::proto::ProtocolErrc;
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    // The Error frame for `id` that ends a connection, after any other frames; then the close.
    auto expectError = [](storage::Channel<typename TestType::R>& raw, ProtocolErrc code,
                          std::uint64_t id) -> Task<void> {
      Result<storage::IncomingFrame> frame = co_await readRaw(raw);
      while (frame && frame->header.type != MessageType::error) frame = co_await readRaw(raw);
      REQUIRE(frame);
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == code);
      CHECK(frame->header.requestId == id);
      Result<storage::IncomingFrame> after = co_await readRaw(raw);
      CHECK(after.error() == coio::Errc::eof);
    };
    {  // The same requestId while the first is in flight (waiting for its grant).
      auto raw = co_await fx.channel();
      const std::vector<std::byte> request = requestFrame(7, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}});
      co_await sendRaw(*raw, request);
      Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
      REQUIRE(ask);
      CHECK(ask->header.type == MessageType::transmitRequest);
      co_await sendRaw(*raw, request);
      co_await expectError(*raw, ProtocolErrc::unexpectedMessage, 7);
      co_await raw->close();
    }
    {  // A TransmitGrant for a request sent granted: none was asked for.
      auto raw = co_await fx.channel();
      // Frames built before the co_await: g++ 12 cannot keep an initializer list's array across one.
      const std::vector<std::byte> request = requestFrame(8, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}}, true);
      co_await sendRaw(*raw, request);
      std::vector<std::byte> grant;
      storage::proto::encodeEmpty(grant, MessageType::transmitGrant, 8);
      co_await sendRaw(*raw, grant);
      co_await expectError(*raw, ProtocolErrc::unexpectedMessage, 8);
      co_await raw->close();
    }
    const std::uint64_t protocolErrors = fx.server->stats().protocolErrors;
    CHECK(protocolErrors == 2);
    {  // An Error frame from the client: the server closes without answering.
      auto raw = co_await fx.channel();
      std::vector<std::byte> error;
      storage::proto::encode(error, 9, storage::proto::ErrorFrame{ProtocolErrc::idleTimeout, "giving up"});
      co_await sendRaw(*raw, error);
      Result<storage::IncomingFrame> after = co_await readRaw(*raw);
      CHECK(after.error() == coio::Errc::eof);
      co_await raw->close();
      CHECK(fx.server->stats().protocolErrors == protocolErrors);  // not the client's protocol error
    }
  });
}

TEMPLATE_LIST_TEST_CASE("nothing to read, no TransmitRequest: ioCount 0, zero-length and invalid IOs are answered "
                        "at once",
                        "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    const std::vector<std::byte> none = requestFrame(1, {});
    co_await sendRaw(*raw, none);
    Result<storage::IncomingFrame> empty = co_await readRaw(*raw);
    REQUIRE(empty);
    CHECK(empty->header.type == storage::proto::MessageType::batchReadResponse);
    CHECK(empty->header.requestId == 1);
    auto noResults = storage::proto::decodeBatchReadResponse(empty->payload, 0);
    REQUIRE(noResults);
    CHECK(noResults->results.empty());
    // A zero-length IO of a chunk it holds, and one of a chunk it does not.
    const std::vector<std::byte> nothingToRead =
        requestFrame(2, {{3, 100, 0, remoteOf(*raw, fx.buffer(1))}, {999, 0, 10, {}}});
    co_await sendRaw(*raw, nothingToRead);
    Result<storage::IncomingFrame> reply = co_await readRaw(*raw);
    REQUIRE(reply);
    CHECK(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 2);
    REQUIRE(response);
    CHECK(response->results[0].status == IoStatus::ok);
    CHECK(response->results[0].bytes == 0);
    CHECK(response->results[0].checksum == 0);  // the CRC32C of no bytes
    CHECK(response->results[1].status == IoStatus::chunkNotFound);
    co_await raw->close();
  });
}

#if !COIO_E2E_RDMA  // over RDMA the remote buffer is where the data goes
TEMPLATE_LIST_TEST_CASE("over TCP an IO's remote buffer is not read: any value is served", "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    const storage::proto::RemoteBuffer junk{0xdeadbeef000, 1, 77};  // 1 byte: too small, were it read
    const std::vector<std::byte> request = requestFrame(3, {{2, 0, 100, junk}}, true);
    co_await sendRaw(*raw, request);
    std::vector<std::byte> data(100);
    std::size_t delivered = 0;
    Result<storage::IncomingFrame> reply = co_await readResponse(*raw, data, delivered);
    REQUIRE(reply);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
    REQUIRE(response);
    CHECK(response->results[0].status == IoStatus::ok);
    CHECK(delivered == 100);
    CHECK(storage::matchesChunkBytes(2, 0, data));
    co_await raw->close();
  });
}
#endif

TEMPLATE_LIST_TEST_CASE("a client that disconnects mid-request gets every buffer freed", "[storage][e2e]",
                        Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto& server = *fx.server;
    {
      // Granted with their requests, more data than the pool and the socket
      // buffers together hold (4 × 3 MiB; pool 8 MiB), and never read: over
      // TCP the server's sends stall with the buffers.
      auto raw = co_await fx.channel();
      const std::span<std::byte> into = fx.buffer(kChunkSize);  // shared: its contents do not matter here
      for (std::uint64_t id = 1; id <= 4; ++id) {
        std::vector<storage::proto::ReadIo> ios;
        for (std::uint64_t i = 0; i < 48; ++i) ios.push_back({i % kChunks, 0, kChunkSize, remoteOf(*raw, into)});
        co_await sendRaw(*raw, requestFrame(id, std::move(ios), true));
      }
      co_await eventually(fx.reactor, [&server] { return server.buffersInUse() > 0; });
      co_await fx.reactor.sleepFor(100ms);  // the sends stall
      if (!TestType::rdma) CHECK(server.buffersInUse() > 0);  // RDMA writes need nothing of the client: may be done
      co_await raw->close();
    }
    const bool closed = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(closed);
    CHECK(server.buffersInUse() == 0);
  });
}

#if COIO_E2E_RDMA
// A forked child's own device (not the parent's context); exit code 2 if none.
template <typename S>
std::unique_ptr<coio::rdma::Device> childDevice() {
  auto device = coio::rdma::Device::open({.name = Fixture<S>::deviceName()});
  if (!device) ::_exit(2);
  return std::move(*device);
}
#endif

// In a forked child, with its own reactor (and device): connects a channel
// of the setup's transport to `address`, writes a byte to `ready`, then
// waits to be killed. Never returns; no Catch2 here (exit codes instead).
template <typename S>
[[noreturn]] void runDoomedClient(coio::SocketAddress address, int ready) {
  using R = typename S::R;
#if COIO_E2E_RDMA
  const std::unique_ptr<coio::rdma::Device> device = childDevice<S>();
#endif
  R reactor;
  auto connectThenWait = [&](R& r) -> Task<void> {
    Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, address);
    if (!stream) ::_exit(3);
#if COIO_E2E_RDMA
    Result<std::unique_ptr<storage::Channel<R>>> channel =
        co_await storage::RdmaChannel<R>::connect(r, *device, std::move(*stream), {}, 10s);
    if (!channel) ::_exit(4);
#endif
    const char byte = 1;
    if (::write(ready, &byte, 1) != 1) ::_exit(5);
    for (;;) ::pause();  // connected, silent, until SIGKILL
  };
  reactor.runUntil(connectThenWait(reactor));
  ::_exit(6);
}

TEMPLATE_LIST_TEST_CASE("a client process killed while connected is dropped at once", "[storage][e2e]", Setups) {
  // Over RDMA an idle queue pair never learns that its peer died: the
  // server watches the bootstrap TCP stream, which the kernel closes.
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    int pipeFds[2];
    REQUIRE(::pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) == 0);
    coio::detail::FileDescriptor readyRead(pipeFds[0]), readyWrite(pipeFds[1]);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) runDoomedClient<TestType>(fx.address, readyWrite.get());
    readyWrite.reset();
    // The server (this loop) serves the child's handshake meanwhile.
    const Result<void> readable = co_await fx.reactor.readable(readyRead.get());
    char byte = 0;
    const bool connected = readable && ::read(readyRead.get(), &byte, 1) == 1;
    fx.reactor.forget(readyRead.get());
    auto& server = *fx.server;
    // The child's side of the handshake may finish before the server's
    // (same loop, next events): wait for the server to count it.
    bool whileAlive = false;
    if (connected) whileAlive = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 1; });
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(connected);  // else the child exited early: its exit code says where
    CHECK(whileAlive);
    CHECK(WIFSIGNALED(status));
    const bool dropped = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(dropped);
  });
}

// In a forked child, with its own reactor (and device): serves `dir` on
// 127.0.0.1 (any port) over the setup's transport, writes the port to
// `ready`, then serves until killed. Never returns; no Catch2 here.
template <typename S>
[[noreturn]] void runDoomedServer(const std::filesystem::path& dir, int ready) {
  using R = typename S::R;
#if COIO_E2E_RDMA
  const std::unique_ptr<coio::rdma::Device> device = childDevice<S>();
#endif
  R reactor;
  auto server = storage::StorageServer<R>::open(reactor, dir.string(), Fixture<S>::small());
  if (!server) ::_exit(3);
#if COIO_E2E_RDMA
  auto transport = storage::RdmaTransport<R>::create(reactor, *device, (*server)->bufferMemory(), 256);
  if (!transport) ::_exit(4);
  (*server)->useTransport(std::move(*transport));
#endif
  auto listener = coio::TcpListener<R>::bind(reactor, coio::SocketAddress::loopbackV4());
  if (!listener) ::_exit(5);
  (*server)->serve(*listener);
  const std::uint16_t port = listener->localAddress()->port();
  if (::write(ready, &port, sizeof port) != sizeof port) ::_exit(6);
  reactor.runUntil([](R& r) -> Task<void> {
    for (;;) co_await r.sleepFor(1h);  // serving, until SIGKILL
  }(reactor));
  ::_exit(7);
}

#if COIO_E2E_RDMA
// How many memory regions this process has registered, as the kernel counts
// them (iproute2's `rdma resource show mr`); -1 if that cannot be run.
int registeredRegions() {
  FILE* rdma = ::popen("rdma -j resource show mr", "r");
  if (!rdma) return -1;
  std::string out;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, rdma)) > 0;) out.append(buffer, n);
  if (::pclose(rdma) != 0) return -1;
  const std::string mine = "\"pid\":" + std::to_string(::getpid());
  int count = 0;
  for (std::size_t at = out.find(mine); at != std::string::npos; at = out.find(mine, at + 1)) {
    const std::size_t end = at + mine.size();
    count += end == out.size() || std::isdigit(static_cast<unsigned char>(out[end])) == 0;
  }
  return count;
}
#endif

TEMPLATE_LIST_TEST_CASE("a server process killed under load: every request ends in time, no memory stays registered",
                        "[storage][e2e]", Setups) {
  // Over RDMA the client learns it from the transport (work the dead server
  // never acknowledges fails within transportFailureBound()) or from a
  // request's timeout; either way every request ends within its timeout,
  // and a timed-out one is retried until the connection fails.
  using Clock = std::chrono::steady_clock;
  constexpr auto kSlack = 2s;  // a TCG guest on a loaded host
  Fixture<TestType> f;
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    int pipeFds[2];
    REQUIRE(::pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) == 0);
    coio::detail::FileDescriptor readyRead(pipeFds[0]), readyWrite(pipeFds[1]);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) runDoomedServer<TestType>(fx.dir.path, readyWrite.get());
    readyWrite.reset();
    const coio::testing::KilledAtEnd reap(child);
    const Result<void> readable = co_await fx.reactor.readable(readyRead.get());
    std::uint16_t port = 0;
    const bool serving = readable && ::read(readyRead.get(), &port, sizeof port) == sizeof port;
    fx.reactor.forget(readyRead.get());
    REQUIRE(serving);  // else the child exited early: its exit code says where
#if COIO_E2E_RDMA
    const int registeredBefore = registeredRegions();
    REQUIRE(registeredBefore > 0);  // the fixture's own server: the count works
#endif
    const storage::ClientOptions options{.timeout = 1500ms, .verifyChecksums = true};
    auto client = co_await fx.client(options, coio::SocketAddress::loopbackV4(port));

    struct Reader {
      std::size_t served = 0;
      std::size_t timedOut = 0;  // and retried
      std::error_code error;     // the connection's, that ended it
      Clock::duration longest{};
    };
    std::size_t servedSoFar = 0;
    Clock::time_point giveUp = Clock::time_point::max();  // set at the kill
    auto reader = [&](std::span<std::byte> into) -> Task<Reader> {
      Reader r;
      const ReadOp op{1, 0, static_cast<std::uint32_t>(into.size()), into};
      while (Clock::now() < giveUp) {
        const Clock::time_point start = Clock::now();
        Result<std::vector<ReadOutcome>> got = co_await client->batchRead(std::span(&op, 1));
        r.longest = std::max(r.longest, Clock::now() - start);
        if (got) {
          ++r.served;
          ++servedSoFar;
        } else if (got.error() == std::errc::timed_out) {
          ++r.timedOut;
        } else {
          r.error = got.error();
          break;
        }
      }
      co_return r;
    };
    auto killUnderLoad = [&]() -> Task<Reader> {
      // Once the load flows (a TCG guest takes a while to start serving).
      for (int i = 0; i < 1000 && servedSoFar < 32; ++i) co_await fx.reactor.sleepFor(10ms);
      CHECK(servedSoFar >= 32);
      giveUp = Clock::now() + 2 * options.timeout;
      ::kill(child, SIGKILL);
      co_return Reader{};
    };
    std::vector<Task<Reader>> tasks;
    for (int i = 0; i < 8; ++i) tasks.push_back(reader(fx.buffer(16 * 1024)));
    tasks.push_back(killUnderLoad());
    std::vector<Reader> readers = co_await coio::collectAllRange(std::move(tasks));
    readers.pop_back();
    for (const Reader& r : readers) {
      INFO("served " << r.served << ", timed out " << r.timedOut << ", ended by \"" << r.error.message()
                     << "\"; longest request " << r.longest / 1ms << " ms");
      CHECK(r.longest <= options.timeout + kSlack);
    }
    const Clock::time_point closing = Clock::now();
    co_await client->close();
    CHECK(Clock::now() - closing < kSlack);
    client.reset();
#if COIO_E2E_RDMA
    CHECK(registeredRegions() == registeredBefore);  // the client's registrations went with it
#endif
  });
}

TEMPLATE_LIST_TEST_CASE("a request that cannot even be sent ends within its timeout", "[storage][e2e]", Setups) {
  // A server that accepts and never reads: over RDMA the client's credits
  // run out (they are never returned), over TCP the socket buffers fill.
  // The timeout used to start once the request was sent: those waited forever.
  using R = typename TestType::R;
  using Clock = std::chrono::steady_clock;
  constexpr auto kSlack = 2s;
  Fixture<TestType> f;
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    auto silent = coio::TcpListener<R>::bind(fx.reactor, coio::SocketAddress::loopbackV4());
    REQUIRE(silent);
    auto acceptSilently = [&]() -> Task<std::unique_ptr<storage::Channel<R>>> {
      Result<coio::TcpStream<R>> stream = co_await silent->accept();
      REQUIRE(stream);
#if COIO_E2E_RDMA
      Result<std::unique_ptr<storage::Channel<R>>> c =
          co_await storage::RdmaChannel<R>::connect(fx.reactor, *fx.device, std::move(*stream), {}, 10s);
      REQUIRE(c);
      co_return std::move(*c);
#else
      co_return std::make_unique<storage::TcpChannel<R>>(std::move(*stream));
#endif
    };
    const storage::ClientOptions options{.timeout = 300ms};
    auto ends = co_await coio::collectAll(acceptSilently(), fx.client(options, *silent->localAddress()));
    std::unique_ptr<storage::Channel<R>>& peer = std::get<0>(ends);  // not bindings: lambdas use them (clang 14)
    std::unique_ptr<storage::StorageClient<R>>& client = std::get<1>(ends);
    // RDMA: more requests than credits (32). TCP: 1 MiB frames, more than the socket buffers hold.
    const std::size_t ios = TestType::rdma ? 8 : storage::proto::kMaxIosPerFrame;
    const std::size_t requests = TestType::rdma ? 40 : 32;
    const std::vector<ReadOp> batch(ios, ReadOp{1, 0, 1, fx.buffer(1)});
    auto request = [&]() -> Task<std::pair<std::error_code, Clock::duration>> {
      const Clock::time_point start = Clock::now();
      Result<std::vector<ReadOutcome>> r = co_await client->batchRead(batch);
      co_return std::pair{r ? std::error_code{} : r.error(), Clock::now() - start};
    };
    std::vector<Task<std::pair<std::error_code, Clock::duration>>> tasks;
    for (std::size_t i = 0; i < requests; ++i) tasks.push_back(request());
    // Were a request stuck, this ends it (Errc::closed), failing the test, not hanging it.
    std::stop_source done;
    bool closed = false;
    auto unstick = [&]() -> Task<void> {
      const bool due = co_await fx.reactor.sleepFor(options.timeout + kSlack + 1s, done.get_token());
      if (due) {  // bound first: g++ 12 and `if (co_await ...)`
        closed = true;
        co_await client->close();
      }
    };
    auto allThenDone = [&]() -> Task<std::vector<std::pair<std::error_code, Clock::duration>>> {
      auto results = co_await coio::collectAllRange(std::move(tasks));
      done.request_stop();
      co_return results;
    };
    auto [results, unit] = co_await coio::collectAll(allThenDone(), unstick());
    (void)unit;
    std::size_t timedOut = 0;
    for (const auto& [error, took] : results) {
      INFO(error.message() << " after " << took / 1ms << " ms");
      CHECK(error);
      CHECK(took <= options.timeout + kSlack);
      // RDMA: a request sent (granted with it) that times out aborts the
      // queue pair, as the server may be writing; the rest then fail with
      // the connection. Those still waiting for a credit sent nothing.
      if constexpr (TestType::rdma) CHECK((error == std::errc::timed_out || error == client->failure()));
      timedOut += error == std::errc::timed_out;
    }
    CHECK(timedOut > 0);
    if (!closed) co_await client->close();
    co_await peer->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a request waiting for its grant holds no read buffers: a granted one is served meanwhile",
                        "[storage][e2e]", Setups) {
  // Request 1 (ungranted, never granted for now) asks for the whole pool;
  // then a client with a free slot grants with its request. Were request 1
  // to take the buffers while it waits, the granted request would wait for
  // them until request 1's transmit timeout (30 s) while holding the slot.
  storage::ServerOptions options = Fixture<TestType>::small();
  options.poolBytes = 8 * options.pieceSize;  // two whole chunks
  options.transmitTimeout = 30s;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(2 * kChunkSize);
    const std::vector<std::byte> request = requestFrame(
        1, {{1, 0, kChunkSize, remoteOf(*raw, into.first(kChunkSize))},
            {2, 0, kChunkSize, remoteOf(*raw, into.subspan(kChunkSize))}});
    co_await sendRaw(*raw, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    REQUIRE(ask->header.type == storage::proto::MessageType::transmitRequest);
    CHECK(fx.server->buffersInUse() == 0);
    auto client = co_await fx.client();
    const auto start = std::chrono::steady_clock::now();
    const std::vector<ReadOp> ios = {{3, 100, 1000, {}}};
    const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *client, ios);
    CHECK(served[0].status == IoStatus::ok);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    // Request 1, granted now, is served in full.
    std::vector<std::byte> grant;
    storage::proto::encodeEmpty(grant, storage::proto::MessageType::transmitGrant, 1);
    co_await sendRaw(*raw, grant);
    std::size_t delivered = 0;
    for (;;) {
      Result<storage::IncomingFrame> frame = co_await readRaw(*raw);
      REQUIRE(frame);
      if (frame->header.type == storage::proto::MessageType::batchReadResponse) {
        auto response = storage::proto::decodeBatchReadResponse(frame->payload, 2);
        REQUIRE(response);
        for (const auto& r : response->results) CHECK(r.status == IoStatus::ok);
        break;
      }
      REQUIRE(frame->header.type == storage::proto::MessageType::ioData);  // TCP: both IOs' pieces
      auto piece = storage::proto::decodeIoData(frame->payload);
      REQUIRE(piece);
      REQUIRE(piece->ioIndex < 2);
      const Result<void> got =
          co_await raw->receiveData(into.subspan(piece->ioIndex * kChunkSize + piece->offset, piece->length), {});
      REQUIRE(got);
      delivered += piece->length;
    }
    if (!TestType::rdma) CHECK(delivered == 2 * kChunkSize);
    CHECK(storage::matchesChunkBytes(1, 0, into.first(kChunkSize)));
    CHECK(storage::matchesChunkBytes(2, 0, into.subspan(kChunkSize)));
    co_await client->close();
    co_await raw->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a client that never grants times out; its buffers are released", "[storage][e2e]",
                        Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.transmitTimeout = 100ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    // The third IO is invalid (no such chunk): timedOut goes to it too.
    const std::vector<std::byte> request = requestFrame(
        5, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}, {2, 0, 200, remoteOf(*raw, fx.buffer(200))}, {999, 0, 10, {}}});
    co_await sendRaw(*raw, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    CHECK(ask->header.type == storage::proto::MessageType::transmitRequest);
    Result<storage::IncomingFrame> reply = co_await readRaw(*raw);
    REQUIRE(reply);
    REQUIRE(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 3);
    REQUIRE(response);
    REQUIRE(response->results.size() == 3);
    for (const auto& r : response->results) {
      CHECK(r.status == IoStatus::timedOut);
      CHECK(r.bytes == 0);
    }
    CHECK(fx.server->buffersInUse() == 0);
    CHECK(fx.server->stats().transmitTimeouts == 1);
    // A grant that crossed the timedOut response is not an error.
    std::vector<std::byte> late;
    storage::proto::encodeEmpty(late, storage::proto::MessageType::transmitGrant, 5);
    co_await sendRaw(*raw, late);
    const std::vector<std::byte> next = requestFrame(6, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}});
    co_await sendRaw(*raw, next);
    Result<storage::IncomingFrame> again = co_await readRaw(*raw);
    REQUIRE(again);
    CHECK(again->header.type == storage::proto::MessageType::transmitRequest);
    CHECK(again->header.requestId == 6);
    co_await raw->close();
  });
}

TEMPLATE_LIST_TEST_CASE("the transmission limit is never exceeded, across 64 concurrent clients",
                        "[storage][e2e]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  // 192 requests through 3 slots: on a slow device (Soft-RoCE under TCG)
  // the last grants come seconds after their reads; this test is about the
  // bound, not the transmit timeout.
  options.transmitTimeout = 30s;
  Fixture<TestType> f(options, kTransmissionLimit);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    std::vector<std::unique_ptr<storage::StorageClient<typename TestType::R>>> clients;
    for (int c = 0; c < 64; ++c) clients.push_back(co_await fx.client());
    std::vector<Task<std::vector<ReadOutcome>>> reads;
    for (std::size_t c = 0; c < clients.size(); ++c) {
      for (std::uint32_t r = 0; r < 3; ++r) {
        std::vector<ReadOp> ios = {{(c + r) % kChunks, r * 1000, 20000, {}}, {c % kChunks, 7, 3, {}}};
        reads.push_back(readAndCheck(fx, *clients[c], std::move(ios)));
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
  std::set<std::pair<std::uint64_t, std::uint32_t>> corrupt;
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
          std::vector<std::pair<std::uint64_t, std::uint32_t>> covered;
          const std::uint32_t end = op.offset + op.length;
          for (std::uint32_t block = op.offset / kBlock; op.length > 0 && block * kBlock < end; ++block) {
            if (corrupt.count({op.chunkId, block})) covered.emplace_back(op.chunkId, block);
          }
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

TEMPLATE_LIST_TEST_CASE("a server shut down under load fails its clients' requests, no hang", "[storage][e2e]",
                        Setups) {
  Fixture<TestType> f;
  f.reactor.runUntil([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    std::vector<std::span<std::byte>> buffers;
    for (int i = 0; i < 32; ++i) buffers.push_back(fx.buffer(kChunkSize));
    auto reader = [](storage::StorageClient<typename TestType::R>& c,
                     std::span<std::byte> into) -> Task<Result<std::size_t>> {
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

TEMPLATE_LIST_TEST_CASE("shutdown drains: a request in flight completes, new ones are answered unavailable",
                        "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.reactor.runUntil([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(5000);
    const std::vector<std::byte> request = requestFrame(1, {{3, 100, 5000, remoteOf(*raw, into)}});
    co_await sendRaw(*raw, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    REQUIRE(ask->header.type == storage::proto::MessageType::transmitRequest);

    // Shut down while request 1 waits for its grant; then ask for more and grant 1.
    co_await coio::collectAll(shutdownServer(*fx.server), grantWhileDraining(fx, *raw, into));
    CHECK(fx.server->buffersInUse() == 0);
    co_await raw->close();
  }(f));
}

TEMPLATE_LIST_TEST_CASE("more requests in flight than --max-requests is a protocol error for that connection only",
                        "[storage][e2e]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.maxRequestsPerConnection = 2;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    auto raw = co_await fx.channel();
    for (std::uint64_t id = 1; id <= 3; ++id) {
      const std::vector<std::byte> request = requestFrame(id, {{id, 0, 100, remoteOf(*raw, fx.buffer(100))}});
      co_await sendRaw(*raw, request);
    }
    bool sawError = false;
    for (int frames = 0; frames < 3 && !sawError; ++frames) {  // TransmitRequests may come first
      Result<storage::IncomingFrame> frame = co_await readRaw(*raw);
      REQUIRE(frame);
      if (frame->header.type != storage::proto::MessageType::error) continue;
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == storage::proto::ProtocolErrc::tooManyRequests);
      CHECK(frame->header.requestId == 3);
      sawError = true;
    }
    CHECK(sawError);
    co_await raw->close();
    auto& server = *fx.server;
    const bool closed = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 1; });
    CHECK(closed);
    CHECK(server.buffersInUse() == 0);
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *good, probe);
    CHECK(served[0].status == IoStatus::ok);
    co_await good->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a client that stops reading is dropped after the send timeout; buffers are freed",
                        "[storage][e2e]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.sendTimeout = 200ms;
  options.transmitTimeout = 100ms;
  // Zero copy (TCP): the stalled sends hold their buffers until the stop resets the connection.
  options.zeroCopySend = GENERATE(false, true);
  INFO((options.zeroCopySend ? "zero-copy sends" : "copying sends"));
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    if constexpr (TestType::rdma) {
      // 40 requests, nothing consumed: the server's TransmitRequests and
      // timedOut responses use up the credits we never return.
      for (std::uint64_t id = 1; id <= 40; ++id) {
        const std::vector<std::byte> request = requestFrame(id, {{id % kChunks, 0, 10, remoteOf(*raw, fx.buffer(10))}});
        co_await sendRaw(*raw, request);
      }
    } else {
      // Grant two 4 MiB requests, then read nothing: their data fills the socket buffers.
      const std::vector<storage::proto::ReadIo> whole(64, storage::proto::ReadIo{1, 0, kChunkSize, {}});
      co_await sendRaw(*raw, requestFrame(1, whole));
      co_await sendRaw(*raw, requestFrame(2, whole));
      // Both fit in the pool (2 x 256 pieces): both ask before either is granted.
      for (std::uint64_t id = 1; id <= 2; ++id) {
        Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
        REQUIRE(ask);
        REQUIRE(ask->header.type == storage::proto::MessageType::transmitRequest);
      }
      for (std::uint64_t id = 1; id <= 2; ++id) {
        std::vector<std::byte> grant;
        storage::proto::encodeEmpty(grant, storage::proto::MessageType::transmitGrant, id);
        co_await sendRaw(*raw, grant);
      }
    }
    auto& server = *fx.server;
    const bool dropped = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(dropped);
    CHECK(server.stats().sendTimeouts >= 1);
    CHECK(server.buffersInUse() == 0);
    co_await raw->close();
  });
}

namespace {

using Clock = std::chrono::steady_clock;

// Reads `stream` until it ends (EOF, reset): what arrived, or nullopt if it
// is still open after 5 s.
template <typename R>
Task<std::optional<std::vector<std::byte>>> readUntilEnd(R& reactor, coio::TcpStream<R>& stream) {
  std::vector<std::byte> got;
  auto readAll = [&](std::stop_token stop) -> Task<Result<void>> {
    std::byte chunk[256];
    for (;;) {
      Result<std::size_t> n = co_await stream.read(chunk, stop);
      if (!n) co_return n.error();
      got.insert(got.end(), chunk, chunk + *n);
    }
  };
  const Result<void> end = co_await coio::withTimeout(reactor, readAll, 5s);
  if (end.error() == std::errc::timed_out) co_return std::nullopt;
  co_return std::move(got);
}

// The next frame on `channel`, or timed_out after `limit`.
template <typename R, typename Channel>
Task<Result<storage::IncomingFrame>> readWithin(R& reactor, Channel& channel, Clock::duration limit) {
  storage::ReadFailure failure;
  auto read = [&](std::stop_token stop) { return channel.readFrame(failure, std::move(stop)); };
  co_return co_await coio::withTimeout(reactor, read, limit);
}

// The code of an Error frame (the test fails on anything else).
storage::proto::ProtocolErrc errorCode(const storage::IncomingFrame& frame) {
  REQUIRE(frame.header.type == storage::proto::MessageType::error);
  Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame.payload);
  REQUIRE(error);
  return error->code;
}

// How the server ended a dribbling connection.
struct Cut {
  bool ended = false;           // within 5 s
  Clock::duration after{};      // since just before the connect
  std::vector<std::byte> received;
};

// Connects and sends the first `atOnce` bytes of a request frame (id 1),
// then one more every 20 ms up to `total` (over RDMA the bytes are taken
// for the start of the 48-byte handshake): never a whole frame. Returns
// when and how the server ended the connection.
template <typename S>
Task<Cut> dribble(Fixture<S>& fx, std::size_t atOnce, std::size_t total) {
  using R = typename S::R;
  const Clock::time_point start = Clock::now();
  Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(fx.reactor, fx.address);
  REQUIRE(stream);
  const std::vector<std::byte> frame = requestFrame(1, {{1, 0, 10, {}}});
  std::stop_source ended;
  auto send = [&]() -> Task<void> {
    for (std::size_t at = 0, n = atOnce; at < total && !ended.stop_requested(); at += n, n = 1) {
      const Result<void> sent = co_await stream->writeAll(std::span(frame).subspan(at, n));
      if (!sent) co_return;
      (void)co_await fx.reactor.sleepFor(20ms, ended.get_token());
    }
  };
  auto watch = [&]() -> Task<Cut> {
    std::optional<std::vector<std::byte>> received = co_await readUntilEnd(fx.reactor, *stream);
    ended.request_stop();
    co_return Cut{received.has_value(), Clock::now() - start, received.value_or(std::vector<std::byte>{})};
  };
  auto [unit, cut] = co_await coio::collectAll(send(), watch());
  (void)unit;
  co_return std::move(cut);
}

// `n` small reads in a row, once the dribblers have begun: how long they took.
template <typename S, typename Client>
Task<Clock::duration> readMany(Fixture<S>& fx, Client& client, std::uint32_t n) {
  co_await fx.reactor.sleepFor(20ms);
  const Clock::time_point start = Clock::now();
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::vector<ReadOp> ios = {{i % kChunks, 100 * i, 4096, {}}};
    const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, client, ios);
    CHECK(outcomes[0].status == IoStatus::ok);
  }
  co_return Clock::now() - start;
}

// Whether `stream` ends (EOF, reset) within 1 s, or stays open.
template <typename R>
Task<bool> endsSoon(R& reactor, coio::TcpStream<R>& stream) {
  std::byte byte[64];
  auto read = [&](std::stop_token stop) { return stream.read(byte, std::move(stop)); };
  const Result<std::size_t> n = co_await coio::withTimeout(reactor, read, 1s);
  co_return !n && n.error() != std::errc::timed_out;  // over RDMA an admitted one sends its handshake
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("peers that stall mid-frame are cut at the frame deadline; a good client keeps being served",
                        "[storage][e2e][deadline]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.frameTimeout = 200ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    // Three dribble a header; the last sends a header and 3 payload bytes, then 3 more.
    std::vector<Task<Cut>> dribblers;
    for (int i = 0; i < 3; ++i) dribblers.push_back(dribble(fx, 1, 20));
    dribblers.push_back(dribble(fx, storage::proto::kHeaderSize + 3, storage::proto::kHeaderSize + 6));
    auto [cuts, took] = co_await coio::collectAll(coio::collectAllRange(std::move(dribblers)), readMany(fx, *good, 50));
    CHECK(took < 2s);  // 50 reads while 4 connections dribble
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      const Cut& cut = cuts[i];
      CHECK(cut.ended);
      if (!cut.ended) continue;
      CHECK(cut.after >= 200ms);  // not before the deadline
      CHECK(cut.after < 3s);
      if constexpr (!TestType::rdma) {  // an Error frame, then the close
        REQUIRE(cut.received.size() >= storage::proto::kHeaderSize);
        Result<storage::proto::FrameHeader> header =
            storage::proto::decodeHeader(std::span(cut.received).first(storage::proto::kHeaderSize));
        REQUIRE(header);
        CHECK(header->requestId == (i == 3 ? 1u : 0u));  // once the header is in, the frame's
        const std::span<const std::byte> payload = std::span(cut.received).subspan(storage::proto::kHeaderSize);
        CHECK(errorCode({*header, {payload.begin(), payload.end()}}) == storage::proto::ProtocolErrc::frameTimeout);
      }
    }
    // Counted once the server is done with the connection: over RDMA after
    // the handshake's queue pair is closed, which may come after the peer
    // saw its stream end.
    auto& server = *fx.server;
    const std::size_t expected = cuts.size();
    const bool counted = co_await eventually(fx.reactor, [&] { return server.stats().frameTimeouts == expected; });
    INFO(server.stats().frameTimeouts << " frame timeouts counted");
    CHECK(counted);
    CHECK(fx.server->stats().protocolErrors == 0);
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *good, probe);
    CHECK(served[0].status == IoStatus::ok);
    co_await good->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a connection with nothing in flight is closed after the idle timeout, with Error(idleTimeout)",
                        "[storage][e2e][deadline]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.idleTimeout = 200ms;
  options.transmitTimeout = 2s;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    using storage::proto::MessageType;
    const Clock::time_point start = Clock::now();
    auto idle = co_await fx.channel();
    auto busy = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(100);
    const std::vector<std::byte> request = requestFrame(1, {{1, 0, 100, remoteOf(*busy, into)}});
    co_await sendRaw(*busy, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*busy);
    REQUIRE(ask);
    REQUIRE(ask->header.type == MessageType::transmitRequest);

    Result<storage::IncomingFrame> told = co_await readWithin(fx.reactor, *idle, 5s);
    const Clock::duration after = Clock::now() - start;
    INFO(told.error().message());
    REQUIRE(told);
    CHECK(errorCode(*told) == storage::proto::ProtocolErrc::idleTimeout);
    CHECK(told->header.requestId == 0);
    CHECK(after >= 200ms);
    CHECK(after < 3s);
    Result<storage::IncomingFrame> end = co_await readWithin(fx.reactor, *idle, 5s);
    CHECK_FALSE(end);
    CHECK(end.error() != std::errc::timed_out);  // closed

    // A request waiting for its grant longer than the idle timeout keeps its connection.
    co_await fx.reactor.sleepFor(100ms);
    const Clock::time_point granted = Clock::now();
    std::vector<std::byte> grant;
    storage::proto::encodeEmpty(grant, MessageType::transmitGrant, 1);
    co_await sendRaw(*busy, grant);
    std::size_t delivered = 0;
    Result<storage::IncomingFrame> reply = co_await readResponse(*busy, into, delivered);
    REQUIRE(reply);
    REQUIRE(reply->header.type == MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
    REQUIRE(response);
    CHECK(response->results.at(0).status == IoStatus::ok);
    if (!TestType::rdma) CHECK(delivered == into.size());
    CHECK(storage::matchesChunkBytes(1, 0, into));
    // ... and its idle time counts from the end of that request.
    Result<storage::IncomingFrame> busyTold = co_await readWithin(fx.reactor, *busy, 5s);
    REQUIRE(busyTold);
    CHECK(errorCode(*busyTold) == storage::proto::ProtocolErrc::idleTimeout);
    CHECK(Clock::now() - granted >= 200ms);
    CHECK(fx.server->stats().idleTimeouts == 2);
    CHECK(fx.server->stats().protocolErrors == 0);
    co_await idle->close();
    co_await busy->close();
  });
}

TEMPLATE_LIST_TEST_CASE("after the server closes an idle connection the client reconnects: no error reaches the caller",
                        "[storage][e2e][deadline]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.idleTimeout = 200ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    int connects = 0;
    auto connected = co_await storage::StorageClient<typename TestType::R>::connect(
        [&fx, &connects](std::stop_token stop) {
          ++connects;
          return fx.connectChannel(fx.address, std::move(stop));
        },
        fx.limiter, {.verifyChecksums = true});
    REQUIRE(connected);
    auto& client = **connected;
    const std::vector<ReadOp> ios = {{2, 10, 3000, {}}};
    const std::vector<ReadOutcome> first = co_await readAndCheck(fx, client, ios);
    CHECK(first[0].status == IoStatus::ok);
    auto& server = *fx.server;
    const bool closed = co_await eventually(
        fx.reactor, [&server] { return server.stats().idleTimeouts == 1 && server.admittedConnections() == 0; });
    CHECK(closed);
    CHECK_FALSE(client.failure());
    // Three at once share one new connection.
    std::vector<Task<std::vector<ReadOutcome>>> reads;
    for (int i = 0; i < 3; ++i) reads.push_back(readAndCheck(fx, client, ios));
    const std::vector<std::vector<ReadOutcome>> again = co_await coio::collectAllRange(std::move(reads));
    for (const auto& outcomes : again) CHECK(outcomes[0].status == IoStatus::ok);
    CHECK(connects == 2);
    CHECK(server.stats().idleTimeouts == 1);
    CHECK(server.admittedConnections() == 1);
    co_await client.close();
  });
}

TEMPLATE_LIST_TEST_CASE("a request that crosses the server's idle close is sent again on a new connection",
                        "[storage][e2e][deadline]", Setups) {
  using R = typename TestType::R;
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    // The first connection goes to a stand-in server that reads the request
    // and answers Error(idleTimeout), as the real one does when it decided
    // the connection was idle just before the request came.
    auto bound = coio::TcpListener<R>::bind(fx.reactor, *coio::SocketAddress::parse("127.0.0.1:0"));
    REQUIRE(bound);
    const coio::SocketAddress standIn = *bound->localAddress();
    int connects = 0;
    auto connectClient = [&]() -> Task<Result<std::unique_ptr<storage::StorageClient<R>>>> {
      co_return co_await storage::StorageClient<R>::connect(
          [&](std::stop_token stop) {
            return fx.connectChannel(connects++ == 0 ? standIn : fx.address, std::move(stop));
          },
          fx.limiter,
          {.verifyChecksums = true});
    };
    auto acceptStandIn = [&]() -> Task<Result<std::unique_ptr<storage::Channel<R>>>> {
      Result<coio::TcpStream<R>> stream = co_await bound->accept();
      if (!stream) co_return stream.error();
      co_return co_await fx.acceptChannel(std::move(*stream));
    };
    auto [client, standInChannel] = co_await coio::collectAll(connectClient(), acceptStandIn());
    REQUIRE(client);
    REQUIRE(standInChannel);
    auto answerIdle = [&](storage::Channel<R>& channel) -> Task<void> {
      Result<storage::IncomingFrame> request = co_await readRaw(channel);
      REQUIRE(request);
      CHECK(request->header.type == storage::proto::MessageType::batchReadRequest);
      co_await channel.sendError({storage::proto::ProtocolErrc::idleTimeout, 0}, 1s);
    };
    const std::vector<ReadOp> ios = {{3, 7, 2000, {}}};
    auto [outcomes, unit] = co_await coio::collectAll(readAndCheck(fx, **client, ios), answerIdle(**standInChannel));
    (void)unit;
    CHECK(outcomes[0].status == IoStatus::ok);
    CHECK(connects == 2);
    CHECK_FALSE((*client)->failure());
    co_await (*standInChannel)->close();
    co_await (*client)->close();
  });
}

TEMPLATE_LIST_TEST_CASE("connections over --max-connections are closed at once; open ones keep working; new ones are "
                        "served after the flood", "[storage][e2e][limit]", Setups) {
  using R = typename TestType::R;
  storage::ServerOptions options = Fixture<TestType>::small();
  options.maxConnections = 8;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    std::vector<coio::TcpStream<R>> flood;
    for (int i = 0; i < 20; ++i) {
      Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(fx.reactor, fx.address);
      REQUIRE(stream);
      flood.push_back(std::move(*stream));
    }
    auto& server = *fx.server;
    const bool refused = co_await eventually(fx.reactor, [&server] { return server.stats().refusedConnections == 13; });
    CHECK(refused);
    CHECK(server.admittedConnections() == 8);
    std::vector<Task<bool>> probes;
    for (coio::TcpStream<R>& stream : flood) probes.push_back(endsSoon(fx.reactor, stream));
    const std::vector<bool> ended = co_await coio::collectAllRange(std::move(probes));
    CHECK(std::count(ended.begin(), ended.end(), true) == 13);
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    const std::vector<ReadOutcome> during = co_await readAndCheck(fx, *good, probe);
    CHECK(during[0].status == IoStatus::ok);

    flood.clear();
    const bool drained = co_await eventually(fx.reactor, [&server] { return server.admittedConnections() == 1; });
    REQUIRE(drained);
    auto late = co_await fx.client();
    const std::vector<ReadOutcome> after = co_await readAndCheck(fx, *late, probe);
    CHECK(after[0].status == IoStatus::ok);
    CHECK(server.stats().refusedConnections == 13);
    co_await late->close();
    co_await good->close();
  });
}

#if !COIO_E2E_RDMA
namespace {

// Lowers the fd limit to 64 past the lowest free fd and takes every fd
// left under it; restores both on destruction.
struct FdSqueeze {
  FdSqueeze() {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    coio::detail::FileDescriptor null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(null.valid());
    rlimit low = saved;
    low.rlim_cur = static_cast<rlim_t>(null.get()) + 64;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    for (int fd; (fd = ::fcntl(null.get(), F_DUPFD_CLOEXEC, 0)) >= 0;) dummies.emplace_back(fd);
    REQUIRE(errno == EMFILE);
    dummies.emplace_back(std::move(null));
  }
  ~FdSqueeze() { release(); }
  void release() {
    dummies.clear();
    (void)::setrlimit(RLIMIT_NOFILE, &saved);
  }
  rlimit saved{};
  std::vector<coio::detail::FileDescriptor> dummies;
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("out of fds the accept loop backs off, without spinning, and serves again once fds are free",
                        "[storage][e2e][limit]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    FdSqueeze squeeze;
    squeeze.dummies.pop_back();  // one fd left: the client's socket; none for the server's accept
    const std::uint64_t before = fx.server->stats().acceptErrors;
    auto client = co_await fx.client();
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    std::vector<ReadOutcome> served;
    auto read = [&]() -> Task<void> { served = co_await readAndCheck(fx, *client, probe); };
    auto freeLater = [&]() -> Task<void> {
      co_await fx.reactor.sleepFor(300ms);
      squeeze.release();
    };
    co_await coio::collectAll(read(), freeLater());
    const std::uint64_t errors = fx.server->stats().acceptErrors - before;
    CHECK(errors >= 1);
    CHECK(errors <= 60);  // a retry per 10 ms at most; a busy loop makes thousands
    REQUIRE(served.size() == 1);
    CHECK(served[0].status == IoStatus::ok);
    co_await client->close();
  });
}
#endif

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

#if !COIO_E2E_RDMA
namespace {

// One piece a scripted server sends: `length` bytes of IO `io` at `offset`.
struct ScriptedPiece {
  std::uint32_t io, offset, length;
};

std::byte scriptedByte(std::size_t io, std::size_t offset) { return static_cast<std::byte>((io * 97 + offset * 7) & 0xff); }

// A server written from PROTOCOL.md that answers one batchRead with the
// given pieces, in the given order, and then a response saying each IO is
// ok with `bytes[i]` bytes (and their CRC); then reads until the client
// goes. Yields the code of the Error frame the client sent, if it did.
template <typename R>
Task<std::optional<storage::proto::ProtocolErrc>> scriptedServer(coio::TcpListener<R>& listener, std::vector<ScriptedPiece> pieces,
                          std::vector<std::uint32_t> bytes) {
  Result<coio::TcpStream<R>> stream = co_await listener.accept();
  REQUIRE(stream);
  storage::TcpChannel<R> channel(std::move(*stream));
  storage::ReadFailure failure;
  Result<storage::IncomingFrame> frame = co_await channel.readFrame(failure, {});
  REQUIRE(frame);
  REQUIRE(frame->header.type == storage::proto::MessageType::batchReadRequest);
  Result<storage::proto::BatchReadRequest> request = storage::proto::decodeBatchReadRequest(frame->payload, 16);
  REQUIRE(request);
  CHECK(request->granted);  // the client had a free slot
  const std::uint64_t id = frame->header.requestId;
  for (const ScriptedPiece& p : pieces) {
    std::vector<std::byte> data(p.length);
    for (std::size_t k = 0; k < p.length; ++k) data[k] = scriptedByte(p.io, p.offset + k);
    const std::span<std::byte> buffers[] = {data};
    const storage::OutgoingPiece piece{id, {}, {p.io, p.offset, p.length}, buffers};
    const Result<void> sent = co_await channel.sendData(piece, {});
    REQUIRE(sent);
  }
  storage::proto::BatchReadResponse response;
  for (std::size_t io = 0; io < bytes.size(); ++io) {
    std::vector<std::byte> whole(bytes[io]);
    for (std::size_t k = 0; k < whole.size(); ++k) whole[k] = scriptedByte(io, k);
    response.results.push_back({IoStatus::ok, bytes[io], storage::crc32c(whole)});
  }
  std::vector<std::byte> encoded;
  storage::proto::encode(encoded, id, response);
  const Result<void> sent = co_await channel.send(encoded, {});
  REQUIRE(sent);
  std::optional<storage::proto::ProtocolErrc> said;
  for (;;) {  // until the client closes
    Result<storage::IncomingFrame> next = co_await channel.readFrame(failure, {});
    if (!next) break;
    REQUIRE(next->header.type == storage::proto::MessageType::error);
    Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(next->payload);
    REQUIRE(error);
    said = error->code;
  }
  co_await channel.close();
  co_return said;
}

// batchRead of IOs of `lengths` against scriptedServer(pieces, bytes);
// `clientSaid`: the Error frame the client sent the server, if any.
template <typename R>
Result<std::vector<ReadOutcome>> readFromScript(std::vector<std::uint32_t> lengths, std::vector<ScriptedPiece> pieces,
                                                std::vector<std::uint32_t> bytes,
                                                std::vector<std::vector<std::byte>>& into,
                                                std::optional<storage::proto::ProtocolErrc>& clientSaid) {
  R reactor;
  auto listener = coio::TcpListener<R>::bind(reactor, coio::SocketAddress::loopbackV4());
  REQUIRE(listener);
  storage::TransmissionLimiter limiter(4);
  auto client = [&]() -> Task<Result<std::vector<ReadOutcome>>> {
    auto connected = co_await storage::StorageClient<R>::connect(reactor, *listener->localAddress(), limiter,
                                                                 {.timeout = 5s, .verifyChecksums = true});
    REQUIRE(connected);
    std::vector<ReadOp> ios;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      into.emplace_back(lengths[i], std::byte{0xEE});
      ios.push_back({i, 0, lengths[i], into.back()});
    }
    Result<std::vector<ReadOutcome>> outcomes = co_await (*connected)->batchRead(ios);
    co_await (*connected)->close();
    co_return outcomes;
  };
  auto [served, read] =
      reactor.runUntil(coio::collectAll(scriptedServer(*listener, std::move(pieces), std::move(bytes)), client()));
  clientSaid = served;
  return read;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("pieces out of order, interleaved across IOs, each land in their own IO", "[storage][tcp]",
                        Setups) {
  using R = typename TestType::R;
  const std::vector<std::uint32_t> lengths = {10000, 5000, 7000};
  std::vector<std::vector<std::byte>> into;
  std::optional<storage::proto::ProtocolErrc> said;
  SECTION("in any order between IOs, in order within each") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(
        lengths, {{2, 0, 3000}, {0, 0, 4000}, {1, 0, 5000}, {2, 3000, 4000}, {0, 4000, 6000}}, lengths, into, said);
    REQUIRE(outcomes);
    CHECK_FALSE(said.has_value());
    for (std::size_t io = 0; io < lengths.size(); ++io) {
      CHECK((*outcomes)[io].status == IoStatus::ok);
      CHECK((*outcomes)[io].bytes == lengths[io]);
      CHECK_FALSE((*outcomes)[io].checksumMismatch);
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < lengths[io]; ++k) wrong += into[io][k] != scriptedByte(io, k);
      CHECK(wrong == 0);
    }
  }
  // PROTOCOL.md's checks: each is a protocol error for the whole connection.
  SECTION("a piece that skips ahead within its IO") {
    Result<std::vector<ReadOutcome>> outcomes =
        readFromScript<R>(lengths, {{0, 4000, 6000}, {0, 0, 4000}}, {10000, 0, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
  SECTION("a piece past its IO's length") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(lengths, {{1, 0, 5001}}, {0, 5001, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
  SECTION("a piece of an IO the request does not have") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(lengths, {{3, 0, 10}}, {0, 0, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
  SECTION("a response claiming more bytes than its pieces delivered") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(lengths, {{0, 0, 4000}}, {10000, 0, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
}
TEMPLATE_LIST_TEST_CASE("the TCP channel's read-ahead: reads of every size across fills come out intact",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto listener = coio::TcpListener<R>::bind(r, coio::SocketAddress::loopbackV4());
    REQUIRE(listener);
    auto connected = co_await coio::TcpStream<R>::connect(r, *listener->localAddress());
    REQUIRE(connected);
    auto accepted = co_await listener->accept();
    REQUIRE(accepted);
    constexpr std::size_t kTotal = 1 << 20;
    const auto byteAt = [](std::size_t i) { return static_cast<std::byte>((i * 131 + i / 257) & 0xff); };
    // The writer sends in uneven pieces; the reader (a 1 KiB read-ahead)
    // asks for small, buffer-sized and larger-than-buffer spans.
    auto writer = [&](coio::TcpStream<R>& out) -> Task<Result<void>> {
      std::vector<std::byte> data(kTotal);
      for (std::size_t i = 0; i < kTotal; ++i) data[i] = byteAt(i);
      std::mt19937 rng(7);
      for (std::size_t at = 0; at < kTotal;) {
        const std::size_t n = std::min<std::size_t>(kTotal - at, 1 + rng() % 9000);
        Result<void> w = co_await out.writeAll(std::span(data).subspan(at, n));
        if (!w) co_return w;
        at += n;
      }
      out.close();
      co_return Result<void>{};
    };
    auto reader = [&](storage::BufferedReader<R>& in) -> Task<std::size_t> {
      std::vector<std::byte> got(kTotal);
      std::mt19937 rng(11);
      const std::size_t sizes[] = {1, 7, 100, 1023, 1024, 1025, 4096, 70000};
      std::size_t at = 0;
      while (at < kTotal) {
        const std::size_t n = std::min(kTotal - at, sizes[rng() % std::size(sizes)]);
        Result<void> r = co_await in.readExact(std::span(got).subspan(at, n), {});
        if (!r) break;
        at += n;
      }
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < at; ++i) wrong += got[i] != byteAt(i);
      std::byte more[1];
      Result<void> end = co_await in.readExact(more, {});  // the writer closed: the end, not stale bytes
      co_return at == kTotal && wrong == 0 && !end && end.error() == coio::Errc::eof ? 0 : 1 + wrong;
    };
    storage::BufferedReader<R> in(*accepted, 1024);
    auto [written, failures] = co_await coio::collectAll(writer(*connected), reader(in));
    CHECK(written);
    CHECK(failures == 0);
  }(reactor));
}

// A connected loopback pair on `r`: {connected, accepted}.
template <typename R>
Task<std::pair<coio::TcpStream<R>, coio::TcpStream<R>>> loopbackPair(R& r) {
  auto listener = coio::TcpListener<R>::bind(r, coio::SocketAddress::loopbackV4());
  REQUIRE(listener);
  auto connected = co_await coio::TcpStream<R>::connect(r, *listener->localAddress());
  REQUIRE(connected);
  auto accepted = co_await listener->accept();
  REQUIRE(accepted);
  co_return std::pair{std::move(*connected), std::move(*accepted)};
}

TEMPLATE_LIST_TEST_CASE("the TCP channel's read-ahead: after a large read, the next receive takes one frame header",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto [out, in] = co_await loopbackPair(r);
    // A 1 KiB read-ahead: small enough that everything sent fits in the
    // sockets at once, so each fill could take all that is left.
    constexpr std::size_t kLarge = 1024, kHeader = 40;
    std::vector<std::byte> sent(2 * kLarge + kHeader);
    for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<std::byte>(i * 7 + i / 251);
    const Result<void> written = co_await out.writeAll(sent);
    REQUIRE(written);
    storage::BufferedReader<R> reader(in, kLarge, kHeader);
    std::vector<std::byte> got(sent.size());
    Result<void> step = co_await reader.readExact(std::span(got).first(kLarge), {});  // straight into `got`
    REQUIRE(step);
    step = co_await reader.fill({});
    REQUIRE(step);
    CHECK(reader.buffered() == kHeader);  // not the next large piece's first bytes as well
    step = co_await reader.readExact(std::span(got).subspan(kLarge, kHeader), {});
    REQUIRE(step);
    step = co_await reader.readExact(std::span(got).subspan(kLarge + kHeader), {});
    REQUIRE(step);
    CHECK(got == sent);
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("the TCP frame writer: sends made at once go out whole, in call order", "[storage][tcp]",
                        Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto pair = co_await loopbackPair(r);  // not a structured binding: clang 14 cannot capture one
    coio::TcpStream<R>& out = pair.first;
    coio::TcpStream<R>& in = pair.second;
    storage::FrameWriter<R> writer(out);
    // 300 sends of 1..3 parts (8 B .. 64 KiB each) started in one turn: they
    // queue behind the first and go in group writes, which must keep each
    // send's parts together and the sends in order.
    constexpr int kSends = 300;
    std::mt19937 rng(5);
    std::vector<std::vector<std::vector<std::byte>>> sends(kSends);
    std::size_t total = 0;
    for (int i = 0; i < kSends; ++i) {
      // One send of more than IOV_MAX parts: it goes alone, and still whole.
      sends[i].resize(i == kSends / 2 ? IOV_MAX + 100 : 1 + rng() % 3);
      for (std::vector<std::byte>& part : sends[i]) {
        part.assign(rng() % 4 == 0 ? 1 + rng() % 65536 : 8 + rng() % 200, static_cast<std::byte>(i));
        total += part.size();
      }
    }
    int failed = 0;
    auto send = [&](int i) -> Task<void> {
      std::vector<iovec> parts;
      for (std::vector<std::byte>& part : sends[i]) parts.push_back({part.data(), part.size()});
      failed += !(co_await writer.send(parts, {}));
    };
    auto readAll = [&]() -> Task<std::vector<std::byte>> {
      std::vector<std::byte> got(total);
      storage::BufferedReader<R> reader(in, 4096);
      Result<void> r = co_await reader.readExact(got, {});
      CHECK(r);
      co_return got;
    };
    coio::AsyncScope scope;
    for (int i = 0; i < kSends; ++i) scope.spawn(send(i));
    std::vector<std::byte> got = co_await readAll();
    co_await scope.join();
    CHECK(failed == 0);
    std::size_t at = 0, wrong = 0;
    for (int i = 0; i < kSends; ++i) {
      for (const std::vector<std::byte>& part : sends[i]) {
        for (std::size_t k = 0; k < part.size(); ++k) wrong += got[at + k] != static_cast<std::byte>(i);
        at += part.size();
      }
    }
    CHECK(wrong == 0);
    CHECK(!writer.broken());
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("the TCP frame writer: a queued send cancelled before it is written leaves no bytes",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto pair = co_await loopbackPair(r);  // not a structured binding: clang 14 cannot capture one
    coio::TcpStream<R>& out = pair.first;
    coio::TcpStream<R>& in = pair.second;
    storage::FrameWriter<R> writer(out);
    // The first send is larger than the socket buffers take while nobody
    // reads: it stalls, and the two behind it queue.
    std::vector<std::byte> big(32u << 20, std::byte{1}), cancelled(1000, std::byte{2}), last(1000, std::byte{3});
    std::stop_source stop;
    Result<void> bigSent = coio::Errc::closed, cancelledSent = Result<void>{}, lastSent = coio::Errc::closed;
    // Named: a coroutine lambda's captures live in the lambda object.
    auto send = [&writer](Result<void>& sent, std::span<const std::byte> frame, std::stop_token token) -> Task<void> {
      sent = co_await writer.send(frame, std::move(token));
    };
    coio::AsyncScope scope;
    scope.spawn(send(bigSent, big, {}));
    co_await r.sleepFor(50ms);  // its write is under way (sends made in the same turn would join it)
    scope.spawn(send(cancelledSent, cancelled, stop.get_token()));
    scope.spawn(send(lastSent, last, {}));
    co_await r.sleepFor(10ms);
    stop.request_stop();
    REQUIRE(!cancelledSent);
    CHECK(cancelledSent.error() == std::errc::operation_canceled);
    CHECK(!writer.broken());
    std::vector<std::byte> got(big.size() + last.size());
    storage::BufferedReader<R> reader(in, 65536);
    // Not co_await inside CHECK: Catch's temporaries across a suspension hang g++ 12 here.
    const Result<void> read = co_await reader.readExact(got, {});
    CHECK(read);
    co_await scope.join();
    CHECK(bigSent);
    CHECK(lastSent);
    CHECK(std::count(got.begin(), got.begin() + big.size(), std::byte{1}) == static_cast<std::ptrdiff_t>(big.size()));
    CHECK(std::count(got.begin() + big.size(), got.end(), std::byte{3}) == static_cast<std::ptrdiff_t>(last.size()));
    out.close();
    std::byte more[1];
    Result<void> end = co_await reader.readExact(more, {});
    CHECK(end.error() == coio::Errc::eof);  // nothing of the cancelled send
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("the TCP frame writer: a write stopped part-way breaks it, for queued and later sends",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto pair = co_await loopbackPair(r);
    storage::FrameWriter<R> writer(pair.first);
    // Nobody reads pair.second: the big send stalls part-way, the small one queues behind.
    std::vector<std::byte> big(32u << 20, std::byte{1}), small(1000, std::byte{2});
    std::stop_source stop;
    Result<void> bigSent = Result<void>{}, queuedSent = Result<void>{};
    auto send = [&writer](Result<void>& sent, std::span<const std::byte> frame, std::stop_token token) -> Task<void> {
      sent = co_await writer.send(frame, std::move(token));
    };
    coio::AsyncScope scope;
    scope.spawn(send(bigSent, big, stop.get_token()));
    co_await r.sleepFor(50ms);
    scope.spawn(send(queuedSent, small, {}));
    co_await r.sleepFor(10ms);
    CHECK(!writer.broken());
    stop.request_stop();
    co_await scope.join();
    REQUIRE(!bigSent);
    CHECK(bigSent.error() == std::errc::operation_canceled);
    CHECK(writer.broken());
    REQUIRE(!queuedSent);  // the stream is cut mid-frame: nothing may follow
    CHECK(queuedSent.error() == coio::Errc::closed);
    const Result<void> later = co_await writer.send(small, {});
    REQUIRE(!later);
    CHECK(later.error() == coio::Errc::closed);
  }(reactor));
}
#endif

#if !COIO_E2E_RDMA
namespace {

// Where a scripted server stops answering a batchRead: before any data of
// a request granted with it, after its TransmitRequest (a request the
// client could not grant: the test holds the only slot), between two
// pieces of the data, or half-way through a piece.
enum class Stall { beforeData, afterTransmitRequest, betweenPieces, midPiece };

const char* toString(Stall stall) {
  switch (stall) {
    case Stall::beforeData: return "before any data";
    case Stall::afterTransmitRequest: return "after TransmitRequest";
    case Stall::betweenPieces: return "between pieces";
    case Stall::midPiece: return "mid-piece";
  }
  return "?";
}

// Where the client keeps the connection: it was not reading a piece when
// it gave up.
bool keepsConnection(Stall stall) { return stall != Stall::midPiece; }

constexpr auto kClientTimeout = 200ms;
// Larger than the TCP channel's 32 KiB read-ahead: the client reads this
// IO's data straight into the caller's buffer.
constexpr std::uint32_t kStalledIoSize = 64 * 1024;
// How long the scripted server waits for the client at any point before
// it gives up and closes (so that a client that never times out fails the
// test instead of hanging it).
constexpr auto kPeerPatience = 3s;
constexpr std::byte kPoison{0xA5};

std::vector<std::byte> peerData() {
  std::vector<std::byte> data(kStalledIoSize);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 + 1);
  return data;
}

// What the scripted server saw, checked once it is done.
struct PeerLog {
  bool servedFirst = false;   // got the first request and stalled where told
  bool servedSecond = false;  // served a second request in full (the connection stayed usable)
  bool sawEnd = false;        // the client closed the connection
};

// Sends `parts` in order (frames and raw data); false once one fails.
template <typename R>
Task<bool> sendAll(storage::TcpChannel<R>& channel, std::vector<std::span<const std::byte>> parts) {
  for (std::span<const std::byte> part : parts) {
    const Result<void> sent = co_await channel.send(part, {});
    if (!sent) co_return false;
  }
  co_return true;
}

std::vector<std::byte> emptyFrame(storage::proto::MessageType type, std::uint64_t id) {
  std::vector<std::byte> frame;
  storage::proto::encodeEmpty(frame, type, id);
  return frame;
}

// An IoData frame for `bytes` of IO 0 at `offset`.
std::vector<std::byte> pieceFrame(std::uint64_t id, std::size_t offset, std::span<const std::byte> bytes) {
  std::vector<std::byte> frame;
  storage::proto::encode(frame, id,
                         storage::proto::IoData{0, static_cast<std::uint32_t>(offset),
                                                static_cast<std::uint32_t>(bytes.size())});
  return frame;
}

std::vector<std::byte> responseFrame(std::uint64_t id, IoStatus status, std::span<const std::byte> data) {
  const storage::proto::IoResult result{status, static_cast<std::uint32_t>(data.size()),
                                        status == IoStatus::ok ? storage::crc32c(data) : 0};
  std::vector<std::byte> frame;
  storage::proto::encode(frame, id, storage::proto::BatchReadResponse{{result}});
  return frame;
}

// A server written from PROTOCOL.md, for one client on its connection: it
// stalls the first request at `stall` (the connection up, silent) until
// `resume` (the client timed out), then goes on as a late server would.
// Where the client keeps the connection it then serves a second request in
// full. Last it reads until the client closes. The IO's data goes in two
// pieces.
template <typename R>
Task<void> playScript(R& reactor, storage::TcpChannel<R>& channel, Stall stall, std::stop_token resume,
                      PeerLog& log) {
  using storage::proto::MessageType;
  const std::vector<std::byte> data = peerData();
  const std::span<const std::byte> all(data), first = all.first(all.size() / 2), second = all.subspan(all.size() / 2);
  // Reads a BatchReadRequest: its id, and whether it came granted.
  const auto request = [&](std::uint64_t& id, bool& granted) -> Task<bool> {
    storage::ReadFailure failure;
    auto read = [&](std::stop_token stop) { return channel.readFrame(failure, std::move(stop)); };
    const Result<storage::IncomingFrame> frame = co_await coio::withTimeout(reactor, read, kPeerPatience);
    if (!frame || frame->header.type != MessageType::batchReadRequest) co_return false;
    const Result<storage::proto::BatchReadRequest> decoded = storage::proto::decodeBatchReadRequest(frame->payload, 1);
    if (!decoded) co_return false;
    id = frame->header.requestId;
    granted = decoded->granted;
    co_return true;
  };
  std::uint64_t id = 0;
  bool granted = false;
  if (!co_await request(id, granted)) co_return;
  if (granted != (stall != Stall::afterTransmitRequest)) co_return;  // the client granted as it should have
  const std::vector<std::byte> firstPiece = pieceFrame(id, 0, first), secondPiece = pieceFrame(id, first.size(), second);
  const std::vector<std::byte> ok = responseFrame(id, IoStatus::ok, data);
  const std::vector<std::byte> ask = emptyFrame(MessageType::transmitRequest, id);
  const std::vector<std::byte> timedOut = responseFrame(id, IoStatus::timedOut, {});
  // What goes before the stall, and (late) after it.
  std::vector<std::span<const std::byte>> before, after;
  switch (stall) {
    case Stall::beforeData: after = {firstPiece, first, secondPiece, second, ok}; break;
    case Stall::afterTransmitRequest:  // never granted (the client gave up first): answered without data
      before = {ask};
      after = {timedOut};
      break;
    case Stall::betweenPieces:
      before = {firstPiece, first};
      after = {secondPiece, second, ok};
      break;
    case Stall::midPiece:
      before = {firstPiece, first.first(first.size() / 2)};
      after = {first.subspan(first.size() / 2), secondPiece, second, ok};
      break;
  }
  if (!co_await sendAll(channel, std::move(before))) co_return;
  log.servedFirst = true;
  const bool clientGaveUp = !co_await reactor.sleepFor(kPeerPatience, resume);
  if (!clientGaveUp) co_return;  // closes: the client then fails with EOF, not timed_out
  // The rest of the exchange, late; writes may fail where the client cut
  // the connection, and what arrives must not land in the caller's buffer.
  (void)co_await sendAll(channel, std::move(after));
  if (keepsConnection(stall)) {
    // The next request comes granted (the timeout freed the slot); a grant
    // for the given-up request would arrive here instead.
    std::uint64_t next = 0;
    bool nextGranted = false;
    if (!co_await request(next, nextGranted) || !nextGranted) co_return;
    const std::vector<std::byte> one = pieceFrame(next, 0, first), two = pieceFrame(next, first.size(), second);
    const std::vector<std::byte> nextOk = responseFrame(next, IoStatus::ok, data);
    std::vector<std::span<const std::byte>> nextParts = {one, first, two, second, nextOk};
    log.servedSecond = co_await sendAll(channel, std::move(nextParts));
  }
  storage::ReadFailure failure;
  auto read = [&](std::stop_token stop) { return channel.readFrame(failure, std::move(stop)); };
  for (;;) {
    const Result<storage::IncomingFrame> frame = co_await coio::withTimeout(reactor, read, kPeerPatience);
    if (frame) continue;
    log.sawEnd = frame.error() != std::errc::timed_out;  // EOF or a reset
    break;
  }
}

template <typename R>
Task<void> scriptedPeer(R& reactor, coio::TcpListener<R>& listener, Stall stall, std::stop_token resume,
                        PeerLog& log) {
  Result<coio::TcpStream<R>> accepted = co_await listener.accept();
  if (!accepted) co_return;
  storage::TcpChannel<R> channel(std::move(*accepted));
  co_await playScript(reactor, channel, stall, std::move(resume), log);
  co_await channel.close();
}

// The client's side: a batchRead that the peer stalls, then what the
// client does next. Sets `resume` when its batchRead has returned.
template <typename S>
Task<void> stalledClient(Fixture<S>& fx, coio::SocketAddress peer, Stall stall, std::stop_source& resume,
                         const PeerLog& log, storage::StorageClient<typename S::R>& good) {
  using R = typename S::R;
  using Clock = std::chrono::steady_clock;
  Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(fx.reactor, peer);
  REQUIRE(stream);
  auto client = storage::StorageClient<R>::open(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)),
                                                fx.limiter, {.timeout = kClientTimeout});
  std::vector<std::byte> into(kStalledIoSize, kPoison);
  const ReadOp op{1, 0, kStalledIoSize, into};
  // Holding the only slot makes the client send the request ungranted.
  const bool held = stall == Stall::afterTransmitRequest && fx.limiter.tryAcquire();
  const Clock::time_point start = Clock::now();
  const Result<std::vector<ReadOutcome>> stalled = co_await client->batchRead(std::span(&op, 1));
  const Clock::duration took = Clock::now() - start;
  const std::vector<std::byte> atReturn = into;
  if (held) fx.limiter.release();
  // The timeout freed the request's limiter slot, the peer still stalled:
  // another client sharing the one-slot limiter gets a grant (else the
  // server times that request out).
  const std::vector<ReadOp> probe = {{5, 100, 20000, {}}};
  const std::vector<ReadOutcome> probed = co_await readAndCheck(fx, good, probe);
  CHECK(probed[0].status == IoStatus::ok);
  resume.request_stop();
  CHECK(log.servedFirst);
  CHECK(stalled.error() == std::errc::timed_out);
  CHECK(took >= kClientTimeout);
  CHECK(took < 2s);

  if (keepsConnection(stall)) {
    // The late pieces are read into scratch; the next request works.
    std::vector<std::byte> next(kStalledIoSize, kPoison);
    const ReadOp nextOp{2, 0, kStalledIoSize, next};
    const Result<std::vector<ReadOutcome>> served = co_await client->batchRead(std::span(&nextOp, 1));
    INFO(served.error().message());
    CHECK(served);
    CHECK(log.servedSecond);
    CHECK(next == peerData());
    CHECK_FALSE(client->failure());
  } else {
    // The connection is cut: the peer sees it end; later calls fail at once.
    const bool ended = co_await eventually(fx.reactor, [&log] { return log.sawEnd; });
    CHECK(ended);
    co_await fx.reactor.sleepFor(20ms);  // time for a (wrong) late read to land
    CHECK(client->failure() == std::errc::timed_out);
    const Clock::time_point again = Clock::now();
    const Result<std::vector<ReadOutcome>> after = co_await client->batchRead(std::span(&op, 1));
    CHECK(after.error() == std::errc::timed_out);
    CHECK(Clock::now() - again < kClientTimeout);
  }
  CHECK(into == atReturn);  // nothing landed in the caller's buffer after batchRead returned
  co_await client->close();
}

template <typename S>
Task<void> runStalled(Fixture<S>& fx, coio::TcpListener<typename S::R>& listener, Stall stall, PeerLog& log,
                      storage::StorageClient<typename S::R>& good) {
  std::stop_source resume;
  co_await coio::collectAll(scriptedPeer(fx.reactor, listener, stall, resume.get_token(), log),
                            stalledClient(fx, *listener.localAddress(), stall, resume, log, good));
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("batchRead times out wherever the server stalls; its buffer is never written after",
                        "[storage][e2e][timeout]", Setups) {
  using R = typename TestType::R;
  for (const Stall stall :
       {Stall::beforeData, Stall::afterTransmitRequest, Stall::betweenPieces, Stall::midPiece}) {
    INFO("the server stalls " << toString(stall));
    Fixture<TestType> f(Fixture<TestType>::small(), 1);  // one transmission slot, shared by both clients
    PeerLog log;
    f.run([stall, &log](Fixture<TestType>& fx) -> Task<void> {
      auto listener = coio::TcpListener<R>::bind(fx.reactor, coio::SocketAddress::loopbackV4());
      REQUIRE(listener);
      auto good = co_await fx.client();
      co_await runStalled(fx, *listener, stall, log, *good);
      co_await good->close();
    });
    CHECK(log.sawEnd);
  }
}
#endif

namespace {

// The congestion control of this process's sockets accepted on `port`.
std::vector<std::string> acceptedCongestionControls(std::uint16_t port) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage local{}, peer{};
    socklen_t localLength = sizeof local, peerLength = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLength) != 0 || local.ss_family != AF_INET ||
        ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port) != port ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0) {
      continue;
    }
    char name[16] = {};
    socklen_t length = sizeof name;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length) == 0) names.emplace_back(name);
  }
  return names;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("tcpCongestion: every accepted connection sends with the named algorithm", "[storage][e2e]",
                        Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.tcpCongestion = "reno";  // always built in; the system default may be anything else
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto first = co_await fx.client();
    auto second = co_await fx.client();
    const std::vector<ReadOp> ios = {{1, 0, 100, {}}};
    (void)co_await readAndCheck(fx, *first, ios);
    (void)co_await readAndCheck(fx, *second, ios);
    CHECK(acceptedCongestionControls(fx.address.port()) == std::vector<std::string>{"reno", "reno"});
    co_await first->close();
    co_await second->close();
  });
}

#if !COIO_E2E_RDMA
namespace {

// A TCP channel to `to` whose socket takes little before the server's sends
// stall: its receive buffer (64 KiB) is set before the handshake.
template <typename R>
Task<std::unique_ptr<storage::TcpChannel<R>>> connectNarrow(R& reactor, coio::SocketAddress to) {
  coio::detail::FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  const int receiveBuffer = 64 * 1024;
  REQUIRE(::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer) == 0);
  coio::TcpStream<R> stream(reactor, std::move(fd));
  const Result<void> connected = co_await reactor.connect(stream.fd(), to.data(), to.size());
  REQUIRE(connected);
  co_return std::make_unique<storage::TcpChannel<R>>(std::move(stream));
}

// Reads request `id`'s pieces and response off `channel` and checks every
// IO: ok, every byte delivered in order and equal to the dataset's, the
// checksum that of the bytes.
template <typename Channel>
Task<void> readVerified(Channel& channel, std::uint64_t id, const std::vector<storage::proto::ReadIo>& ios) {
  std::vector<std::vector<std::byte>> data;
  for (const storage::proto::ReadIo& io : ios) data.emplace_back(io.length);
  std::vector<std::size_t> delivered(ios.size(), 0);
  Result<storage::IncomingFrame> frame = co_await readRaw(channel);
  for (; frame && frame->header.type == storage::proto::MessageType::ioData; frame = co_await readRaw(channel)) {
    REQUIRE(frame->header.requestId == id);
    const Result<storage::proto::IoData> piece = storage::proto::decodeIoData(frame->payload);
    REQUIRE(piece);
    REQUIRE(piece->ioIndex < ios.size());
    REQUIRE(piece->offset == delivered[piece->ioIndex]);
    REQUIRE(piece->offset + piece->length <= ios[piece->ioIndex].length);
    const Result<void> got =
        co_await channel.receiveData(std::span(data[piece->ioIndex]).subspan(piece->offset, piece->length), {});
    REQUIRE(got);
    delivered[piece->ioIndex] += piece->length;
  }
  REQUIRE(frame);
  REQUIRE(frame->header.type == storage::proto::MessageType::batchReadResponse);
  REQUIRE(frame->header.requestId == id);
  const Result<storage::proto::BatchReadResponse> response =
      storage::proto::decodeBatchReadResponse(frame->payload, static_cast<std::uint32_t>(ios.size()));
  REQUIRE(response);
  REQUIRE(response->results.size() == ios.size());
  for (std::size_t i = 0; i < ios.size(); ++i) {
    INFO("IO " << i);
    const storage::proto::IoResult& result = response->results[i];
    CHECK(result.status == IoStatus::ok);
    CHECK(result.bytes == ios[i].length);
    CHECK(delivered[i] == ios[i].length);
    CHECK(storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, data[i]));
    CHECK(storage::crc32c(data[i]) == result.checksum);
  }
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("zero-copy sends: a request's buffers are reused only once the kernel let go of its data",
                        "[storage][e2e][zerocopy]", Setups) {
  // The pool holds one request. Client A asks for 15 pieces and stalls
  // before reading; with a receive buffer of 64 KiB, most of its data sits
  // in the server's socket. Client B's request, made meanwhile, needs 16:
  // it gets them once A's are back. A server that gave A's buffers back at
  // the send's first completion would fill them with the pool's pattern and
  // B's data while A's bytes still wait in the socket: A would read those.
  storage::ServerOptions options = Fixture<TestType>::small();
  options.zeroCopySend = true;
  options.poisonBuffers = true;
  options.poolBytes = 16 * options.pieceSize;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    using R = typename TestType::R;
    auto& server = *fx.server;
    const bool zeroCopy = coio::detail::sendsZeroCopy(fx.reactor);
    INFO(server.note());
    CHECK((server.note().find("zero-copy sends (TCP)") != std::string::npos) == zeroCopy);
    CHECK(server.note().find("poisoned") != std::string::npos);
    // Three whole chunks (12 pieces) and an unaligned part of a fourth (3).
    const std::vector<storage::proto::ReadIo> ios = {
        {0, 0, kChunkSize, {}}, {1, 0, kChunkSize, {}}, {2, 0, kChunkSize, {}}, {3, 100, 40000, {}}};
    bool aAsked = false, bDone = false;
    auto clientA = [&]() -> Task<void> {
      std::unique_ptr<storage::TcpChannel<R>> a = co_await connectNarrow(fx.reactor, fx.address);
      co_await sendRaw(*a, requestFrame(1, ios, true));
      if (zeroCopy) {  // a copying server may be done with them before a check sees it
        const bool holding = co_await eventually(fx.reactor, [&server] { return server.buffersInUse() == 15; });
        CHECK(holding);
      }
      aAsked = true;
      co_await fx.reactor.sleepFor(300ms);  // the sends sit in the server's socket
      if (zeroCopy) {
        CHECK(server.buffersInUse() == 15);  // still referenced by the kernel
        CHECK_FALSE(bDone);
      }
      co_await readVerified(*a, 1, ios);
      co_await a->close();
    };
    auto clientB = [&]() -> Task<void> {
      auto b = co_await fx.client();
      co_await eventually(fx.reactor, [&aAsked] { return aAsked; });
      const std::vector<ReadOp> reads = {{4, 0, kChunkSize, {}}, {5, 0, kChunkSize, {}},
                                         {6, 0, kChunkSize, {}}, {7, 0, kChunkSize, {}}};
      const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, *b, reads);
      for (const ReadOutcome& o : outcomes) CHECK(o.status == IoStatus::ok);
      bDone = true;
      co_await b->close();
    };
    co_await coio::collectAll(clientA(), clientB());
    CHECK(bDone);
    const bool released = co_await eventually(fx.reactor, [&server] { return server.buffersInUse() == 0; });
    CHECK(released);
  });
}
#endif
