#pragma once
// The storage cluster's state in etcd (CHAINS.md, "Routing in a cluster
// manager"): servers register under a lease (registerServer), follow their
// chains' versions (followRouting), and a cluster manager, one leader among
// any number of `mgmtd`s, turns the registrations into the chains' states
// (ClusterManager). `cluster load` and `cluster status` read and write the
// records (loadRouting, readRouting).
#include "cluster/chain_table.hpp"
#include "etcd/etcd_client.hpp"
#include "cluster/routing_json.hpp"

#include <coio/core/cancellation.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace storage {

/// The prefix of every routing key.
inline std::string routingPrefix() { return "/coio/"; }
/// The prefix of the chain keys.
inline std::string chainPrefix() { return "/coio/chains/"; }
/// The prefix of the servers' registrations.
inline std::string livePrefix() { return "/coio/live/"; }
/// Server `name`'s registration: its ServerRecord, bound to its lease, so
/// that it is gone when the server is (killed: at the lease's expiry;
/// stopped: at once, it revokes the lease first).
inline std::string liveKey(std::string_view name) { return livePrefix() + std::string(name); }
/// The cluster manager's leader key: its id, bound to its lease.
inline std::string leaderKey() { return "/coio/leader"; }

/// Everything under /coio/ at one revision: the routing's records, each
/// chain key's mod revision (what a change compares), the registered
/// servers' names and the leader key's lease (0: no leader).
struct StoredRouting {
  RoutingRecords records;
  std::vector<std::int64_t> chainRevisions;  ///< parallel to records.chains
  std::set<std::string> live;
  std::int64_t leaderLease = 0;
  std::int64_t revision = 0;  ///< the read's
};

/// How long one etcd call may take here: the registration, the manager and
/// the tools all give up on a call after this and retry or report.
inline constexpr std::chrono::seconds kEtcdCallTimeout{2};

/// Reads every routing key (one range, so one revision). Errors: the
/// client's; Errc::invalidArgument for a record that does not parse (`why`
/// naming its key) or no dataset record (nothing loaded).
template <coio::Reactor R>
coio::Task<coio::Result<StoredRouting>> readRouting(etcd::EtcdClient<R>& client, std::string* why = nullptr) {
  coio::Result<etcd::RangeResponse> all = co_await client.range(etcd::RangeRequest::prefix(routingPrefix()), kEtcdCallTimeout);
  if (!all) {
    if (why != nullptr) *why = "cannot read the routing from etcd: " + client.lastError();
    co_return all.error();
  }
  StoredRouting stored;
  stored.revision = all->header.revision;
  bool dataset = false;
  std::string problem;
  for (const etcd::KeyValue& kv : all->kvs) {
    const std::string_view key = kv.key;
    if (key == datasetKey()) {
      coio::Result<DatasetRecord> record = parseDatasetRecord(kv.value, &problem);
      if (record) stored.records.dataset = std::move(*record);
      dataset = true;
    } else if (key.starts_with(chainPrefix())) {
      coio::Result<ChainRecord> record = parseChainRecord(kv.value, &problem);
      if (record) {
        stored.records.chains.push_back(std::move(*record));
        stored.chainRevisions.push_back(kv.modRevision);
      }
    } else if (key.starts_with(serverKey(""))) {
      coio::Result<ServerRecord> record = parseServerRecord(kv.value, &problem);
      if (record) stored.records.servers.push_back(std::move(*record));
    } else if (key.starts_with(livePrefix())) {
      stored.live.insert(std::string(key.substr(livePrefix().size())));
    } else if (key == leaderKey()) {
      stored.leaderLease = kv.lease;
    }
    if (!problem.empty()) {
      if (why != nullptr) *why = kv.key + ": " + problem;
      co_return coio::Errc::invalidArgument;
    }
  }
  if (!dataset) {
    if (why != nullptr) *why = "etcd holds no routing (" + datasetKey() + " is missing): run `cluster load FILE` first";
    co_return coio::Errc::invalidArgument;
  }
  co_return stored;
}

