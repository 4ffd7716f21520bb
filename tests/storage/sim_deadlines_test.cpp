// The storage example's deadlines in virtual time: its client, its
// server's connection deadlines and the etcd client's keep-alives on
// coio::sim::SimReactor. Every time they measure is the reactor's
// (reactor.now()), so a deadline ends at exactly its virtual duration, on
// every seed. Were one to read steady_clock, it would be off by the wall
// time the run took (a few microseconds: still not exact), or, where the
// clock decides whether to go on (retryFor, the idle and frame deadlines,
// the keep-alive rate), run on in virtual time for as long as the wall
// clock takes to catch up.
#include "client/cluster_client.hpp"
#include "client/etcd_routing.hpp"
#include "client/storage_client.hpp"
#include "cluster/cluster_manager.hpp"
#include "etcd/etcd_client.hpp"
#include "fake_etcd.hpp"
#include "server/connection.hpp"
#include "transport/tcp_channel.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using coio::sim::SimReactor;
using Listener = coio::TcpListener<SimReactor>;
using Stream = coio::TcpStream<SimReactor>;

// The example's coordination compiles on the simulation too, every member
// (the cluster under the simulation needs it; no test here runs it yet).
template class storage::EtcdRouting<SimReactor>;
template class storage::ClusterManager<SimReactor>;

namespace {

constexpr auto kLatency = 1ms;  // each way, every link
constexpr std::uint64_t kSeeds = 8;
constexpr const char* kServer = "10.0.0.1:9000";

long long ns(std::chrono::nanoseconds d) { return d.count(); }

coio::SocketAddress address(const char* text) {
  const Result<coio::SocketAddress> a = coio::SocketAddress::parse(text);
  REQUIRE(a);
  return *a;
}

Listener listening(SimReactor& reactor, const char* at) {
  Result<Listener> listener = Listener::bind(reactor, address(at));
  REQUIRE(listener);
  return std::move(*listener);
}

// Accepts every connection and holds it open without reading or answering
// a byte: a server stopped (SIGSTOP) whose kernel still accepts and buffers.
struct SilentServer {
  SilentServer(SimReactor& reactor, const char* at) : listener(listening(reactor, at)) { scope.spawn(acceptAll()); }
  Task<void> stop() {
    scope.requestStop();
    co_await scope.join();
    held.clear();
  }
  Task<void> acceptAll() {
    for (;;) {
      Result<Stream> stream = co_await listener.accept();
      if (!stream) co_return;
      held.push_back(std::move(*stream));
    }
  }
  Listener listener;
  std::vector<Stream> held;
  coio::AsyncScope scope;
};

// Nobody listening at the address: connections are refused.
struct NoServer {
  NoServer() = default;
  NoServer(SimReactor&, const char*) {}
  Task<void> stop() { co_return; }
};

// One chain of one replica: target 1 on kServer.
storage::ChainTable oneReplica() {
  Result<storage::ChainTable> table =
      storage::ChainTable::parse(std::string("coio-chains 1\nchunks 8\nchunk-size 4K\nchain 1 ") + kServer + "/1\n",
                                 "test");
  REQUIRE(table);
  return std::move(*table);
}

// A cluster client of oneReplica(): requestTimeout 1 s, retryFor 3 s, the
// default pauses (50 ms, doubling up to 2 s).
storage::ClusterOptions retrying(std::vector<std::string>& log) {
  storage::ClusterOptions options;
  options.requestTimeout = 1s;
  options.retryFor = 3s;
  options.log = [&log](const std::string& line) { log.push_back(line); };
  return options;
}

// What a batchRead of one IO met: its outcome, the virtual time from the
// call, the client's figures.
struct ClusterRead {
  storage::ClusterOutcome outcome;
  std::chrono::nanoseconds took{};
  storage::ClusterStats stats;
};

// Why and when (from the accept) a served connection's deadlines ended it.
struct Expiry {
  storage::ConnectionExpiry why = storage::ConnectionExpiry::none;
  std::chrono::nanoseconds after{};
};

Task<Result<Stream>> acceptOne(Listener& listener) { co_return co_await listener.accept(); }

// A connection served with idleTimeout 3 s and frameTimeout 2 s (its
// deadlines checked every 2 s) whose client sends, after `stallAfter`, the
// first 3 bytes of a frame header and no more (nothing at all if none).
Task<Expiry> expiry(SimReactor& reactor, Listener& listener, std::optional<std::chrono::nanoseconds> stallAfter) {
  storage::ServerOptions options;
  options.idleTimeout = 3s;
  options.frameTimeout = 2s;
  options.sendTimeout = 8s;
  auto both = co_await coio::collectAll(Stream::connect(reactor, address(kServer)), acceptOne(listener));
  Result<Stream>& client = std::get<0>(both);
  Result<Stream>& accepted = std::get<1>(both);
  REQUIRE(client);
  REQUIRE(accepted);
  storage::ServedConnection<SimReactor> conn(std::make_unique<storage::TcpChannel<SimReactor>>(std::move(*accepted)));
  const auto start = reactor.now();
  storage::ReadFailure failure;
  auto read = [&]() -> Task<void> { (void)co_await conn.channel->readFrame(failure, conn.stop.get_token()); };
  auto stall = [&]() -> Task<void> {
    if (!stallAfter) co_return;
    co_await reactor.sleepFor(*stallAfter);
    const std::array<std::byte, 3> part{};
    const Result<void> sent = co_await client->writeAll(std::span<const std::byte>(part));
    REQUIRE(sent);
  };
  co_await coio::collectAll(read(), stall(), conn.enforceDeadlines(reactor, options));
  const Expiry out{conn.expired, reactor.now() - start};
  co_await conn.channel->close();
  co_return out;
}

// Runs `body`, then stops `server` (also when the body failed an assertion).
template <typename Server, typename T>
T runAgainst(SimReactor& reactor, Server& server, Task<T> body) {
  T result{};
  reactor.runUntil(storage::etcd::fake::guarded(server, [](Task<T> b, T& out) -> Task<void> {
    out = co_await std::move(b);
  }(std::move(body), result)));
  return result;
}

// A batchRead of one 4 KiB IO through a ClusterClient of oneReplica(),
// whose server at kServer is a `Server`, on a simulation of `seed`.
template <typename Server>
ClusterRead readThroughCluster(std::uint64_t seed) {
  SimReactor reactor(seed);
  reactor.setLink({.latency = kLatency});
  Server server(reactor, kServer);
  std::vector<std::string> log;
  return runAgainst(reactor, server, [](SimReactor& r, std::vector<std::string>& l) -> Task<ClusterRead> {
    std::unique_ptr<storage::ClusterClient<SimReactor>> client =
        co_await storage::ClusterClient<SimReactor>::connect(r, oneReplica(), retrying(l));
    std::vector<std::byte> into(4096);
    const storage::ReadOp op{.chunkId = 0, .offset = 0, .length = 4096, .into = into};
    const auto start = r.now();
    std::vector<storage::ClusterOutcome> outcomes = co_await client->batchRead(std::span(&op, 1));
    ClusterRead read{outcomes.at(0), r.now() - start, client->stats()};
    co_await client->close();
    co_return read;
  }(reactor, log));
}

}  // namespace

