#pragma once
// ClusterClient: reads a dataset spread over many storage servers by a
// chain table (CHAINS.md), and keeps reading when servers fail, as 3FS's
// batchReadWithRetry does: a batch is split by chain, each IO goes to one
// serving replica of its chain, and what a replica fails is read from the
// next. The routing is live: updateRouting() applies a new one (a cluster
// manager's), and a server that answers staleRouting makes the client
// fetch a fresh one (ClusterOptions::refreshRouting).
//
// One file of about 850 lines, on purpose: its options, outcomes and
// figures are in cluster_options.hpp, and what is left is one class whose
// parts (rounds of a batch, the routing and its refreshes, hedges, probes
// of down servers) all read and write the same per-server state and the
// same routing snapshot; apart, each would take that state as arguments.
#include "client/cluster_options.hpp"
#include "cluster/chain_table.hpp"
#include "client/replica_router.hpp"
#include "client/storage_client.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace storage {

/// A client of a cluster of storage servers (a ChainTable, its routing):
/// one StorageClient (one connection) per server.
///
/// Guarantees:
/// - Used on its reactor's loop thread only; every awaitable resumes there.
/// - `co_await batchRead(ios)` yields one outcome per IO, in request order,
///   whatever happens to the servers (it never fails as a whole). It
///   splits the batch by chain: each IO reads one serving replica of its
///   chunk's chain (ReplicaRouter: the least loaded; an offline target is
///   never read), the IOs for one server go in one request (at most
///   maxIosPerRequest IOs), and the requests to different servers run
///   concurrently. A ReadOp's targetId and chainVersion are ignored: the
///   routing decides, and each IO carries its chain's version in it.
/// - Retries as 3FS's batchReadWithRetry: an IO whose replica fails it (the
///   connection fails, the request misses its deadline, or the status is
///   unavailable, timedOut, ioError, internalError, targetNotFound,
///   chunkNotFound, corrupt, or the bytes fail their checksum) is read from another
///   replica of its chain in the next round; it fails only when every
///   serving replica has failed it (or is on a server marked down whose
///   connection failed), with the last status; with retryFor, only once
///   that long has passed since the call: until then it goes round again
///   after a pause (reconnectMin, doubling up to reconnectMax; counted in
///   stats().retryPauses), every replica not known corrupt allowed again,
///   unless its chain has no such serving replica. Statuses that blame the
///   request (rangeOutsideChunk, bufferTooSmall, batchTooLarge) are
///   final; so is an IO that the table says cannot exist (a chunk id past
///   the dataset: chunkNotFound; a range past the chunk:
///   rangeOutsideChunk; a destination too small: bufferTooSmall), which is
///   not sent. An IO whose chain has no serving
///   target fails `unavailable` with ClusterErrc::noServingTarget, unsent.
/// - Live routing: `co_await updateRouting(table)` applies a new routing:
///   servers new in it are connected (within requestTimeout; one that does
///   not answer starts marked down), servers no longer in it get no new
///   request and their connections close once their requests in flight
///   are done. Each round of a batch routes with the routing current when
///   it starts and keeps it (a shared, immutable snapshot) until its
///   requests are done, so a routing applied meanwhile never pulls one
///   from under them; the next round uses the new one.
/// - Stale routing (PROTOCOL.md): an IO answered `staleRouting` (the
///   server knows a newer version of its chain) is not a failed replica:
///   after the round, the batch asks `refreshRouting` for a fresh routing
///   (once for all batches that saw the same one stale), applies it, and
///   sends the IO again on it; at most maxRoutingRefreshes per batch,
///   after which (or without refreshRouting, or if it fails or misses the
///   request deadline) the replica counts as failed and the next is tried.
///   Counted in stats().
/// - Reads never wait on a cluster manager beyond a refresh's deadline:
///   the client reads with the routing it has until given another, and
///   failover (down servers, retries, probes) works the same on any
///   routing.
/// - A request gets `requestTimeout` (coio::withTimeout over the whole
///   request): a hung server (SIGSTOP) costs a batch at most that, then is
///   marked down. A server marked down (its connection failed, a deadline
///   missed, or it answered `unavailable`: draining) gets no requests but
///   the last resort of IOs that no other replica can serve (while its
///   connection stands: slow, perhaps hung, not known dead); a
///   task in the client reconnects if needed and probes it (a one-byte read
///   of one of its serving targets, that must come back in time, not
///   `unavailable`) after reconnectMin, doubling up to reconnectMax, until
///   it answers; then it is used again. A down server with no serving
///   target in the routing is neither reconnected nor probed until the
///   routing has one of its targets serving: nothing is sent to a target
///   the routing has offline (stats().offlineIos counts what would be).
/// - Hedging (hedgeAfter > 0): a request unanswered after hedgeAfter is
///   also sent to other replicas (every IO must have one left, else no
///   hedge), into memory of the client's own; coio::collectAny races the
///   two, the first to deliver every IO intact wins (its bytes are copied
///   to the destinations if it was the hedge) and the other is cancelled
///   (awaited before batchRead goes on: nothing writes into a destination
///   after batchRead returns). A hedge that fails never wins; one whose
///   targets a routing applied meanwhile has offline is not sent. A server
///   whose requests lose to hedges three times in a row is treated as hung
///   (marked down). Over RDMA the hedge's memory is not registered, so it
///   never wins: hedging is for TCP.
/// - A corrupt replica (answered `corrupt`: the server found a block the
///   IO read failing its stored CRC, whole-chunk and partial reads alike;
///   or bytes that failed the response's checksum) is counted and logged
///   once per (target, chunk) and not read again for that chunk (other
///   replicas are, even in later batches); the IO is read from another.
/// - Transmission control per server connection: at most
///   maxTransmissionsPerServer requests granted at once on each.
/// - batchRead always suspends: one that could send nothing (every replica
///   down) yields to the loop once, so that a caller retrying in a loop
///   does not starve the client's probes (or anything else on the loop).
/// - A batchRead whose awaiting task is stopped (coio::currentStopToken)
///   cancels its requests and starts no new round: the IOs not delivered
///   fail (`unavailable`, error operation_canceled).
/// - Servers are numbered (serverStats(), ClusterOutcome::server) in the
///   order the client first met them: the first table's order, then each
///   new server of later routings; a number is never reused.
/// - `co_await close()` before destruction, once no batchRead or
///   updateRouting is pending.
template <coio::Reactor R>
class ClusterClient {
 public:
  using Client = StorageClient<R>;
  /// Makes the connector of one server (e.g. RDMA over a TCP bootstrap);
  /// empty: TCP.
  using ConnectorFactory = std::function<ChannelConnector<R>(const coio::SocketAddress&)>;

