// The example storage server and its client, unchanged, on the simulated
// reactor (coio::sim): one thread, virtual time, the simulated network and
// disk, faults drawn from the seed. Invariant of every run: each IO reads
// the dataset's bytes or fails with a named status; nothing hangs (a hang
// is a sim::Deadlock); the server shuts down; the same seed, the same run.
#include "e2e_support.hpp"
#include "sim_cluster.hpp"
#include "client/cluster_client.hpp"
#include "client/storage_client.hpp"
#include "cluster/chain_table.hpp"
#include "server/storage_server.hpp"

#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/testing/sim_disk.hpp>
#include <coio/testing/seed_driver.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using coio::sim::SimReactor;
using storage::proto::IoStatus;
using namespace storage::simcluster;

namespace {

constexpr std::uint32_t kChunkSize = 64 * 1024;
constexpr std::uint64_t kChunks = 16;

struct Faults {
  coio::sim::DiskFaults disk{};
  bool partition = false;  // the client's host and the server's, for 300 ms of the run
};

// Reads `batches` batches of 8 random IOs (whole chunks and partial ranges)
// with a verifying client; the server on 10.0.0.1, both on `seed`'s run.
RunReport run(std::uint64_t seed, const std::filesystem::path& dataset, const Faults& faults, int batches = 12) {
  SimReactor reactor(seed);
  reactor.drawLinks({.latency = 20us, .window = 64 * 1024}, {.latency = 2ms, .window = 1 << 20});
  reactor.setDiskFaults(faults.disk);
  storage::ServerOptions options;
  options.pieceSize = 16 * 1024;
  options.poolBytes = 4u << 20;
  options.maxBatchBytes = 2u << 20;
  options.transmitTimeout = 2s;
  auto server = storage::StorageServer<R>::open(reactor, {{0, dataset.string()}}, options);
  INFO(server.error().message());
  REQUIRE(server);
  const coio::SocketAddress at = *coio::SocketAddress::parse("10.0.0.1:9000");
  auto bound = coio::TcpListener<R>::bind(reactor, at);
  REQUIRE(bound);
  std::optional<coio::TcpListener<R>> listener(std::move(*bound));
  (*server)->serve(*listener);
  storage::TransmissionLimiter limiter(16);
  RunReport report;
  const auto start = reactor.now();

  auto body = [](R& r, storage::TransmissionLimiter& lim, coio::SocketAddress to, int n, bool partition,
                 RunReport& out) -> Task<void> {
    storage::ChannelConnector<R> connect = tcpChannels(r)(to);
    Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await storage::StorageClient<R>::connect(
        connect, lim, {.timeout = 500ms, .verifyChecksums = true});
    INFO(client.error().message());
    REQUIRE(client);
    std::vector<std::byte> arena(8 * kChunkSize);
    for (int b = 0; b < n; ++b) {
      if (partition && b == n / 3) r.partition("127.0.0.1", "10.0.0.1");
      if (partition && b == n / 3 + 1) r.heal("127.0.0.1", "10.0.0.1");
      const std::vector<storage::ReadOp> ios = drawIos(r.random(), arena, kChunks, kChunkSize);
      Result<std::vector<storage::ReadOutcome>> outcomes = co_await (*client)->batchRead(ios);
      if (!outcomes) {  // the whole batch failed (the connection): every IO of it, named
        out.failed["batch: " + outcomes.error().message()] += ios.size();
        continue;
      }
      for (std::size_t i = 0; i < ios.size(); ++i) {
        const storage::ReadOutcome& o = (*outcomes)[i];
        if (o.status != IoStatus::ok) {
          ++out.failed[std::string(storage::proto::toString(o.status))];
          continue;
        }
        if (o.bytes != ios[i].length || o.checksumMismatch ||
            !storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, ios[i].into.first(o.bytes))) {
          out.wrongBytes += o.bytes;
          continue;
        }
        ++out.ok;
      }
    }
    co_await (*client)->close();
  };

  std::exception_ptr failure;
  reactor.runUntil([](R& r, Task<void> b, storage::StorageServer<R>& s, std::exception_ptr& f) -> Task<void> {
    try {
      co_await std::move(b);
    } catch (...) {
      f = std::current_exception();
    }
    co_await s.shutdown();
    (void)r;
  }(reactor, body(reactor, limiter, at, batches, faults.partition, report), **server, failure));
  if (failure) std::rethrow_exception(failure);
  report.took = reactor.now() - start;
  report.trace = reactor.traceHash();
  return report;
}


}  // namespace

TEST_CASE("Storage on the simulation: every IO of every seed reads the dataset's bytes; a seed replays", "[sim]") {
  storage::testing::TempDir dir({kChunks, kChunkSize, 3});
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const RunReport report = run(seed, dir.path, {});
    INFO("seed " << seed << ": " << describe(report));
    CHECK(report.ok == 12 * 8);
    CHECK(report.failed.empty());
    CHECK(report.wrongBytes == 0);
  }
  CHECK(run(7, dir.path, {}) == run(7, dir.path, {}));
}

