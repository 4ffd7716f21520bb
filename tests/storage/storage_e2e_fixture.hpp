#pragma once
// What the storage e2e suite's files share (storage_e2e_*_test.cpp, one
// topic each, one test binary): the server and client end to end, in one
// process on one reactor (each reactor kind). Built twice: over loopback
// TCP (host suite) and, with COIO_E2E_RDMA, over RDMA (label `rdma`: runs
// where a device exists, e.g. the Soft-RoCE guest). The binary is one
// translation unit (unity build): a name a file keeps to itself must not
// be another file's too.
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
#include <coio/reactor/with_timeout.hpp>

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

// The next frame on `channel`, or timed_out after `limit`.
template <typename R, typename Channel>
Task<Result<storage::IncomingFrame>> readWithin(R& reactor, Channel& channel, std::chrono::steady_clock::duration limit) {
  storage::ReadFailure failure;
  auto read = [&](std::stop_token stop) { return channel.readFrame(failure, std::move(stop)); };
  co_return co_await coio::withTimeout(reactor, read, limit);
}

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

// Sends request `id`'s TransmitGrant.
template <typename Channel>
Task<void> sendGrant(Channel& channel, std::uint64_t id) {
  std::vector<std::byte> grant;
  storage::proto::encodeEmpty(grant, storage::proto::MessageType::transmitGrant, id);
  co_await sendRaw(channel, grant);
}

// The next BatchReadResponse of a one-IO request on `channel` (its data read
// into `into` as readResponse does): its request id and the IO's result.
template <typename Channel>
Task<std::pair<std::uint64_t, storage::proto::IoResult>> readOneResult(Channel& channel, std::span<std::byte> into,
                                                                      std::size_t& delivered) {
  Result<storage::IncomingFrame> reply = co_await readResponse(channel, into, delivered);
  REQUIRE(reply);
  REQUIRE(reply->header.type == storage::proto::MessageType::batchReadResponse);
  auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
  REQUIRE(response);
  co_return std::pair{reply->header.requestId, response->results.at(0)};
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

// (chunk, block) pairs: blocks of a chunk, e.g. those a test damaged on disk.
using BlockSet = std::set<std::pair<std::uint64_t, std::uint32_t>>;

// The blocks of `blocks` (of `blockSize` bytes) that `op` reads from.
inline std::vector<std::pair<std::uint64_t, std::uint32_t>> blocksRead(const ReadOp& op, const BlockSet& blocks,
                                                                      std::uint32_t blockSize) {
  std::vector<std::pair<std::uint64_t, std::uint32_t>> read;
  const std::uint64_t end = std::uint64_t{op.offset} + op.length;
  for (std::uint32_t block = op.offset / blockSize; op.length > 0 && block * std::uint64_t{blockSize} < end; ++block) {
    if (blocks.count({op.chunkId, block}) > 0) read.emplace_back(op.chunkId, block);
  }
  return read;
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
  co_await sendGrant(channel, 1);
  bool sawUnavailable = false, sawData = false;
  std::size_t delivered = 0;  // of request 1 (request 2 has no data)
  for (int responses = 0; responses < 2; ++responses) {
    const auto [id, result] = co_await readOneResult(channel, data, delivered);
    if (id == 2) {
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
