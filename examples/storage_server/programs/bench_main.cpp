// coio-storage-bench: a load generator for coio-storage-server. Keeps
// --depth batchReads in flight over --connections connections (or, with
// --cluster, over a whole cluster through ClusterClient) for --duration
// seconds, then reports IOPS, throughput, batch latency and the failed IOs
// by status; the first few failures are logged to stderr as they happen.
#include "cluster/chain_table.hpp"
#include "store/chunk_store.hpp"
#include "programs/cli.hpp"
#include "client/cluster_client.hpp"
#include "client/etcd_routing.hpp"
#include "client/storage_client.hpp"
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/core/collect_all.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Now, in Unix time: milliseconds (what the logs write).
double unixMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr const char* kUsage = R"(usage: coio-storage-bench [options]
  --address 127.0.0.1:9000   the server
  --transport tcp|rdma       rdma: a queue pair per connection, brought up over TCP
  --rdma-device NAME         (default: the first device with an ACTIVE port)
  --dir D                    learn the dataset's shape from D/index, or give
  --chunks N --chunk-size S  it explicitly
  --target ID                the server's target to read (default 0: what serve --dir serves)
  --io-size 64K              bytes per IO (at most the chunk size); offsets are random, unaligned
  --batch 16                 IOs per batchRead
  --depth 8                  batchReads in flight
  --connections 4            spread over this many connections
  --max-transmissions 64     the client's transmission limit
  --duration 10              seconds
  --timeout-ms 30000         per batchRead; a stalled server shows as timed-out requests
                             (the run ends within --duration plus this)
  --reactor uring|epoll
  --verify                   ask for CRC32C and check it, and check every byte's content
  --json                     print the report as one JSON object
                             (failed IOs are counted by status name, in both reports; the
                             first five failures are logged to stderr, with where they failed)
  --latency-log FILE         write one line per batch: "UNIX-TIME-MS LATENCY-MS" (its end)
  --cluster FILE             read a whole cluster (a chain table, CHAINS.md) through
                             ClusterClient: one connection per server, each IO from a
                             replica of its chunk's chain, failing over between them;
                             the table gives the dataset (--address, --dir, --chunks,
                             --chunk-size, --target, --connections do not apply), and
                             --max-transmissions is per server
  --etcd URL[,URL...]        as --cluster, with the routing from etcd instead of a file
                             (the records under /coio/, CHAINS.md): read once, then
                             followed through a watch; reads never wait on etcd
  --request-timeout-ms 2000  cluster: a request's deadline (finds a hung server)
  --hedge-ms 0               cluster: also ask other replicas for a request unanswered
                             this long (0: off)
  --routing-log FILE         cluster: write one line per routing the client puts in use
                             (the first, then each change), as it does:
                             "UNIX-TIME-MS offline [TARGET...]" (its offline targets)
)";

struct Settings {
  coio::SocketAddress server;
  storage::ChunkStoreLayout layout;
  std::uint32_t ioSize = 64 * 1024;
  std::uint32_t target = 0;
  std::size_t batch = 16, depth = 8, connections = 4, maxTransmissions = 64;
  double duration = 10;
  std::chrono::milliseconds timeout{30000};
  coio::ReactorKind kind = coio::ReactorKind::uring;
  bool verify = false, json = false;
  std::string transport = "tcp";
  std::string latencyLog;
  std::string routingLog;                    // --routing-log: a cluster client's routings, as applied
  std::string clusterFile;                   // --cluster: read through ClusterClient
  std::vector<std::string> etcdEndpoints;    // --etcd: the routing from there, not from clusterFile
  std::optional<storage::ChainTable> table;  // ... loaded from the file (etcd's: in runCluster)
  std::chrono::milliseconds requestTimeout{2000}, hedge{0};
#if COIO_STORAGE_RDMA
  std::unique_ptr<coio::rdma::Device> device;  // opened for --transport rdma
#endif
};

// One IO's outcome, as the worker counts it, and where it was read (what
// a failure's log line names).
struct IoDone {
  storage::proto::IoStatus status = storage::proto::IoStatus::ok;
  std::uint32_t bytes = 0;
  bool checksumMismatch = false;
  std::error_code error;                      // the request's, if it failed as a whole
  std::optional<std::uint32_t> target;        // the (last) replica's
  const coio::SocketAddress* server = nullptr;  // its server's address
  std::optional<std::uint32_t> chain;         // cluster: the chunk's chain
  std::uint32_t attempts = 0;                 // cluster: replicas asked
  std::string replicas;                       // cluster, a failed IO no replica was asked for: the chain's
};

constexpr std::size_t kStatuses = static_cast<std::size_t>(storage::proto::IoStatus::corrupt) + 1;