  /// Connects to every server of `table` at once (each within
  /// requestTimeout); servers that do not answer start marked down, and
  /// are probed as any other down server.
  static coio::Task<std::unique_ptr<ClusterClient>> connect(R& reactor, ChainTable table, ClusterOptions options = {},
                                                            ConnectorFactory connectorFor = {}) {
    auto client =
        std::unique_ptr<ClusterClient>(new ClusterClient(reactor, std::move(options), std::move(connectorFor)));
    co_await client->apply(std::move(table));
    co_return std::move(client);
  }

  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  /// The routing in use (valid until the next routing is applied).
  const ChainTable& table() const noexcept { return routing_->table; }
  /// The routing in use, and which server number each of its servers has.
  std::shared_ptr<const RoutedTable> routing() const noexcept { return routing_; }
  const ClusterStats& stats() const noexcept { return stats_; }
  /// How many servers the client has met (numbers 0 .. servers() - 1).
  std::size_t servers() const noexcept { return servers_.size(); }
  const ClusterServerStats& serverStats(std::size_t server) const { return servers_.at(server).stats; }
  const coio::SocketAddress& serverAddress(std::size_t server) const { return servers_.at(server).address; }
  /// Whether `server` is marked down right now.
  bool isDown(std::size_t server) const { return router_.isDown(server); }
  /// Whether `server` has a connection (a server no longer in the routing
  /// loses it once idle).
  bool isConnected(std::size_t server) const { return servers_.at(server).client != nullptr; }
  /// IOs sent to target `targetId` so far (requests and probes).
  std::uint64_t iosSentTo(std::uint32_t targetId) const {
    const auto found = targetIos_.find(targetId);
    return found == targetIos_.end() ? 0 : found->second;
  }

  /// Registers memory that IOs may land in with every server's connection,
  /// now and on every reconnection (RDMA needs it; TCP: nothing to do).
  coio::Result<void> registerMemory(std::span<std::byte> memory) {
    memory_.push_back(memory);
    for (Server& server : servers_) {
      if (!server.client) continue;
      coio::Result<void> registered = server.client->registerMemory(memory);
      if (!registered) return registered;
    }
    return {};
  }

  /// Applies `table` as the routing (see the class comment); resumes once
  /// its new servers are connected (or found down). A table equal to the
  /// one in use changes nothing.
  coio::Task<void> updateRouting(ChainTable table) {
    const coio::LockGuard<coio::Mutex> serialized = co_await routingLock_.scopedLock();
    co_await apply(std::move(table));
  }

