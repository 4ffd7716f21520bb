#pragma once
// The storage client, over TCP or RDMA (a Channel): batchRead with per-IO
// results, checksum verification, the client side of transmission
// control, timeouts.
#include "transport/channel.hpp"
#include "protocol/crc32c.hpp"
#include "protocol/protocol.hpp"
#include "transport/tcp_channel.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/event.hpp>
#include <coio/core/result.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/wait_for.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stop_token>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace storage {

/// One IO of a batchRead: `length` bytes at `offset` of chunk `chunkId` on
/// the server's target `targetId`, delivered into `into` (at least `length`
/// bytes, valid until batchRead returns). `chainVersion`: the version of the
/// target's chain in the routing that chose it (PROTOCOL.md; 0: no routing,
/// never stale).
struct ReadOp {
  std::uint64_t chunkId = 0;
  std::uint32_t offset = 0;
  std::uint32_t length = 0;
  std::span<std::byte> into;
  std::uint32_t targetId = 0;
  std::uint32_t chainVersion = 0;
};

/// One IO's outcome: the server's status, byte count and checksum, and
/// whether the checksum disagreed with the bytes received (when verifying).
/// The server checks every block it reads against its stored CRC, whether
/// or not the client verifies: a copy corrupted on its disk comes back as
/// status `corrupt` (PROTOCOL.md, "Checksums"); a checksum mismatch is
/// damage after that check (network, memory).
struct ReadOutcome {
  proto::IoStatus status = proto::IoStatus::ok;
  std::uint32_t bytes = 0;
  std::uint32_t checksum = 0;
  bool checksumMismatch = false;
};

/// How many requests may be granted transmission at once, shared by the
/// clients it is given to (3FS's client-side limiter). Use it from one
/// reactor thread: a released slot resumes the next waiter inline.
class TransmissionLimiter {
 public:
  explicit TransmissionLimiter(std::size_t maxTransmissions = 64) : slots_(maxTransmissions) {}
  auto acquire(std::stop_token stop) noexcept { return slots_.acquire(std::move(stop)); }
  /// A slot if one is free now (and nobody waits for one).
  bool tryAcquire() noexcept { return slots_.tryAcquire(); }
  void release() noexcept { slots_.release(); }

 private:
  coio::Semaphore slots_;
};

/// A StorageClient's options. Its durations run on the reactor's clock
/// (now(): steady_clock, or virtual time under coio::sim::SimReactor).
struct ClientOptions {
  /// Per batchRead, from the call, whatever the server does: sending the
  /// request (over RDMA it waits for a credit, which a dead server never
  /// returns; over TCP for room in the socket), waiting for a grant, for
  /// the response, or in the middle of its data (see StorageClient).
  std::chrono::steady_clock::duration timeout = std::chrono::seconds(30);
  bool verifyChecksums = false;  ///< ask for CRC32C and check it against the bytes received
  /// batchReads sent at once on this connection; more wait for a slot.
  /// At most the server's --max-requests (256 by default).
  std::size_t maxRequestsInFlight = 256;
};

