#pragma once
// ClusterClient: reads a dataset spread over many storage servers by a
// chain table (CHAINS.md), and keeps reading when servers fail, as 3FS's
// batchReadWithRetry does: a batch is split by chain, each IO goes to one
// replica of its chain, and what a replica fails is read from the next.
#include "chain_table.hpp"
#include "replica_router.hpp"
#include "storage_client.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/collect_any.hpp>
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
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace storage {

struct ClusterOptions {
  /// Each server connection's options. verifyChecksums is always on: a
  /// corrupted replica is noticed by its checksum only.
  ClientOptions connection{};
  /// Deadline of one request to one server (coio::withTimeout): a server
  /// that does not answer in time (hung, stopped) is marked down and the
  /// request's IOs go to other replicas.
  std::chrono::steady_clock::duration requestTimeout = std::chrono::seconds(2);
  /// Hedged reads: a request still unanswered after this long is sent to
  /// other replicas too, and the first to deliver every IO wins (the other
  /// is cancelled). Zero: off. See ClusterClient for what it costs.
  std::chrono::steady_clock::duration hedgeAfter{};
  /// A server marked down is probed again after this long, then after
  /// twice as long each time, up to reconnectMax.
  std::chrono::steady_clock::duration reconnectMin = std::chrono::milliseconds(50);
  std::chrono::steady_clock::duration reconnectMax = std::chrono::seconds(2);
  /// Requests granted transmission at once per server connection (its
  /// TransmissionLimiter): the bound of a single-server client, per server.
  std::size_t maxTransmissionsPerServer = 64;
  /// Most IOs in one request; a server's larger share of a batch is split.
  /// At most the servers' --max-batch (and 408 over RDMA).
  std::size_t maxIosPerRequest = 256;
  /// Where reports go (a corrupted replica; a server down, back); empty: stderr.
  std::function<void(const std::string&)> log;
};

/// One IO's outcome from a ClusterClient: the last replica's answer.
struct ClusterOutcome {
  /// ok, or the last status: a replica's, `unavailable` when the last
  /// request failed as a whole (or every replica's server was down), or
  /// `timedOut` when it missed its deadline.
  proto::IoStatus status = proto::IoStatus::unavailable;
  std::uint32_t bytes = 0;
  std::uint32_t checksum = 0;
  bool checksumMismatch = false;  ///< the last replica's bytes failed their checksum (a corrupt replica)
  std::error_code error;          ///< why the last request failed as a whole, if it did
  std::size_t server = SIZE_MAX;  ///< the last replica's server (ChainTable::servers() index); none: SIZE_MAX
  std::uint32_t attempts = 0;     ///< replicas asked
  /// The bytes are there and passed their checksum.
  bool ok() const noexcept { return status == proto::IoStatus::ok && !checksumMismatch; }
};

/// Figures per server (ClusterClient::serverStats).
struct ClusterServerStats {
  std::uint64_t requests = 0;        ///< requests sent
  std::uint64_t ios = 0;             ///< IOs it delivered (ok, checksum good)
  std::uint64_t bytes = 0;           ///< their bytes
  std::uint64_t failedRequests = 0;  ///< requests that failed as a whole (connection, deadline)
  std::uint64_t timeouts = 0;        ///< ... of which missed their deadline
  std::uint64_t downs = 0;           ///< times marked down
  std::uint64_t ups = 0;             ///< times found back
};

/// Figures of the whole client (ClusterClient::stats).
struct ClusterStats {
  std::uint64_t retries = 0;          ///< IOs sent again, to another replica
  std::uint64_t failovers = 0;        ///< servers marked down
  std::uint64_t hedges = 0;           ///< requests hedged (sent to other replicas too)
  std::uint64_t hedgeWins = 0;        ///< ... whose hedge delivered first
  std::uint64_t corruptReplicas = 0;  ///< (target, chunk) copies found corrupt
  std::uint64_t failedIos = 0;        ///< IOs that failed on every replica
};

/// A client of a cluster of storage servers (a ChainTable): one
/// StorageClient (one connection) per server.
///
/// Guarantees:
/// - Used on its reactor's loop thread only; every awaitable resumes there.
/// - `co_await batchRead(ios)` yields one outcome per IO, in request order,
///   whatever happens to the servers (it never fails as a whole). It
///   splits the batch by chain: each IO reads one replica of its chunk's
///   chain (ReplicaRouter: the least loaded), the IOs for one server go in
///   one request (at most maxIosPerRequest IOs), and the requests to
///   different servers run concurrently. A ReadOp's targetId is ignored:
///   the chain table decides.
/// - Retries as 3FS's batchReadWithRetry: an IO whose replica fails it (the
///   connection fails, the request misses its deadline, or the status is
///   unavailable, timedOut, ioError, internalError, targetNotFound,
///   chunkNotFound, or the bytes fail their checksum) is read from another
///   replica of its chain in the next round; it fails only when every
///   replica has failed it (or is on a server marked down), with the last
///   status. Statuses that blame the request (rangeOutsideChunk,
///   bufferTooSmall, batchTooLarge) are final; so is an IO that the table
///   says cannot exist (a chunk id past the dataset: chunkNotFound; a range
///   past the chunk: rangeOutsideChunk; a destination too small:
///   bufferTooSmall), which is not sent.
/// - A request gets `requestTimeout` (coio::withTimeout over the whole
///   request): a hung server (SIGSTOP) costs a batch at most that, then is
///   marked down. A server marked down (its connection failed, a deadline
///   missed, or it answered `unavailable`: draining) gets no requests; a
///   task in the client reconnects if needed and probes it (a one-byte read
///   that must come back in time, not `unavailable`) after reconnectMin,
///   doubling up to reconnectMax, until it answers; then it is used again.
/// - Hedging (hedgeAfter > 0): a request unanswered after hedgeAfter is
///   also sent to other replicas (every IO must have one left, else no
///   hedge), into memory of the client's own; coio::collectAny races the
///   two, the first to deliver every IO intact wins (its bytes are copied
///   to the destinations if it was the hedge) and the other is cancelled
///   (awaited before batchRead goes on: nothing writes into a destination
///   after batchRead returns). A hedge that fails never wins. A server
///   whose requests lose to hedges three times in a row is treated as hung
///   (marked down). Over RDMA the hedge's memory is not registered, so it
///   never wins: hedging is for TCP.
/// - A replica whose bytes fail their checksum is counted and logged once
///   per (target, chunk) and not read again for that chunk (other replicas
///   are, even in later batches). Only a read of a whole chunk compares
///   against the CRC stored at init (the server computes a partial read's
///   CRC from the bytes it read): corruption inside a partial range is
///   noticed by a whole-chunk read only.
/// - Transmission control per server connection: at most
///   maxTransmissionsPerServer requests granted at once on each.
/// - batchRead always suspends: one that could send nothing (every replica
///   down) yields to the loop once, so that a caller retrying in a loop
///   does not starve the client's probes (or anything else on the loop).
/// - A batchRead whose awaiting task is stopped (coio::currentStopToken)
///   cancels its requests and starts no new round: the IOs not delivered
///   fail (`unavailable`, error operation_canceled).
/// - `co_await close()` before destruction, once no batchRead is pending.
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
    auto client = std::unique_ptr<ClusterClient>(
        new ClusterClient(reactor, std::move(table), std::move(options), std::move(connectorFor)));
    std::vector<coio::Task<void>> connects;
    for (std::size_t s = 0; s < client->servers_.size(); ++s) connects.push_back(client->connectFirst(s));
    co_await coio::collectAllRange(std::move(connects));
    co_return std::move(client);
  }

  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  const ChainTable& table() const noexcept { return table_; }
  const ClusterStats& stats() const noexcept { return stats_; }
  const ClusterServerStats& serverStats(std::size_t server) const { return servers_.at(server).stats; }
  /// Whether `server` is marked down right now.
  bool isDown(std::size_t server) const { return router_.isDown(server); }

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

  /// Reads every IO (see the class comment).
  coio::Task<std::vector<ClusterOutcome>> batchRead(std::span<const ReadOp> ios) {
    Batch batch(ios);
    std::vector<std::size_t> pending;
    for (std::size_t i = 0; i < ios.size(); ++i) {
      if (!admit(ios[i], batch.outcomes[i])) continue;
      pending.push_back(i);
      // A copy known to be corrupt counts as a replica that failed the IO.
      batch.tried[i] = router_.corruptMask(ios[i].chunkId);
      if (batch.tried[i] != 0) batch.outcomes[i] = {proto::IoStatus::ok, 0, 0, true, {}, SIZE_MAX, 0};
    }
    const std::stop_token caller = co_await coio::currentStopToken();
    bool sent = false;
    while (!pending.empty()) {
      if (caller.stop_requested()) {  // no more rounds: what is not delivered fails
        for (std::size_t io : pending) {
          batch.outcomes[io].status = proto::IoStatus::unavailable;
          batch.outcomes[io].error = std::make_error_code(std::errc::operation_canceled);
        }
        break;
      }
      ReplicaRouter::Routes routes = router_.route(batch.chunkIds, pending, batch.tried, options_.maxIosPerRequest);
      for (std::size_t io : routes.unroutable) unroutable(batch, io);
      std::vector<coio::Task<void>> requests;
      for (SubBatch& sub : routes.batches) {
        for (std::size_t io : sub.ios) stats_.retries += batch.outcomes[io].attempts > 0;
        requests.push_back(serve(batch, std::move(sub)));
      }
      if (requests.empty()) break;
      sent = true;
      co_await coio::collectAllRange(std::move(requests));
      pending = std::exchange(batch.retry, {});
      std::sort(pending.begin(), pending.end());
    }
    for (const ClusterOutcome& o : batch.outcomes) stats_.failedIos += !o.ok();
    // Nothing sent (every replica down): still let the loop run the rest
    // (the probes among them) before the caller's next try.
    if (!sent) co_await reactor_.schedule();
    co_return std::move(batch.outcomes);
  }

  /// Stops probing and closes every connection. Once, with no batchRead pending.
  coio::Task<void> close() {
    probes_.requestStop();
    co_await probes_.join();
    for (Server& server : servers_) {
      if (std::shared_ptr<Client> client = std::move(server.client)) co_await client->close();
    }
  }

 private:
  struct Server {
    coio::SocketAddress address;
    std::unique_ptr<TransmissionLimiter> limiter;
    std::shared_ptr<Client> client;  // none while down without a connection
    std::error_code lastError;       // why it was last marked down
    unsigned lostHedges = 0;         // its requests cancelled by a winning hedge, in a row
    bool probing = false;
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
    std::vector<std::uint32_t> tried;  // per IO: replica positions asked (or known corrupt)
    std::vector<ClusterOutcome> outcomes;
    std::vector<std::size_t> retry;  // IOs for the next round
  };

  // A request's answer, or why it failed as a whole.
  using Answer = coio::Result<std::vector<ReadOutcome>>;

  static constexpr unsigned kLostHedgesForDown = 3;
  static constexpr std::uint32_t kProbeBytes = 1;

  ClusterClient(R& reactor, ChainTable table, ClusterOptions options, ConnectorFactory connectorFor)
      : reactor_(reactor), table_(std::move(table)), options_(std::move(options)),
        connectorFor_(std::move(connectorFor)), router_(table_), servers_(table_.servers().size()),
        probeMemory_(table_.servers().size() * kProbeBytes) {
    options_.connection.verifyChecksums = true;
    for (std::size_t s = 0; s < servers_.size(); ++s) {
      servers_[s].address = table_.servers()[s];
      servers_[s].limiter = std::make_unique<TransmissionLimiter>(options_.maxTransmissionsPerServer);
    }
    memory_.push_back(probeMemory_);
  }

  void log(const std::string& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  // False (and the IO's final outcome set) for an IO the table says cannot be served.
  bool admit(const ReadOp& op, ClusterOutcome& outcome) const {
    if (op.chunkId >= table_.chunks()) {
      outcome.status = proto::IoStatus::chunkNotFound;
    } else if (std::uint64_t{op.offset} + op.length > table_.chunkSize()) {
      outcome.status = proto::IoStatus::rangeOutsideChunk;
    } else if (op.into.size() < op.length) {
      outcome.status = proto::IoStatus::bufferTooSmall;
    } else {
      return true;
    }
    return false;
  }

  // An IO with no replica left: it keeps its last outcome; never sent at
  // all (every replica's server down), it fails with the servers' error.
  void unroutable(Batch& batch, std::size_t io) {
    ClusterOutcome& outcome = batch.outcomes[io];
    if (outcome.attempts > 0 || outcome.checksumMismatch) return;
    const Chain& chain = table_.chains()[table_.chainIndexOf(batch.chunkIds[io])];
    outcome.status = proto::IoStatus::unavailable;
    outcome.error = servers_[chain.replicas.front().server].lastError;
    if (!outcome.error) outcome.error = std::make_error_code(std::errc::host_unreachable);
  }

  // One request of a round, hedged if so configured; records what it got.
  coio::Task<void> serve(Batch& batch, SubBatch sub) {
    std::vector<ReadOp> ops = opsOf(batch, sub);
    std::optional<ReplicaRouter::Routes> alternatives;
    if (options_.hedgeAfter > std::chrono::steady_clock::duration::zero()) alternatives = hedgeRoutes(batch, sub);
    if (!alternatives) {
      record(batch, sub, co_await request(sub.server, ops));
      co_return;
    }
    std::vector<std::byte> scratch;
    auto first = co_await coio::collectAny(request(sub.server, ops), hedge(batch, *alternatives, scratch));
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
  std::optional<ReplicaRouter::Routes> hedgeRoutes(const Batch& batch, const SubBatch& sub) const {
    std::vector<std::uint32_t> tried(batch.tried);
    for (std::size_t k = 0; k < sub.ios.size(); ++k) tried[sub.ios[k]] |= 1u << sub.positions[k];
    ReplicaRouter::Routes routes = router_.route(batch.chunkIds, sub.ios, tried, options_.maxIosPerRequest);
    if (!routes.unroutable.empty()) return std::nullopt;
    return routes;
  }

  // The hedge: after hedgeAfter, the same IOs from other replicas, into
  // `scratch`. Finishes only with every IO delivered intact (then it wins
  // collectAny); otherwise it waits to be cancelled by the request.
  coio::Task<std::vector<Answer>> hedge(const Batch& batch, const ReplicaRouter::Routes& routes,
                                        std::vector<std::byte>& scratch) {
    if (!co_await reactor_.sleepFor(options_.hedgeAfter, {})) co_return std::vector<Answer>{};  // answered in time
    ++stats_.hedges;
    std::size_t total = 0;
    for (const SubBatch& alt : routes.batches) {
      for (std::size_t io : alt.ios) total += batch.ops[io].length;
    }
    scratch.resize(total);
    std::vector<std::vector<ReadOp>> ops;
    std::size_t at = 0;
    for (const SubBatch& alt : routes.batches) {
      ops.push_back(opsOf(batch, alt));
      for (ReadOp& op : ops.back()) {
        op.into = std::span(scratch).subspan(at, op.length);
        at += op.length;
      }
    }
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

  std::vector<ReadOp> opsOf(const Batch& batch, const SubBatch& sub) const {
    std::vector<ReadOp> ops;
    ops.reserve(sub.ios.size());
    for (std::size_t k = 0; k < sub.ios.size(); ++k) {
      ReadOp op = batch.ops[sub.ios[k]];
      op.targetId = sub.targets[k];
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
    }
    const bool draining = std::any_of(answer->begin(), answer->end(),
                                      [](const ReadOutcome& o) { return o.status == proto::IoStatus::unavailable; });
    if (draining) markDown(s, std::make_error_code(std::errc::connection_aborted));
    co_return answer;
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
  // the next round.
  void record(Batch& batch, const SubBatch& sub, const Answer& answer) {
    for (std::size_t k = 0; k < sub.ios.size(); ++k) {
      const std::size_t io = sub.ios[k];
      ClusterOutcome& outcome = batch.outcomes[io];
      batch.tried[io] |= 1u << sub.positions[k];
      const std::uint32_t attempts = outcome.attempts + 1;
      if (!answer) {
        const bool late = answer.error() == std::errc::timed_out;
        outcome = {late ? proto::IoStatus::timedOut : proto::IoStatus::unavailable, 0, 0, false, answer.error(),
                   sub.server, attempts};
        if (answer.error() != coio::Errc::invalidArgument) batch.retry.push_back(io);
        continue;
      }
      const ReadOutcome& got = (*answer)[k];
      outcome = {got.status, got.bytes, got.checksum, got.checksumMismatch, {}, sub.server, attempts};
      if (got.status == proto::IoStatus::ok && got.checksumMismatch) reportCorrupt(sub, k, batch.chunkIds[io]);
      if (!outcome.ok() && retryable(got.status)) batch.retry.push_back(io);
    }
  }

  void reportCorrupt(const SubBatch& sub, std::size_t k, std::uint64_t chunkId) {
    if (!router_.markCorrupt(sub.targets[k], chunkId)) return;
    ++stats_.corruptReplicas;
    log("coio-storage: chunk " + std::to_string(chunkId) + " of target " + std::to_string(sub.targets[k]) + " on " +
        servers_[sub.server].address.toString() +
        " failed its checksum: a corrupt replica, not read again; reading another replica");
  }

  // Stops using `s` and starts probing it (once).
  void markDown(std::size_t s, std::error_code why) {
    Server& server = servers_[s];
    server.lastError = why;
    if (router_.isDown(s)) return;
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
  // byte of its first target, with backoff between tries.
  coio::Task<void> probe(std::size_t s) {
    Server& server = servers_[s];
    std::chrono::steady_clock::duration backoff = options_.reconnectMin;
    for (;;) {
      if (!co_await reactor_.sleepFor(backoff, {})) break;  // close()
      backoff = std::min(backoff * 2, options_.reconnectMax);
      if (!server.client || server.client->failure()) {
        coio::Result<std::shared_ptr<Client>> fresh =
            co_await coio::withTimeout(reactor_, open(s), options_.requestTimeout);
        if (!fresh) {
          server.lastError = fresh.error();
          continue;
        }
        std::shared_ptr<Client> old = std::exchange(server.client, std::move(*fresh));
        co_await release(s, std::move(old));
      }
      if (co_await answers(s)) {
        router_.setDown(s, false);
        server.lostHedges = 0;
        ++server.stats.ups;
        log("coio-storage: server " + server.address.toString() + " is back");
        break;
      }
    }
    server.probing = false;
  }

  // A one-byte read of the first chunk of `s`'s first target, in time and
  // not `unavailable` (draining).
  coio::Task<bool> answers(std::size_t s) {
    for (std::size_t c = 0; c < table_.chains().size(); ++c) {
      for (const Replica& r : table_.chains()[c].replicas) {
        if (r.server != s) continue;
        const ReadOp op{c, 0, kProbeBytes, std::span(probeMemory_).subspan(s * kProbeBytes, kProbeBytes), r.targetId};
        std::shared_ptr<Client> client = servers_[s].client;
        Answer answer = co_await coio::withTimeout(reactor_, client->batchRead(std::span(&op, 1)),
                                                   options_.requestTimeout);
        co_await release(s, std::move(client));
        co_return answer && answer->front().status != proto::IoStatus::unavailable;
      }
    }
    co_return false;  // a server with no target: the table never routes to it
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
  ChainTable table_;
  ClusterOptions options_;
  ConnectorFactory connectorFor_;
  ReplicaRouter router_;
  std::vector<Server> servers_;
  std::vector<std::byte> probeMemory_;  // one probe byte per server
  std::vector<std::span<std::byte>> memory_;  // registered with every connection
  ClusterStats stats_;
  coio::AsyncScope probes_;  // one probe task per server marked down
};

}  // namespace storage