  /// Reads every IO (see the class comment).
  coio::Task<std::vector<ClusterOutcome>> batchRead(std::span<const ReadOp> ios) {
    std::shared_ptr<const RoutedTable> routing = routing_;
    Batch batch(ios);
    std::vector<std::size_t> pending;
    for (std::size_t i = 0; i < ios.size(); ++i) {
      if (!admit(routing->table, ios[i], batch.outcomes[i])) continue;
      pending.push_back(i);
      // A copy known to be corrupt counts as a replica that failed the IO.
      batch.tried[i] = router_.corruptMask(routing->table, ios[i].chunkId);
      if (batch.tried[i] != 0) batch.outcomes[i] = {proto::IoStatus::corrupt, 0, 0, false, {}, SIZE_MAX, 0, {}};
    }
    const std::stop_token caller = co_await coio::currentStopToken();
    const auto started = reactor_.now();
    std::chrono::steady_clock::duration pause = options_.reconnectMin;
    bool sent = false;
    unsigned refreshes = 0;
    while (!pending.empty()) {
      if (caller.stop_requested()) {  // no more rounds: what is not delivered fails
        for (std::size_t io : pending) {
          batch.outcomes[io].status = proto::IoStatus::unavailable;
          batch.outcomes[io].error = std::make_error_code(std::errc::operation_canceled);
        }
        break;
      }
      if (routing != routing_) {  // a newer routing: this round uses it
        for (std::size_t io : pending) {
          batch.tried[io] = remapTried(routing->table, routing_->table, batch.chunkIds[io], batch.tried[io]);
        }
        routing = routing_;
      }
      ReplicaRouter::Routes routes =
          router_.route(*routing, batch.chunkIds, pending, batch.tried, options_.maxIosPerRequest);
      if (!routes.unroutable.empty()) lastResort(*routing, batch, routes);
      // IOs no replica is left to serve: within retryFor they go round
      // again after a pause; otherwise they fail.
      std::vector<std::size_t> again;
      const bool mayWait = reactor_.now() - started < options_.retryFor && !caller.stop_requested();
      for (std::size_t io : routes.unroutable) {
        if (mayWait && anotherTryMayServe(*routing, batch, io)) {
          again.push_back(io);
        } else {
          unroutable(*routing, batch, io);
        }
      }
      std::vector<coio::Task<void>> requests;
      for (SubBatch& sub : routes.batches) {
        for (std::size_t io : sub.ios) stats_.retries += batch.outcomes[io].attempts > 0;
        requests.push_back(serve(batch, routing, std::move(sub)));
      }
      if (requests.empty() && again.empty()) break;
      sent = sent || !requests.empty();
      co_await coio::collectAllRange(std::move(requests));
      pending = std::exchange(batch.retry, {});
      if (!again.empty()) co_await waitToRetry(*routing, batch, again, started, pause, caller, pending);
      if (!batch.stale.empty()) {
        bool fresh = false;  // not `a && co_await b`: g++ 12 miscompiles co_await in such expressions
        if (refreshes < options_.maxRoutingRefreshes) fresh = co_await refresh(routing);
        refreshes += fresh ? 1 : 0;
        for (const auto& [io, position] : batch.stale) {
          // Fresh routing: the IO is sent again on it, the same target allowed. Else the replica failed it.
          if (fresh) {
            ++stats_.staleRoutingRetries;
          } else {
            batch.tried[io] |= 1u << position;
          }
          pending.push_back(io);
        }
        batch.stale.clear();
      }
      std::sort(pending.begin(), pending.end());
    }
    for (const ClusterOutcome& o : batch.outcomes) stats_.failedIos += !o.ok();
    // Nothing sent (every replica down): still let the loop run the rest
    // (the probes among them) before the caller's next try.
    if (!sent) co_await reactor_.schedule();
    co_return std::move(batch.outcomes);
  }

  /// Stops probing and closes every connection. Once, with no batchRead or
  /// updateRouting pending.
  coio::Task<void> close() {
    probes_.requestStop();
    co_await probes_.join();
    for (Server& server : servers_) {
      if (std::shared_ptr<Client> client = std::move(server.client)) co_await client->close();
    }
  }

 private:
  struct Server {
    std::string name;
    coio::SocketAddress address;
    std::unique_ptr<TransmissionLimiter> limiter;
    std::shared_ptr<Client> client;  // none while down without a connection, or once retired
    std::error_code lastError;       // why it was last marked down
    unsigned lostHedges = 0;         // its requests cancelled by a winning hedge, in a row
    bool probing = false;
    bool retired = false;            // not in the routing (any more)
    ClusterServerStats stats;
  };

  // One batchRead's state, shared by its requests (all on the loop thread).
  struct Batch {
    explicit Batch(std::span<const ReadOp> o)
        : ops(o), chunkIds(o.size()), tried(o.size(), 0), outcomes(o.size()) {
      for (std::size_t i = 0; i < o.size(); ++i) chunkIds[i] = o[i].chunkId;
    }
    std::span<const ReadOp> ops;
    std::vector<std::uint64_t> chunkIds;
    std::vector<std::uint32_t> tried;  // per IO: replica positions asked (or known corrupt), in the round's routing
    std::vector<ClusterOutcome> outcomes;
    std::vector<std::size_t> retry;  // IOs for the next round
    std::vector<std::pair<std::size_t, std::uint32_t>> stale;  // IOs answered staleRouting, with their position
  };

  // A request's answer, or why it failed as a whole.
  using Answer = coio::Result<std::vector<ReadOutcome>>;

  static constexpr unsigned kLostHedgesForDown = 3;
  static constexpr std::uint32_t kProbeBytes = 1;