/// One connection to a storage server; StorageClient (below) is the
/// client, which replaces a connection the server closed as idle.
///
/// Guarantees:
/// - Used on its reactor's loop thread only; every awaitable resumes there.
/// - Many batchReads may be outstanding at once on one client; each gets
///   its own response (matched by request id).
/// - Transmission is granted only while the limiter has a slot: with the
///   request when a slot is free as it is sent (no TransmitRequest round
///   trip), else in answer to the server's TransmitRequest once one frees.
///   The slot is freed when that request's response arrives, it times out,
///   or the connection fails.
/// - batchRead yields per-IO outcomes, or a request-level error: timed_out,
///   the transport's error (eof, connection_reset), a ProtocolErrc the
///   server or this client detected, Errc::invalidArgument for a batch the
///   transport cannot carry (a destination smaller than its IO, more IOs
///   than a frame holds, RDMA: a destination outside registered memory),
///   or Errc::closed after close(). After a transport or protocol error,
///   or a timeout that cut the connection (below), every later batchRead
///   fails at once with that error.
/// - batchRead returns within `timeout` of the call (plus the time to
///   cancel a read) whatever the server does, also when the request could
///   not be sent (over TCP a frame cut by the timeout ends the connection).
/// - A batchRead whose awaiting task is stopped (its token, see
///   coio::currentStopToken: a collectAny it lost, a withTimeout deadline,
///   AsyncScope::requestStop) ends at once the way a timeout would (below),
///   with std::errc::operation_canceled: before it was sent it sends
///   nothing; waiting for its response, it is abandoned and the connection
///   stays; cut while its data was arriving, or granted over RDMA, it ends
///   the connection as a timeout does there.
/// - When batchRead returns, nothing writes into its destinations any more:
///   - a request that times out before its data arrives is abandoned: the
///     connection stays, a late response's data is read into scratch;
///   - over TCP, a request that times out while its data is being read
///     (the server stalled mid-response) cuts the connection: the read is
///     cancelled (batchRead returns once the kernel has let go of the
///     buffers), the connection is shut down, and every call on it fails
///     with timed_out (the timed-out call itself returns its response if
///     its read completed before the cancellation); the stream's place in
///     the data is lost, so no later call could use it;
///   - over RDMA, a request that times out after it was granted
///     transmission aborts the connection (the queue pair goes to ERR, so
///     no late RDMA WRITE can land), and every call on it fails.
/// - `co_await close()` before destruction, once no batchRead is pending.
template <coio::Reactor R>
class ClientConnection {
 public:
  /// A connection over a connected channel (e.g. RdmaChannel::connect's).
  static std::unique_ptr<ClientConnection> open(std::unique_ptr<Channel<R>> channel, TransmissionLimiter& limiter,
                                                ClientOptions options = {}) {
    auto client = std::unique_ptr<ClientConnection>(new ClientConnection(std::move(channel), limiter, options));
    client->scope_.spawn(client->readResponses());
    return client;
  }

  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;

  /// Registers memory that IOs may land in, once (RDMA needs it; TCP
  /// accepts any memory and this does nothing). Errors: the registration's.
  coio::Result<void> registerMemory(std::span<std::byte> memory) { return channel_->registerMemory(memory); }

  coio::Task<coio::Result<std::vector<ReadOutcome>>> batchRead(std::span<const ReadOp> ios) {
    if (failure_) co_return failure_;
    if (ios.size() > channel_->maxIosPerFrame()) co_return coio::Errc::invalidArgument;
    proto::BatchReadRequest request;
    request.checksum = options_.verifyChecksums ? proto::ChecksumMode::crc32c : proto::ChecksumMode::none;
    for (const ReadOp& op : ios) {
      if (op.into.size() < op.length) co_return coio::Errc::invalidArgument;
      coio::Result<proto::RemoteBuffer> remote = channel_->remoteBuffer(op.into.first(op.length));
      if (!remote) co_return remote.error();
      request.ios.push_back({op.chunkId, op.offset, op.length, *remote, op.targetId, op.chainVersion});
    }
    // The caller's stop (the token its task runs under: a collectAny it
    // lost, a withTimeout deadline) ends the call as its own timeout does.
    const std::stop_token caller = co_await coio::currentStopToken();
    std::stop_source giveUp;  // close(), or the caller's stop
    const auto forward = [&giveUp] { giveUp.request_stop(); };
    const std::stop_callback onClose(stop_.get_token(), forward);
    const std::stop_callback onCaller(caller, forward);
    const bool admitted = co_await requestSlots_.acquire(giveUp.get_token());
    if (!admitted) co_return stop_.stop_requested() ? coio::Result<std::vector<ReadOutcome>>(coio::Errc::closed)
                                                    : std::make_error_code(std::errc::operation_canceled);
    const RequestSlot slot{requestSlots_};
    if (failure_) co_return failure_;
    const std::uint64_t id = nextId_++;
    auto owned = std::make_unique<Call>();
    Call& call = *owned;
    call.ios.assign(ios.begin(), ios.end());
    call.delivered.assign(ios.size(), 0);
    calls_.emplace(id, std::move(owned));
    // A free slot grants transmission with the request (released by complete() or on timeout).
    request.granted = call.granted = call.grantAsked = limiter_.tryAcquire();

    std::vector<std::byte> frame;
    proto::encode(frame, id, request);
    const auto started = reactor_.now();
    auto sendUntilClosed = [&](std::stop_token timeout) -> coio::Task<coio::Result<void>> {
      std::stop_source either;
      const auto forward = [&either] { either.request_stop(); };
      const std::stop_callback onTimeout(timeout, forward);
      const std::stop_callback onClose(stop_.get_token(), forward);
      co_return co_await channel_->send(frame, either.get_token());
    };
    coio::Result<void> sent = co_await coio::withTimeout(reactor_, sendUntilClosed, options_.timeout);
    if (!sent) {
      releaseSlot(call);
      calls_.erase(id);
      // A frame cut short (TCP) leaves the stream unusable: end the
      // connection, so that every call learns it.
      if (channel_->broken()) channel_->abort();
      co_return failure_ ? failure_ : sent.error();
    }
    const auto left = std::max(options_.timeout - (reactor_.now() - started),
                               std::chrono::steady_clock::duration::zero());
    // The response, the deadline, or the caller's stop (its task's token).
    const coio::Result<void> answered = co_await coio::waitFor(reactor_, call.done, left);
    const bool due = !answered && answered.error() == std::errc::timed_out;
    const bool stopped = !answered && !due;  // the caller gave up
    if ((due || stopped) && call.receiving) {
      // Its data is being read into the caller's buffers and the rest is
      // late: only cancelling the read gets them back now. The stream's
      // place is then lost, so the reader fails every call (this one with
      // timed_out, unless its read won the race) and shuts the connection.
      readStop_.request_stop();
      // A cancelled read resumes the reader once the kernel has let go of
      // the buffers; returning before that would let them be freed under it.
      // (Not under the caller's token, which may be stopped: this wait must end
      // with the reader's.)
      co_await call.done.wait();
    } else if (due || stopped) {
      // The response may still come: the reader then drains its data.
      call.abandoned = true;
      const bool mayBeWriting = call.granted && channel_->writesRemote();
      releaseSlot(call);
      // Granted over RDMA: the server may be writing into the destinations
      // right now. Only a dead queue pair guarantees it stops; the reader
      // then fails every call (and may free this one: do not touch it).
      if (mayBeWriting) channel_->abort();
      co_return std::make_error_code(due ? std::errc::timed_out : std::errc::operation_canceled);
    }
    coio::Result<std::vector<ReadOutcome>> result = std::move(call.result);
    releaseSlot(call);  // normally done by complete(); never leak a slot
    calls_.erase(id);
    co_return result;
  }

