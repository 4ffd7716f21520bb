// The storage cluster with its coordination in the simulated etcd
// (sim_etcd.hpp), under seeds: three servers that register under leases
// and follow their chains (registerServer, followRouting: what `serve
// --etcd` runs), a ClusterManager turning registrations into chain states,
// a ClusterClient routed by EtcdRouting, all nodes of one simulation; while
// it reads, etcd stops (SIGSTOP) for 1-3 s, crashes and restarts, slows
// down, loses its leader, and a server's lease is lost (and, in a second
// scenario, servers crash). Invariants: every IO reads the dataset's bytes
// (or, with servers crashing, fails by name); once the faults stop, the
// routing settles and every chunk reads right.
#include "sim_cluster.hpp"
#include "sim_etcd.hpp"
#include "client/cluster_client.hpp"
#include "client/etcd_routing.hpp"
#include "cluster/cluster_manager.hpp"
#include "etcd/etcd_client.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/testing/seed_driver.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using storage::etcd::EtcdClient;
using storage::etcd::SimEtcdStore;

namespace storage::simcluster {
namespace {

constexpr const char* kEtcdNode = "10.0.0.100";
constexpr const char* kManagerNode = "10.0.0.50";
// Server leases outlive the longest etcd stop (3 s): a stop alone loses none.
constexpr std::int64_t kServerTtl = 5;
constexpr std::int64_t kManagerTtl = 5;

// What a run of the scenario did, beside its reads.
struct EtcdRunReport {
  RunReport reads;
  std::uint64_t chainChanges = 0;    // the manager's committed chain changes
  std::uint64_t routingUpdates = 0;  // routings the client's EtcdRouting applied
  std::uint64_t etcdStops = 0;       // the faults: etcd stopped (SIGSTOP),
  std::uint64_t etcdCrashes = 0;     // crashed and restarted,
  std::uint64_t etcdSlowdowns = 0;   // slowed down,
  std::uint64_t etcdLeaderless = 0;  // without a leader for a while,
  std::uint64_t leasesLost = 0;      // a server's lease lost,
  std::uint64_t serverCrashes = 0;   // a server crashed, back 1-8 s later (in the crash scenario)
  std::uint64_t registrations = 0;   // servers' registrations (the first ones and those after a lost lease)
  std::chrono::steady_clock::duration settle{};  // from the last fault until the routing settled
};

std::unique_ptr<EtcdClient<R>> etcdClientOn(R& r) {
  storage::etcd::EtcdOptions o;
  o.endpoints = {std::string("http://") + kEtcdNode + ":2379"};
  auto made = EtcdClient<R>::create(r, std::move(o));
  if (!made) throw std::logic_error("etcd client: " + made.error().message());
  return std::move(*made);
}

// Server s: serves its targets, registers in etcd and follows its chains there until killed.
void startEtcdServers(R& reactor, ClusterData& data, const ServerOptions& options, const ChainTable& table,
                      std::uint64_t& registrations) {
  for (std::size_t s = 0; s < kServers; ++s) {
    const storage::ServerRecord record = table.records().servers.at(s);
    reactor.startNode(host(s), [&data, options, s, record, &registrations](R& r) -> Task<void> {
      auto server = StorageServer<R>::open(r, data.targetsOf(s), options);
      if (!server) throw std::runtime_error("server " + host(s) + ": " + server.error().message());
      auto bound = coio::TcpListener<R>::bind(r, *coio::SocketAddress::parse("0.0.0.0:9000"));
      if (!bound) throw std::runtime_error("listen on " + host(s) + ": " + bound.error().message());
      (*server)->serve(*bound);
      std::unique_ptr<EtcdClient<R>> etcd = etcdClientOn(r);
      StorageServer<R>& served = **server;
      const std::stop_token killed = co_await coio::currentStopToken();
      std::int64_t lease = 0;
      auto log = [&r, &registrations, s](const std::string& line) {
        if (line.starts_with("registered")) ++registrations;
        simLog(r, host(s) + ": " + line);
      };
      co_await coio::collectAll(
          storage::registerServer(*etcd, record, kServerTtl, &lease, log, killed),
          storage::followRouting(*etcd, std::function<void(const ChainTable&)>([&served](const ChainTable& t) {
                                   served.updateRouting(t);
                                 }),
                                 log, killed));
      co_await served.shutdown();
    });
  }
}

// The fault schedule of etcd, beside the reads: every 0.5-1.5 s, etcd stops
// for 1-3 s, or crashes (its connections reset, or its machine silent) and
// restarts 0.2-2 s later, or its links slow to 100-400 ms each way for a
// while, or it has no leader for 1-3 s, or a server's registration lease
// is lost (at most one per 2 s: a chain keeps a serving replica while its
// server registers again); with `serverCrashes`, or a server crashes
// (reset or silent) and restarts 1-8 s later. One fault at a time.
Task<void> etcdFaults(R& r, SimEtcdStore& store, const ChainTable& table, bool serverCrashes, EtcdRunReport& out,
                      std::stop_token stop) {
  const std::vector<std::string> hosts{"127.0.0.1", host(0), host(1), host(2), kManagerNode};
  coio::sim::Node& etcd = r.node(kEtcdNode);
  const auto lasting = [&r](std::uint64_t from, std::uint64_t to) {
    return std::chrono::milliseconds(from + r.random().below(to - from));
  };
  // Holds a fault for `d` (less if stopped), then undoes it: whether to go on.
  const auto held = [&r, &stop](std::chrono::milliseconds d, auto undo) -> Task<bool> {
    const bool on = co_await r.sleepFor(d, stop);
    undo();
    simLog(r, "fault: over");
    co_return on;
  };
  while (co_await r.sleepFor(lasting(500, 1500), stop)) {
    switch (r.random().below(serverCrashes ? 6 : 5)) {
      case 0: {
        simLog(r, "fault: etcd stops (SIGSTOP)");
        ++out.etcdStops;
        etcd.pause();
        const bool on = co_await held(lasting(1000, 3000), [&] { etcd.resume(); });
        if (!on) co_return;
        break;
      }
      case 1: {
        const bool silent = r.random().below(2) == 0;
        simLog(r, silent ? "fault: etcd's machine is gone" : "fault: etcd crashes");
        ++out.etcdCrashes;
        etcd.kill(silent ? coio::sim::KillMode::silent : coio::sim::KillMode::reset);
        const bool on = co_await held(lasting(200, 2000), [&] { etcd.restart(); });
        if (!on) co_return;
        break;
      }
      case 2: {
        const auto slow = lasting(100, 400);
        simLog(r, "fault: etcd's links slow to " + std::to_string(slow.count()) + " ms");
        ++out.etcdSlowdowns;
        for (const std::string& h : hosts) r.setLink(kEtcdNode, h, {.latency = slow});
        const bool on = co_await held(lasting(500, 2000), [&] {
          for (const std::string& h : hosts) r.setLink(kEtcdNode, h, {.latency = 200us});
        });
        if (!on) co_return;
        break;
      }
      case 3: {
        simLog(r, "fault: etcd loses its leader");
        ++out.etcdLeaderless;
        store.setNoLeader(true, r.now());
        const bool on = co_await held(lasting(1000, 3000), [&] { store.setNoLeader(false, r.now()); });
        if (!on) co_return;
        break;
      }
      case 5: {
        const std::size_t server = r.random().below(kServers);
        const bool silent = r.random().below(2) == 0;
        simLog(r, "fault: " + host(server) + (silent ? " goes silent" : " crashes"));
        ++out.serverCrashes;
        coio::sim::Node& node = r.node(host(server));
        node.kill(silent ? coio::sim::KillMode::silent : coio::sim::KillMode::reset);
        const bool on = co_await held(lasting(1000, 8000), [&] { node.restart(); });  // longer than its lease, or not
        if (!on) co_return;
        break;
      }
      default: {
        const std::string name = table.records().servers.at(r.random().below(kServers)).name;
        const std::optional<storage::etcd::KeyValue> live = store.get(storage::liveKey(name));
        if (live && store.loseLease(live->lease)) {
          simLog(r, "fault: the lease of " + name + " is lost");
          ++out.leasesLost;
          if (!co_await r.sleepFor(2s, stop)) co_return;
        }
      }
    }
  }
}

// Whether every chain in `store` has all its targets serving, and
// `followed` (the client's routing) holds those very records.
bool settled(const SimEtcdStore& store, const ChainTable& followed) {
  const std::vector<storage::ChainRecord> held = followed.records().chains;
  for (std::uint32_t id = 1; id <= kServers; ++id) {
    const std::optional<storage::etcd::KeyValue> kv = store.get(storage::chainKey(id));
    if (!kv) return false;
    const Result<storage::ChainRecord> chain = storage::parseChainRecord(kv->value);
    if (!chain || std::find(held.begin(), held.end(), *chain) == held.end()) return false;
    for (const storage::TargetRecord& target : chain->targets) {
      if (target.state != storage::ReplicaState::serving) return false;
    }
  }
  return true;
}

// Checks one batch's outcomes into `out`.
void check(R& r, ClusterData& d, const std::vector<ReadOp>& ios, const std::vector<ClusterOutcome>& outcomes,
           RunReport& out) {
  for (std::size_t i = 0; i < ios.size(); ++i) {
    const ClusterOutcome& io = outcomes.at(i);
    if (!io.ok()) {
      simLog(r, "IO failed: chunk " + std::to_string(ios[i].chunkId) + ", " + std::string(proto::toString(io.status)) +
                    ", " + io.error.message());
      ++out.failed[std::string(proto::toString(io.status))];
    } else if (io.bytes != ios[i].length || !d.matches(ios[i].chunkId, ios[i].offset, ios[i].into.first(io.bytes))) {
      out.wrongBytes += io.bytes;
    } else {
      ++out.ok;
    }
  }
}

// How long the routing may take to settle once the faults stop: a lost
// lease's server registers again at its next keep-alive (TTL / 3), a
// deposed manager campaigns again after a second, leads after its grace.
constexpr auto kSettleWithin = 15s;

// The client: the routing from etcd (EtcdRouting, followed), `batches`
// batches of reads 0-200 ms apart, each IO checked; then the faults stop
// (`faults`), the routing must settle (every target serving in etcd, the
// client following) within kSettleWithin, and every chunk then reads right.
Task<void> etcdRoutedReads(R& r, ClusterData& d, const SimEtcdStore& store, int batches, std::stop_source& faults,
                           EtcdRunReport& report) {
  RunReport& out = report.reads;
  std::unique_ptr<EtcdClient<R>> etcd = etcdClientOn(r);
  std::string why;
  Result<std::unique_ptr<storage::EtcdRouting<R>>> routing =
      co_await storage::EtcdRouting<R>::load(*etcd, 30s, [&r](const std::string& line) { simLog(r, line); }, &why);
  if (!routing) throw std::runtime_error("cannot load the routing from etcd: " + why);
  ClusterOptions o;
  o.requestTimeout = 300ms;
  o.reconnectMin = 20ms;
  o.reconnectMax = 200ms;
  o.retryFor = 3s;
  o.hedgeAfter = r.random().below(2) == 0 ? std::chrono::steady_clock::duration{} : 50ms;
  o.refreshRouting = (*routing)->refresher(o.requestTimeout);
  o.log = [&r](const std::string& line) { simLog(r, line); };
  std::unique_ptr<ClusterClient<R>> client =
      co_await ClusterClient<R>::connect(r, (*routing)->table(), std::move(o), tcpChannels(r));
  (*routing)->follow(*client);
  std::vector<std::byte> arena(16 * kClusterChunk);
  for (int b = 0; b < batches; ++b) {
    co_await r.sleepFor(std::chrono::milliseconds(r.random().below(200)));
    const std::vector<ReadOp> ios = drawIos(r.random(), arena, kClusterChunks, kClusterChunk);
    const auto called = r.now();
    const std::vector<ClusterOutcome> outcomes = co_await client->batchRead(ios);
    out.longestBatch = std::max(out.longestBatch, r.now() - called);
    check(r, d, ios, outcomes, out);
  }
  faults.request_stop();
  const auto stopped = r.now();
  while (!settled(store, (*routing)->table())) {
    if (r.now() - stopped > kSettleWithin) {
      throw std::runtime_error("the routing did not settle within 15 s of the last fault");
    }
    co_await r.sleepFor(50ms);
  }
  report.settle = r.now() - stopped;
  for (std::uint64_t first = 0; first < kClusterChunks; first += 16) {  // every chunk, whole
    std::vector<ReadOp> ios;
    for (std::uint64_t c = first; c < std::min<std::uint64_t>(first + 16, kClusterChunks); ++c) {
      ReadOp op;
      op.chunkId = c;
      op.length = kClusterChunk;
      op.into = std::span(arena).subspan((c - first) * kClusterChunk, kClusterChunk);
      ios.push_back(op);
    }
    const std::vector<ClusterOutcome> outcomes = co_await client->batchRead(ios);
    check(r, d, ios, outcomes, out);
  }
  out.cluster = client->stats();
  for (std::size_t i = 0; i < client->servers(); ++i) out.requests += client->serverStats(i).requests;
  report.routingUpdates = (*routing)->stats().updates;
  co_await (*routing)->close();
  co_await client->close();
}

constexpr int kEtcdRunBatches = 30;

// The invariants of a run: every IO read right (`strict`: the servers all
// live, etcd's faults may delay the routing, never fail a read) or failed
// by name (with server crashes: a chain may have no serving replica), none
// unaccounted for, the routing settled after the faults (checked in the
// run), no batchRead past its retry budget and a request's deadline (3 s +
// 0.3 s), nothing in flight. What was violated, if anything.
std::optional<std::string> etcdRunViolated(const EtcdRunReport& r, bool strict) {
  std::string why;
  if (r.reads.wrongBytes != 0) why += " wrong bytes delivered as good;";
  if (strict && failures(r.reads) != 0) why += " IOs failed;";
  if (r.reads.ok + failures(r.reads) != kEtcdRunBatches * 16u + kClusterChunks) why += " IOs unaccounted for;";
  if (r.reads.longestBatch > 3400ms) why += " a batchRead outlived its deadline;";
  if (r.reads.inFlight != 0) why += " operations left in flight;";
  if (why.empty()) return std::nullopt;
  return describe(r.reads) + ":" + why;
}

EtcdRunReport clusterEtcdRun(std::uint64_t seed, ClusterData& data, bool serverCrashes = false,
                             int batches = kEtcdRunBatches) {
  R reactor(seed);
  reactor.drawLinks({.latency = 20us, .window = 64 * 1024}, {.latency = 1ms, .window = 1 << 20});
  EtcdRunReport report;
  SimEtcdStore store;
  reactor.startNode(kEtcdNode, storage::etcd::simEtcd(store));
  const ChainTable table = *ChainTable::parse(tableText(), "cluster");
  ServerOptions options;
  options.directIo = false;  // as clusterRun: buffered reads of the real files
  options.pieceSize = 16 * 1024;
  options.poolBytes = 2u << 20;
  // The routing in etcd first (`cluster load`), then the servers and the manager.
  {
    std::unique_ptr<EtcdClient<R>> etcd = etcdClientOn(reactor);
    Result<std::int64_t> loaded = reactor.runUntil(storage::loadRouting(*etcd, table, false));
    if (!loaded) throw std::runtime_error("cannot load the routing: " + loaded.error().message());
  }
  startEtcdServers(reactor, data, options, table, report.registrations);
  std::uint64_t& changes = report.chainChanges;
  reactor.startNode(kManagerNode, [&changes](R& r) -> Task<void> {
    std::unique_ptr<EtcdClient<R>> etcd = etcdClientOn(r);
    auto log = [&r](const std::string& line) { simLog(r, "manager: " + line); };
    storage::ClusterManager<R> manager(*etcd, "mgmtd", kManagerTtl, log, std::chrono::seconds(1));
    co_await manager.run(co_await coio::currentStopToken());
    changes = manager.changes();
  });
  std::exception_ptr failure;
  reactor.runUntil([](R& r, SimEtcdStore& s, const ChainTable& t, ClusterData& d, int n, bool crashes,
                      EtcdRunReport& out, std::exception_ptr& f) -> Task<void> {
    std::stop_source stopFaults;
    auto readThenStop = [](Task<void> reads, std::stop_source& done) -> Task<void> {
      struct Stop {
        std::stop_source& s;
        ~Stop() { s.request_stop(); }
      } stopAtEnd{done};
      co_await std::move(reads);
    };
    try {
      co_await coio::collectAll(readThenStop(etcdRoutedReads(r, d, s, n, stopFaults, out), stopFaults),
                                etcdFaults(r, s, t, crashes, out, stopFaults.get_token()));
    } catch (...) {
      f = std::current_exception();
    }
    // A crash is no shutdown: the servers and the manager end as killed, etcd last.
    for (std::size_t i = 0; i < kServers; ++i) r.node(host(i)).kill();
    r.node(kManagerNode).kill();
    r.node(kEtcdNode).kill();
  }(reactor, store, table, data, batches, serverCrashes, report, failure));
  if (failure) std::rethrow_exception(failure);
  report.reads.inFlight = reactor.stats().inFlight;
  report.reads.trace = reactor.traceHash();
  return report;
}

}  // namespace
}  // namespace storage::simcluster