  ClusterClient(R& reactor, ClusterOptions options, ConnectorFactory connectorFor)
      : reactor_(reactor), options_(std::move(options)), connectorFor_(std::move(connectorFor)),
        probeMemory_(kProbeBytes) {
    options_.connection.verifyChecksums = true;
    memory_.push_back(probeMemory_);
  }

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  // Makes `table` the routing: numbers its servers (new ones get the next
  // numbers and are connected before it is used), retires the servers it
  // no longer names. The caller holds routingLock_ (or is connect()).
  coio::Task<void> apply(ChainTable table) {
    if (routing_ && routing_->table == table) co_return;
    RoutedTable next{std::move(table), {}};
    std::vector<std::size_t> joining;
    for (std::size_t i = 0; i < next.table.servers().size(); ++i) {
      const std::string& name = next.table.serverName(i);
      const coio::SocketAddress& address = next.table.servers()[i];
      auto found = std::find_if(servers_.begin(), servers_.end(),
                                [&](const Server& s) { return s.name == name && s.address == address; });
      if (found == servers_.end()) {
        servers_.push_back({name, address, std::make_unique<TransmissionLimiter>(options_.maxTransmissionsPerServer),
                            {}, {}, 0, false, true, {}});
        router_.addSlot();
        found = std::prev(servers_.end());
      }
      const auto slot = static_cast<std::size_t>(found - servers_.begin());
      next.slots.push_back(slot);
      if (found->retired) {
        found->retired = false;
        router_.setDown(slot, false);
        joining.push_back(slot);
      }
    }
    std::vector<coio::Task<void>> connects;
    for (std::size_t slot : joining) connects.push_back(connectFirst(slot));
    co_await coio::collectAllRange(std::move(connects));
    if (routing_) ++stats_.routingUpdates;
    routing_ = std::make_shared<const RoutedTable>(std::move(next));
    if (options_.routingApplied) options_.routingApplied(routing_->table);
    for (std::size_t slot = 0; slot < servers_.size(); ++slot) {
      if (servers_[slot].retired || std::find(routing_->slots.begin(), routing_->slots.end(), slot) !=
                                        routing_->slots.end()) {
        continue;
      }
      Server& gone = servers_[slot];
      gone.retired = true;
      log("coio-storage: server " + gone.address.toString() + " is no longer in the routing");
      co_await release(slot, std::move(gone.client));  // closed now if idle, else by its last request
    }
  }

  // After a round answered staleRouting with `used`: a fresh routing from
  // refreshRouting, applied; true if the batch should send its stale IOs
  // again. Batches that saw the same routing stale share one refresh.
  coio::Task<bool> refresh(const std::shared_ptr<const RoutedTable>& used) {
    if (!options_.refreshRouting) co_return false;
    const coio::LockGuard<coio::Mutex> serialized = co_await routingLock_.scopedLock();
    if (routing_ != used) co_return true;  // refreshed (or updated) meanwhile
    // Under the request deadline: a manager that does not answer costs a
    // batch that much, then the other replicas are read.
    coio::Result<ChainTable> fresh =
        co_await coio::withTimeout(reactor_, options_.refreshRouting(), options_.requestTimeout);
    if (!fresh) {
      log("coio-storage: a server has a newer routing, and fetching one failed (" + fresh.error().message() +
          "): reading other replicas");
      co_return false;
    }
    ++stats_.routingRefreshes;
    co_await apply(std::move(*fresh));
    co_return true;
  }

  // `tried` (positions in `from`'s chain of `chunkId`) as positions in
  // `to`'s: target ids are what stays.
  static std::uint32_t remapTried(const ChainTable& from, const ChainTable& to, std::uint64_t chunkId,
                                  std::uint32_t tried) {
    if (tried == 0) return 0;
    const Chain& before = from.chains()[from.chainIndexOf(chunkId)];
    const Chain& after = to.chains()[to.chainIndexOf(chunkId)];
    std::uint32_t out = 0;
    for (std::size_t p = 0; p < before.replicas.size(); ++p) {
      if ((tried >> p & 1u) == 0) continue;
      for (std::size_t q = 0; q < after.replicas.size(); ++q) {
        if (after.replicas[q].targetId == before.replicas[p].targetId) out |= 1u << q;
      }
    }
    return out;
  }

  // False (and the IO's final outcome set) for an IO the table says cannot be served.
  static bool admit(const ChainTable& table, const ReadOp& op, ClusterOutcome& outcome) {
    if (op.chunkId >= table.chunks()) {
      outcome.status = proto::IoStatus::chunkNotFound;
    } else if (std::uint64_t{op.offset} + op.length > table.chunkSize()) {
      outcome.status = proto::IoStatus::rangeOutsideChunk;
    } else if (op.into.size() < op.length) {
      outcome.status = proto::IoStatus::bufferTooSmall;
    } else {
      return true;
    }
    return false;
  }