/// Writes `table`'s records (dataset, servers, chains) in one transaction
/// that first checks that no chain key exists, unless `force` (then they
/// are overwritten, and the chains and servers not in the table deleted). Returns the
/// transaction's revision. Errors: the client's; std::errc::file_exists
/// when chains exist and not `force`.
template <coio::Reactor R>
coio::Task<coio::Result<std::int64_t>> loadRouting(etcd::EtcdClient<R>& client, const ChainTable& table, bool force) {
  const RoutingRecords records = table.records();
  std::vector<etcd::TxnOp> writes;
  if (force) {
    // etcd refuses a put and a delete of one key in a transaction: delete only the records the table drops.
    std::set<std::string> kept;
    for (const ServerRecord& server : records.servers) kept.insert(serverKey(server.name));
    for (const ChainRecord& chain : records.chains) kept.insert(chainKey(chain.id));
    const std::string prefixes[] = {chainPrefix(), serverKey("")};  // named: no temporary lives across a co_await
    for (const std::string& prefix : prefixes) {
      etcd::RangeRequest keys = etcd::RangeRequest::prefix(prefix);
      keys.keysOnly = true;
      coio::Result<etcd::RangeResponse> old = co_await client.range(std::move(keys), kEtcdCallTimeout);
      if (!old) co_return old.error();
      for (const etcd::KeyValue& kv : old->kvs) {
        if (!kept.contains(kv.key)) writes.emplace_back(etcd::DeleteRequest(kv.key));
      }
    }
  }
  writes.emplace_back(etcd::PutRequest(datasetKey(), toJson(records.dataset)));
  for (const ServerRecord& server : records.servers) writes.emplace_back(etcd::PutRequest(serverKey(server.name), toJson(server)));
  for (const ChainRecord& chain : records.chains) writes.emplace_back(etcd::PutRequest(chainKey(chain.id), toJson(chain)));
  std::vector<etcd::Compare> noChains;
  if (!force) {
    etcd::Compare none = etcd::Compare::createRevision(chainPrefix(), etcd::Compare::Op::equal, 0);
    none.rangeEnd = etcd::prefixEnd(chainPrefix());
    noChains.push_back(std::move(none));
  }
  coio::Result<etcd::TxnResponse> done =
      co_await client.txn(etcd::TxnRequest(std::move(noChains), std::move(writes)), kEtcdCallTimeout);
  if (!done) co_return done.error();
  if (!done->succeeded) co_return std::make_error_code(std::errc::file_exists);
  co_return done->header.revision;
}

namespace detail {

// Sleeps `d` unless `stop` comes first; false once stopped.
template <coio::Reactor R>
coio::Task<bool> pause(R& reactor, etcd::Clock::duration d, std::stop_token stop) {
  co_return co_await reactor.sleepFor(d, std::move(stop)) && !stop.stop_requested();
}

// keepLeaseAlive under the awaiting coroutine's token (a collectAny child's).
template <coio::Reactor R>
coio::Task<coio::Result<void>> heartbeat(etcd::EtcdClient<R>& client, std::int64_t lease, etcd::Clock::duration ttl) {
  std::stop_token stop = co_await coio::currentStopToken();
  co_return co_await etcd::keepLeaseAlive(client, lease, ttl, std::move(stop));
}

}  // namespace detail

