#pragma once
// The storage server of one reactor: serves BatchReadRequests (PROTOCOL.md)
// from its targets (chunk stores) over TCP or RDMA (a Transport). A multi-reactor server
// runs one per reactor and lets one of them accept for all (serve()).
// One file (about 700 lines): its parts are already in their own headers
// (connection, read plan, spliced pieces, pipes, targets, options); what is
// left is the one class whose accept loops, connections and request
// pipeline share its buffer pool, tokens, counters and drain state.
#include "cluster/chain_table.hpp"
#include "server/connection.hpp"
#include "server/pipe_pool.hpp"
#include "server/read_plan.hpp"
#include "server/server_options.hpp"
#include "server/spliced_pieces.hpp"
#include "server/target.hpp"
#include "transport/channel.hpp"
#include "store/chunk_store.hpp"
#include "protocol/crc32c.hpp"
#include "metrics/latency_histogram.hpp"
#include "protocol/protocol.hpp"
#include "transport/tcp_channel.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/batch_semaphore.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/event.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/direct_io.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/disk/read_batch.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/splice.hpp>
#include <coio/reactor/wait_for.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace storage {



/// One reactor's share of the server: every target's files opened on the
/// reactor's one Disk, one registered BufferPool shared by all targets, and
/// the connections it serves. One pool per reactor, not per target: the
/// reactor's ring has one fixed-buffer table, and a busy target may then
/// use buffers an idle one does not need.
///
/// Guarantees:
/// - Everything runs on the reactor's loop thread: create it there (or
///   before the loop runs), call adopt()/serve()/shutdown() there.
/// - Per request: every IO is validated (an invalid one gets its own
///   status), the valid ones are read with one streaming ReadBatch into
///   pool buffers (ranges widened to whole blocks of their target and to
///   the O_DIRECT alignment, split into pieces of pieceSize), and each
///   piece is verified (each of its blocks against the CRC in the index)
///   and sent as soon as it and the pieces before it in its IO are read,
///   while the other reads go on (PROTOCOL.md). A piece whose block fails
///   its CRC is not sent: its IO is answered `corrupt` and nothing more of
///   it goes (PROTOCOL.md, "Checksums"). Nothing is read or sent before
///   the client granted transmission (with the request, or by
///   TransmitGrant; without it, after transmitTimeout, the request is
///   answered timedOut), so buffers are only held by requests that can
///   finish.
///   The response goes last. Pool buffers are returned on every path:
///   completion, timeout, disconnect, shutdown.
/// - Spliced requests (ServerOptions::dataPath; TCP, targets read through
///   the page cache, requests asking for the response CRC): each piece's
///   asked bytes are spliced into a pipe of the reactor's PipePool and from
///   there into the socket behind its IoData frame (SplicedPieces); only
///   the blocks an IO covers in part are read and checked, the response CRC
///   of the others comes from their stored CRCs. A piece the file no longer
///   holds whole fails its IO (ioError) before any of it is sent. Pipes go
///   back (emptied) on every path, as buffers do; without pipes (EMFILE)
///   the request is copied.
/// - Bounded per connection: at most maxRequestsPerConnection requests in
///   flight, and sends that make no progress for sendTimeout (a client
///   that stopped reading) drop the connection (and free its buffers).
/// - A protocol error on a connection gets an Error frame and closes that
///   connection only.
/// - Deadlines: a frame must be complete within frameTimeout of its first
///   byte (an RDMA handshake within frameTimeout of the accept), and a
///   connection with nothing in flight is closed after idleTimeout; both
///   with an Error frame (frameTimeout, idleTimeout) where the transport
///   is up.
/// - At most maxConnections connections per server, from accept to close
///   (the accepting shard hands a connection to the next one with room);
///   one more is accepted and closed at once. A failed accept (EMFILE)
///   backs off for 10 ms: the accept loop neither stalls nor spins.
/// - `co_await stopAccepting()` ends the accept loops: once it resumes no
///   accept is pending, and the caller may close the listeners, so that
///   connections made during a drain are refused at once (their clients
///   go to other replicas) rather than left in the backlog and reset when
///   the listener closes after it.
/// - `co_await shutdown()` stops accepting (as above), drains: requests in flight
///   finish (new ones are answered `unavailable`) for up to drainTimeout,
///   then every connection is cut (what is still in flight fails; clients
///   see the connection close). It resumes once all is done and must
///   complete before the server is destroyed.
/// - The transport is TCP unless useTransport() set another (RDMA).
/// - Routing (PROTOCOL.md, "Chain versions"): each target knows the version
///   of its chain, 0 (unknown) until updateRouting() says otherwise; an IO
///   that names an older, non-zero version is answered `staleRouting`, not
///   read. A multi-reactor server is fed on each shard.
template <coio::Reactor R>
class StorageServer {
 public:
  /// Serves the targets (each id at most once): loads each one's index and
  /// opens its data files, all on this reactor's Disk. Errors: an index's
  /// (ENOENT: no index; Errc::invalidArgument: malformed or of an old
  /// version), a data file's open error, Errc::invalidArgument for unusable
  /// options, no target, a repeated id, or a target whose block size does
  /// not divide pieceSize (a piece holds whole blocks).
  static coio::Result<std::unique_ptr<StorageServer>> open(R& reactor, const std::vector<TargetSpec>& targets,
                                                          ServerOptions options) {
    if (targets.empty() || options.pieceSize == 0 || options.pieceSize % 4096 != 0 ||
        options.splicePieceSize % options.pieceSize != 0 || options.splicePieceSize > (1u << 30) ||
        options.poolBytes < options.pieceSize || options.frameTimeout <= std::chrono::steady_clock::duration::zero() ||
        options.idleTimeout <= std::chrono::steady_clock::duration::zero() || options.maxConnections == 0) {
      return coio::Errc::invalidArgument;
    }
    auto server = std::unique_ptr<StorageServer>(new StorageServer(reactor, options));
    for (const TargetSpec& spec : targets) {
      if (server->findTarget(spec.id) != nullptr) return coio::Errc::invalidArgument;
      coio::Result<Target> target = server->openTarget(spec);
      if (!target) return target.error();
      server->targets_.push_back(std::move(*target));
    }
    (void)server->disk_.registerBuffers(server->pool_);
    server->note_ += server->pool_.registrationNote();
    if (options.zeroCopySend) {
      server->note_ += coio::detail::sendsZeroCopy(reactor) ? "; zero-copy sends (TCP)"
                                                             : "; zero-copy sends unavailable on this reactor: copying";
    }
    if (options.poisonBuffers) server->note_ += "; buffers poisoned on release (a debugging aid)";
    server->note_ += server->dataPathNote();
    return server;
  }