  // IOs that only servers marked down could serve go to one still
  // connected (down for a missed deadline or lost hedges: slow, perhaps
  // hung, not known dead), rather than fail unsent; the rest stay unroutable.
  void lastResort(const RoutedTable& routing, const Batch& batch, ReplicaRouter::Routes& routes) const {
    std::vector<bool> connected(servers_.size());
    for (std::size_t s = 0; s < servers_.size(); ++s) {
      connected[s] = router_.isDown(s) && servers_[s].client && !servers_[s].client->failure();
    }
    ReplicaRouter::Routes more =
        router_.route(routing, batch.chunkIds, routes.unroutable, batch.tried, options_.maxIosPerRequest, connected);
    for (SubBatch& sub : more.batches) routes.batches.push_back(std::move(sub));
    routes.unroutable = std::move(more.unroutable);
  }

  // Whether asking `io`'s replicas again could serve it: its chain has a
  // serving replica not known corrupt, and no replica answered it with a
  // status that blames the request.
  bool anotherTryMayServe(const RoutedTable& routing, const Batch& batch, std::size_t io) const {
    if (batch.outcomes[io].attempts > 0 && !retryable(batch.outcomes[io].status)) return false;
    const std::uint64_t chunk = batch.chunkIds[io];
    const std::uint32_t corrupt = router_.corruptMask(routing.table, chunk);
    const std::vector<Replica>& replicas = routing.table.chains()[routing.table.chainIndexOf(chunk)].replicas;
    for (std::size_t r = 0; r < replicas.size(); ++r) {
      if (replicas[r].state == ReplicaState::serving && (corrupt & (1u << r)) == 0) return true;
    }
    return false;
  }

  // The pause before `again` (IOs every replica has failed, or whose
  // servers are down) goes round again: `pause`, doubled each time up to
  // reconnectMax, within what is left of retryFor (or until the caller's
  // stop). Then every replica not known corrupt may be asked again.
  coio::Task<void> waitToRetry(const RoutedTable& routing, Batch& batch, const std::vector<std::size_t>& again,
                               std::chrono::steady_clock::time_point started,
                               std::chrono::steady_clock::duration& pause, const std::stop_token& caller,
                               std::vector<std::size_t>& pending) {
    const auto left = options_.retryFor - (reactor_.now() - started);
    const bool slept = co_await reactor_.sleepFor(std::max(std::min(pause, left), decltype(left)::zero()), caller);
    (void)slept;  // stopped: the next round fails what is pending
    pause = std::min(pause * 2, options_.reconnectMax);
    ++stats_.retryPauses;
    for (std::size_t io : again) {
      batch.tried[io] = router_.corruptMask(routing.table, batch.chunkIds[io]);
      pending.push_back(io);
    }
  }

  // An IO with no replica left: it keeps its last outcome; never sent at
  // all, it fails with why (no serving target, or its servers' error).
  void unroutable(const RoutedTable& routing, Batch& batch, std::size_t io) {
    ClusterOutcome& outcome = batch.outcomes[io];
    if (outcome.attempts > 0 || outcome.status == proto::IoStatus::corrupt) return;
    const Chain& chain = routing.table.chains()[routing.table.chainIndexOf(batch.chunkIds[io])];
    outcome.status = proto::IoStatus::unavailable;
    const auto serving = std::find_if(chain.replicas.begin(), chain.replicas.end(),
                                      [](const Replica& r) { return r.state == ReplicaState::serving; });
    if (serving == chain.replicas.end()) {
      outcome.error = ClusterErrc::noServingTarget;
      return;
    }
    outcome.error = servers_[routing.slots[serving->server]].lastError;
    if (!outcome.error) outcome.error = std::make_error_code(std::errc::host_unreachable);
  }

  // `routing` (the round's) is held until the request is done.
  coio::Task<void> serve(Batch& batch, std::shared_ptr<const RoutedTable> routing, SubBatch sub) {
    std::vector<ReadOp> ops = opsOf(routing->table, batch, sub);
    std::optional<ReplicaRouter::Routes> alternatives;
    if (options_.hedgeAfter > std::chrono::steady_clock::duration::zero()) {
      alternatives = hedgeRoutes(*routing, batch, sub);
    }
    if (!alternatives) {
      record(batch, sub, co_await request(sub.server, ops));
      co_return;
    }
    std::vector<std::byte> scratch;
    auto first =
        co_await coio::collectAny(request(sub.server, ops), hedge(routing->table, batch, *alternatives, scratch));
    if (first.index() == 0) {
      record(batch, sub, std::get<0>(first));
      co_return;
    }
    if (std::get<1>(first).empty()) {  // both stopped by the caller's stop before the hedge was sent
      record(batch, sub, std::make_error_code(std::errc::operation_canceled));
      co_return;
    }
    // The hedge delivered every IO first: its bytes are the answer.
    ++stats_.hedgeWins;
    Server& slow = servers_[sub.server];
    if (++slow.lostHedges >= kLostHedgesForDown) markDown(sub.server, std::make_error_code(std::errc::timed_out));
    std::size_t at = 0;
    for (SubBatch& alt : alternatives->batches) {
      for (std::size_t k = 0; k < alt.ios.size(); ++k) {
        const ReadOp& op = batch.ops[alt.ios[k]];
        std::memcpy(op.into.data(), scratch.data() + at, op.length);
        at += op.length;
      }
      record(batch, alt, std::get<1>(first).at(&alt - alternatives->batches.data()));
    }
  }