  /// Closes the connection; pending batchReads fail with Errc::closed.
  coio::Task<void> close() {
    stop_.request_stop();
    readStop_.request_stop();
    co_await scope_.join();
    co_await channel_->close();
  }

  /// Why the connection failed, or an empty error_code.
  std::error_code failure() const noexcept { return failure_; }

 private:
  struct Call {
    std::vector<ReadOp> ios;
    std::vector<std::uint32_t> delivered;  // TCP: bytes of each IO received so far (IoData)
    coio::Event done;  // set when `result` is set
    coio::Result<std::vector<ReadOutcome>> result = coio::Errc::closed;
    bool grantAsked = false;
    bool granted = false;    // holds a limiter slot
    bool abandoned = false;  // timed out: its destinations are gone
    bool receiving = false;  // a piece of its data is being read into `ios`
  };

  // Gives a request slot back when batchRead returns.
  struct RequestSlot {
    coio::Semaphore& slots;
    ~RequestSlot() { slots.release(); }
  };

  ClientConnection(std::unique_ptr<Channel<R>> channel, TransmissionLimiter& limiter, ClientOptions options)
      : channel_(std::move(channel)),
        reactor_(channel_->reactor()),
        limiter_(limiter),
        options_(options),
        requestSlots_(std::max<std::size_t>(options.maxRequestsInFlight, 1)) {}

  void releaseSlot(Call& call) noexcept {
    if (std::exchange(call.granted, false)) limiter_.release();
  }

  void complete(std::uint64_t id, Call& call, coio::Result<std::vector<ReadOutcome>> result) {
    releaseSlot(call);
    if (call.abandoned) {
      calls_.erase(id);
      return;
    }
    call.result = std::move(result);
    call.done.set();
  }