  /// Serves `dir` as the only target, id 0 (`serve --dir`).
  static coio::Result<std::unique_ptr<StorageServer>> open(R& reactor, const std::string& dir, ServerOptions options) {
    return open(reactor, std::vector<TargetSpec>{{0, dir}}, options);
  }

  StorageServer(const StorageServer&) = delete;
  StorageServer& operator=(const StorageServer&) = delete;
  ~StorageServer() { COIO_ASSERT(scopeJoined_, "StorageServer destroyed before co_await shutdown() completed"); }

  R& reactor() const noexcept { return reactor_; }
  /// The first target's dataset shape.
  const ChunkStoreLayout& layout() const noexcept { return targets_.front().index.layout; }
  /// The target ids served, in the order given to open().
  std::vector<std::uint32_t> targetIds() const {
    std::vector<std::uint32_t> ids;
    for (const Target& t : targets_) ids.push_back(t.id);
    return ids;
  }
  const ServerOptions& options() const noexcept { return options_; }
  const ServerStats& stats() const noexcept { return stats_; }
  /// The latency histograms (loop thread).
  const ServerLatencies& latencies() const noexcept { return latencies_; }
  /// Connections between accept and close right now (counted against
  /// maxConnections; stats().connections counts those past the handshake).
  std::size_t admittedConnections() const noexcept { return admitted_.load(std::memory_order_relaxed); }
  /// Pool buffers held by requests right now.
  std::size_t buffersInUse() const noexcept { return pool_.count() - pool_.available(); }
  /// Pipes held by spliced requests right now.
  std::size_t pipesInUse() const noexcept { return pipes_.inUse(); }
  /// Pipes open: held, or kept for the next spliced requests (2 fds each).
  std::size_t pipesOpen() const noexcept { return pipes_.open(); }
  /// O_DIRECT and buffer-registration notes, for the start-up banner.
  const std::string& note() const noexcept { return note_; }
  /// The read-buffer pool's whole mapping (to register it for RDMA).
  std::span<std::byte> bufferMemory() const noexcept { return {pool_.data(), pool_.size()}; }
  /// Takes each served target's chain version from `routing` (a target it
  /// does not list: 0, never stale). Loop thread; requests decoded from
  /// now on are checked against it.
  void updateRouting(const ChainTable& routing) {
    for (Target& t : targets_) t.chainVersion = routing.chainVersionOfTarget(t.id).value_or(0);
  }
  /// The chain version target `targetId` knows (0: unknown); nullopt if not served.
  std::optional<std::uint32_t> chainVersion(std::uint32_t targetId) const noexcept {
    const Target* target = findTarget(targetId);
    if (target == nullptr) return std::nullopt;
    return target->chainVersion;
  }
  /// Serves new connections over `transport` (before serve()/adopt()).
  void useTransport(std::unique_ptr<Transport<R>> transport) { transport_ = std::move(transport); }
  const Transport<R>& transport() const noexcept { return *transport_; }

