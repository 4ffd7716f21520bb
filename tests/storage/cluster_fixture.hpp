#pragma once
// The cluster of cluster_e2e_test.cpp, for the suites that drive a
// ClusterClient against storage servers in child processes (that one, and
// etcd_routing_test.cpp): servers 0..n-1 in a ring of replication 2, each
// in a child process, the client on the fixture's reactor. Included by one
// test source each (hence the unnamed namespace).
#include "client/cluster_client.hpp"
#include "e2e_support.hpp"
#include "client/storage_client.hpp"
#if COIO_E2E_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/core/collect_all.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using storage::ClusterOutcome;
using storage::ReadOp;
using storage::proto::IoStatus;
using Clock = std::chrono::steady_clock;

namespace {

using storage::testing::Setups;

constexpr std::uint32_t kChunkSize = 16 * 1024;
// Scheduling on a loaded machine (a TCG guest); unused by the RDMA build.
[[maybe_unused]] constexpr auto kSlack = 2s;

// Servers 0..n-1 in a ring: chain k has target 10k+1 on server k and
// target 10k'+2 on server k' = k+1 (mod n), so every server holds two
// targets of two chains, and chunk c is on chain c mod n.
template <typename S>
struct Cluster {
  using R = typename S::R;
  using Client = storage::ClusterClient<R>;
  static constexpr std::size_t kServers = S::rdma ? 2 : 3;
  static constexpr std::uint64_t kChunks = 20 * kServers;

  // `firstRouting`: the chain versions server 0 starts with (none: it knows none). `spliced`: the
  // servers read through the page cache and splice (--buffered --data-path splice).
  explicit Cluster(const storage::ChainTable* firstRouting = nullptr, bool spliced = false)
      : splicedReads(spliced), arena(8u << 20) {
    std::vector<std::uint16_t> placeholders;
    for (std::size_t s = 0; s < kServers; ++s) placeholders.push_back(static_cast<std::uint16_t>(1 + s));
    // The chunks of a target depend on its chain, not on addresses.
    const storage::ChainTable shape = *storage::ChainTable::parse(tableText(placeholders), "shape");
    for (std::size_t s = 0; s < kServers; ++s) {
      for (const storage::TargetSpec& t : targetsOf(s)) {
        dirs.emplace(t.id, std::make_unique<storage::testing::TempDir>(*shape.targetLayout(t.id, 8)));
      }
    }
    for (std::size_t s = 0; s < kServers; ++s) start(s, 0, s == 0 ? firstRouting : nullptr);
    std::vector<std::uint16_t> ports;
    for (const auto& server : servers) ports.push_back(server.port());
    std::string why;
    auto parsed = storage::ChainTable::parse(tableText(ports), "cluster", &why);
    INFO(why);
    REQUIRE(parsed);
    table = std::move(*parsed);
#if COIO_E2E_RDMA
    std::string reason;
    auto dev = coio::rdma::Device::open({.name = storage::testing::rdmaDeviceName()}, &reason);
    INFO(reason);
    REQUIRE(dev);  // no device is a failure here, never a skip
    device = std::move(*dev);
#endif
  }

  static std::uint32_t firstTarget(std::size_t s) { return static_cast<std::uint32_t>(10 * s + 1); }
  static std::uint32_t secondTarget(std::size_t s) { return static_cast<std::uint32_t>(10 * s + 2); }

  static std::string tableText(const std::vector<std::uint16_t>& ports) {
    std::string text = "coio-chains 1\nchunks " + std::to_string(kChunks) + "\nchunk-size 16K\n";
    for (std::size_t k = 0; k < kServers; ++k) {
      const std::size_t next = (k + 1) % kServers;
      text += "chain " + std::to_string(k + 1) + " 127.0.0.1:" + std::to_string(ports[k]) + "/" +
              std::to_string(firstTarget(k)) + " 127.0.0.1:" + std::to_string(ports[next]) + "/" +
              std::to_string(secondTarget(next)) + "\n";
    }
    return text;
  }

  std::vector<storage::TargetSpec> targetsOf(std::size_t s) const {
    const auto dirOf = [this](std::uint32_t id) { return dirs.count(id) ? dirs.at(id)->path.string() : ""; };
    return {{firstTarget(s), dirOf(firstTarget(s))}, {secondTarget(s), dirOf(secondTarget(s))}};
  }