  coio::Task<void> readResponses() {
    ReadFailure failure;
    bool peerClosing = false;  // the server sent Error: it closes, nothing to answer
    std::vector<std::byte> scratch;
    for (;;) {
      coio::Result<IncomingFrame> frame = co_await channel_->readFrame(failure, readStop_.get_token());
      if (!frame) break;
      const std::uint64_t id = frame->header.requestId;
      const auto found = calls_.find(id);
      Call* call = found == calls_.end() ? nullptr : found->second.get();
      if (frame->header.type == proto::MessageType::error) {
        coio::Result<proto::ErrorFrame> error = proto::decodeError(frame->payload);
        failure = {error ? make_error_code(error->code) : error.error(), id};
        peerClosing = true;
        break;
      }
      if (call == nullptr) {
        failure = {proto::ProtocolErrc::unexpectedMessage, id};
        break;
      }
      if (frame->header.type == proto::MessageType::transmitRequest && !call->grantAsked) {
        call->grantAsked = true;
        if (!call->abandoned && !stop_.stop_requested()) scope_.spawn(grant(id));  // close() may be joining
        continue;
      }
      if (frame->header.type == proto::MessageType::ioData) {
        call->receiving = true;
        co_await receivePiece(*call, frame->payload, scratch, failure, id);
        call->receiving = false;
        if (failure.error) break;
        continue;
      }
      if (frame->header.type != proto::MessageType::batchReadResponse) {
        failure = {proto::ProtocolErrc::unexpectedMessage, id};
        break;
      }
      coio::Result<std::vector<ReadOutcome>> outcomes = outcomesOf(*call, frame->payload, failure, id);
      if (failure.error) break;
      complete(id, *call, std::move(outcomes));
    }
    fail(failure);
    if (failure.isProtocolError() && !peerClosing) co_await channel_->sendError(failure, std::chrono::seconds(1));
    if (!stop_.stop_requested()) channel_->abort();  // tell the server now; close() closes properly
  }

  // Reads the data after an IoData frame into the call's destination (or
  // into `scratch` for an abandoned call). Sets `failure` on errors: a
  // piece out of place (PROTOCOL.md's checks) is a protocol error.
  coio::Task<void> receivePiece(Call& call, std::span<const std::byte> payload, std::vector<std::byte>& scratch,
                                ReadFailure& failure, std::uint64_t id) {
    coio::Result<proto::IoData> data = proto::decodeIoData(payload);
    if (!data) {
      failure = {data.error(), id};
      co_return;
    }
    const std::size_t io = data->ioIndex;
    if (channel_->writesRemote() || io >= call.ios.size() || data->offset != call.delivered[io] ||
        std::uint64_t{data->offset} + data->length > call.ios[io].length) {
      failure = {proto::ProtocolErrc::unexpectedMessage, id};
      co_return;
    }
    std::span<std::byte> into;
    if (call.abandoned) {
      scratch.resize(data->length);
      into = scratch;
    } else {
      into = call.ios[io].into.subspan(data->offset, data->length);
    }
    coio::Result<void> got = co_await channel_->receiveData(into, readStop_.get_token());
    if (!got) {
      failure = {got.error(), id};
      co_return;
    }
    call.delivered[io] += data->length;
  }

  // Decodes a response (the request's last frame) into per-IO outcomes,
  // checking them against what was delivered. Sets `failure` on errors.
  coio::Result<std::vector<ReadOutcome>> outcomesOf(const Call& call, std::span<const std::byte> payload,
                                                    ReadFailure& failure, std::uint64_t id) const {
    const auto count = static_cast<std::uint32_t>(call.ios.size());
    coio::Result<proto::BatchReadResponse> response = proto::decodeBatchReadResponse(payload, count);
    if (response && response->results.size() != count) response = proto::ProtocolErrc::truncated;
    if (!response) {
      failure = {response.error(), id};
      return response.error();
    }
    std::vector<ReadOutcome> outcomes(count);
    for (std::size_t i = 0; i < count; ++i) {
      const proto::IoResult& r = response->results[i];
      const bool ok = r.status == proto::IoStatus::ok;
      // TCP: an ok IO's pieces add up to its byte count (a failed IO may
      // have sent some before it failed: they mean nothing).
      const bool counted = channel_->writesRemote() || r.bytes == call.delivered[i];
      if ((ok && (r.bytes > call.ios[i].length || !counted)) || (!ok && r.bytes != 0)) {
        failure = {proto::ProtocolErrc::unexpectedMessage, id};
        return failure.error;
      }
      outcomes[i] = {r.status, r.bytes, r.checksum, false};
      // An abandoned call's destinations are the caller's again: not read.
      if (ok && options_.verifyChecksums && !call.abandoned) {
        outcomes[i].checksumMismatch = crc32c(call.ios[i].into.first(r.bytes)) != r.checksum;
      }
    }
    return outcomes;
  }