TEST_CASE("StorageClient on SimReactor: a server that never answers fails a batchRead timed_out after exactly "
          "ClientOptions::timeout of virtual time",
          "[sim]") {
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    SimReactor reactor(seed);
    reactor.setLink({.latency = kLatency});
    SilentServer server(reactor, kServer);
    const auto tooks = runAgainst(reactor, server, [](SimReactor& r) -> Task<std::array<std::chrono::nanoseconds, 2>> {
      storage::TransmissionLimiter limiter;
      Result<std::unique_ptr<storage::StorageClient<SimReactor>>> client =
          co_await storage::StorageClient<SimReactor>::connect(r, address(kServer), limiter, {.timeout = 3s});
      REQUIRE(client);
      std::vector<std::byte> into(4096);
      const storage::ReadOp op{.chunkId = 0, .offset = 0, .length = 4096, .into = into};
      std::array<std::chrono::nanoseconds, 2> took{};
      // Twice: a timed-out request is abandoned, the connection stays for the next.
      for (std::chrono::nanoseconds& t : took) {
        const auto start = r.now();
        const Result<std::vector<storage::ReadOutcome>> read = co_await (*client)->batchRead(std::span(&op, 1));
        t = r.now() - start;
        REQUIRE(!read);
        CHECK(read.error() == std::errc::timed_out);
      }
      CHECK(!(*client)->failure());
      co_await (*client)->close();
      co_return took;
    }(reactor));
    CHECK(ns(tooks[0]) == ns(3s));
    CHECK(ns(tooks[1]) == ns(3s));
  }
}

