// The example storage server and its client, unchanged, on the simulated
// reactor (coio::sim): one thread, virtual time, the simulated network and
// disk, faults drawn from the seed. Invariant of every run: each IO reads
// the dataset's bytes or fails with a named status; nothing hangs (a hang
// is a sim::Deadlock); the server shuts down; the same seed, the same run.
#include "e2e_support.hpp"
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

namespace {

using R = SimReactor;
constexpr std::uint32_t kChunkSize = 64 * 1024;
constexpr std::uint64_t kChunks = 16;

// What a run did: IOs read right, IOs failed (by status name), bytes wrong
// (must be 0), the virtual time it took, its trace.
struct RunReport {
  std::uint64_t ok = 0;
  std::map<std::string, std::uint64_t> failed;
  std::uint64_t wrongBytes = 0;
  std::chrono::steady_clock::duration took{};
  std::chrono::steady_clock::duration longestBatch{};  // a batchRead's, call to return
  std::size_t buffersInUse = 0;                        // the servers' read buffers once the client is gone
  std::uint64_t inFlight = 0;                          // the reactor's operations at the end
  storage::ClusterStats cluster{};                     // the client's: what the faults made it do
  std::uint64_t requests = 0;                          // the client's requests to the servers
  std::uint64_t trace = 0;
  bool operator==(const RunReport& o) const {
    return ok == o.ok && failed == o.failed && wrongBytes == o.wrongBytes && took == o.took &&
           longestBatch == o.longestBatch && buffersInUse == o.buffersInUse && inFlight == o.inFlight &&
           trace == o.trace;
  }
};

// A batch of IOs drawn from `random`, one per `chunkSize` of `arena`:
// whole chunks and random ranges of them, of `chunks` chunks.
std::vector<storage::ReadOp> drawIos(coio::sim::Random& random, std::span<std::byte> arena, std::uint64_t chunks,
                                     std::uint32_t chunkSize) {
  std::vector<storage::ReadOp> ios;
  for (std::size_t i = 0; i < arena.size() / chunkSize; ++i) {
    storage::ReadOp op;
    op.chunkId = random.below(chunks);
    const bool whole = random.below(2) == 0;
    op.offset = whole ? 0 : static_cast<std::uint32_t>(random.below(chunkSize - 1));
    op.length = whole ? chunkSize : 1 + static_cast<std::uint32_t>(random.below(chunkSize - op.offset));
    op.into = arena.subspan(i * chunkSize, op.length);
    ios.push_back(op);
  }
  return ios;
}

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
    auto connect = [&r, to](std::stop_token stop) -> Task<Result<std::unique_ptr<storage::Channel<R>>>> {
      Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, to, stop);
      if (!stream) co_return stream.error();
      co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)));
    };
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