  // Grants transmission of request `id` once a limiter slot is free.
  coio::Task<void> grant(std::uint64_t id) {
    const bool slot = co_await limiter_.acquire(stop_.get_token());
    if (!slot) co_return;
    const auto found = calls_.find(id);
    // Also give the slot back if the call already completed (e.g. the server
    // answered timedOut while this grant waited for a slot).
    if (failure_ || found == calls_.end() || found->second->abandoned || found->second->done.isSet()) {
      limiter_.release();
      co_return;
    }
    found->second->granted = true;
    std::vector<std::byte> frame;
    proto::encodeEmpty(frame, proto::MessageType::transmitGrant, id);
    (void)co_await channel_->send(frame, stop_.get_token());  // a broken connection ends the reader too
  }

  // Fails every call: the connection is unusable from now on.
  void fail(const ReadFailure& failure) {
    failure_ = failure.error ? failure.error : make_error_code(coio::Errc::closed);
    // A cancelled read: close(), or a batchRead that timed out mid-response.
    if (failure_ == std::errc::operation_canceled) {
      failure_ = stop_.stop_requested() ? make_error_code(coio::Errc::closed)
                                        : std::make_error_code(std::errc::timed_out);
    }
    std::vector<std::uint64_t> ids;
    for (auto& [id, call] : calls_) ids.push_back(id);
    // complete() may resume a batchRead inline (one waiting for its cancelled
    // read), which erases its own call: look each one up afresh.
    for (std::uint64_t id : ids) {
      if (const auto found = calls_.find(id); found != calls_.end()) complete(id, *found->second, failure_);
    }
  }

  std::unique_ptr<Channel<R>> channel_;
  R& reactor_;
  TransmissionLimiter& limiter_;
  ClientOptions options_;
  coio::Semaphore requestSlots_;
  std::uint64_t nextId_ = 1;
  std::unordered_map<std::uint64_t, std::unique_ptr<Call>> calls_;
  std::error_code failure_;
  std::stop_source stop_;
  std::stop_source readStop_;  // cancels the reader's read: close(), or a timeout mid-response
  coio::AsyncScope scope_;  // the reader and grant tasks
};

/// Opens a fresh connected channel to the server (giving up when `stop` is
/// requested): how StorageClient replaces a connection the server closed
/// as idle. TCP: connect; RDMA: connect over TCP, then RdmaChannel::connect.
template <coio::Reactor R>
using ChannelConnector = std::function<coio::Task<coio::Result<std::unique_ptr<Channel<R>>>>(std::stop_token stop)>;

/// A client of a storage server: batchReads over one ClientConnection at a
/// time (its guarantees hold for each).
///
/// Guarantees, beyond those:
/// - The server closing a connection as idle (Error `idleTimeout`,
///   PROTOCOL.md) is routine: the next batchRead opens a new connection
///   with the connector and registers again the memory given to
///   registerMemory(); no error reaches the caller. A batchRead that
///   crossed the close (the server never served it) is sent again, once,
///   on the new connection. One reconnection at a time, bounded by
///   ClientOptions::timeout; the batchRead that made one that failed
///   fails with its error (e.g. connection_refused, timed_out), and the
///   next batchRead tries again.
/// - Any other failure of the connection stays: every later batchRead
///   fails at once. A client made by open() has no connector: an idle
///   close is then a failure like any other.
/// - Used on its reactor's loop thread only; every awaitable resumes there.
/// - `co_await close()` before destruction, once no batchRead is pending.
template <coio::Reactor R>
class StorageClient {
 public:
  using Connection = ClientConnection<R>;

  /// Connects over TCP, and reconnects the same way.
  static coio::Task<coio::Result<std::unique_ptr<StorageClient>>> connect(R& reactor, coio::SocketAddress server,
                                                                          TransmissionLimiter& limiter,
                                                                          ClientOptions options = {}) {
    co_return co_await connect(
        [&reactor, server](std::stop_token stop) { return connectTcp(reactor, server, std::move(stop)); }, limiter,
        options);
  }

  /// Connects with `connector`, and reconnects with it.
  static coio::Task<coio::Result<std::unique_ptr<StorageClient>>> connect(ChannelConnector<R> connector,
                                                                          TransmissionLimiter& limiter,
                                                                          ClientOptions options = {}) {
    coio::Result<std::unique_ptr<Channel<R>>> channel = co_await connector({});
    if (!channel) co_return channel.error();
    std::unique_ptr<StorageClient> client = open(std::move(*channel), limiter, options);
    client->connector_ = std::move(connector);
    co_return std::move(client);
  }