  /// Serves `stream` until it closes (loop thread). After shutdown() began,
  /// or at maxConnections, the stream is closed at once.
  void adopt(coio::TcpStream<R> stream) {
    if (!tryAdmit()) {
      ++stats_.refusedConnections;
      return;
    }
    serveAdmitted(std::move(stream));
  }

  /// Accepts connections on `listener` until shutdown(), handing them round
  /// robin to `shards` (each on its own reactor; empty: this server only).
  /// The listener must outlive stopAccepting() (or shutdown()).
  void serve(coio::TcpListener<R>& listener, std::vector<StorageServer*> shards = {}) {
    if (stopping_ || acceptStopped_) return;
    if (shards.empty()) shards.push_back(this);
    acceptors_.spawn(acceptLoop(listener, std::move(shards)));
  }

  /// Ends accepting (loop thread; see the class comment); resumes once no
  /// accept is pending on a listener given to serve(). Also cuts RDMA
  /// handshakes in progress. Idempotent.
  coio::Task<void> stopAccepting() {
    stop_.request_stop();
    if (acceptStopped_) co_return;
    acceptStopped_ = true;
    co_await acceptors_.join();
  }

  /// Stops accepting, drains (see the class comment) and waits until every
  /// connection and request is gone. Once only.
  coio::Task<void> shutdown() {
    stopping_ = true;
    co_await stopAccepting();
    for (Connection* c : connections_) {
      if (c->inFlight.empty()) c->stop.request_stop();  // else the last request to finish stops it
    }
    coio::Event joined;
    co_await coio::collectAll(joinThenSet(joined), cutWhenDue(joined));
    scopeJoined_ = true;
  }

 private:
  using Target = ServedTarget;
  using Piece = ReadPiece;
  using Lease = BufferLease;

  const Target* findTarget(std::uint32_t id) const noexcept { return findServedTarget(targets_, id); }
  // Which targets' data is spliced, for the banner.
  std::string dataPathNote() const {
    if (options_.dataPath == DataPath::copy) return "; data copied (--data-path copy)";
    if (!coio::SpliceReactor<R>) return "";
    const auto splices = std::count_if(targets_.begin(), targets_.end(), [](const Target& t) { return t.splices; });
    if (splices == 0) return "; data copied (no target read through the page cache, or no splice on its file system)";
    return "; TCP data of " + std::to_string(splices) + " of " + std::to_string(targets_.size()) +
           " target(s) spliced from the page cache" +
           (options_.dataPath == DataPath::automatic ? " (requests of IOs >= 64K asking for CRCs)"
                                                     : " (requests asking for CRCs)");
  }
  coio::Result<Target> openTarget(const TargetSpec& spec) { return openServedTarget(disk_, spec, options_, note_); }
  using Connection = ServedConnection<R>;
  using Expiry = ConnectionExpiry;