  // Where a request's IOs could go instead: another replica each, none on
  // the request's server; nullopt if some IO has none.
  std::optional<ReplicaRouter::Routes> hedgeRoutes(const RoutedTable& routing, const Batch& batch,
                                                   const SubBatch& sub) const {
    std::vector<std::uint32_t> tried(batch.tried);
    for (std::size_t k = 0; k < sub.ios.size(); ++k) tried[sub.ios[k]] |= 1u << sub.positions[k];
    ReplicaRouter::Routes routes = router_.route(routing, batch.chunkIds, sub.ios, tried, options_.maxIosPerRequest);
    if (!routes.unroutable.empty()) return std::nullopt;
    return routes;
  }

  // The hedge: after hedgeAfter, the same IOs from other replicas, into
  // `scratch`. Finishes only with every IO delivered intact (then it wins
  // collectAny); otherwise it waits to be cancelled by the request.
  coio::Task<std::vector<Answer>> hedge(const ChainTable& table, const Batch& batch,
                                        const ReplicaRouter::Routes& routes, std::vector<std::byte>& scratch) {
    if (!co_await reactor_.sleepFor(options_.hedgeAfter, {})) co_return std::vector<Answer>{};  // answered in time
    std::size_t total = 0;
    for (const SubBatch& alt : routes.batches) {
      for (std::size_t io : alt.ios) total += batch.ops[io].length;
    }
    scratch.resize(total);
    std::vector<std::vector<ReadOp>> ops;
    std::size_t at = 0;
    bool offline = false;
    for (const SubBatch& alt : routes.batches) {
      ops.push_back(opsOf(table, batch, alt));
      for (ReadOp& op : ops.back()) {
        op.into = std::span(scratch).subspan(at, op.length);
        at += op.length;
        offline = offline || offlineNow(op);
      }
    }
    if (offline) {  // a routing applied since the round began has one of these targets offline: no hedge
      (void)co_await reactor_.sleepFor(std::chrono::hours(24));
      co_return std::vector<Answer>{};
    }
    ++stats_.hedges;
    std::vector<coio::Task<Answer>> requests;
    for (std::size_t r = 0; r < routes.batches.size(); ++r) {
      requests.push_back(request(routes.batches[r].server, ops[r]));
    }
    std::vector<Answer> answers = co_await coio::collectAllRange(std::move(requests));
    const bool intact = std::all_of(answers.begin(), answers.end(), [](const Answer& a) {
      return a && std::all_of(a->begin(), a->end(), [](const ReadOutcome& o) {
               return o.status == proto::IoStatus::ok && !o.checksumMismatch;
             });
    });
    // Not intact: the request answers (it has its own deadline). A day is "until cancelled".
    if (!intact) (void)co_await reactor_.sleepFor(std::chrono::hours(24));
    co_return answers;
  }

  // The sub-batch's IOs, each naming its replica's target and chain version.
  static std::vector<ReadOp> opsOf(const ChainTable& table, const Batch& batch, const SubBatch& sub) {
    std::vector<ReadOp> ops;
    ops.reserve(sub.ios.size());
    for (std::size_t k = 0; k < sub.ios.size(); ++k) {
      ReadOp op = batch.ops[sub.ios[k]];
      op.targetId = sub.targets[k];
      op.chainVersion = table.chains()[table.chainIndexOf(op.chunkId)].version;
      ops.push_back(op);
    }
    return ops;
  }

  // One request to one server under its deadline; marks the server down
  // when it fails as a whole or answers `unavailable`.
  coio::Task<Answer> request(std::size_t s, std::span<const ReadOp> ops) {
    Server& server = servers_[s];
    std::shared_ptr<Client> client = server.client;
    if (!client) co_return server.lastError ? server.lastError : make_error_code(coio::Errc::closed);
    router_.addLoad(s, ops.size());
    ++server.stats.requests;
    countSent(ops);
    Answer answer = co_await coio::withTimeout(reactor_, client->batchRead(ops), options_.requestTimeout);
    router_.removeLoad(s, ops.size());
    co_await release(s, std::move(client));
    if (!answer) {
      // Cancelled: a hedge won (serve() counts it), or close().
      if (answer.error() == std::errc::operation_canceled) co_return answer;
      ++server.stats.failedRequests;
      server.stats.timeouts += answer.error() == std::errc::timed_out;
      if (answer.error() != coio::Errc::invalidArgument) markDown(s, answer.error());
      co_return answer;
    }
    server.lostHedges = 0;
    for (std::size_t k = 0; k < answer->size(); ++k) {
      const ReadOutcome& o = (*answer)[k];
      if (o.status == proto::IoStatus::ok && !o.checksumMismatch) {
        ++server.stats.ios;
        server.stats.bytes += o.bytes;
      }
      server.stats.staleIos += o.status == proto::IoStatus::staleRouting;
    }
    const bool draining = std::any_of(answer->begin(), answer->end(),
                                      [](const ReadOutcome& o) { return o.status == proto::IoStatus::unavailable; });
    if (draining) markDown(s, std::make_error_code(std::errc::connection_aborted));
    co_return answer;
  }