  /// A client over a connected channel (e.g. RdmaChannel::connect's); it
  /// never reconnects.
  static std::unique_ptr<StorageClient> open(std::unique_ptr<Channel<R>> channel, TransmissionLimiter& limiter,
                                             ClientOptions options = {}) {
    R& reactor = channel->reactor();
    return std::unique_ptr<StorageClient>(
        new StorageClient(Connection::open(std::move(channel), limiter, options), reactor, limiter, options));
  }

  StorageClient(const StorageClient&) = delete;
  StorageClient& operator=(const StorageClient&) = delete;

  /// Registers memory that IOs may land in, once (RDMA needs it; TCP
  /// accepts any memory and this does nothing). Errors: the registration's.
  coio::Result<void> registerMemory(std::span<std::byte> memory) {
    coio::Result<void> registered = connection_->registerMemory(memory);
    if (registered) memory_.push_back(memory);
    return registered;
  }

  /// See ClientConnection::batchRead.
  coio::Task<coio::Result<std::vector<ReadOutcome>>> batchRead(std::span<const ReadOp> ios) {
    for (bool resent = false;; resent = true) {
      coio::Result<std::shared_ptr<Connection>> connection = co_await usableConnection();
      if (!connection) co_return connection.error();
      coio::Result<std::vector<ReadOutcome>> result = co_await (*connection)->batchRead(ios);
      const bool crossedIdleClose = !result && connector_ && closedIdle(**connection) &&
                                    result.error() == (*connection)->failure();
      co_await release(std::move(*connection));
      if (!crossedIdleClose || resent) co_return result;
    }
  }

  /// Closes the connection; pending batchReads fail with Errc::closed.
  coio::Task<void> close() { co_await connection_->close(); }

  /// Why the connection failed, or an empty error_code (also after an idle
  /// close that the next batchRead repairs).
  std::error_code failure() const noexcept {
    return connector_ && closedIdle(*connection_) ? std::error_code{} : connection_->failure();
  }

 private:
  StorageClient(std::unique_ptr<Connection> connection, R& reactor, TransmissionLimiter& limiter,
                ClientOptions options)
      : connection_(std::move(connection)), reactor_(reactor), limiter_(limiter), options_(options) {}

  static coio::Task<coio::Result<std::unique_ptr<Channel<R>>>> connectTcp(R& reactor, coio::SocketAddress server,
                                                                         std::stop_token stop) {
    coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, server, std::move(stop));
    if (!stream) co_return stream.error();
    (void)stream->setNoDelay(true);
    co_return std::unique_ptr<Channel<R>>(std::make_unique<TcpChannel<R>>(std::move(*stream)));
  }

  static bool closedIdle(const Connection& connection) noexcept {
    return connection.failure() == proto::ProtocolErrc::idleTimeout;
  }

  // The connection to use: a new one if the server closed the current one
  // as idle (one reconnection at a time; the others wait for it).
  coio::Task<coio::Result<std::shared_ptr<Connection>>> usableConnection() {
    if (!connector_ || !closedIdle(*connection_)) co_return connection_;
    co_await reconnecting_.acquire();
    struct Unlock {
      coio::Semaphore& lock;
      ~Unlock() { lock.release(); }
    };
    const Unlock unlock{reconnecting_};
    if (!closedIdle(*connection_)) co_return connection_;  // replaced while this one waited
    coio::Result<std::unique_ptr<Channel<R>>> channel =
        co_await coio::withTimeout(reactor_, connector_, options_.timeout);
    if (!channel) co_return channel.error();
    for (std::span<std::byte> memory : memory_) {
      coio::Result<void> registered = (*channel)->registerMemory(memory);
      if (!registered) {
        co_await (*channel)->close();
        co_return registered.error();
      }
    }
    std::shared_ptr<Connection> old =
        std::exchange(connection_, Connection::open(std::move(*channel), limiter_, options_));
    co_await release(std::move(old));
    co_return connection_;
  }

  // Closes a replaced connection once its last batchRead is done with it.
  coio::Task<void> release(std::shared_ptr<Connection> connection) {
    if (connection != connection_ && connection.use_count() == 1) co_await connection->close();
  }

  std::shared_ptr<Connection> connection_;
  R& reactor_;
  TransmissionLimiter& limiter_;
  ClientOptions options_;
  ChannelConnector<R> connector_;  // empty: never reconnects
  std::vector<std::span<std::byte>> memory_;  // registered with every connection
  coio::Semaphore reconnecting_{1};
};

}  // namespace storage