  // Takes a request id out of the connection's in-flight set when its task
  // ends; the last one of a draining server ends the connection. Requests
  // that arrive while draining are answered `unavailable` and not counted:
  // a client that keeps sending cannot keep its connection open.
  struct InFlightEntry {
    StorageServer& server;
    Connection& conn;
    std::uint64_t id;
    bool counted;
    ~InFlightEntry() {
      if (!counted) return;
      conn.inFlight.erase(id);
      if (!conn.inFlight.empty()) return;
      conn.idleSince = server.reactor_.now();
      if (server.stopping_) conn.stop.request_stop();
    }
  };

  StorageServer(R& reactor, const ServerOptions& options)
      : reactor_(reactor),
        options_(options),
        pool_({.bufferSize = options.pieceSize,
               .count = options.poolBytes / options.pieceSize,
               .poisonOnRelease = options.poisonBuffers}),
        disk_(reactor),
        tokens_(pool_.count()),
        pipes_(reactor, options.splicePieceSize, pool_.count()),
        transport_(std::make_unique<TcpTransport<R>>(options.zeroCopySend)) {}

  coio::Task<void> joinThenSet(coio::Event& joined) {
    co_await scope_.join();
    joined.set();
  }
  // Cuts every connection still draining once drainTimeout has passed (at
  // once if shutdown()'s caller is stopped).
  coio::Task<void> cutWhenDue(coio::Event& joined) {
    const coio::Result<void> drained = co_await coio::waitFor(reactor_, joined, options_.drainTimeout);
    if (drained) co_return;
    for (Connection* c : connections_) c->stop.request_stop();
  }

  coio::Task<void> acceptLoop(coio::TcpListener<R>& listener, std::vector<StorageServer*> shards) {
    for (std::size_t next = 0;; ++next) {
      coio::Result<coio::TcpStream<R>> stream = co_await listener.accept(stop_.get_token());
      if (!stream) {
        if (stop_.stop_requested()) co_return;
        ++stats_.acceptErrors;
        // e.g. EMFILE: that connection is lost, the listener is not. Back off:
        // the error repeats without ever suspending, which would keep this
        // reactor from running anything else (other connections, shutdown).
        const bool slept = co_await reactor_.sleepFor(std::chrono::milliseconds(10), stop_.get_token());
        (void)slept;
        continue;
      }
      // The next shard in turn with room; none: over the limit, closed at once.
      StorageServer* shard = nullptr;
      for (std::size_t i = 0; i < shards.size() && shard == nullptr; ++i) {
        StorageServer* candidate = shards[(next + i) % shards.size()];
        if (candidate->tryAdmit()) shard = candidate;
      }
      if (shard == nullptr) {
        ++stats_.refusedConnections;
        continue;
      }
      (void)stream->setNoDelay(true);
      // Checked at start-up (server_main): a name the kernel took once it takes again.
      if (!options_.tcpCongestion.empty()) (void)stream->setCongestionControl(options_.tcpCongestion);
      if (shard != this) {
        // Not read yet, so nothing is read ahead and the release succeeds
        // (if it did not, this shard would serve the connection, moving
        // the admission here even past this shard's limit).
        coio::Result<coio::FileDescriptor> fd = stream->release();
        if (fd) {
          shard->reactor().spawn(adoptOn(shard, std::move(*fd)));
          continue;
        }
        shard->unadmit();
        admitted_.fetch_add(1, std::memory_order_relaxed);
      }
      serveAdmitted(std::move(*stream));
    }
  }

  // Runs on `shard`'s loop thread.
  static coio::Task<void> adoptOn(StorageServer* shard, coio::FileDescriptor fd) {
    shard->serveAdmitted(coio::TcpStream<R>(shard->reactor(), std::move(fd)));
    co_return;
  }