TEST_CASE("ClusterClient on SimReactor: the retry budget (retryFor) ends on virtual time, to the nanosecond",
          "[sim]") {
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    // Every connection refused: pauses of 50, 100, 200, 400, 800 ms, then
    // the 1450 ms left of the 3 s (not 1600): the IO fails, never sent, as
    // the budget ends.
    const ClusterRead refused = readThroughCluster<NoServer>(seed);
    CHECK(ns(refused.took) == ns(3s));
    CHECK(refused.stats.retryPauses == 6);
    CHECK(refused.outcome.status == storage::proto::IoStatus::unavailable);
    CHECK(refused.outcome.error == std::errc::connection_refused);
    CHECK(refused.outcome.attempts == 0);
    // A server that never answers: a request (1 s), a pause of 50 ms, a
    // request as the last resort of a down server (1 s), a pause of 100
    // ms, a request (1 s): at 3.15 s the 3 s are spent, and the IO fails
    // with its last outcome.
    const ClusterRead hung = readThroughCluster<SilentServer>(seed);
    CHECK(ns(hung.took) == ns(3150ms));
    CHECK(hung.stats.retryPauses == 2);
    CHECK(hung.outcome.status == storage::proto::IoStatus::timedOut);
    CHECK(hung.outcome.error == std::errc::timed_out);
    CHECK(hung.outcome.attempts == 3);
  }
}

TEST_CASE("StorageServer's connection deadlines on SimReactor: idle and frame timeouts at exactly their virtual "
          "time",
          "[sim]") {
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    SimReactor reactor(seed);
    reactor.setLink({.latency = kLatency});
    Listener listener = listening(reactor, kServer);
    NoServer nobody;  // the listener is the server: nothing else to stop
    // Nothing sent: closed as idle, idleTimeout after the connection came.
    const Expiry idle = runAgainst(reactor, nobody, expiry(reactor, listener, std::nullopt));
    CHECK(idle.why == storage::ConnectionExpiry::idle);
    CHECK(ns(idle.after) == ns(3s));
    // A frame begun at 1 s and a latency, never finished: frameTimeout after its first byte.
    const Expiry frame = runAgainst(reactor, nobody, expiry(reactor, listener, 1s));
    CHECK(frame.why == storage::ConnectionExpiry::frame);
    CHECK(ns(frame.after) == ns(1s + kLatency + 2s));
  }
}

TEST_CASE("etcd keepLeaseAlive on SimReactor: a keep-alive every ttl/3 of virtual time, at a fixed rate", "[sim]") {
  using namespace storage::etcd;
  for (std::uint64_t seed = 1; seed <= kSeeds; ++seed) {
    INFO("seed " << seed);
    SimReactor reactor(seed);
    reactor.setLink({.latency = kLatency});
    fake::FakeEtcd<SimReactor> etcd(reactor);
    for (int i = 0; i < 4; ++i) etcd.replies.push_back({fake::ok(R"({"result":{"ID":"5","TTL":"3"}})")});
    EtcdOptions o;
    o.endpoints = {etcd.endpoint()};
    Result<std::unique_ptr<EtcdClient<SimReactor>>> client = EtcdClient<SimReactor>::create(reactor, std::move(o));
    REQUIRE(client);
    const auto start = reactor.now();
    const bool kept = runAgainst(reactor, etcd, [](SimReactor& r, EtcdClient<SimReactor>& c) -> Task<bool> {
      std::stop_source stop;
      auto stopLater = [&]() -> Task<void> {
        co_await r.sleepFor(4500ms);
        stop.request_stop();
      };
      auto [kept, stopped] = co_await coio::collectAll(keepLeaseAlive(c, 5, 3s, stop.get_token()), stopLater());
      (void)stopped;
      co_return kept.hasValue();
    }(reactor, **client));
    CHECK(kept);
    // Each on a new connection: a round trip to connect, then the request
    // one latency later.
    REQUIRE(etcd.arrivals.size() == 4);
    for (std::size_t k = 0; k < etcd.arrivals.size(); ++k) {
      CHECK(ns(etcd.arrivals[k] - start) == ns(static_cast<int>(k + 1) * 1s + 3 * kLatency));
    }
  }
}