  // Starts server `s` on `port` (0: any; a restart takes its old one),
  // with `routing`'s chain versions if given.
  void start(std::size_t s, std::uint16_t port, const storage::ChainTable* routing = nullptr) {
    storage::ServerOptions o;
    o.pieceSize = 16 * 1024;
    o.poolBytes = 4u << 20;
    if (splicedReads) {
      o.directIo = false;
      o.dataPath = storage::DataPath::splice;
    }
    servers[s].template start<R>(targetsOf(s), o, port, S::rdma, routing);
  }
  void restart(std::size_t s) {
    const std::uint16_t port = servers[s].port();
    servers[s].kill();
    start(s, port);
  }
  // The table (any ports: versions go by target) with chain 1 (targets 1
  // on server 0, 12 on server 1) moved on to version 3: target 12 went
  // offline and came back.
  static storage::ChainTable chainOneAtVersion3() {
    std::vector<std::uint16_t> ports;
    for (std::size_t s = 0; s < kServers; ++s) ports.push_back(static_cast<std::uint16_t>(1 + s));
    storage::ChainTable t = *storage::ChainTable::parse(tableText(ports), "newer");
    t = t.withChain(storage::markTargetOffline(t.chainRecord(0), 12)).value();
    return t.withChain(storage::markTargetServing(t.chainRecord(0), 12)).value();
  }

  // Fast failure handling, and the log captured.
  storage::ClusterOptions options() {
    storage::ClusterOptions o;
    o.requestTimeout = 2s;  // generous: a loaded machine must not look like a hung server
    o.reconnectMin = 20ms;
    o.reconnectMax = 200ms;
    o.log = [this](const std::string& line) { log.push_back(line); };
    return o;
  }

  Task<Result<std::unique_ptr<storage::Channel<R>>>> connectChannel(coio::SocketAddress to, std::stop_token stop) {
    Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, to, stop);
    if (!stream) co_return stream.error();
#if COIO_E2E_RDMA
    co_return co_await storage::RdmaChannel<R>::connect(reactor, *device, std::move(*stream), std::move(stop), 10s);
#else
    (void)stream->setNoDelay(true);
    co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)));
#endif
  }

  // Runs `body(client)` with a client of the cluster, closed afterwards
  // even if the body fails an assertion.
  template <typename Body>
  void run(storage::ClusterOptions o, Body body) {
    reactor.runUntil(withClient(std::move(o), std::move(body)));
  }
  template <typename Body>
  Task<void> withClient(storage::ClusterOptions o, Body body) {
    typename Client::ConnectorFactory factory = [this](const coio::SocketAddress& to) -> storage::ChannelConnector<R> {
      return [this, to](std::stop_token stop) { return connectChannel(to, std::move(stop)); };
    };
    std::unique_ptr<Client> client = co_await Client::connect(reactor, table, std::move(o), std::move(factory));
    std::exception_ptr failure;
    try {
      REQUIRE(client->registerMemory(arena));
      co_await body(*client);
    } catch (...) {
      failure = std::current_exception();
    }
    co_await client->close();
    if (failure) std::rethrow_exception(failure);
  }

  // `n` bytes of the arena, 64-byte aligned, wrapping around.
  std::span<std::byte> buffer(std::size_t n) {
    std::size_t at = (used + 63) / 64 * 64;
    if (at + n > arena.size()) at = 0;
    used = at + n;
    return std::span(arena).subspan(at, n);
  }

  // Reads `ios` (destinations from the arena); every IO must come back
  // whole and right, in request order.
  Task<std::vector<ClusterOutcome>> readAll(Client& client, std::vector<ReadOp> ios) {
    for (ReadOp& op : ios) op.into = buffer(op.length);
    std::vector<ClusterOutcome> outcomes = co_await client.batchRead(ios);
    REQUIRE(outcomes.size() == ios.size());
    for (std::size_t i = 0; i < ios.size(); ++i) {
      INFO("IO " << i << ": chunk " << ios[i].chunkId << ", status " << static_cast<int>(outcomes[i].status) << ", "
                 << outcomes[i].error.message() << ", " << outcomes[i].attempts << " attempt(s)");
      REQUIRE(outcomes[i].ok());
      CHECK(outcomes[i].bytes == ios[i].length);
      CHECK(storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, ios[i].into.first(ios[i].length)));
    }
    co_return outcomes;
  }

  // Waits (polling the loop) until `done()` or 5 s pass.
  template <typename Pred>
  Task<bool> eventually(Pred done) {
    for (int i = 0; i < 500 && !done(); ++i) co_await reactor.sleepFor(10ms);
    co_return done();
  }

  bool splicedReads;  // the servers splice (read through the page cache)
  std::map<std::uint32_t, std::unique_ptr<storage::testing::TempDir>> dirs;  // by target id
  std::array<storage::testing::ServerProcess, kServers> servers;             // killed before the dirs go
  storage::ChainTable table;
  std::vector<std::byte> arena;  // before the reactor: registrations of it die with the channels
#if COIO_E2E_RDMA
  std::unique_ptr<coio::rdma::Device> device;
#endif
  R reactor;
  std::size_t used = 0;
  std::vector<std::string> log;
};

// `n` whole chunks, every chain's, from `first` on.
std::vector<ReadOp> wholeChunks(std::uint64_t first, std::size_t n, std::uint64_t chunks) {
  std::vector<ReadOp> ios;
  for (std::size_t i = 0; i < n; ++i) ios.push_back({(first + i) % chunks, 0, kChunkSize, {}});
  return ios;
}

}  // namespace