struct Tally {
  std::uint64_t ios = 0, bytes = 0;
  std::uint64_t badStatus = 0, checksumMismatches = 0, contentMismatches = 0, timedOutRequests = 0, failedRequests = 0;
  std::array<std::uint64_t, kStatuses> byStatus{};  // failed IOs (badStatus) by status
  std::uint64_t wrongBytes = 0;   // --verify: bytes that differ from the chunk's content
  std::vector<double> latencies;  // seconds per batchRead
  std::vector<double> endedAt;    // --latency-log: when each batch ended, Unix time in ms
  std::uint64_t errors() const {
    return badStatus + checksumMismatches + contentMismatches + timedOutRequests + failedRequests;
  }
  // A batch that ended now, after starting at `start`.
  void batchDone(Clock::time_point start, bool logging) {
    latencies.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (logging) endedAt.push_back(unixMs());
  }
  // One IO's outcome; under --verify its bytes are checked. What was wrong
  // with it ("" if nothing).
  std::string io(const Settings& settings, const storage::ReadOp& op, const IoDone& done) {
    if (done.status != storage::proto::IoStatus::ok) {
      ++badStatus;
      ++byStatus.at(static_cast<std::size_t>(done.status));
      return std::string(storage::proto::toString(done.status)) + (done.error ? " (" + done.error.message() + ")" : "");
    }
    ++ios;
    bytes += done.bytes;
    std::string wrong;
    if (done.checksumMismatch) {
      ++checksumMismatches;
      wrong = "its bytes failed the response's checksum";
    }
    if (!settings.verify) return wrong;
    std::uint64_t differ = 0;
    const std::span<const std::byte> data = op.into.first(done.bytes);
    storage::forEachChunkByte(op.chunkId, op.offset, done.bytes, [&](std::size_t i, std::byte b) {
      differ += data[i] != b;
      return true;
    });
    contentMismatches += differ != 0;
    wrongBytes += differ;
    if (differ != 0) wrong += (wrong.empty() ? "" : "; ") + std::to_string(differ) + " of its bytes wrong (status ok)";
    return wrong;
  }
};

// The first failures of a run, each on stderr as it happens, then no more
// (they are counted in the report).
class FailureLog {
 public:
  void note(const std::string& what) {
    if (left_ == 0) return;
    std::fprintf(stderr, "coio-storage-bench: %s\n", what.c_str());
    if (--left_ == 0) std::fprintf(stderr, "coio-storage-bench: more failures are counted, not logged\n");
  }
  // An IO that failed (`problem`: Tally::io's).
  void io(const storage::ReadOp& op, const IoDone& done, const std::string& problem) {
    if (left_ == 0) return;
    std::string where;
    if (done.chain) where += ", chain " + std::to_string(*done.chain);
    if (done.target) where += ", target " + std::to_string(*done.target);
    if (done.server) where += " on " + done.server->toString();
    if (done.chain) {
      where += done.attempts == 0 ? ", sent to no replica" : ", " + std::to_string(done.attempts) + " replica(s) asked";
    }
    if (!done.replicas.empty()) where += " (its replicas: " + done.replicas + ")";
    note("IO failed: chunk " + std::to_string(op.chunkId) + ", offset " + std::to_string(op.offset) + ", " +
         std::to_string(op.length) + " bytes" + where + ": " + problem);
  }

 private:
  unsigned left_ = 5;
};

// A new batch of random IOs, landing in `memory`.
void randomBatch(std::mt19937_64& random, const Settings& settings, std::span<std::byte> memory,
                 std::vector<storage::ReadOp>& ios) {
  for (std::size_t i = 0; i < ios.size(); ++i) {
    ios[i].chunkId = settings.layout.chunkAt(random() % settings.layout.chunks);
    ios[i].offset = static_cast<std::uint32_t>(random() % (settings.layout.chunkSize - settings.ioSize + 1));
    ios[i].length = settings.ioSize;
    ios[i].into = std::span(memory).subspan(i * settings.ioSize, settings.ioSize);
    ios[i].targetId = settings.target;
  }
}

// One batch on one server into `done`; a request that fails as a whole is
// counted (and logged) and leaves `done` empty. False once the connection is gone.
template <coio::Reactor R>
coio::Task<bool> readBatch(storage::StorageClient<R>& client, const Settings& settings,
                           std::span<const storage::ReadOp> ios, Tally& tally, FailureLog& failures,
                           std::vector<IoDone>& done) {
  coio::Result<std::vector<storage::ReadOutcome>> outcomes = co_await client.batchRead(ios);
  if (!outcomes) {
    ++(outcomes.error() == std::errc::timed_out ? tally.timedOutRequests : tally.failedRequests);
    failures.note("a batchRead of " + std::to_string(ios.size()) + " IOs from target " +
                  std::to_string(settings.target) + " on " + settings.server.toString() +
                  " failed: " + outcomes.error().message());
    co_return !client.failure();
  }
  for (const storage::ReadOutcome& o : *outcomes) {
    done.push_back({o.status, o.bytes, o.checksumMismatch, {}, settings.target, &settings.server, {}, 1, {}});
  }
  co_return true;
}