std::string describe(const RunReport& r) {
  std::string s = "ok " + std::to_string(r.ok) + ", wrong bytes " + std::to_string(r.wrongBytes) + ", failed:";
  for (const auto& [status, n] : r.failed) s += " " + status + " " + std::to_string(n);
  return s;
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

// Three servers on 10.0.0.1..3 in a ring: chain k has target 10k+1 on
// server k and target 10k'+2 on server k' = k+1 (mod 3), so each chain has
// a replica on two servers, and chunk c is on chain c mod 3.
constexpr std::size_t kServers = 3;
constexpr std::uint32_t kClusterChunk = 16 * 1024;
constexpr std::uint64_t kClusterChunks = 60;

std::string host(std::size_t s) { return "10.0.0." + std::to_string(s + 1); }
std::uint32_t firstTarget(std::size_t s) { return static_cast<std::uint32_t>(10 * s + 1); }
std::uint32_t secondTarget(std::size_t s) { return static_cast<std::uint32_t>(10 * s + 2); }

std::string tableText() {
  std::string text = "coio-chains 1\nchunks " + std::to_string(kClusterChunks) + "\nchunk-size 16K\n";
  for (std::size_t k = 0; k < kServers; ++k) {
    const std::size_t next = (k + 1) % kServers;
    text += "chain " + std::to_string(k + 1) + " " + host(k) + ":9000/" + std::to_string(firstTarget(k)) + " " +
            host(next) + ":9000/" + std::to_string(secondTarget(next)) + "\n";
  }
  return text;
}

// The datasets of the six targets, made once (runs only read them, but
// for the corruption a run flips and flips back).
struct ClusterData {
  ClusterData() {
    const storage::ChainTable shape = *storage::ChainTable::parse(tableText(), "shape");
    for (std::size_t s = 0; s < kServers; ++s) {
      for (const std::uint32_t t : {firstTarget(s), secondTarget(s)}) {
        dirs.emplace(t, std::make_unique<storage::testing::TempDir>(*shape.targetLayout(t, 8)));
      }
    }
  }
  std::vector<storage::TargetSpec> targetsOf(std::size_t s) const {
    return {{firstTarget(s), dirs.at(firstTarget(s))->path.string()},
            {secondTarget(s), dirs.at(secondTarget(s))->path.string()}};
  }
  std::map<std::uint32_t, std::unique_ptr<storage::testing::TempDir>> dirs;
};

struct ClusterFaults {
  bool partitions = false;   // the network's fault schedule (drawn): partitions, resets, slow links
  bool corruptOne = false;   // one replica of one chunk has a flipped bit (drawn)
  coio::sim::DiskFaults disk{};
  // Tight budgets: a small read-buffer pool (16 pieces), 2 transmissions
  // per server, a 100 ms transmit grant, 30 ms request deadlines, hedges
  // after 5 ms: the faults meet the backpressure paths.
  bool tight = false;
};

// A client reads `batches` batches of 16 random IOs from the cluster, under
// `faults`; the servers' and the client's reports.
RunReport clusterRun(std::uint64_t seed, ClusterData& data, const ClusterFaults& faults, int batches = 20) {
  SimReactor reactor(seed);
  reactor.drawLinks({.latency = 20us, .window = 64 * 1024}, {.latency = 1ms, .window = 1 << 20});
  reactor.setDiskFaults(faults.disk);
  // The corrupt replica: a chunk's bytes in one of its two targets.
  std::optional<std::pair<std::filesystem::path, std::uint64_t>> flipped;
  if (faults.corruptOne) {
    const std::size_t s = reactor.random().below(kServers);
    const std::uint32_t t = reactor.random().below(2) == 0 ? firstTarget(s) : secondTarget(s);
    const std::filesystem::path dir = data.dirs.at(t)->path;
    std::filesystem::path file;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename().string().starts_with("data")) file = entry.path();
    }
    REQUIRE(!file.empty());
    const std::uint64_t at = reactor.random().below(std::filesystem::file_size(file));
    storage::testing::flipBits(file, at, std::byte{0x10});
    flipped.emplace(file, at);
  }
  storage::ServerOptions options;
  options.pieceSize = 16 * 1024;
  options.poolBytes = faults.tight ? 256u << 10 : 2u << 20;
  options.transmitTimeout = faults.tight ? 100ms : 2s;
  std::vector<std::unique_ptr<storage::StorageServer<R>>> servers;
  std::vector<coio::TcpListener<R>> listeners;
  for (std::size_t s = 0; s < kServers; ++s) {
    auto server = storage::StorageServer<R>::open(reactor, data.targetsOf(s), options);
    INFO(server.error().message());
    REQUIRE(server);
    auto bound = coio::TcpListener<R>::bind(reactor, *coio::SocketAddress::parse(host(s) + ":9000"));
    REQUIRE(bound);
    listeners.push_back(std::move(*bound));
    servers.push_back(std::move(*server));
  }
  for (std::size_t s = 0; s < kServers; ++s) servers[s]->serve(listeners[s]);
  storage::ChainTable table = *storage::ChainTable::parse(tableText(), "cluster");
  RunReport report;
  const auto start = reactor.now();

  // The fault schedule, beside the reads: every 0-200 ms the client loses
  // one server for 50-500 ms (one at a time: each chain keeps a replica),
  // or its connections to one server are reset, or one server crashes and
  // comes back 50-500 ms later, or its link to one gets slow (100-400 ms
  // each way) for a while.
  auto partitions = [](R& r, std::stop_token stop) -> Task<void> {
    while (co_await r.sleepFor(std::chrono::milliseconds(r.random().below(200)), stop)) {
      const std::string server = host(r.random().below(kServers));
      switch (r.random().below(5)) {
        case 0:
          (void)r.resetConnections("127.0.0.1", server);
          continue;
        case 2: {  // the server's process crashes and is back 50-500 ms later
          r.hostDown(server);
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          r.hostUp(server);
          if (!on) co_return;
          continue;
        }
        case 1: {
          r.setLink("127.0.0.1", server, {.latency = std::chrono::milliseconds(100 + r.random().below(300))});
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          r.setLink("127.0.0.1", server, {.latency = 100us});
          if (!on) co_return;
          continue;
        }
        default: {
          r.partition("127.0.0.1", server);
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          r.heal("127.0.0.1", server);
          if (!on) co_return;
        }
      }
    }
  };
  auto reads = [](R& r, storage::ChainTable t, int n, bool tight, RunReport& out) -> Task<void> {
    using Client = storage::ClusterClient<R>;
    typename Client::ConnectorFactory factory = [&r](const coio::SocketAddress& to) -> storage::ChannelConnector<R> {
      return [&r, to](std::stop_token stop) -> Task<Result<std::unique_ptr<storage::Channel<R>>>> {
        Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, to, stop);
        if (!stream) co_return stream.error();
        co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)));
      };
    };
    storage::ClusterOptions o;
    o.requestTimeout = tight ? 30ms : 300ms;
    if (tight) o.maxTransmissionsPerServer = 2;
    o.reconnectMin = 20ms;
    o.reconnectMax = 200ms;
    o.retryFor = 3s;  // longer than a partition: an IO whose good replica is cut off waits for it
    o.hedgeAfter = r.random().below(2) == 0 ? std::chrono::steady_clock::duration{} : tight ? 5ms : 50ms;
    o.log = [](const std::string&) {};  // the outcomes tell
    std::unique_ptr<Client> client = co_await Client::connect(r, std::move(t), o, std::move(factory));
    std::vector<std::byte> arena(16 * kClusterChunk);
    for (int b = 0; b < n; ++b) {
      // Batches 0-100 ms apart: the run spans a second or so of virtual
      // time, in which the fault schedule strikes several times.
      co_await r.sleepFor(std::chrono::milliseconds(r.random().below(100)));
      const std::vector<storage::ReadOp> ios = drawIos(r.random(), arena, kClusterChunks, kClusterChunk);
      const auto called = r.now();
      const std::vector<storage::ClusterOutcome> outcomes = co_await client->batchRead(ios);
      out.longestBatch = std::max(out.longestBatch, r.now() - called);
      REQUIRE(outcomes.size() == ios.size());
      for (std::size_t i = 0; i < ios.size(); ++i) {
        const storage::ClusterOutcome& o = outcomes[i];
        if (!o.ok()) {
          ++out.failed[std::string(storage::proto::toString(o.status))];
          continue;
        }
        if (o.bytes != ios[i].length ||
            !storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, ios[i].into.first(o.bytes))) {
          out.wrongBytes += o.bytes;
          continue;
        }
        ++out.ok;
      }
    }
    out.cluster = client->stats();
    for (std::size_t i = 0; i < client->servers(); ++i) out.requests += client->serverStats(i).requests;
    co_await client->close();
  };
  auto body = [](R& r, Task<void> readAll, std::optional<Task<void>> faultsOf) -> Task<void> {
    if (!faultsOf) co_return co_await std::move(readAll);
    std::stop_source stopFaults;
    auto thenStop = [](Task<void> t, std::stop_source& s) -> Task<void> {
      struct Stop {
        std::stop_source& s;
        ~Stop() { s.request_stop(); }
      } stopAtEnd{s};
      co_await std::move(t);
    };
    (void)r;
    co_await coio::collectAll(thenStop(std::move(readAll), stopFaults),
                              coio::withStopToken(stopFaults.get_token(), std::move(*faultsOf)));
  };

  std::exception_ptr failure;
  reactor.runUntil([](R& r, Task<void> b, std::vector<std::unique_ptr<storage::StorageServer<R>>>& all,
                      std::exception_ptr& f, RunReport& out) -> Task<void> {
    try {
      co_await std::move(b);
    } catch (...) {
      f = std::current_exception();
    }
    // The client is gone: a second on, every server has its read buffers
    // back (a request of a closed connection, even one whose disk read
    // hangs, lets go of them), before anything is shut down.
    co_await r.sleepFor(1s);
    for (auto& server : all) out.buffersInUse += server->buffersInUse();
    for (auto& server : all) co_await server->shutdown();
  }(reactor, body(reactor, reads(reactor, std::move(table), batches, faults.tight, report),
                  faults.partitions ? std::optional<Task<void>>(partitions(reactor, {})) : std::nullopt),
    servers, failure, report));
  if (flipped) storage::testing::flipBits(flipped->first, flipped->second, std::byte{0x10});  // as it was
  if (failure) std::rethrow_exception(failure);
  report.inFlight = reactor.stats().inFlight;
  report.took = reactor.now() - start;
  report.trace = reactor.traceHash();
  return report;
}

std::uint64_t failures(const RunReport& r) {
  std::uint64_t n = 0;
  for (const auto& [status, count] : r.failed) n += count;
  return n;
}

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
  INFO(report.failures.size() << " of " << report.runs << " seeds failed; the first: seed "
                              << (report.failures.empty() ? 0 : report.failures[0].seed) << ": "
                              << (report.failures.empty() ? "" : report.failures[0].what));
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
