#pragma once
// A ClusterClient's routing from etcd (CHAINS.md, "Routing in a cluster
// manager"): the records under /coio/ read once at one revision, then
// followed through a watch from the next revision, each change applied
// with ClusterClient::updateRouting. etcd is off the data path: reads use
// the routing the client holds, whether etcd answers or not.
#include "cluster/chain_table.hpp"
#include "client/cluster_client.hpp"
#include "etcd/etcd_client.hpp"
#include "cluster/routing_json.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace storage {

/// What an EtcdRouting has done (EtcdRouting::stats()).
struct EtcdRoutingStats {
  std::uint64_t updates = 0;      ///< routings applied to the client from the watch (each changed something)
  std::uint64_t reloads = 0;      ///< full re-reads after a compacted watch
  std::uint64_t refreshes = 0;    ///< re-reads for a staleRouting answer (refresher())
  std::uint64_t badRecords = 0;   ///< records (or record sets) refused: the routing in use stays
  std::int64_t revision = 0;      ///< the etcd revision the routing is at
  /// When the last update was applied, on the reactor's clock (epoch: none yet).
  std::chrono::steady_clock::time_point lastUpdate{};
};

/// A ClusterClient's routing, followed from etcd.
///
/// Guarantees:
/// - Used on its reactor's loop thread only; every awaitable resumes there.
/// - load() reads every record under /coio/ (datasetKey, serverKey,
///   chainKey; other keys there are ignored) in one range, so at one
///   revision, and assembles them (ChainTable::assemble): the routing to
///   connect a ClusterClient with.
/// - follow(client) watches /coio/ from that revision + 1 in a task of its
///   own and applies every change in revision order: the records are
///   updated, assembled, and a table that differs from the last applied
///   one goes to client.updateRouting(). A record that does not parse is
///   logged, counted and skipped (its key keeps its last good value); a
///   record set that does not assemble (a chain naming a server with no
///   record yet) is logged and counted, and the routing in use stays until
///   a later change makes the set whole again. Reads never wait on this:
///   updateRouting swaps the routing under requests in flight.
/// - While etcd is unreachable the client keeps the routing it has; the
///   watch reconnects in the background (its own failover and backoff) and
///   resumes at the revision after the last event seen, so no change is
///   lost. If etcd compacted that revision meanwhile, everything is read
///   again (load's range) and watched from there.
/// - refresher() is a ClusterOptions::refreshRouting: it reads the records
///   afresh (within the given deadline) and returns their table; it applies
///   nothing itself. A watch lagging behind such a refresh can apply an
///   older table for a moment; the next event (or staleRouting answer)
///   brings the client forward again.
/// - `co_await close()` before the client is closed, and before
///   destruction; the EtcdClient outlives this.
template <coio::Reactor R>
class EtcdRouting {
 public:
  using Etcd = etcd::EtcdClient<R>;

  /// The prefix every routing key lives under.
  static constexpr std::string_view kPrefix = "/coio/";

  /// Reads the routing from `etcd` within `timeout`. Errors: the etcd
  /// call's (etcd unreachable: std::errc::timed_out), or
  /// Errc::invalidArgument when the records are missing, do not parse or do
  /// not assemble; `why` then says which and why.
  static coio::Task<coio::Result<std::unique_ptr<EtcdRouting>>> load(
      Etcd& etcd, std::chrono::steady_clock::duration timeout,
      std::function<void(const std::string&)> log = {}, std::string* why = nullptr) {
    auto routing = std::unique_ptr<EtcdRouting>(new EtcdRouting(etcd, std::move(log)));
    coio::Result<ChainTable> table = co_await routing->read(timeout);
    if (!table) {
      if (why != nullptr) *why = routing->lastError_;
      co_return table.error();
    }
    routing->table_ = std::move(*table);
    co_return std::move(routing);
  }

  EtcdRouting(const EtcdRouting&) = delete;
  EtcdRouting& operator=(const EtcdRouting&) = delete;