// One batch on a cluster: it never fails as a whole, each IO has its outcome.
template <coio::Reactor R>
coio::Task<bool> readBatch(storage::ClusterClient<R>& client, const Settings&, std::span<const storage::ReadOp> ios,
                           Tally&, FailureLog&, std::vector<IoDone>& done) {
  const std::vector<storage::ClusterOutcome> outcomes = co_await client.batchRead(ios);
  const storage::ChainTable& table = client.table();
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const storage::ClusterOutcome& o = outcomes[i];
    const storage::Chain& chain = table.chains()[table.chainIndexOf(ios[i].chunkId)];
    done.push_back({o.status, o.bytes, o.checksumMismatch, o.error, o.target,
                    o.server == SIZE_MAX ? nullptr : &client.serverAddress(o.server), chain.id, o.attempts, {}});
    if (o.ok() || o.target) continue;
    for (const storage::Replica& r : chain.replicas) {
      done.back().replicas += (done.back().replicas.empty() ? "target " : ", target ") + std::to_string(r.targetId) +
                              " on " + table.servers()[r.server].toString() +
                              (r.state == storage::ReplicaState::offline ? " (offline)" : "");
    }
  }
  co_return true;
}

// Keeps one batch in flight on `client` (a StorageClient or a ClusterClient) until `end`.
template <typename Client>
coio::Task<void> worker(Client& client, const Settings& settings, Clock::time_point end, std::uint64_t seed,
                        std::span<std::byte> memory, Tally& tally, FailureLog& failures) {
  std::mt19937_64 random(seed);
  std::vector<storage::ReadOp> ios(settings.batch);
  std::vector<IoDone> done;
  while (Clock::now() < end) {
    randomBatch(random, settings, memory, ios);
    const Clock::time_point start = Clock::now();
    done.clear();
    const bool usable = co_await readBatch(client, settings, ios, tally, failures, done);
    if (!usable) co_return;  // the connection is gone: this worker is done
    if (done.empty()) continue;
    tally.batchDone(start, !settings.latencyLog.empty());
    for (std::size_t i = 0; i < ios.size(); ++i) {
      const std::string problem = tally.io(settings, ios[i], done[i]);
      if (!problem.empty()) failures.io(ios[i], done[i], problem);
    }
  }
}

// What a cluster run reports beyond a single server's figures.
struct ClusterFigures {
  std::string source;  // the file, or "etcd URL,..."
  std::size_t chains = 0;
  storage::ClusterStats stats;
  std::vector<std::pair<std::string, storage::ClusterServerStats>> servers;  // address, figures
  std::optional<storage::EtcdRoutingStats> etcd;  // --etcd: the follower's figures
};

// The live line, on a terminal only.
template <coio::Reactor R>
coio::Task<void> progress(R& reactor, Clock::time_point begin, Clock::time_point end,
                          const std::vector<Tally>& tallies) {
  if (!::isatty(STDERR_FILENO)) co_return;
  while (Clock::now() < end) {
    co_await reactor.sleepFor(std::min<Clock::duration>(std::chrono::seconds(1), end - Clock::now()));
    const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
    std::uint64_t ios = 0, bytes = 0, errors = 0;
    for (const Tally& t : tallies) {
      ios += t.ios;
      bytes += t.bytes;
      errors += t.errors();
    }
    std::fprintf(stderr, "\r  %5.1f s  %8.3f GiB/s  %10.0f IOPS  errors %llu   ", elapsed,
                 static_cast<double>(bytes) / elapsed / (1u << 30), static_cast<double>(ios) / elapsed,
                 static_cast<unsigned long long>(errors));
  }
  std::fputs("\n", stderr);
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto at = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(at, sorted.size() - 1)];
}

// --latency-log: one line per batch, "UNIX-TIME-MS LATENCY-MS".
bool writeLatencyLog(const Settings& settings, const Tally& tally) {
  std::ofstream out(settings.latencyLog, std::ios::trunc);
  char line[64];
  for (std::size_t i = 0; i < tally.latencies.size() && i < tally.endedAt.size(); ++i) {
    std::snprintf(line, sizeof line, "%.3f %.3f\n", tally.endedAt[i], tally.latencies[i] * 1e3);
    out << line;
  }
  out.close();
  if (!out) std::fprintf(stderr, "coio-storage-bench: cannot write %s\n", settings.latencyLog.c_str());
  return static_cast<bool>(out);
}

// --routing-log: "UNIX-TIME-MS offline [TARGET...]" for `table`, written
// through at once (a soak reads it while the client runs).
void logRouting(std::ofstream& out, const storage::ChainTable& table) {
  char when[32];
  std::snprintf(when, sizeof when, "%.3f offline", unixMs());
  out << when;
  for (const storage::Chain& chain : table.chains()) {
    for (const storage::Replica& r : chain.replicas) {
      if (r.state == storage::ReplicaState::offline) out << ' ' << r.targetId;
    }
  }
  out << '\n' << std::flush;
}

// Seconds since the follower's last update; -1: none (JSON's value for none).
double sinceLastUpdate(const storage::EtcdRoutingStats& e) {
  if (e.updates == 0) return -1;
  return std::chrono::duration<double>(Clock::now() - e.lastUpdate).count();
}