/// A server's registration: `record` under liveKey(record.name), bound to
/// a lease of `ttlSeconds` kept alive until `stop`; registered again when
/// the lease is lost (it expired while etcd was unreachable), and retried
/// every second while etcd cannot be reached. `*lease` is the lease in use
/// (0: none), for the caller to revoke on the way out. Never fails; loop
/// thread of the client's reactor.
template <coio::Reactor R>
coio::Task<void> registerServer(etcd::EtcdClient<R>& client, ServerRecord record, std::int64_t ttlSeconds,
                                std::int64_t* lease, std::function<void(const std::string&)> log, std::stop_token stop) {
  const etcd::Clock::duration ttl = std::chrono::seconds(ttlSeconds);
  while (!stop.stop_requested()) {
    coio::Result<etcd::Lease> granted = co_await coio::withStopToken(stop, client.leaseGrant(ttlSeconds, kEtcdCallTimeout));
    coio::Result<etcd::PutResponse> put = coio::Errc::closed;
    if (granted) {
      *lease = granted->id;
      put = co_await coio::withStopToken(stop, client.put({liveKey(record.name), toJson(record), granted->id}, kEtcdCallTimeout));
    }
    if (!put) {
      if (!stop.stop_requested()) log("cannot register in etcd (retrying): " + client.lastError());
      if (!co_await detail::pause(client.reactor(), std::chrono::seconds(1), stop)) break;
      continue;
    }
    log("registered as " + liveKey(record.name) + " (lease " + std::to_string(*lease) + ")");
    const coio::Result<void> kept = co_await etcd::keepLeaseAlive(client, *lease, ttl, stop);
    if (!kept) log("the lease was lost: registering again");
  }
}

/// Follows the chains in etcd: reads the routing, hands it to `apply`,
/// then applies every change of a chain key as it comes (a watch from the
/// read's revision, so none is missed); reads afresh when the watch or a
/// record fails. While etcd cannot be reached `apply` is simply not called:
/// what was applied stays. Returns once `stop` is requested; loop thread.
template <coio::Reactor R>
coio::Task<void> followRouting(etcd::EtcdClient<R>& client, std::function<void(const ChainTable&)> apply,
                               std::function<void(const std::string&)> log, std::stop_token stop) {
  while (!stop.stop_requested()) {
    std::string why;
    coio::Result<StoredRouting> stored = co_await coio::withStopToken(stop, readRouting(client, &why));
    coio::Result<ChainTable> table = stored ? ChainTable::assemble(stored->records, &why) : coio::Result<ChainTable>(stored.error());
    coio::Result<std::unique_ptr<etcd::EtcdWatch<R>>> watch = coio::Errc::closed;
    if (table) {
      apply(*table);
      watch = co_await coio::withStopToken(
          stop, client.watch(etcd::WatchRequest::prefix(chainPrefix(), stored->revision + 1), kEtcdCallTimeout));
    }
    while (watch && table && !stop.stop_requested()) {
      coio::Result<etcd::WatchBatch> batch = co_await coio::withStopToken(stop, (*watch)->next(std::chrono::seconds(1)));
      if (!batch && batch.error() == std::errc::timed_out) continue;
      if (!batch) break;
      for (const etcd::Event& event : batch->events) {
        coio::Result<ChainRecord> chain = event.type == etcd::Event::Type::put ? parseChainRecord(event.kv.value, &why)
                                                                               : coio::Result<ChainRecord>(coio::Errc::invalidArgument);
        if (chain) table = table->withChain(*chain, &why);
        if (!chain || !table) {
          if (why.empty()) why = event.kv.key + " was deleted";
          break;
        }
      }
      if (!table) break;
      apply(*table);
    }
    if (stop.stop_requested()) break;
    log("following the routing in etcd: " + (why.empty() ? client.lastError() : why) + "; reading it again");
    if (!co_await detail::pause(client.reactor(), std::chrono::seconds(1), stop)) break;
  }
}

/// A cluster manager (3FS's mgmtd): campaigns for leaderKey() with a lease
/// of `ttlSeconds`; the leader makes every chain reflect the registrations
/// (a serving target whose server has no live key goes offline, to the end
/// of its chain; an offline one whose server is registered serves again:
/// markTargetOffline/markTargetServing), on taking over and on every change
/// of /coio/live/. For a grace after it takes over (one TTL unless given) it
/// marks nothing offline: a registration missing then may be one a server
/// is renewing after etcd lost its leader or a member (a server that is
/// really gone lost its lease a TTL ago or will within one, and goes
/// offline at the grace's end). Each change is one transaction that compares the chain
/// key's mod revision it read and that the leader key is still bound to
/// its own lease: two managers never lose each other's updates, and a
/// deposed leader writes nothing. A failed compare makes it read again.
/// Runs on the client's loop thread until run()'s token stops.
template <coio::Reactor R>
class ClusterManager {
 public:
  using Log = std::function<void(const std::string&)>;