  /// The last routing read or applied.
  const ChainTable& table() const noexcept { return table_; }
  const EtcdRoutingStats& stats() const noexcept { return stats_; }
  /// Why the last read or change was refused (empty: none yet).
  const std::string& lastError() const noexcept { return lastError_; }

  /// Starts following the watch into `client` (once); `client` outlives
  /// close().
  void follow(ClusterClient<R>& client) { tasks_.spawn(watchLoop(client)); }

  /// A ClusterOptions::refreshRouting reading etcd within `timeout` (the
  /// client's requestTimeout); valid while this lives.
  std::function<coio::Task<coio::Result<ChainTable>>()> refresher(std::chrono::steady_clock::duration timeout) {
    return [this, timeout]() -> coio::Task<coio::Result<ChainTable>> {
      ++stats_.refreshes;
      RoutingRecords records;
      std::int64_t revision = 0;
      co_return co_await readInto(records, revision, timeout);
    };
  }

  /// Stops following; resumes once the watch task has ended.
  coio::Task<void> close() {
    tasks_.requestStop();
    co_await tasks_.join();
  }

 private:
  // One watch wait: long enough to be cheap, short enough for a stop to be
  // noticed by the loop (a stop also ends it at once).
  static constexpr auto kWatchWait = std::chrono::seconds(1);
  static constexpr auto kRetryPause = std::chrono::milliseconds(100);

  EtcdRouting(Etcd& etcd, std::function<void(const std::string&)> log) : etcd_(etcd), log_(std::move(log)) {}

  void report(std::string what) {
    lastError_ = std::move(what);
    if (log_) log_("etcd routing: " + lastError_);
  }

  // Reads every record into `records` (and their revision), assembled.
  coio::Task<coio::Result<ChainTable>> readInto(RoutingRecords& records, std::int64_t& revision,
                                                std::chrono::steady_clock::duration timeout) {
    coio::Result<etcd::RangeResponse> all =
        co_await etcd_.range(etcd::RangeRequest::prefix(kPrefix), timeout);
    if (!all) {
      report("reading " + std::string(kPrefix) + ": " + all.error().message() + " (" + etcd_.lastError() + ")");
      co_return all.error();
    }
    // etcd's state as it is: a record that does not parse is left out (and reported).
    records = {};
    for (const etcd::KeyValue& kv : all->kvs) (void)applyPut(records, kv.key, kv.value);
    revision = all->header.revision;
    co_return assembled(records);
  }

  // The routing of records_ at revision_, read afresh.
  coio::Task<coio::Result<ChainTable>> read(std::chrono::steady_clock::duration timeout) {
    return readInto(records_, stats_.revision, timeout);
  }

  coio::Result<ChainTable> assembled(const RoutingRecords& records) {
    std::string why;
    coio::Result<ChainTable> table = ChainTable::assemble(records, &why);
    if (!table) {
      ++stats_.badRecords;
      report("the records do not make a routing: " + why);
    }
    return table;
  }

  // "/coio/chains/": chainKey(id) without its id.
  static std::string chainsPrefix() {
    const std::string any = chainKey(0);
    return any.substr(0, any.size() - 1);
  }

  // Applies a put of `key`; false (reported) if its value does not parse.
  bool applyPut(RoutingRecords& records, std::string_view key, std::string_view value) {
    std::string why;
    if (key == datasetKey()) {
      coio::Result<DatasetRecord> dataset = parseDatasetRecord(value, &why);
      if (dataset) records.dataset = std::move(*dataset);
      return parsed(dataset.hasValue(), key, why);
    }
    if (key.starts_with(serverKey(""))) {
      coio::Result<ServerRecord> server = parseServerRecord(value, &why);
      if (server) replace(records.servers, std::move(*server), [](const ServerRecord& a, const ServerRecord& b) {
        return a.name == b.name;
      });
      return parsed(server.hasValue(), key, why);
    }
    if (key.starts_with(chainsPrefix())) {
      coio::Result<ChainRecord> chain = parseChainRecord(value, &why);
      if (chain) replace(records.chains, std::move(*chain), [](const ChainRecord& a, const ChainRecord& b) {
        return a.id == b.id;
      });
      return parsed(chain.hasValue(), key, why);
    }
    return true;  // not a routing key
  }