void reportCluster(const Settings& settings, const ClusterFigures& cluster, double elapsed) {
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  const storage::ClusterStats& c = cluster.stats;
  if (settings.json) {
    std::printf(",\"cluster\":{\"file\":\"%s\",\"servers\":%zu,\"chains\":%zu,\"retries\":%llu,\"failovers\":%llu,"
                "\"hedges\":%llu,\"hedge_wins\":%llu,\"corrupt_replicas\":%llu,\"failed_ios\":%llu,"
                "\"routing_updates\":%llu,\"routing_refreshes\":%llu,\"stale_routing_retries\":%llu,"
                "\"offline_ios\":%llu",
                cluster.source.c_str(), cluster.servers.size(), cluster.chains, u(c.retries), u(c.failovers),
                u(c.hedges), u(c.hedgeWins), u(c.corruptReplicas), u(c.failedIos), u(c.routingUpdates),
                u(c.routingRefreshes), u(c.staleRoutingRetries), u(c.offlineIos));
    if (const auto& e = cluster.etcd) {
      std::printf(",\"etcd\":{\"updates\":%llu,\"reloads\":%llu,\"refreshes\":%llu,\"bad_records\":%llu,"
                  "\"revision\":%lld,\"last_update_s_ago\":%.3f}",
                  u(e->updates), u(e->reloads), u(e->refreshes), u(e->badRecords), static_cast<long long>(e->revision),
                  sinceLastUpdate(*e));
    }
    std::printf("},\"servers\":[");
    for (std::size_t i = 0; i < cluster.servers.size(); ++i) {
      const auto& [address, s] = cluster.servers[i];
      std::printf("%s{\"address\":\"%s\",\"ios\":%llu,\"bytes\":%llu,\"iops\":%.1f,\"gib_per_s\":%.4f,"
                  "\"requests\":%llu,\"failed_requests\":%llu,\"timeouts\":%llu,\"downs\":%llu,\"ups\":%llu,"
                  "\"stale_ios\":%llu}",
                  i == 0 ? "" : ",", address.c_str(), u(s.ios), u(s.bytes), static_cast<double>(s.ios) / elapsed,
                  static_cast<double>(s.bytes) / elapsed / (1u << 30), u(s.requests), u(s.failedRequests),
                  u(s.timeouts), u(s.downs), u(s.ups), u(s.staleIos));
    }
    std::printf("]");
    return;
  }
  std::printf("  cluster         %zu servers, %zu chains: retries %llu, failovers %llu, hedges %llu (won %llu), "
              "corrupt replicas %llu, failed IOs %llu\n"
              "  routing         updates %llu, refreshes on staleRouting %llu, IOs sent again on them %llu, "
              "IOs sent to offline targets %llu\n",
              cluster.servers.size(), cluster.chains, u(c.retries), u(c.failovers), u(c.hedges), u(c.hedgeWins),
              u(c.corruptReplicas), u(c.failedIos), u(c.routingUpdates), u(c.routingRefreshes),
              u(c.staleRoutingRetries), u(c.offlineIos));
  if (const auto& e = cluster.etcd) {
    char last[48] = "";
    if (e->updates != 0) std::snprintf(last, sizeof last, " (the last %.3f s ago)", sinceLastUpdate(*e));
    std::printf("  etcd routing    updates %llu%s, reloads %llu, refreshes %llu, bad records %llu, revision %lld\n",
                u(e->updates), last, u(e->reloads), u(e->refreshes), u(e->badRecords),
                static_cast<long long>(e->revision));
  }
  for (const auto& [address, s] : cluster.servers) {
    std::printf("  %-22s %10.0f IOPS  %8.3f GiB/s  requests %llu (failed %llu, timed out %llu), down %llux, "
                "back %llux, stale IOs %llu\n",
                address.c_str(), static_cast<double>(s.ios) / elapsed,
                static_cast<double>(s.bytes) / elapsed / (1u << 30), u(s.requests), u(s.failedRequests),
                u(s.timeouts), u(s.downs), u(s.ups), u(s.staleIos));
  }
}

// The failed IOs by status, each status that occurred formatted with
// `format` (its name, its count), joined by `separator`.
std::string statusCounts(const Tally& tally, const char* format, const char* separator) {
  std::string out;
  char item[64];
  for (std::size_t s = 0; s < kStatuses; ++s) {
    if (tally.byStatus[s] == 0) continue;
    std::snprintf(item, sizeof item, format, storage::proto::toString(static_cast<storage::proto::IoStatus>(s)),
                  static_cast<unsigned long long>(tally.byStatus[s]));
    out += (out.empty() ? "" : separator) + std::string(item);
  }
  return out;
}