  // Whether the routing in use has `op`'s target offline.
  bool offlineNow(const ReadOp& op) const {
    const ChainTable& table = routing_->table;
    const std::vector<Replica>& replicas = table.chains()[table.chainIndexOf(op.chunkId)].replicas;
    return std::any_of(replicas.begin(), replicas.end(), [&](const Replica& r) {
      return r.targetId == op.targetId && r.state == ReplicaState::offline;
    });
  }

  // Counts IOs about to be sent: iosSentTo(), and stats().offlineIos.
  void countSent(std::span<const ReadOp> ops) {
    for (const ReadOp& op : ops) {
      ++targetIos_[op.targetId];
      stats_.offlineIos += offlineNow(op);
    }
  }

  static bool retryable(proto::IoStatus status) noexcept {
    switch (status) {
      case proto::IoStatus::rangeOutsideChunk:
      case proto::IoStatus::bufferTooSmall:
      case proto::IoStatus::batchTooLarge: return false;
      default: return true;
    }
  }

  // Records a request's answer for its IOs; those to read elsewhere go to
  // the next round, those answered staleRouting wait for batchRead's
  // refresh (their replica not yet counted as tried).
  void record(Batch& batch, const SubBatch& sub, const Answer& answer) {
    for (std::size_t k = 0; k < sub.ios.size(); ++k) {
      const std::size_t io = sub.ios[k];
      ClusterOutcome& outcome = batch.outcomes[io];
      const std::uint32_t attempts = outcome.attempts + 1;
      if (answer && (*answer)[k].status == proto::IoStatus::staleRouting) {
        outcome = {proto::IoStatus::staleRouting, 0, 0, false, {}, sub.server, attempts, sub.targets[k]};
        batch.stale.emplace_back(io, sub.positions[k]);
        continue;
      }
      batch.tried[io] |= 1u << sub.positions[k];
      if (!answer) {
        const bool late = answer.error() == std::errc::timed_out;
        outcome = {late ? proto::IoStatus::timedOut : proto::IoStatus::unavailable, 0, 0, false, answer.error(),
                   sub.server, attempts, sub.targets[k]};
        if (answer.error() != coio::Errc::invalidArgument) batch.retry.push_back(io);
        continue;
      }
      const ReadOutcome& got = (*answer)[k];
      outcome = {got.status, got.bytes, got.checksum, got.checksumMismatch, {}, sub.server, attempts, sub.targets[k]};
      if (got.status == proto::IoStatus::corrupt || (got.status == proto::IoStatus::ok && got.checksumMismatch)) {
        reportCorrupt(sub, k, batch.chunkIds[io], got.status == proto::IoStatus::corrupt);
      }
      if (!outcome.ok() && retryable(got.status)) batch.retry.push_back(io);
    }
  }

  // `onDisk`: the server found the copy corrupt (status corrupt), else its
  // bytes failed the response's checksum here (damage on the way, or at
  // rest in a block the server spliced without reading: PROTOCOL.md,
  // "Checksums").
  void reportCorrupt(const SubBatch& sub, std::size_t k, std::uint64_t chunkId, bool onDisk) {
    if (!router_.markCorrupt(sub.targets[k], chunkId)) return;
    ++stats_.corruptReplicas;
    log("coio-storage: chunk " + std::to_string(chunkId) + " of target " + std::to_string(sub.targets[k]) + " on " +
        servers_.at(sub.server).address.toString() +
        (onDisk ? " is corrupt (a block failed the server's check against its stored CRC)"
                : " failed the response's checksum") +
        ": a corrupt replica, not read again; reading another replica");
  }

  // Stops using `s` and starts probing it (once; not a retired server).
  void markDown(std::size_t s, std::error_code why) {
    Server& server = servers_[s];
    server.lastError = why;
    if (router_.isDown(s) || server.retired) return;
    router_.setDown(s, true);
    ++server.stats.downs;
    ++stats_.failovers;
    log("coio-storage: server " + server.address.toString() + " down (" + why.message() +
        "): its replicas' reads go to the others");
    if (!server.probing) {
      server.probing = true;
      probes_.spawn(probe(s));
    }
  }