using namespace storage::simcluster;

namespace {

// The seeds of a scenario through the seed driver; a failing one is
// printed with its replay line, and fails the test.
void etcdSeeds(bool serverCrashes, const char* filter) {
  ClusterData data;
  const coio::sim::SeedRange seeds = coio::sim::SeedRange::fromEnvironment(20);
  EtcdRunReport all;
  const coio::sim::SeedReport report = coio::sim::runSeeds(
      seeds,
      [&](std::uint64_t seed) {
        const EtcdRunReport r = clusterEtcdRun(seed, data, serverCrashes);
        if (const std::optional<std::string> why = etcdRunViolated(r, !serverCrashes)) throw std::runtime_error(*why);
        all.reads.ok += r.reads.ok;
        for (const auto& [status, n] : r.reads.failed) all.reads.failed[status] += n;
        all.chainChanges += r.chainChanges;
        all.routingUpdates += r.routingUpdates;
        all.etcdStops += r.etcdStops;
        all.etcdCrashes += r.etcdCrashes;
        all.etcdSlowdowns += r.etcdSlowdowns;
        all.etcdLeaderless += r.etcdLeaderless;
        all.leasesLost += r.leasesLost;
        all.serverCrashes += r.serverCrashes;
        all.registrations += r.registrations;
        all.settle = std::max(all.settle, r.settle);
        return r.reads.trace;
      },
      coio::sim::thisProgram() + " '" + filter + "'");
  INFO(failedSeeds(report));
  CHECK(report.runs == seeds.count);
  CHECK(report.failures.empty());
  std::printf("%s: %llu seeds, %.2f s of wall time, trace %016llx; IOs %s; etcd stopped %llu, crashed %llu, "
              "slowed %llu, without a leader %llu times, leases lost %llu, servers crashed %llu; registrations %llu, "
              "chain changes %llu, routings applied %llu; the routing settled at most %.2f s after the last fault\n",
              filter, static_cast<unsigned long long>(report.runs), report.wall.count(),
              static_cast<unsigned long long>(report.trace), describe(all.reads).c_str(),
              static_cast<unsigned long long>(all.etcdStops), static_cast<unsigned long long>(all.etcdCrashes),
              static_cast<unsigned long long>(all.etcdSlowdowns), static_cast<unsigned long long>(all.etcdLeaderless),
              static_cast<unsigned long long>(all.leasesLost), static_cast<unsigned long long>(all.serverCrashes),
              static_cast<unsigned long long>(all.registrations),
              static_cast<unsigned long long>(all.chainChanges), static_cast<unsigned long long>(all.routingUpdates),
              std::chrono::duration<double>(all.settle).count());
  // The faults struck and the cluster answered: leases lost, servers registered
  // again, the manager moved chains, the client followed.
  if (seeds.count >= 20) {
    CHECK(all.etcdStops > 0);
    CHECK(all.etcdCrashes > 0);
    CHECK(all.etcdSlowdowns > 0);
    CHECK(all.etcdLeaderless > 0);
    CHECK(all.leasesLost > 0);
    CHECK(all.registrations > all.leasesLost);
    CHECK(all.chainChanges > 0);
    CHECK(all.routingUpdates > 0);
    if (serverCrashes) CHECK(all.serverCrashes > 0);
  }
}

}  // namespace

TEST_CASE("Storage cluster with its routing in the simulated etcd, under seeds: etcd stops, crashes, slows down, "
          "loses its leader and leases; every IO reads right, the routing settles after the faults",
          "[sim][seeds][cluster-etcd]") {
  etcdSeeds(false, "[cluster-etcd]");
}

TEST_CASE("Storage cluster with its routing in the simulated etcd, under seeds: etcd's faults and servers crashing "
          "for 1-8 s; IOs read right or fail by name, the routing settles after the faults",
          "[sim][seeds][cluster-etcd-crash]") {
  etcdSeeds(true, "[cluster-etcd-crash]");
}

TEST_CASE("Storage cluster with its routing in the simulated etcd: a seed replays", "[sim][cluster-etcd]") {
  ClusterData data;
  const EtcdRunReport first = clusterEtcdRun(3, data);
  CHECK(first.reads.ok > 0);
  const EtcdRunReport again = clusterEtcdRun(3, data);
  CHECK(again.reads == first.reads);
  CHECK(again.chainChanges == first.chainChanges);
}