void report(const Settings& settings, Tally& tally, double elapsed, const ClusterFigures* cluster) {
  std::sort(tally.latencies.begin(), tally.latencies.end());
  const double iops = static_cast<double>(tally.ios) / elapsed;
  const double gib = static_cast<double>(tally.bytes) / elapsed / (1u << 30);
  const double p50 = percentile(tally.latencies, 0.5) * 1e3, p99 = percentile(tally.latencies, 0.99) * 1e3,
               p999 = percentile(tally.latencies, 0.999) * 1e3;
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  if (settings.json) {
    std::printf("{\"transport\":\"%s\",\"reactor\":\"%s\",\"connections\":%zu,\"depth\":%zu,\"batch\":%zu,"
                "\"io_size\":%u,\"verify\":%s,\"seconds\":%.3f,\"ios\":%llu,\"bytes\":%llu,\"iops\":%.1f,"
                "\"gib_per_s\":%.4f,\"batch_latency_ms\":{\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f},"
                "\"errors\":{\"total\":%llu,\"io_status\":{\"total\":%llu,\"by_status\":{%s}},\"checksum\":%llu,"
                "\"content\":%llu,\"wrong_bytes\":%llu,\"timed_out\":%llu,\"request\":%llu}",
                settings.transport.c_str(), std::string(coio::toString(settings.kind)).c_str(),
                cluster ? cluster->servers.size() : settings.connections, settings.depth, settings.batch,
                settings.ioSize, settings.verify ? "true" : "false", elapsed, u(tally.ios), u(tally.bytes), iops, gib,
                p50, p99, p999, u(tally.errors()), u(tally.badStatus), statusCounts(tally, "\"%s\":%llu", ",").c_str(),
                u(tally.checksumMismatches), u(tally.contentMismatches), u(tally.wrongBytes), u(tally.timedOutRequests),
                u(tally.failedRequests));
    if (cluster) reportCluster(settings, *cluster, elapsed);
    std::printf("}\n");
    return;
  }
  const std::string to = cluster ? std::to_string(cluster->servers.size()) + " servers (" + cluster->source + ")"
                                 : settings.server.toString();
  std::printf("coio-storage-bench: %s to %s, %s reactor, %zu connection(s), depth %zu, batch %zu x %u bytes, "
              "verify %s\n",
              settings.transport.c_str(), to.c_str(), std::string(coio::toString(settings.kind)).c_str(),
              cluster ? cluster->servers.size() : settings.connections, settings.depth, settings.batch,
              settings.ioSize, settings.verify ? "on" : "off");
  std::printf("  duration        %.2f s\n", elapsed);
  std::printf("  IOPS            %.0f\n", iops);
  std::printf("  throughput      %.3f GiB/s\n", gib);
  std::printf("  batch latency   p50 %.3f ms   p99 %.3f ms   p999 %.3f ms   (%zu batches)\n", p50, p99, p999,
              tally.latencies.size());
  const std::string named = tally.badStatus == 0 ? "" : " [" + statusCounts(tally, "%s %llu", ", ") + "]";
  std::printf("  errors          %llu (IO status %llu%s, checksum %llu, content %llu (%llu bytes wrong), "
              "timed out %llu, failed requests %llu)\n",
              u(tally.errors()), u(tally.badStatus), named.c_str(), u(tally.checksumMismatches),
              u(tally.contentMismatches), u(tally.wrongBytes), u(tally.timedOutRequests), u(tally.failedRequests));
  if (cluster) reportCluster(settings, *cluster, elapsed);
}

// The workers' tallies added up.
Tally total(std::vector<Tally>& tallies) {
  Tally all;
  for (Tally& t : tallies) {
    all.ios += t.ios;
    all.bytes += t.bytes;
    all.badStatus += t.badStatus;
    for (std::size_t s = 0; s < kStatuses; ++s) all.byStatus[s] += t.byStatus[s];
    all.checksumMismatches += t.checksumMismatches;
    all.contentMismatches += t.contentMismatches;
    all.wrongBytes += t.wrongBytes;
    all.timedOutRequests += t.timedOutRequests;
    all.failedRequests += t.failedRequests;
    all.latencies.insert(all.latencies.end(), t.latencies.begin(), t.latencies.end());
    all.endedAt.insert(all.endedAt.end(), t.endedAt.begin(), t.endedAt.end());
  }
  return all;
}

// The report, the latency log; the exit code.
int finish(const Settings& settings, std::vector<Tally>& tallies, double elapsed, const ClusterFigures* cluster) {
  Tally all = total(tallies);
  const bool logged = settings.latencyLog.empty() || writeLatencyLog(settings, all);
  report(settings, all, elapsed, cluster);
  return all.errors() == 0 && all.ios > 0 && logged ? 0 : 1;
}

#if COIO_STORAGE_RDMA
// A queue pair brought up over a new TCP connection: how an RDMA client
// connects, and reconnects after an idle close.
template <coio::Reactor R>
coio::Task<coio::Result<std::unique_ptr<storage::Channel<R>>>> connectRdma(R& reactor, const Settings& settings,
                                                                           coio::SocketAddress server,
                                                                           std::stop_token stop) {
  coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, server, stop);
  if (!stream) co_return stream.error();
  co_return co_await storage::RdmaChannel<R>::connect(reactor, *settings.device, std::move(*stream), std::move(stop),
                                                      std::chrono::seconds(10));
}
#endif