  // Until `s` answers: reconnects if its connection failed, then reads one
  // byte of its first target, with backoff between tries. After a probe
  // that failed, the next one reconnects: a connection whose request timed
  // out may still be clogged with what a slow path queued on it (TCP keeps
  // it in order: a new request waits behind the old bytes), so the server
  // would look down for as long as they take to drain, although a fresh
  // connection gets through (found by the simulation's seeds).
  coio::Task<void> probe(std::size_t s) {
    Server& server = servers_[s];
    std::chrono::steady_clock::duration backoff = options_.reconnectMin;
    bool reconnect = false;
    for (;;) {
      if (!co_await reactor_.sleepFor(backoff, {})) break;  // close()
      if (server.retired) break;  // no longer in the routing: nothing to probe
      if (!probeOf(s)) {  // nothing of it serves: sends nothing until the routing says it does
        backoff = options_.reconnectMin;
        continue;
      }
      backoff = std::min(backoff * 2, options_.reconnectMax);
      if (!server.client || server.client->failure() || reconnect) {
        coio::Result<std::shared_ptr<Client>> fresh =
            co_await coio::withTimeout(reactor_, open(s), options_.requestTimeout);
        if (!fresh) {
          server.lastError = fresh.error();
          continue;
        }
        if (server.retired) {  // left the routing while connecting
          co_await (*fresh)->close();
          break;
        }
        std::shared_ptr<Client> old = std::exchange(server.client, std::move(*fresh));
        co_await release(s, std::move(old));
      }
      const bool back = co_await answers(s);  // bound first: g++ 12 and `if (co_await ...)`
      reconnect = !back;
      if (back) {
        router_.setDown(s, false);
        server.lostHedges = 0;
        ++server.stats.ups;
        log("coio-storage: server " + server.address.toString() + " is back");
        break;
      }
    }
    server.probing = false;
  }

  // The probe of `s` in the routing in use: a one-byte read of the first
  // chunk of one of its serving targets; none if it has none.
  std::optional<ReadOp> probeOf(std::size_t s) {
    const RoutedTable& routing = *routing_;
    for (std::size_t c = 0; c < routing.table.chains().size(); ++c) {
      const Chain& chain = routing.table.chains()[c];
      for (const Replica& r : chain.replicas) {
        if (routing.slots[r.server] == s && r.state == ReplicaState::serving) {
          return ReadOp{c, 0, kProbeBytes, probeMemory_, r.targetId, chain.version};
        }
      }
    }
    return std::nullopt;
  }

  // The probe of `s` (probeOf) answered in time and not `unavailable`
  // (draining); false if it has none now (the routing changed).
  coio::Task<bool> answers(std::size_t s) {
    const std::optional<ReadOp> probe = probeOf(s);
    if (!probe) co_return false;
    countSent(std::span(&*probe, 1));
    std::shared_ptr<Client> client = servers_[s].client;
    Answer answer =
        co_await coio::withTimeout(reactor_, client->batchRead(std::span(&*probe, 1)), options_.requestTimeout);
    co_await release(s, std::move(client));
    co_return answer && answer->front().status != proto::IoStatus::unavailable;
  }

  coio::Task<void> connectFirst(std::size_t s) {
    coio::Result<std::shared_ptr<Client>> client =
        co_await coio::withTimeout(reactor_, open(s), options_.requestTimeout);
    if (client) {
      servers_[s].client = std::move(*client);
    } else {
      markDown(s, client.error());
    }
  }

  // A new connection to `s`, every registered memory registered with it.
  // Run under withTimeout: a connection made as the deadline passed is
  // closed here (withTimeout would destroy it unclosed), and nothing
  // suspends after that check.
  coio::Task<coio::Result<std::shared_ptr<Client>>> open(std::size_t s) {
    Server& server = servers_[s];
    // Not `c ? co_await a : co_await b`: g++ 12 then destroys the result twice.
    coio::Result<std::unique_ptr<Client>> client = coio::Errc::closed;
    if (connectorFor_) {
      client = co_await Client::connect(connectorFor_(server.address), *server.limiter, options_.connection);
    } else {
      client = co_await Client::connect(reactor_, server.address, *server.limiter, options_.connection);
    }
    if (!client) co_return client.error();
    const std::stop_token deadline = co_await coio::currentStopToken();
    if (deadline.stop_requested()) {
      co_await (*client)->close();
      co_return std::make_error_code(std::errc::operation_canceled);
    }
    for (std::span<std::byte> memory : memory_) {
      coio::Result<void> registered = (*client)->registerMemory(memory);
      if (!registered) {
        co_await (*client)->close();
        co_return registered.error();
      }
    }
    co_return std::shared_ptr<Client>(std::move(*client));
  }

  // Closes a replaced connection once its last user is done with it.
  coio::Task<void> release(std::size_t s, std::shared_ptr<Client> client) {
    if (client && client != servers_[s].client && client.use_count() == 1) co_await client->close();
  }

  R& reactor_;
  ClusterOptions options_;
  ConnectorFactory connectorFor_;
  std::shared_ptr<const RoutedTable> routing_;  // the routing new rounds use
  coio::Mutex routingLock_;  // one routing change at a time (updateRouting, refresh)
  ReplicaRouter router_;
  std::deque<Server> servers_;  // by server number; a deque: probes hold references across growth
  // The probes' landing byte, shared: its content is never read.
  std::vector<std::byte> probeMemory_;
  std::vector<std::span<std::byte>> memory_;  // registered with every connection
  std::unordered_map<std::uint32_t, std::uint64_t> targetIos_;  // IOs sent, by target
  ClusterStats stats_;
  coio::AsyncScope probes_;  // one probe task per server marked down
};

}  // namespace storage