  // Takes a connection slot if this server has one free; any thread (the
  // accepting shard admits for all).
  bool tryAdmit() noexcept {
    std::size_t n = admitted_.load(std::memory_order_relaxed);
    while (n < options_.maxConnections) {
      if (admitted_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  void unadmit() noexcept { admitted_.fetch_sub(1, std::memory_order_relaxed); }

  // Serves a connection that holds a slot (loop thread); the slot is given
  // back once its socket is closed.
  void serveAdmitted(coio::TcpStream<R> stream) {
    if (stopping_) {
      stream.close();
      unadmit();
      return;
    }
    scope_.spawn(serveConnection(std::move(stream)));
  }

  coio::Task<void> serveConnection(coio::TcpStream<R> stream) {
    struct Slot {
      StorageServer& server;
      ~Slot() { server.unadmit(); }
    };
    const Slot slot{*this};  // destroyed last: after the channel closed its sockets
    coio::Result<std::unique_ptr<Channel<R>>> channel =
        co_await transport_->accept(std::move(stream), stop_.get_token(), options_.frameTimeout);
    if (!channel) {
      ++stats_.handshakeFailures;
      if (channel.error() == std::errc::timed_out) ++stats_.frameTimeouts;
      co_return;
    }
    Connection conn(std::move(*channel));
    // Undone however the task ends: a task that threw (a bug, see
    // taskFailed) must leave no dangling pointer for shutdown's cut.
    struct Registered {
      StorageServer& server;
      Connection& conn;
      ~Registered() {
        --server.stats_.connections;
        server.connections_.erase(&conn);
      }
    };
    connections_.insert(&conn);
    ++stats_.connections;
    const Registered registered{*this, conn};
    // A task of the connection that throws (a bug): once all are done (the
    // reader's end, by a throw too, stops the others) the connection is
    // aborted and closed, and the exception goes on to taskFailed.
    std::exception_ptr bug;
    ReadFailure failure;
    try {
      auto [read, watched, enforced] = co_await coio::collectAll(
          readRequestsThenStop(conn), stopIfThrows(conn.stop, conn.channel->watchPeer(conn.stop.get_token())),
          stopIfThrows(conn.stop, conn.enforceDeadlines(reactor_, options_)));
      (void)watched;
      (void)enforced;
      failure = read;
    } catch (...) {
      bug = std::current_exception();
    }
    try {
      co_await conn.requests.join();
    } catch (...) {
      if (!bug) bug = std::current_exception();
    }
    if (bug) {
      conn.channel->abort();
      co_await conn.channel->close();
      std::rethrow_exception(bug);
    }
    if (conn.expired == Expiry::frame) {
      ++stats_.frameTimeouts;
      failure = {proto::ProtocolErrc::frameTimeout, failure.requestId};  // the id of a stalled payload's header
    } else if (conn.expired == Expiry::idle) {
      ++stats_.idleTimeouts;
      failure = {proto::ProtocolErrc::idleTimeout, 0};
    } else if (conn.expired == Expiry::send) {
      ++stats_.sendTimeouts;  // the client stopped reading: no Error frame could reach it
    } else if (failure.isProtocolError()) {
      ++stats_.protocolErrors;
    }
    if (failure.isProtocolError()) co_await conn.channel->sendError(failure, options_.errorGrace);
    co_await conn.channel->close();
  }

  // A connection or accept task that threw: a bug. That connection is
  // gone (aborted: its client sees it end); the server goes on serving the
  // others, and says so at once rather than at shutdown.
  void taskFailed(std::exception_ptr failure) noexcept {
    ++stats_.taskFailures;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "storage server: a connection or accept task failed (a bug): %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "storage server: a connection or accept task failed (a bug): unknown exception\n");
    }
  }


  // A task beside the reader (the peer's watch, the deadlines) that throws
  // (a bug) stops the connection's other tasks, the reader too: else the
  // connection would stay open, unserved, until its client went.
  static coio::Task<void> stopIfThrows(std::stop_source& stop, coio::Task<void> task) {
    try {
      co_await std::move(task);
    } catch (...) {
      stop.request_stop();
      throw;
    }
  }

  // The reader; its end (or the watch's abort, which ends it) ends
  // everything else on the connection.
  coio::Task<ReadFailure> readRequestsThenStop(Connection& conn) {
    struct StopAtEnd {  // however the reader ends: a throw too
      std::stop_source& stop;
      ~StopAtEnd() { stop.request_stop(); }
    };
    const StopAtEnd atEnd{conn.stop};
    co_return co_await readRequests(conn);
  }

  // The connection's reader: decodes frames and starts a task per request.
  coio::Task<ReadFailure> readRequests(Connection& conn) {
    ReadFailure failure;
    for (;;) {
      coio::Result<IncomingFrame> frame = co_await conn.channel->readFrame(failure, conn.stop.get_token());
      if (!frame) co_return failure;
      const std::uint64_t id = frame->header.requestId;
      switch (frame->header.type) {
        case proto::MessageType::batchReadRequest: {
          const std::chrono::steady_clock::time_point received = reactor_.now();
          coio::Result<proto::BatchReadRequest> request =
              proto::decodeBatchReadRequest(frame->payload, conn.channel->maxIosPerFrame());
          if (!request) co_return ReadFailure{request.error(), id};
          const bool counted = !stopping_;
          if (counted && conn.inFlight.size() >= options_.maxRequestsPerConnection) {
            co_return ReadFailure{proto::ProtocolErrc::tooManyRequests, id};
          }
          if (counted && !conn.inFlight.insert(id).second) {
            co_return ReadFailure{proto::ProtocolErrc::unexpectedMessage, id};
          }
          ++stats_.requests;
          conn.requests.spawn(serveRequest(conn, id, std::move(*request), counted, received));
          break;
        }
        case proto::MessageType::transmitGrant: {
          const auto waiting = conn.awaiting.find(id);
          if (waiting != conn.awaiting.end()) {
            waiting->second->granted = true;
            waiting->second->arrived.set();
            conn.awaiting.erase(waiting);
          } else if (std::find(conn.ignoredGrants.begin(), conn.ignoredGrants.end(), id) == conn.ignoredGrants.end()) {
            co_return ReadFailure{proto::ProtocolErrc::unexpectedMessage, id};
          }  // else: a grant that crossed our response
          break;
        }
        case proto::MessageType::error:
          co_return ReadFailure{coio::Errc::eof, id};  // the client gave up on us: close without answering
        default:
          co_return ReadFailure{proto::ProtocolErrc::unexpectedMessage, id};
      }
    }
  }

  // Validates every IO: ok, or the IO's own error status. Records each
  // valid IO's target in `plans`.
  std::vector<proto::IoResult> validate(const proto::BatchReadRequest& request, const Channel<R>& channel,
                                        std::vector<IoPlan>& plans) {
    std::vector<proto::IoResult> results(request.ios.size());
    if (stopping_) {
      for (proto::IoResult& r : results) r.status = proto::IoStatus::unavailable;
      return results;
    }
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < request.ios.size(); ++i) {
      const proto::ReadIo& io = request.ios[i];
      const Target* target = findTarget(io.targetId);
      if (target == nullptr) {
        results[i].status = proto::IoStatus::targetNotFound;
      } else if (io.chainVersion != 0 && io.chainVersion < target->chainVersion) {
        results[i].status = proto::IoStatus::staleRouting;
        ++stats_.staleIos;
      } else if (!target->index.layout.holds(io.chunkId)) {
        results[i].status = proto::IoStatus::chunkNotFound;
      } else if (std::uint64_t{io.offset} + io.length > target->index.layout.chunkSize) {
        results[i].status = proto::IoStatus::rangeOutsideChunk;
      } else if (channel.writesRemote() && io.remote.length < io.length) {
        results[i].status = proto::IoStatus::bufferTooSmall;
      } else {
        plans[i].target = target;
        total += io.length;
      }
    }
    if (request.ios.size() > options_.maxBatch || total > options_.maxBatchBytes) {
      for (proto::IoResult& r : results) r.status = proto::IoStatus::batchTooLarge;
    }
    return results;
  }


  coio::Task<void> serveRequest(Connection& conn, std::uint64_t id, proto::BatchReadRequest request, bool counted,
                                std::chrono::steady_clock::time_point received) {
    const InFlightEntry entry{*this, conn, id, counted};
    std::vector<IoPlan> plans(request.ios.size());
    std::vector<proto::IoResult> results = validate(request, *conn.channel, plans);
    std::vector<Piece> pieces;
    planReads(request, results, plans, pieces, options_.pieceSize);
    if (pieces.size() > pool_.count()) {  // more than the whole pool could ever hold
      for (proto::IoResult& r : results) r.status = proto::IoStatus::batchTooLarge;
      pieces.clear();
    }
    const std::stop_token stop = conn.stop.get_token();
    // Not granted with the request (the client is at its transmission
    // bound): ask, and take no read buffers before the grant. Requests that
    // hold buffers are then always granted and finish: were an ungranted
    // one to hold buffers while granted ones wait for them, and those hold
    // the client's slots, neither could go on. A response without data
    // needs no grant.
    if (!request.granted && !pieces.empty()) {
      GrantWait<R> grant(conn, id);
      const std::chrono::steady_clock::time_point asked = reactor_.now();
      co_await conn.askForGrant(id);
      const bool granted = co_await conn.awaitGrant(reactor_, options_.transmitTimeout, grant);
      if (stop.stop_requested()) co_return;  // the connection is going away
      latencies_.transmitWait.observe(reactor_.now() - asked);
      if (!granted) {
        ++stats_.transmitTimeouts;
        for (proto::IoResult& r : results) r = {proto::IoStatus::timedOut, 0, 0};
        std::vector<std::byte> frame;
        proto::encode(frame, id, proto::BatchReadResponse{std::move(results)});
        co_await conn.sendFrame(frame);
        answered(received, stop);
        co_return;
      }
    }
    Lease lease;
    if (!pieces.empty()) {
      const bool haveTokens = co_await tokens_.acquire(pieces.size(), stop);
      if (!haveTokens) co_return;  // the connection is going away
    }
    if constexpr (coio::SpliceReactor<R>) {
      if (splicing(request, plans, *conn.channel)) {
        // Pieces of splicePieceSize (a pipe each): fewer system calls than pool-buffer ones. The
        // tokens taken for the pool-buffer pieces still bound the bytes in flight.
        std::vector<IoPlan> splicePlans = plans;
        std::vector<Piece> spliced;
        planReads(request, results, splicePlans, spliced, options_.splicePieceSize);
        PipeLease<R> pipes(pipes_);
        if (pipes.take(spliced.size())) {
          ++stats_.splicedRequests;
          lease.holdTokens(tokens_, pieces.size());
          SplicedPieces<R> source(reactor_, disk_, spliced, pipes.pipes);
          co_await stream(conn, id, request, results, splicePlans, spliced, source, received);
          co_return;
        }
        ++stats_.spliceFallbacks;  // no pipes (the fd limit, the pipe quota): copied instead
      }
    }
    if (!pieces.empty()) lease.hold(tokens_, pool_, pieces.size());
    CopiedPieces source(disk_, pieces, lease);
    co_await stream(conn, id, request, results, plans, pieces, source, received);
  }

  // Whether a granted request's data is spliced (ServerOptions::dataPath):
  // everything it reads is on targets that splice, it asks for the
  // response CRC (which then checks the blocks the server does not see),
  // and its channel splices.
  bool splicing(const proto::BatchReadRequest& request, const std::vector<IoPlan>& plans,
                const Channel<R>& channel) const {
    if (options_.dataPath == DataPath::copy || request.checksum != proto::ChecksumMode::crc32c ||
        !channel.splicesData()) {
      return false;
    }
    bool reads = false;
    for (std::size_t i = 0; i < plans.size(); ++i) {
      if (plans[i].pieces == 0) continue;  // invalid or empty: nothing read
      if (!plans[i].target->splices) return false;
      if (options_.dataPath == DataPath::automatic && request.ios[i].length < kSpliceMinIo) return false;
      reads = true;
    }
    return reads;
  }

  // Reads a granted request's pieces from `source` and streams each run of
  // pieces as soon as it and the pieces before it in its IO are read and
  // checked (PROTOCOL.md: an IO's data goes in order). Sends start in
  // order and overlap the reads still in flight. Then the response.
  template <typename Pieces>
  coio::Task<void> stream(Connection& conn, std::uint64_t id, const proto::BatchReadRequest& request,
                          std::vector<proto::IoResult>& results, const std::vector<IoPlan>& plans,
                          const std::vector<Piece>& pieces, Pieces& source,
                          std::chrono::steady_clock::time_point received) {
    const std::stop_token stop = conn.stop.get_token();
    const std::chrono::steady_clock::time_point reading = reactor_.now();
    RequestStream<Pieces> out(request, results, plans, pieces, source, id);
    coio::AsyncScope sends;
    auto onRead = [&](std::size_t p) {
      out.done[p] = true;
      const std::size_t io = out.ioOf[p];
      if (--out.unread[io] == 0) latencies_.diskRead.observe(reactor_.now() - reading);
      if (stop.stop_requested()) return;  // the connection is going away: a send now would only break it
      if (const std::optional<OutgoingPiece> piece = out.releasable(io)) {
        if (!out.transmitting) stats_.maxTransmitting = std::max(stats_.maxTransmitting, ++stats_.transmitting);
        out.transmitting = true;
        sends.spawn(conn.sendPiece(*piece));
      }
    };
    co_await source.readAll(stop, onRead);
    // The response (every piece is released by now, so the results are
    // final), once every piece has gone, or at least (a channel that sends
    // in order) started: then queued right behind the request's last piece,
    // not behind the pieces of other requests queued while they went out.
    out.finish(results);
    stats_.corruptIos += static_cast<std::uint64_t>(std::count_if(
        results.begin(), results.end(), [](const proto::IoResult& r) { return r.status == proto::IoStatus::corrupt; }));
    std::vector<std::byte> frame;
    proto::encode(frame, id, proto::BatchReadResponse{std::move(results)});
    const bool inOrder = conn.channel->sendsInOrder();
    if (inOrder && !stop.stop_requested()) sends.spawn(conn.sendFrame(frame));
    co_await sends.join();
    if (!inOrder && !stop.stop_requested()) co_await conn.sendFrame(frame);
    if (out.transmitting) --stats_.transmitting;
    answered(received, stop);
  }


  // The request's response went (a send that failed stopped the
  // connection): its latency counts.
  void answered(std::chrono::steady_clock::time_point received, const std::stop_token& stop) {
    if (!stop.stop_requested()) latencies_.request.observe(reactor_.now() - received);
  }


  R& reactor_;
  ServerOptions options_;
  std::string note_;
  // Destroyed in reverse: files before the Disk, the Disk before the pool.
  coio::BufferPool pool_;
  coio::Disk disk_;
  // Every target's files on the one Disk: io_uring has one fixed-buffer
  // table per ring, so one registered pool serves them all.
  std::vector<Target> targets_;
  coio::BatchSemaphore tokens_;  // one per free pool buffer: a request waits for all of its buffers at once
  PipePool<R> pipes_;  // spliced pieces' (one per piece, bounded by tokens_ as buffers are)
  ServerStats stats_;
  ServerLatencies latencies_;
  std::stop_source stop_;  // the accept loop's
  std::atomic<std::size_t> admitted_{0};  // connections from accept to close (tryAdmit)
  bool stopping_ = false;
  bool scopeJoined_ = false;
  bool acceptStopped_ = false;
  std::unordered_set<Connection*> connections_;
  std::unique_ptr<Transport<R>> transport_;  // after the pool: an RDMA registration of it goes first
  coio::AsyncScope scope_{[this](std::exception_ptr e) { taskFailed(std::move(e)); }};  // connections
  coio::AsyncScope acceptors_{[this](std::exception_ptr e) { taskFailed(std::move(e)); }};  // accept loops
};

}  // namespace storage