  // Applies a delete of `key`.
  static void applyDelete(RoutingRecords& records, std::string_view key) {
    if (key == datasetKey()) {
      records.dataset = {};
    } else if (key.starts_with(serverKey(""))) {
      std::erase_if(records.servers, [&](const ServerRecord& s) { return serverKey(s.name) == key; });
    } else if (key.starts_with(chainsPrefix())) {
      std::erase_if(records.chains, [&](const ChainRecord& c) { return chainKey(c.id) == key; });
    }
  }

  bool parsed(bool ok, std::string_view key, const std::string& why) {
    if (!ok) {
      ++stats_.badRecords;
      report(std::string(key) + ": " + why);
    }
    return ok;
  }

  template <typename T, typename Same>
  static void replace(std::vector<T>& all, T record, Same same) {
    const auto found = std::find_if(all.begin(), all.end(), [&](const T& r) { return same(r, record); });
    if (found == all.end()) {
      all.push_back(std::move(record));
    } else {
      *found = std::move(record);
    }
  }

  // Applies records_ to `client` if they make a table other than the last.
  coio::Task<void> publish(ClusterClient<R>& client) {
    coio::Result<ChainTable> table = assembled(records_);
    if (!table || *table == table_) co_return;
    table_ = std::move(*table);
    co_await client.updateRouting(table_);
    ++stats_.updates;
    stats_.lastUpdate = etcd_.reactor().now();
  }

  // Everything again after a compaction: the events in between are gone.
  coio::Task<void> reload(ClusterClient<R>& client) {
    ++stats_.reloads;
    coio::Result<ChainTable> table = co_await read(kWatchWait);
    if (table) co_await publish(client);
  }

  coio::Task<void> watchLoop(ClusterClient<R>& client) {
    const std::stop_token stop = co_await coio::currentStopToken();
    while (!stop.stop_requested()) {
      coio::Result<std::unique_ptr<etcd::EtcdWatch<R>>> watch =
          co_await etcd_.watch(etcd::WatchRequest::prefix(kPrefix, stats_.revision + 1), kWatchWait);
      if (!watch) {
        if (stop.stop_requested()) break;
        if (watch.error() == etcd::EtcdErrc::compacted) {
          co_await reload(client);
        } else {  // etcd unreachable: keep the routing, try again
          co_await etcd_.reactor().sleepFor(kRetryPause, stop);
        }
        continue;
      }
      co_await followWatch(client, **watch, stop);
    }
  }

  // Applies the watch's batches until it is compacted (after a reload: a
  // new watch is needed) or the loop is stopped.
  coio::Task<void> followWatch(ClusterClient<R>& client, etcd::EtcdWatch<R>& watch, const std::stop_token& stop) {
    while (!stop.stop_requested()) {
      coio::Result<etcd::WatchBatch> batch = co_await watch.next(kWatchWait);
      if (!batch) {
        if (batch.error() == etcd::EtcdErrc::compacted) {
          co_await reload(client);
          co_return;
        }
        if (batch.error() != std::errc::timed_out && !stop.stop_requested()) {
          // The watch reconnects on its next call; a pause keeps a refusing etcd from spinning us.
          report("watch: " + batch.error().message() + " (" + etcd_.lastError() + ")");
          co_await etcd_.reactor().sleepFor(kRetryPause, stop);
        }
        continue;
      }
      for (const etcd::Event& event : batch->events) {
        if (event.type == etcd::Event::Type::put) {
          (void)applyPut(records_, event.kv.key, event.kv.value);
        } else {
          applyDelete(records_, event.kv.key);
        }
        stats_.revision = std::max(stats_.revision, event.kv.modRevision);
      }
      co_await publish(client);
    }
  }

  Etcd& etcd_;
  std::function<void(const std::string&)> log_;
  RoutingRecords records_;  // as etcd has them at stats_.revision
  ChainTable table_;        // the last routing read or applied
  EtcdRoutingStats stats_;
  std::string lastError_;
  coio::AsyncScope tasks_;  // the watch loop
};

}  // namespace storage