TEST_CASE("Storage on the simulation: under disk faults and a partition, IOs read right or fail by name", "[sim]") {
  storage::testing::TempDir dir({kChunks, kChunkSize, 3});
  std::uint64_t ok = 0;
  std::map<std::string, std::uint64_t> failed;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const Faults faults{.disk = {.eio = 0.02, .shortRead = 0.02, .hang = 0.005}, .partition = seed % 2 == 0};
    const RunReport report = run(seed, dir.path, faults);
    INFO("seed " << seed << ": " << describe(report));
    CHECK(report.wrongBytes == 0);
    CHECK(report.ok + [&] {
      std::uint64_t n = 0;
      for (const auto& [status, count] : report.failed) n += count;
      return n;
    }() == 12 * 8);
    ok += report.ok;
    for (const auto& [status, n] : report.failed) failed[status] += n;
  }
  // The faults did something (the disk's EIO and short reads are ioError;
  // a hung read or the partition times its batch out), and most IOs still
  // got through.
  CHECK(failed.contains("ioError"));
  CHECK(failed.contains("batch: " + std::make_error_code(std::errc::timed_out).message()));
  CHECK(ok > 20 * 12 * 8 / 2);
}

namespace {

// The invariants of a cluster run: every IO read right (`strict`: no
// fault that may fail an IO with its chain's replicas alive) or failed by
// name, never wrong bytes; no batchRead longer than its retry budget and a
// request's deadline (retryFor 3 s + requestTimeout 0.3 s); every read
// buffer back; nothing in flight. The failure's description, if any.
std::optional<std::string> violated(const RunReport& r, bool strict, int batches = 20) {
  std::string why;
  if (r.wrongBytes != 0) why += " wrong bytes delivered as good;";
  if (r.ok + failures(r) != static_cast<std::uint64_t>(batches) * 16) why += " IOs unaccounted for;";
  if (strict && failures(r) != 0) why += " IOs failed with a replica of their chain alive;";
  if (r.longestBatch > 3300ms + 100ms) why += " a batchRead outlived its deadline;";
  if (r.buffersInUse != 0) why += " read buffers not returned;";
  if (r.inFlight != 0) why += " operations left in flight;";
  if (why.empty()) return std::nullopt;
  return describe(r) + ":" + why;
}

// The seeds of a scenario through the seed driver; a failing one is
// printed with its replay line, and fails the test.
void clusterSeeds(const ClusterFaults& faults, bool strict, std::uint64_t defaultSeeds, const char* filter) {
  ClusterData data;
  const coio::sim::SeedRange seeds = coio::sim::SeedRange::fromEnvironment(defaultSeeds);
  storage::ClusterStats all{};
  std::uint64_t requests = 0;
  const coio::sim::SeedReport report = coio::sim::runSeeds(
      seeds,
      [&](std::uint64_t seed) {
        const RunReport r = clusterRun(seed, data, faults);
        requests += r.requests;
        all.failovers += r.cluster.failovers;
        all.retries += r.cluster.retries;
        all.hedges += r.cluster.hedges;
        all.corruptReplicas += r.cluster.corruptReplicas;
        all.retryPauses += r.cluster.retryPauses;
        if (const std::optional<std::string> why = violated(r, strict)) throw std::runtime_error(*why);
        return r.trace;
      },
      coio::sim::thisProgram() + " '" + filter + "'");
  INFO(failedSeeds(report));
  CHECK(report.runs == seeds.count);
  CHECK(report.failures.empty());
  std::printf("%s: %llu seeds, %.2f s of wall time, trace %016llx; the client's requests %llu (%.0f per wall second), "
              "failovers %llu, retries %llu, hedges %llu, corrupt replicas found %llu, retry pauses %llu\n",
              filter, static_cast<unsigned long long>(report.runs), report.wall.count(),
              static_cast<unsigned long long>(report.trace), static_cast<unsigned long long>(requests),
              static_cast<double>(requests) / report.wall.count(),
              static_cast<unsigned long long>(all.failovers),
              static_cast<unsigned long long>(all.retries), static_cast<unsigned long long>(all.hedges),
              static_cast<unsigned long long>(all.corruptReplicas), static_cast<unsigned long long>(all.retryPauses));
  // The faults struck: servers were lost and found, IOs went to other
  // replicas, the corrupt copy was met (over 30 seeds or more).
  if (seeds.count >= 30) {
    CHECK(all.failovers > 0);
    CHECK(all.retries > 0);
    CHECK(all.corruptReplicas > 0);
  }
}

}  // namespace

