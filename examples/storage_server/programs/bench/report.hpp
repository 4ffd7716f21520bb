#pragma once
// coio-storage-bench's tallies and its report: what each worker counts,
// the first failures logged as they happen, the text or JSON report, the
// latency and routing logs.
#include "client/cluster_client.hpp"
#include "client/etcd_routing.hpp"
#include "programs/bench/settings.hpp"
#include "protocol/crc32c.hpp"
#include "protocol/protocol.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace storage::bench {

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
  // A batch that ended now, after `took`.
  void batchDone(Clock::duration took, bool logging) {
    latencies.push_back(std::chrono::duration<double>(took).count());
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

// What a cluster run reports beyond a single server's figures.
struct ClusterFigures {
  std::string source;  // the file, or "etcd URL,..."
  std::size_t chains = 0;
  storage::ClusterStats stats;
  std::vector<std::pair<std::string, storage::ClusterServerStats>> servers;  // address, figures
  std::optional<storage::EtcdRoutingStats> etcd;  // --etcd: the follower's figures
  Clock::time_point etcdAt{};  // when they were taken, on the reactor's clock (as their lastUpdate)
};

inline double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto at = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(at, sorted.size() - 1)];
}

// --latency-log: one line per batch, "UNIX-TIME-MS LATENCY-MS".
inline bool writeLatencyLog(const Settings& settings, const Tally& tally) {
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
inline void logRouting(std::ofstream& out, const storage::ChainTable& table) {
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

// Seconds from the follower's last update to `at`; -1: none (JSON's value for none).
inline double sinceLastUpdate(const storage::EtcdRoutingStats& e, Clock::time_point at) {
  if (e.updates == 0) return -1;
  return std::chrono::duration<double>(at - e.lastUpdate).count();
}

inline void reportCluster(const Settings& settings, const ClusterFigures& cluster, double elapsed) {
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  const storage::ClusterStats& c = cluster.stats;
  if (settings.json) {
    std::printf(",\"cluster\":{\"file\":\"%s\",\"servers\":%zu,\"chains\":%zu,\"retries\":%llu,\"failovers\":%llu,"
                "\"hedges\":%llu,\"hedge_wins\":%llu,\"corrupt_replicas\":%llu,\"failed_ios\":%llu,"
                "\"routing_updates\":%llu,\"routing_refreshes\":%llu,\"stale_routing_retries\":%llu,"
                "\"offline_ios\":%llu,\"retry_pauses\":%llu",
                cluster.source.c_str(), cluster.servers.size(), cluster.chains, u(c.retries), u(c.failovers),
                u(c.hedges), u(c.hedgeWins), u(c.corruptReplicas), u(c.failedIos), u(c.routingUpdates),
                u(c.routingRefreshes), u(c.staleRoutingRetries), u(c.offlineIos), u(c.retryPauses));
    if (const auto& e = cluster.etcd) {
      std::printf(",\"etcd\":{\"updates\":%llu,\"reloads\":%llu,\"refreshes\":%llu,\"bad_records\":%llu,"
                  "\"revision\":%lld,\"last_update_s_ago\":%.3f}",
                  u(e->updates), u(e->reloads), u(e->refreshes), u(e->badRecords), static_cast<long long>(e->revision),
                  sinceLastUpdate(*e, cluster.etcdAt));
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
              "corrupt replicas %llu, failed IOs %llu, retry pauses %llu\n"
              "  routing         updates %llu, refreshes on staleRouting %llu, IOs sent again on them %llu, "
              "IOs sent to offline targets %llu\n",
              cluster.servers.size(), cluster.chains, u(c.retries), u(c.failovers), u(c.hedges), u(c.hedgeWins),
              u(c.corruptReplicas), u(c.failedIos), u(c.retryPauses), u(c.routingUpdates), u(c.routingRefreshes),
              u(c.staleRoutingRetries), u(c.offlineIos));
  if (const auto& e = cluster.etcd) {
    char last[48] = "";
    if (e->updates != 0) {
      std::snprintf(last, sizeof last, " (the last %.3f s ago)", sinceLastUpdate(*e, cluster.etcdAt));
    }
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
inline std::string statusCounts(const Tally& tally, const char* format, const char* separator) {
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

inline void report(const Settings& settings, Tally& tally, double elapsed, const ClusterFigures* cluster) {
  std::sort(tally.latencies.begin(), tally.latencies.end());
  const double iops = static_cast<double>(tally.ios) / elapsed;
  const double gib = static_cast<double>(tally.bytes) / elapsed / (1u << 30);
  const double p50 = percentile(tally.latencies, 0.5) * 1e3, p99 = percentile(tally.latencies, 0.99) * 1e3,
               p999 = percentile(tally.latencies, 0.999) * 1e3;
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  const std::string_view crc32c = storage::crc32cImplementation();
  if (settings.json) {
    std::printf("{\"transport\":\"%s\",\"reactor\":\"%s\",\"reactors\":%zu,\"connections\":%zu,\"depth\":%zu,\"batch\":%zu,"
                "\"io_size\":%u,\"verify\":%s,\"checksums\":%s,\"crc32c\":\"%.*s\",\"seconds\":%.3f,\"ios\":%llu,\"bytes\":%llu,\"iops\":%.1f,"
                "\"gib_per_s\":%.4f,\"batch_latency_ms\":{\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f},"
                "\"errors\":{\"total\":%llu,\"io_status\":{\"total\":%llu,\"by_status\":{%s}},\"checksum\":%llu,"
                "\"content\":%llu,\"wrong_bytes\":%llu,\"timed_out\":%llu,\"request\":%llu}",
                settings.transport.c_str(), std::string(coio::toString(settings.kind)).c_str(), settings.reactors,
                cluster ? cluster->servers.size() : settings.connections, settings.depth, settings.batch,
                settings.ioSize, settings.verify ? "true" : "false",
                settings.verify || settings.checksums ? "true" : "false", static_cast<int>(crc32c.size()),
                crc32c.data(), elapsed, u(tally.ios), u(tally.bytes), iops, gib,
                p50, p99, p999, u(tally.errors()), u(tally.badStatus), statusCounts(tally, "\"%s\":%llu", ",").c_str(),
                u(tally.checksumMismatches), u(tally.contentMismatches), u(tally.wrongBytes), u(tally.timedOutRequests),
                u(tally.failedRequests));
    if (cluster) reportCluster(settings, *cluster, elapsed);
    std::printf("}\n");
    return;
  }
  const std::string to = cluster ? std::to_string(cluster->servers.size()) + " servers (" + cluster->source + ")"
                                 : settings.server.toString();
  std::printf("coio-storage-bench: %s to %s, %zu %s reactor(s), %zu connection(s), depth %zu, batch %zu x %u "
              "bytes, verify %s%s\n",
              settings.transport.c_str(), to.c_str(), settings.reactors, std::string(coio::toString(settings.kind)).c_str(),
              cluster ? cluster->servers.size() : settings.connections, settings.depth, settings.batch,
              settings.ioSize, settings.verify ? "on" : "off",
              !settings.verify && settings.checksums ? ", checksums on" : "");
  if (settings.verify || settings.checksums) {  // the bench computes CRCs only then
    std::printf("  CRC32C by       %.*s\n", static_cast<int>(crc32c.size()), crc32c.data());
  }
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
inline Tally total(std::vector<Tally>& tallies) {
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
inline int finish(const Settings& settings, std::vector<Tally>& tallies, double elapsed, const ClusterFigures* cluster) {
  Tally all = total(tallies);
  const bool logged = settings.latencyLog.empty() || writeLatencyLog(settings, all);
  report(settings, all, elapsed, cluster);
  return all.errors() == 0 && all.ios > 0 && logged ? 0 : 1;
}

}  // namespace storage::bench