  ClusterManager(etcd::EtcdClient<R>& client, std::string id, std::int64_t ttlSeconds, Log log,
                 std::optional<etcd::Clock::duration> grace = std::nullopt)
      : client_(client),
        id_(std::move(id)),
        ttlSeconds_(ttlSeconds),
        grace_(grace.value_or(std::chrono::seconds(ttlSeconds))),
        log_(std::move(log)) {}

  /// Campaigns, leads, campaigns again after losing its lease; retries
  /// every second while etcd cannot be reached. Returns once `stop` is.
  coio::Task<void> run(std::stop_token stop) {
    while (!stop.stop_requested()) {
      coio::Result<etcd::Lease> lease = co_await coio::withStopToken(stop, client_.leaseGrant(ttlSeconds_, kEtcdCallTimeout));
      if (lease) {
        lease_ = lease->id;
        co_await coio::withStopToken(
            stop, coio::collectAny(detail::heartbeat(client_, lease_, std::chrono::seconds(ttlSeconds_)), campaign()));
        leading_ = false;
        // A follower's too: no leader key of its is left behind to wait for.
        const coio::Result<etcd::ResponseHeader> revoked = co_await client_.leaseRevoke(lease_, kEtcdCallTimeout);
        if (!revoked) log_(id_ + ": cannot revoke its lease (it expires on its own): " + client_.lastError());
        if (stop.stop_requested()) break;
        log_(id_ + ": lost the lease or the leadership; campaigning again");
      } else {
        log_(id_ + ": cannot reach etcd: " + client_.lastError());
      }
      if (!co_await detail::pause(client_.reactor(), std::chrono::seconds(1), stop)) break;
    }
  }

  /// Whether it leads now.
  bool leading() const noexcept { return leading_; }
  /// When it last began to lead (its reactor's clock): the grace for a
  /// missing registration counts from there.
  etcd::Clock::time_point leadingSince() const noexcept { return leadingSince_; }
  /// Chain changes it committed.
  std::uint64_t changes() const noexcept { return changes_; }

 private:
  // Takes the leader key if free, else waits for it to go; then leads.
  // Returns on an etcd failure or once deposed.
  coio::Task<coio::Result<void>> campaign() {
    for (;;) {
      std::vector<etcd::Compare> free{etcd::Compare::createRevision(leaderKey(), etcd::Compare::Op::equal, 0)};
      std::vector<etcd::TxnOp> take{etcd::PutRequest(leaderKey(), id_, lease_)};
      std::vector<etcd::TxnOp> look{etcd::RangeRequest(leaderKey())};
      coio::Result<etcd::TxnResponse> tried =
          co_await client_.txn(etcd::TxnRequest(std::move(free), std::move(take), std::move(look)), kEtcdCallTimeout);
      if (!tried) co_return tried.error();
      if (tried->succeeded) {
        leading_ = true;
        leadingSince_ = client_.reactor().now();
        log_(id_ + ": leading");
        co_return co_await lead();
      }
      coio::Result<void> gone = co_await leaderGone(tried->header.revision);
      if (!gone) co_return gone.error();
    }
  }

  // Waits for the leader key's deletion after `revision`.
  coio::Task<coio::Result<void>> leaderGone(std::int64_t revision) {
    coio::Result<std::unique_ptr<etcd::EtcdWatch<R>>> watch =
        co_await client_.watch(etcd::WatchRequest(leaderKey(), {}, revision + 1), kEtcdCallTimeout);
    if (!watch) co_return watch.error();
    for (;;) {
      coio::Result<etcd::WatchBatch> batch = co_await (*watch)->next(std::chrono::seconds(1));
      if (!batch && batch.error() == std::errc::timed_out) continue;
      if (!batch) co_return batch.error();
      for (const etcd::Event& event : batch->events) {
        if (event.type == etcd::Event::Type::del) co_return coio::Result<void>{};
      }
    }
  }