// Runs --depth workers for --duration, worker w on clients[w % clients]
// with its slice of `memory`, and the live line; the seconds it took.
template <coio::Reactor R, typename Client>
coio::Task<double> runWorkers(R& reactor, const Settings& settings, std::vector<Client*> clients,
                              std::span<std::byte> memory, std::vector<Tally>& tallies) {
  FailureLog failures;
  const Clock::time_point begin = Clock::now();
  const Clock::time_point end =
      begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings.duration));
  std::vector<coio::Task<void>> tasks;
  for (std::size_t w = 0; w < settings.depth; ++w) {
    const std::size_t slice = settings.batch * settings.ioSize;
    tasks.push_back(worker(*clients[w % clients.size()], settings, end, 1000 + w,
                           memory.subspan(w * slice, slice), tallies[w], failures));
  }
  tasks.push_back(progress(reactor, begin, end, tallies));
  co_await coio::collectAllRange(std::move(tasks));
  co_return std::chrono::duration<double>(Clock::now() - begin).count();
}

// One client over the chosen transport; `memory` is where its IOs land.
template <coio::Reactor R>
coio::Task<coio::Result<std::unique_ptr<storage::StorageClient<R>>>> connect(R& reactor, const Settings& settings,
                                                                             storage::TransmissionLimiter& limiter,
                                                                             std::span<std::byte> memory) {
  const storage::ClientOptions options{.timeout = settings.timeout, .verifyChecksums = settings.verify};
#if COIO_STORAGE_RDMA
  if (settings.device) {
    coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await storage::StorageClient<R>::connect(
        [&reactor, &settings](std::stop_token stop) {
          return connectRdma(reactor, settings, settings.server, std::move(stop));
        },
        limiter, options);
    if (!client) co_return client.error();
    if (coio::Result<void> registered = (*client)->registerMemory(memory); !registered) {
      co_await (*client)->close();
      co_return registered.error();
    }
    co_return std::move(*client);
  }
#endif
  (void)memory;  // TCP reads into any memory
  co_return co_await storage::StorageClient<R>::connect(reactor, settings.server, limiter, options);
}

template <coio::Reactor R>
coio::Task<int> run(R& reactor, const Settings& settings) {
  storage::TransmissionLimiter limiter(settings.maxTransmissions);
  // Every worker's destinations, in one allocation that each client registers once (RDMA).
  std::vector<std::byte> memory(settings.depth * settings.batch * settings.ioSize);
  std::vector<std::unique_ptr<storage::StorageClient<R>>> clients;
  for (std::size_t c = 0; c < settings.connections; ++c) {
    coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await connect(reactor, settings, limiter, memory);
    if (!client) {
      std::fprintf(stderr, "coio-storage-bench: cannot connect to %s over %s: %s (is coio-storage-server running%s?)\n",
                   settings.server.toString().c_str(), settings.transport.c_str(), client.error().message().c_str(),
                   settings.transport == "rdma" ? " with --transport rdma" : "");
      for (auto& open : clients) co_await open->close();
      co_return 1;
    }
    clients.push_back(std::move(*client));
  }
  std::vector<storage::StorageClient<R>*> all;
  for (auto& client : clients) all.push_back(client.get());
  std::vector<Tally> tallies(settings.depth);
  const double elapsed = co_await runWorkers(reactor, settings, all, memory, tallies);
  for (auto& client : clients) co_await client->close();
  co_return finish(settings, tallies, elapsed, nullptr);
}