TEST_CASE("Storage cluster on the simulation: a seed replays (the same outcomes, the same trace)", "[sim]") {
  ClusterData data;
  const ClusterFaults faults{.partitions = true, .corruptOne = true, .disk = {.eio = 0.02, .shortRead = 0.02}};
  const RunReport first = clusterRun(5, data, faults);
  CHECK(first.ok > 0);
  CHECK(clusterRun(5, data, faults) == first);
  CHECK(clusterRun(6, data, faults).trace != first.trace);
}

// (Filters name the cases by tag: Catch reads a comma in a filter as "or".)
TEST_CASE("Storage cluster on the simulation under seeds: network faults and a corrupt replica: every IO reads right",
          "[sim][seeds][cluster-network]") {
  clusterSeeds({.partitions = true, .corruptOne = true}, true, 30, "[cluster-network]");
}

TEST_CASE("Storage cluster on the simulation under seeds: tight budgets (backpressure, 30 ms deadlines): every IO "
          "reads right",
          "[sim][seeds][cluster-tight]") {
  clusterSeeds({.partitions = true, .corruptOne = true, .tight = true}, true, 30, "[cluster-tight]");
}

TEST_CASE("Storage cluster on the simulation under seeds: disk faults too: IOs read right or fail by name",
          "[sim][seeds][cluster-disk]") {
  clusterSeeds({.partitions = true, .corruptOne = true, .disk = {.eio = 0.02, .shortRead = 0.02, .hang = 0.002}}, false,
               30, "[cluster-disk]");
}

TEST_CASE("Cluster on the simulation: a server whose slow link recovers is found back within a probe, not once its "
          "clogged connection drains (seeds 5874 and 8207 of [cluster-tight])",
          "[sim]") {
  // Found by 100,000 seeds: the probes of a server marked down reused its
  // connection, whose stream still held what the slow link had queued
  // (TCP keeps order), so every probe timed out behind it; an IO whose only
  // good replica was there ran out of its retry budget. (Since servers
  // crash as nodes, 2026-11-29, these seeds draw other schedules; the
  // scenario below is the regression test proper.)
  ClusterData data;
  for (const std::uint64_t seed : {5874u, 8207u}) {
    const RunReport r = clusterRun(seed, data, {.partitions = true, .corruptOne = true, .tight = true});
    INFO("seed " << seed << ": " << describe(r));
    CHECK(!violated(r, true));
  }
  // The scenario itself: reads from 10.0.0.2 while its link takes 2 s each
  // way mark it down; once the link is fast again it is back within the
  // probes' pace (reconnectMax 200 ms, and a 30 ms request), not 2 s later.
  R reactor(1);
  storage::ServerOptions serverOptions;
  serverOptions.directIo = false;
  LiveServers live;
  startServers(reactor, data, serverOptions, live);
  reactor.runUntil([](R& r) -> Task<void> {
    storage::ClusterOptions o;
    o.requestTimeout = 30ms;
    o.reconnectMin = 20ms;
    o.reconnectMax = 200ms;
    o.log = [](const std::string&) {};
    auto client = co_await storage::ClusterClient<R>::connect(r, *storage::ChainTable::parse(tableText(), "t"), o,
                                                            tcpChannels(r));
    std::vector<std::byte> arena(16 * kClusterChunk);
    auto readAll = [&]() -> Task<std::uint64_t> {  // IOs read right out of 16
      const std::vector<storage::ReadOp> ios = drawIos(r.random(), arena, kClusterChunks, kClusterChunk);
      const std::vector<storage::ClusterOutcome> outcomes = co_await client->batchRead(ios);
      std::uint64_t ok = 0;
      for (std::size_t i = 0; i < ios.size(); ++i) ok += outcomes[i].ok() ? 1 : 0;
      co_return ok;
    };
    auto ups = [&] {
      std::uint64_t n = 0;
      for (std::size_t i = 0; i < client->servers(); ++i) n += client->serverStats(i).ups;
      return n;
    };
    CHECK(co_await readAll() == 16);
    r.setLink("127.0.0.1", host(1), {.latency = 2s});
    for (int i = 0; i < 3; ++i) CHECK(co_await readAll() == 16);  // failed over to the other replicas
    CHECK(client->stats().failovers >= 1);
    co_await r.sleepFor(300ms);  // probes on the clogged connection meanwhile
    const std::uint64_t upsBefore = ups();
    r.setLink("127.0.0.1", host(1), {.latency = 100us});
    const auto fast = r.now();
    while (ups() == upsBefore && r.now() - fast < 5s) co_await r.sleepFor(1ms);
    CHECK(ups() > upsBefore);
    CHECK(r.now() - fast <= 250ms);
    co_await client->close();
    for (std::size_t s = 0; s < kServers; ++s) r.node(host(s)).kill();
  }(reactor));
}