  // Reconciles, then again on every change of a registration (and every
  // ttl, whatever happens); returns once deposed or on an etcd failure.
  coio::Task<coio::Result<void>> lead() {
    for (;;) {
      std::string why;
      coio::Result<StoredRouting> stored = co_await readRouting(client_, &why);
      if (!stored && stored.error() != coio::Errc::invalidArgument) co_return stored.error();
      if (stored && stored->leaderLease != lease_) co_return coio::Errc::closed;  // deposed
      if (!stored) log_(id_ + ": " + why);
      const std::int64_t from = stored ? stored->revision + 1 : 0;  // 0: from now (nothing read to follow on from)
      bool deferred = false;  // a target left serving during the grace
      if (stored) {
        coio::Result<bool> settled = co_await reconcile(*stored, deferred);
        if (!settled) co_return settled.error();
        if (!*settled) continue;  // a compare failed: read again
      }
      coio::Result<std::unique_ptr<etcd::EtcdWatch<R>>> watch =
          co_await client_.watch(etcd::WatchRequest::prefix(livePrefix(), from), kEtcdCallTimeout);
      if (!watch) co_return watch.error();
      etcd::Clock::duration wait = std::chrono::seconds(ttlSeconds_);
      if (deferred) {
        const etcd::Clock::duration graceLeft = graceEnd() - client_.reactor().now();
        wait = std::clamp<etcd::Clock::duration>(graceLeft, std::chrono::milliseconds(1), wait);
      }
      coio::Result<etcd::WatchBatch> batch = co_await (*watch)->next(wait);
      if (!batch && batch.error() != std::errc::timed_out) co_return batch.error();
    }
  }

  // The end of the grace after taking over (see the class comment).
  etcd::Clock::time_point graceEnd() const noexcept { return leadingSince_ + grace_; }

  // Commits each needed change, one transaction per target; false when a
  // compare failed (the chain moved, or this manager no longer leads).
  // `deferred`: a target whose server is not registered was left serving
  // because the grace has not ended.
  coio::Task<coio::Result<bool>> reconcile(const StoredRouting& stored, bool& deferred) {
    const bool grace = client_.reactor().now() < graceEnd();
    for (std::size_t c = 0; c < stored.records.chains.size(); ++c) {
      ChainRecord chain = stored.records.chains[c];
      std::int64_t revision = stored.chainRevisions[c];
      for (const TargetRecord& target : stored.records.chains[c].targets) {
        const bool live = stored.live.contains(target.server);
        if (!live && grace && target.state == ReplicaState::serving) {
          deferred = true;
          continue;
        }
        ChainRecord next = live ? markTargetServing(chain, target.id) : markTargetOffline(chain, target.id);
        if (next.version == chain.version) continue;
        std::vector<etcd::Compare> unchanged{etcd::Compare::modRevision(chainKey(chain.id), etcd::Compare::Op::equal, revision),
                                             etcd::Compare::lease(leaderKey(), etcd::Compare::Op::equal, lease_)};
        std::vector<etcd::TxnOp> write{etcd::PutRequest(chainKey(chain.id), toJson(next))};
        coio::Result<etcd::TxnResponse> done =
            co_await client_.txn(etcd::TxnRequest(std::move(unchanged), std::move(write)), kEtcdCallTimeout);
        if (!done) co_return done.error();
        if (!done->succeeded) co_return false;
        ++changes_;
        log_(id_ + ": chain " + std::to_string(chain.id) + " version " + std::to_string(next.version) + ": target " +
             std::to_string(target.id) + " " + (live ? "serving" : "offline"));
        chain = std::move(next);
        revision = done->header.revision;
      }
    }
    co_return true;
  }

  etcd::EtcdClient<R>& client_;
  std::string id_;
  std::int64_t ttlSeconds_;
  etcd::Clock::duration grace_;
  Log log_;
  std::int64_t lease_ = 0;
  bool leading_ = false;
  etcd::Clock::time_point leadingSince_{};
  std::uint64_t changes_ = 0;
};

}  // namespace storage