// --etcd: the routing read from etcd; the dataset's shape taken from it.
template <coio::Reactor R>
coio::Task<std::unique_ptr<storage::EtcdRouting<R>>> loadEtcdRouting(storage::etcd::EtcdClient<R>& etcd,
                                                                     Settings& settings) {
  std::string why;
  coio::Result<std::unique_ptr<storage::EtcdRouting<R>>> routing = co_await storage::EtcdRouting<R>::load(
      etcd, std::chrono::seconds(5), [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
      &why);
  if (!routing) {
    std::fprintf(stderr, "coio-storage-bench: no routing from etcd: %s\n", why.c_str());
    co_return nullptr;
  }
  const storage::ChainTable& table = (*routing)->table();
  if (settings.ioSize > table.chunkSize()) {
    std::fprintf(stderr, "coio-storage-bench: --io-size is larger than a chunk (%u bytes)\n", table.chunkSize());
    co_return nullptr;
  }
  settings.layout = {table.chunks(), table.chunkSize(), 1};
  settings.table = table;
  co_return std::move(*routing);
}

// --cluster: every server of the table (a file's, or etcd's) through one ClusterClient.
template <coio::Reactor R>
coio::Task<int> runCluster(R& reactor, Settings& settings) {
  storage::ClusterOptions options;
  options.connection.timeout = settings.timeout;
  options.requestTimeout = settings.requestTimeout;
  options.hedgeAfter = settings.hedge;
  options.maxTransmissionsPerServer = settings.maxTransmissions;
  std::ofstream routingLog;
  if (!settings.routingLog.empty()) {
    routingLog.open(settings.routingLog, std::ios::trunc);
    if (!routingLog) {
      std::fprintf(stderr, "coio-storage-bench: cannot write %s\n", settings.routingLog.c_str());
      co_return 1;
    }
    options.routingApplied = [&routingLog](const storage::ChainTable& table) { logRouting(routingLog, table); };
  }
  std::unique_ptr<storage::etcd::EtcdClient<R>> etcd;
  std::unique_ptr<storage::EtcdRouting<R>> routing;
  if (!settings.etcdEndpoints.empty()) {
    storage::etcd::EtcdOptions etcdOptions;
    etcdOptions.endpoints = settings.etcdEndpoints;
    coio::Result<std::unique_ptr<storage::etcd::EtcdClient<R>>> created =
        storage::etcd::EtcdClient<R>::create(reactor, std::move(etcdOptions));
    if (!created) {
      std::fprintf(stderr, "coio-storage-bench: --etcd takes http://IP:PORT[,...]\n");
      co_return 2;
    }
    etcd = std::move(*created);
    routing = co_await loadEtcdRouting(*etcd, settings);
    if (!routing) co_return 1;
    options.refreshRouting = routing->refresher(settings.requestTimeout);
  } else {
    // A server with a newer chain version (serve --chains): the file, read again.
    options.refreshRouting = [&settings]() -> coio::Task<coio::Result<storage::ChainTable>> {
      co_return storage::ChainTable::load(settings.clusterFile);
    };
  }
  typename storage::ClusterClient<R>::ConnectorFactory factory;
#if COIO_STORAGE_RDMA
  if (settings.device) {
    factory = [&reactor, &settings](const coio::SocketAddress& server) -> storage::ChannelConnector<R> {
      return [&reactor, &settings, server](std::stop_token stop) {
        return connectRdma(reactor, settings, server, std::move(stop));
      };
    };
  }
#endif
  std::unique_ptr<storage::ClusterClient<R>> client =
      co_await storage::ClusterClient<R>::connect(reactor, *settings.table, options, std::move(factory));
  if (routing) routing->follow(*client);
  std::vector<std::byte> memory(settings.depth * settings.batch * settings.ioSize);
  coio::Result<void> registered = client->registerMemory(memory);
  std::vector<Tally> tallies(settings.depth);
  double elapsed = 0;
  if (registered) {
    std::vector<storage::ClusterClient<R>*> one(1, client.get());
    elapsed = co_await runWorkers(reactor, settings, std::move(one), memory, tallies);
  }
  ClusterFigures figures{settings.clusterFile, settings.table->chains().size(), client->stats(), {}, {}};
  if (routing) {
    co_await routing->close();
    figures.etcd = routing->stats();
    figures.source = "etcd " + settings.etcdEndpoints.front() + (settings.etcdEndpoints.size() > 1 ? ",..." : "");
  }
  if (!registered) {
    std::fprintf(stderr, "coio-storage-bench: cannot register memory: %s\n", registered.error().message().c_str());
    co_await client->close();
    co_return 1;
  }
  for (std::size_t s = 0; s < client->servers(); ++s) {
    figures.servers.emplace_back(client->serverAddress(s).toString(), client->serverStats(s));
  }
  co_await client->close();
  co_return finish(settings, tallies, elapsed, &figures);
}

int usage(const char* problem = nullptr) {
  if (problem) std::fprintf(stderr, "coio-storage-bench: %s\n", problem);
  std::fputs(kUsage, problem ? stderr : stdout);
  return problem ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  std::string address = "127.0.0.1:9000", transport = "tcp", dir, rdmaDevice;
  for (int i = 1; i < argc; ++i) {
    const std::string_view name = argv[i];
    if (name == "--help" || name == "-h") return usage();
    if (name == "--verify") {
      settings.verify = true;
      continue;
    }
    if (name == "--json") {
      settings.json = true;
      continue;
    }
    if (name == "--latency-log" || name == "--cluster") {
      if (i + 1 >= argc) return usage(("missing value for " + std::string(name)).c_str());
      (name == "--cluster" ? settings.clusterFile : settings.latencyLog) = argv[++i];
      continue;
    }
    if (i + 1 >= argc) return usage(("missing value for " + std::string(name)).c_str());
    const std::string_view value = argv[++i];
    const std::optional<std::uint64_t> count = storage::cli::parseCount(value);
    const std::optional<std::uint64_t> size = storage::cli::parseSize(value);
    bool ok = true;
    if (name == "--address") {
      address = value;
    } else if (name == "--transport") {
      transport = value;
    } else if (name == "--rdma-device") {
      rdmaDevice = value;
    } else if (name == "--dir") {
      dir = value;
    } else if (name == "--target") {
      ok = count && *count <= UINT32_MAX;
      settings.target = static_cast<std::uint32_t>(count.value_or(0));
    } else if (name == "--chunks") {
      ok = count && *count > 0;
      settings.layout.chunks = count.value_or(0);
    } else if (name == "--chunk-size") {
      ok = size && *size > 0 && *size <= UINT32_MAX;
      settings.layout.chunkSize = static_cast<std::uint32_t>(size.value_or(0));
    } else if (name == "--io-size") {
      ok = size && *size > 0 && *size <= UINT32_MAX;
      settings.ioSize = static_cast<std::uint32_t>(size.value_or(0));
    } else if (name == "--batch") {
      ok = count && *count > 0 && *count <= storage::proto::kMaxIosPerFrame;
      settings.batch = count.value_or(0);
    } else if (name == "--depth") {
      ok = count && *count > 0 && *count <= 4096;
      settings.depth = count.value_or(0);
    } else if (name == "--connections") {
      ok = count && *count > 0 && *count <= 1024;
      settings.connections = count.value_or(0);
    } else if (name == "--max-transmissions") {
      ok = count && *count > 0;
      settings.maxTransmissions = count.value_or(0);
    } else if (name == "--duration") {
      ok = count && *count > 0;
      settings.duration = static_cast<double>(count.value_or(0));
    } else if (name == "--timeout-ms") {
      ok = count && *count > 0 && *count <= 24 * 3600 * 1000;
      settings.timeout = std::chrono::milliseconds(count.value_or(0));
    } else if (name == "--request-timeout-ms") {
      ok = count && *count > 0 && *count <= 24 * 3600 * 1000;
      settings.requestTimeout = std::chrono::milliseconds(count.value_or(0));
    } else if (name == "--hedge-ms") {
      ok = count && *count <= 24 * 3600 * 1000;
      settings.hedge = std::chrono::milliseconds(count.value_or(0));
    } else if (name == "--routing-log") {
      settings.routingLog = value;
    } else if (name == "--etcd") {
      settings.etcdEndpoints = storage::cli::splitList(value);
      ok = !settings.etcdEndpoints.empty();
    } else if (name == "--reactor") {
      ok = coio::parseReactorKind(value).hasValue();
      if (ok) settings.kind = *coio::parseReactorKind(value);
    } else {
      return usage(("unknown option " + std::string(name)).c_str());
    }
    if (!ok) return usage(("bad value for " + std::string(name) + ": " + std::string(value)).c_str());
  }
  if (transport != "tcp" && transport != "rdma") return usage("--transport is tcp or rdma");
  settings.transport = transport;
  if (transport == "rdma" && !storage::cli::openRdmaDevice("coio-storage-bench", rdmaDevice, settings)) return 1;
  if (!settings.routingLog.empty() && settings.etcdEndpoints.empty() && settings.clusterFile.empty()) {
    return usage("--routing-log is a cluster client's: it needs --cluster or --etcd");
  }
  if (!settings.etcdEndpoints.empty()) {
    if (!settings.clusterFile.empty()) return usage("--etcd replaces --cluster FILE: give one");
    settings.layout = {1, settings.ioSize, 1};  // a placeholder: etcd's routing gives the shape (runCluster)
  } else if (!settings.clusterFile.empty()) {
    std::string why;
    coio::Result<storage::ChainTable> table = storage::ChainTable::load(settings.clusterFile, &why);
    if (!table) {
      std::fprintf(stderr, "coio-storage-bench: %s\n", why.c_str());
      return 1;
    }
    settings.layout = {table->chunks(), table->chunkSize(), 1};
    settings.table = std::move(*table);
  } else if (!dir.empty()) {
    std::string why;
    coio::Result<storage::ChunkStoreIndex> index = storage::loadChunkStoreIndex(dir, &why);
    if (!index) {
      std::fprintf(stderr, "coio-storage-bench: cannot read %s/index: %s\n", dir.c_str(),
                   why.empty() ? index.error().message().c_str() : why.c_str());
      return 1;
    }
    settings.layout = index->layout;
  }
  if (settings.layout.chunks == 0 || settings.layout.chunkSize == 0) {
    return usage("give the dataset's shape: --dir D, or --chunks N and --chunk-size S");
  }
  if (settings.ioSize > settings.layout.chunkSize) return usage("--io-size is larger than a chunk");
  coio::Result<coio::SocketAddress> server = coio::SocketAddress::parse(address);
  if (!server) return usage("--address takes host:port");
  settings.server = *server;
  std::string why;
  if (const coio::ReactorKind usable = coio::usableReactorKind(settings.kind, &why); usable != settings.kind) {
    std::fprintf(stderr, "coio-storage-bench: %s; using epoll\n", why.c_str());
    settings.kind = usable;
  }
  return coio::withReactor(settings.kind, [&](auto& reactor) {
    const bool cluster = settings.table || !settings.etcdEndpoints.empty();
    return reactor.runUntil(cluster ? runCluster(reactor, settings) : run(reactor, settings));
  });
}
