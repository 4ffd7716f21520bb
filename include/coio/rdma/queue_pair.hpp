#pragma once
// QueuePair, one RC queue pair: the connection (the TCP handshake, the
// state changes), two-sided messages with their credits and acks, one-sided
// RDMA chains, and the watcher that dispatches their completions. One file,
// though long: every part reads and writes the same private state (the
// posted work, the credits, the error that fails the pair) under one set of
// invariants, which a split would spread over headers that each see all of it.
#include <coio/core/baton.hpp>
#include <coio/core/batch_semaphore.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/rdma/completion_queue.hpp>
#include <coio/rdma/config.hpp>
#include <coio/rdma/detail/handshake.hpp>
#include <coio/rdma/detail/wr_id.hpp>
#include <coio/rdma/device.hpp>
#include <coio/rdma/error.hpp>
#include <coio/rdma/memory_region.hpp>
#include <coio/rdma/queue_pair_state.hpp>
#include <coio/rdma/rdma_batch.hpp>
#include <coio/reactor/reactor.hpp>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

namespace coio::rdma {

namespace detail {

// One ibv_post_send chain of RDMA work requests. Its last work request is
// the only signalled one; the others report only failures (flushes
// included), always before the last one's completion (in-order send queue).
struct RdmaChain {
  explicit RdmaChain(std::uint32_t n) noexcept : workRequests(n) {}
  void fail(ibv_wc_status s) noexcept {
    if (status == IBV_WC_SUCCESS) status = s;  // the first error wins
  }
  std::uint32_t workRequests;
  ibv_wc_status status = IBV_WC_SUCCESS;
  Baton done;
};

struct FreeMemory {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};

}  // namespace detail

/// A reliable-connected queue pair bound to a reactor of type R, with one
/// completion queue and channel of its own (3FS's IBSocket).
///
/// Guarantees:
/// - Everything is called and awaited on the reactor's loop thread, and
///   every awaiting coroutine resumes there, inline from the drain of the
///   completion queue (driven by `reactor.readable(channel fd)`; no thread
///   busy-polls: after a burst the watcher polls on for at most
///   config.pollBeforeSleep loop iterations of up to 1 + config.spinPolls
///   CQ polls each, then sleeps). Many coroutines may have operations in
///   flight at once.
/// - Nothing can overflow: the send queue, receive queue and CQ are sized by
///   QueuePairSizes and every producer is bounded (RDMA: a BatchSemaphore of
///   maxRdmaWr work requests, returned only on the chain's completion;
///   messages: send buffers, receive credits and ACK slots), so no RNR and
///   no CQ overrun can happen.
/// - A failed completion (or post) moves the queue pair to `error`: in-flight
///   operations complete with their error (flush completions are consumed;
///   an operation's context lives until its last completion, even when
///   ibv_post_send failed half-way), queued ones with RdmaErrc::queuePairError.
/// - `co_await close()` must end every QueuePair before it is destroyed
///   (asserted): it tells the peer, drains outstanding work (bounded by
///   drainTimeout), and stops the completion watcher.
///
/// Bounding an operation in time (e.g. with coio::withTimeout):
/// - Posted work to a peer that stopped answering (process killed, QP
///   aborted, path down) fails within transportFailureBound(config), 0.47 s
///   with the defaults: the oldest unacknowledged work request with
///   IBV_WC_RETRY_EXC_ERR, the rest flushed (IBV_WC_WR_FLUSH_ERR), waiting
///   ones with RdmaErrc::queuePairError; close() then returns as soon.
/// - send(), recv(), rdmaWrite(), rdmaRead() and RdmaBatch::post() take a
///   std::stop_token (request it on the loop thread). While they wait (for
///   a credit, a send buffer, a message, RDMA work-request tokens) a stop
///   ends them with std::errc::operation_canceled, nothing posted and the
///   queue pair still ready.
/// - A posted SEND is not waited for: send() completes at the post.
/// - A posted RDMA WRITE or READ cannot be recalled (the NIC may still be
///   moving its bytes): stopping it moves the queue pair to `error` (error()
///   is std::errc::operation_canceled; every other operation fails, as after
///   abort()), and the operation completes once its flush completion has
///   arrived, so its buffers are free when it returns: with
///   std::errc::operation_canceled, or with success if it finished first.
/// - connect() is bounded by its stream (shut it down to end it); close()
///   by drainTimeout.
///
/// Lifetime: created by `create()` (immovable: work-request ids point into
/// it); the Device and the reactor must outlive it.
///
/// Example (one end of a connection; runs in CI only where there is a
/// device, the Soft-RoCE guest, and is compiled everywhere):
/// \snippet api_examples_rdma.cpp QueuePair
template <Reactor R>
class QueuePair {
 public:
  /// Creates the CQ, the QP (in INIT, receives posted) and the message
  /// buffers, after checking `config` against the device (RdmaErrc::
  /// deviceTooSmall with the offending limit in `why`).
  static Result<std::unique_ptr<QueuePair>> create(R& reactor, const Device& device, QueuePairConfig config = {},
                                                   std::string* why = nullptr) {
    if (Result<void> ok = checkConfig(config, device.limits(), why); !ok) return ok.error();
    std::unique_ptr<QueuePair> qp(new QueuePair(reactor, device, config));
    if (Result<void> ok = qp->init(); !ok) {
      if (why) *why = "creating the queue pair: " + ok.error().message();
      return ok.error();
    }
    reactor.spawn(qp->watchCompletions(WatcherLife(*qp)));
    return qp;
  }

  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;
  ~QueuePair() { COIO_ASSERT(!watcherAlive_, "QueuePair destroyed without co_await close()"); }

  /// Connects to the peer at the other end of `stream`, which does the same
  /// (the exchange is symmetric): each side sends {magic, QPN, PSN, LID,
  /// port, active MTU, link layer, responder read depth, GID, message
  /// config}, moves to RTR (path MTU = the smaller of both; RoCE: GRH with
  /// the peer's GID and our selected GID index) and RTS (timeout, retryCount,
  /// rnrRetry from the config; max_rd_atomic = the smallest of ours, the
  /// device's and the peer's), then both exchange one byte so that neither
  /// sends before the other is at RTS. Errors: the stream's, the verbs',
  /// RdmaErrc::handshake for a foreign or incompatible peer.
  Task<Result<void>> connect(TcpStream<R>& stream) {
    if (state_ != QueuePairState::init) co_return stateError();
    moveTo(QueuePairState::connecting);
    Result<void> r = co_await handshake(stream);
    if (!r) {
      enterError(r.error());
      co_return r;
    }
    if (state_ != QueuePairState::connecting) co_return stateError();  // closed meanwhile
    moveTo(QueuePairState::ready);
    credits_.release(config_.messageBuffers);
    co_return Result<void>{};
  }

  /// Where the queue pair is in its life (init, connecting, ready, close, error).
  QueuePairState state() const noexcept { return state_; }
  /// The error that moved the queue pair to `error` (empty otherwise).
  std::error_code error() const noexcept { return error_; }
  /// The configuration it was created with.
  const QueuePairConfig& config() const noexcept { return config_; }
  /// The device it was created on.
  const Device& device() const noexcept { return device_; }
  /// The reactor its operations resume on.
  R& reactor() const noexcept { return reactor_; }
  /// The queue pair number (QPN) the peer addresses.
  std::uint32_t qpNumber() const noexcept { return qp_->qp_num; }

  // --- RDMA ----------------------------------------------------------------

  /// An empty batch of RDMA WRITEs or READs on this queue pair, to fill with add() and post().
  RdmaBatch<R> rdmaBatch(RdmaOp op) noexcept { return RdmaBatch<R>(*this, op); }

  /// Writes the local buffers, in order, to the contiguous `remote` range.
  /// `stop`: see "Bounding an operation in time" above.
  Task<Result<void>> rdmaWrite(RemoteBuffer remote, std::span<const LocalBuffer> locals, std::stop_token stop = {}) {
    return rdmaOne(RdmaOp::write, remote, locals, std::move(stop));
  }
  /// Reads the contiguous `remote` range into the local buffers, in order.
  /// `stop`: see "Bounding an operation in time" above.
  Task<Result<void>> rdmaRead(RemoteBuffer remote, std::span<const LocalBuffer> locals, std::stop_token stop = {}) {
    return rdmaOne(RdmaOp::read, remote, locals, std::move(stop));
  }

  // --- messages --------------------------------------------------------------

  /// Copies `message` (at most config().messageSize bytes) into a send
  /// buffer and posts it; completes once posted, not once delivered (when
  /// called from a coroutine the completion watcher resumed, the post goes
  /// out with the others of that reaping, right after it; a failure to post
  /// moves the queue pair to `error`, as a failed delivery does). Waits
  /// for a receive credit (a buffer free at the peer) and a free send
  /// buffer; messages arrive in send order. Errors: RdmaErrc::
  /// messageTooLarge, the state's error (Errc::closed after close(),
  /// Errc::eof after the peer closed, RdmaErrc::queuePairError),
  /// std::errc::operation_canceled when `stop` ends the wait (nothing sent).
  Task<Result<void>> send(std::span<const std::byte> message, std::stop_token stop = {}) {
    if (message.size() > config_.messageSize) co_return RdmaErrc::messageTooLarge;
    if (state_ != QueuePairState::ready) co_return stateError();
    const bool credit = co_await acquireUnlessStopped(one(credits_), stop);
    if (!credit) co_return waitError(stop);
    const bool buffer = co_await acquireUnlessStopped(one(sendBuffers_), stop);
    if (!buffer || state_ != QueuePairState::ready) {
      if (state_ == QueuePairState::ready) credits_.release();  // cancelled: the credit is still good
      if (buffer) sendBuffers_.release();
      co_return waitError(stop);
    }
    // From here to the post nothing suspends, so buffers are posted in ring order.
    const std::uint32_t index = sendHead_;
    sendHead_ = (sendHead_ + 1) % config_.messageBuffers;
    std::byte* data = sendBuffer(index);
    if (!message.empty()) std::memcpy(data, message.data(), message.size());
    // Signal every signalBatch-th send, and the one that takes the last free
    // buffer: a sender waiting for buffers always has a completion coming.
    ++unsignaled_;
    const bool signal = unsignaled_ >= config_.signalBatch || sendBuffers_.available() == 0;
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(data), static_cast<std::uint32_t>(message.size()), messageMr_->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = detail::WrId::send(signal ? unsignaled_ : 0).raw();
    wr.sg_list = &sge;
    wr.num_sge = message.empty() ? 0 : 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = signal ? IBV_SEND_SIGNALED : 0;
    if (signal) unsignaled_ = 0;
    co_return postSend(wr, signal);
  }

  /// Takes the next message into `out`: its size. Waits until one arrives.
  /// Messages that arrived before the peer closed are still delivered;
  /// then Errc::eof. RdmaErrc::bufferTooSmall leaves the message queued;
  /// std::errc::operation_canceled when `stop` ends the wait.
  Task<Result<std::size_t>> recv(std::span<std::byte> out, std::stop_token stop = {}) {
    bool got = received_.tryAcquire();
    if (!got && state_ == QueuePairState::ready) got = co_await acquireUnlessStopped(one(received_), stop);
    // Given up because the state changed: messages that arrived before still count.
    if (!got && !stop.stop_requested()) got = received_.tryAcquire();
    if (!got) co_return waitError(stop);
    const auto [index, length] = inbox_.front();
    if (length > out.size()) {
      received_.release();
      co_return RdmaErrc::bufferTooSmall;
    }
    inbox_.pop_front();
    if (length > 0) std::memcpy(out.data(), recvBuffer(index), length);
    if (state_ == QueuePairState::ready) {
      if (Result<void> r = postRecv(index); !r) {
        enterError(r.error());
        co_return r.error();
      }
      ++ackOwed_;
      sendAcks();
    }
    co_return std::size_t{length};
  }

  // --- closing ---------------------------------------------------------------

  /// Drops the connection at once, as a crash would: the QP moves to ERR
  /// without telling the peer (whose posted work fails with
  /// IBV_WC_RETRY_EXC_ERR within transportFailureBound() of its config),
  /// in-flight work is flushed and every operation fails; error() is
  /// std::errc::connection_aborted. close() is still required.
  void abort() { enterError(std::make_error_code(std::errc::connection_aborted)); }

  /// Closes the queue pair: operations still queued (waiting for a
  /// semaphore, a credit or a message) complete with Errc::closed; if
  /// connected, a CLOSE message tells the peer (whose recv() then yields
  /// Errc::eof); work already posted is given drainTimeout to complete, then
  /// the QP moves to ERR and its remaining work is flushed (its operations
  /// complete with IBV_WC_WR_FLUSH_ERR); finally the completion watcher
  /// stops. std::errc::timed_out if the work did not drain in time (the
  /// device is dead; operations still waiting then never resume). With a
  /// dead peer the posted work fails within transportFailureBound() and
  /// close() returns then, well before drainTimeout.
  /// Idempotent; a second call returns at once.
  Task<Result<void>> close() {
    if (closeStarted_) co_return Result<void>{};
    closeStarted_ = true;
    const bool wasReady = state_ == QueuePairState::ready;
    if (state_ != QueuePairState::close) moveTo(QueuePairState::close);
    abort_.request_stop();
    if (wasReady) {
      ibv_send_wr wr{};
      wr.wr_id = detail::WrId::close().raw();
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.imm_data = htonl(detail::Immediate::close().host());
      wr.send_flags = IBV_SEND_SIGNALED;
      (void)postSend(wr, true);  // a failure shows as an ERR QP; we flush anyway
    }
    bool drained = co_await waitIdle();
    moveQpToError();
    if (!drained) drained = co_await waitIdle();
    stopWatcher_.request_stop();
    co_await watcherDone_;
    reactor_.forget(cq_->fd());
    if (!drained) co_return std::errc::timed_out;
    co_return Result<void>{};
  }

 private:
  template <Reactor>
  friend class RdmaBatch;

  QueuePair(R& reactor, const Device& device, const QueuePairConfig& config)
      : reactor_(reactor), device_(device), config_(config), sizes_(QueuePairSizes::of(config)),
        rdmaTokens_(config.maxRdmaWr), credits_(0), sendBuffers_(config.messageBuffers), received_(0) {}

  Result<void> init() {
    // What one reaping of the CQ can collect (postSend), so that collecting never allocates.
    collectedSends_.reserve(std::size_t{config_.messageBuffers} + sizes_.ackSlots + 1);
    Result<CompletionQueue> cq =
        CompletionQueue::create(device_, static_cast<int>(sizes_.cqe), config_.eventAckBatch);
    if (!cq) return cq.error();
    cq_.emplace(std::move(*cq));

    const std::size_t bytes = (config_.messageBuffers + sizes_.recvBuffers) * std::size_t{config_.messageSize};
    const std::size_t page = 4096;
    memory_.reset(static_cast<std::byte*>(std::aligned_alloc(page, (bytes + page - 1) / page * page)));
    if (!memory_) return systemError(ENOMEM);
    Result<MemoryRegion> mr = MemoryRegion::create(device_, {memory_.get(), bytes}, Access::localWrite);
    if (!mr) return mr.error();
    messageMr_.emplace(std::move(*mr));

    ibv_qp_init_attr attr{};
    attr.send_cq = cq_->get();
    attr.recv_cq = cq_->get();
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = static_cast<std::uint32_t>(sizes_.maxSendWr);
    attr.cap.max_recv_wr = static_cast<std::uint32_t>(sizes_.maxRecvWr);
    attr.cap.max_send_sge = config_.maxSge;
    attr.cap.max_recv_sge = 1;
    qp_.reset(::ibv_create_qp(device_.protectionDomain(), &attr));
    if (!qp_) return systemError(errno ? errno : ENOMEM);

    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.pkey_index = 0;
    init.port_num = device_.port();
    init.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int rc = ::ibv_modify_qp(qp_.get(), &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        rc != 0) {
      return systemError(rc);
    }
    // Receives may be posted in INIT: every buffer is ready before the peer can send.
    for (std::uint32_t i = 0; i < sizes_.recvBuffers; ++i) {
      if (Result<void> r = postRecv(i); !r) return r;
    }
    std::random_device random;
    psn_ = random() & 0xffffff;
    return {};
  }

  std::byte* sendBuffer(std::uint32_t i) const noexcept { return memory_.get() + std::size_t{i} * config_.messageSize; }
  std::byte* recvBuffer(std::uint32_t i) const noexcept {
    return memory_.get() + (std::size_t{config_.messageBuffers} + i) * config_.messageSize;
  }

  // --- connection --------------------------------------------------------------

  detail::ConnectInfo localInfo() const noexcept {
    const ibv_port_attr& port = device_.portAttributes();
    detail::ConnectInfo info;
    info.qpn = qp_->qp_num;
    info.psn = psn_;
    info.lid = port.lid;
    info.port = device_.port();
    info.mtu = static_cast<std::uint8_t>(port.active_mtu);
    info.linkLayer = port.link_layer;
    info.maxRdAtomic = static_cast<std::uint8_t>(responderDepth());
    std::memcpy(info.gid.data(), device_.gid().raw, info.gid.size());
    info.messageSize = config_.messageSize;
    info.messageBuffers = config_.messageBuffers;
    info.ackBatch = config_.ackBatch;
    return info;
  }

  std::uint32_t responderDepth() const noexcept {
    return std::min({config_.maxRdAtomic, device_.limits().maxQpRdAtom, 255u});
  }

  Task<Result<void>> handshake(TcpStream<R>& stream) {
    const detail::ConnectInfo mine = localInfo();
    const detail::ConnectInfo::Wire wire = mine.encode();
    Result<void> io = co_await stream.writeAll(wire);
    if (!io) co_return io;
    detail::ConnectInfo::Wire peerWire{};
    io = co_await stream.readExact(peerWire);
    if (!io) co_return io;
    Result<detail::ConnectInfo> peer = detail::ConnectInfo::decode(peerWire);
    if (!peer) co_return peer.error();
    if (peer->linkLayer != mine.linkLayer || peer->messageSize != mine.messageSize ||
        peer->messageBuffers != mine.messageBuffers || peer->ackBatch != mine.ackBatch) {
      co_return RdmaErrc::handshake;
    }
    if (Result<void> r = moveToRtr(*peer); !r) co_return r;
    if (Result<void> r = moveToRts(*peer); !r) co_return r;
    const std::byte ready{'R'};
    io = co_await stream.writeAll(std::span(&ready, 1));
    if (!io) co_return io;
    std::byte peerReady{};
    io = co_await stream.readExact(std::span(&peerReady, 1));
    if (!io) co_return io;
    if (peerReady != ready) co_return RdmaErrc::handshake;
    co_return Result<void>{};
  }

  Result<void> moveToRtr(const detail::ConnectInfo& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = detail::pathMtu(device_.portAttributes().active_mtu, static_cast<ibv_mtu>(peer.mtu));
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = static_cast<std::uint8_t>(responderDepth());
    a.min_rnr_timer = config_.minRnrTimer;
    a.ah_attr.port_num = device_.port();  // ours (3FS uses the peer's: right only when both are 1)
    a.ah_attr.sl = 0;
    if (device_.isRoce()) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid.data(), peer.gid.size());
      a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(device_.gidIndex());
      a.ah_attr.grh.hop_limit = 64;
    } else {
      a.ah_attr.dlid = peer.lid;
    }
    const int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (int rc = ::ibv_modify_qp(qp_.get(), &a, mask); rc != 0) return systemError(rc);
    return {};
  }

  Result<void> moveToRts(const detail::ConnectInfo& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = config_.timeout;
    a.retry_cnt = config_.retryCount;
    a.rnr_retry = config_.rnrRetry;
    a.sq_psn = psn_;
    a.max_rd_atomic = static_cast<std::uint8_t>(
        std::min({config_.maxRdAtomic, device_.limits().maxQpInitRdAtom, std::uint32_t{peer.maxRdAtomic}, 255u}));
    const int mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                     IBV_QP_MAX_QP_RD_ATOMIC;
    if (int rc = ::ibv_modify_qp(qp_.get(), &a, mask); rc != 0) return systemError(rc);
    return {};
  }

  // --- posting -------------------------------------------------------------------

  Task<Result<void>> rdmaOne(RdmaOp op, RemoteBuffer remote, std::span<const LocalBuffer> locals,
                             std::stop_token stop) {
    RdmaBatch<R> batch(*this, op);
    if (Result<void> added = batch.add(remote, locals); !added) co_return added;
    co_return co_await batch.post(std::move(stop));
  }

  Task<Result<void>> postBatch(ibv_wr_opcode op, std::span<const detail::RdmaWr> wrs, std::span<ibv_sge> sges,
                               std::stop_token stop) {
    const std::size_t perPost = config_.maxRdmaWrPerPost;
    if (wrs.size() <= perPost) co_return co_await postChain(op, wrs, sges, std::move(stop));
    std::vector<Task<Result<void>>> chains;
    for (std::size_t i = 0; i < wrs.size(); i += perPost) {
      chains.push_back(postChain(op, wrs.subspan(i, std::min(perPost, wrs.size() - i)), sges, stop));
    }
    std::vector<Result<void>> results = co_await collectAllRange(std::move(chains));
    for (Result<void>& r : results) {
      if (!r) co_return r;
    }
    co_return Result<void>{};
  }

  Task<Result<void>> postChain(ibv_wr_opcode op, std::span<const detail::RdmaWr> wrs, std::span<ibv_sge> sges,
                               std::stop_token stop) {
    if (wrs.empty()) co_return Result<void>{};
    const auto n = static_cast<std::uint32_t>(wrs.size());
    const auto tokens = [this, n](std::stop_token t) { return rdmaTokens_.acquire(n, std::move(t)); };
    const bool admitted = co_await acquireUnlessStopped(tokens, stop);
    if (!admitted) co_return waitError(stop);
    if (state_ != QueuePairState::ready || stop.stop_requested()) {
      rdmaTokens_.release(n);
      co_return waitError(stop);
    }
    auto chain = std::make_unique<detail::RdmaChain>(n);
    std::vector<ibv_send_wr> list(n);
    for (std::uint32_t i = 0; i < n; ++i) {
      const bool last = i + 1 == n;
      ibv_send_wr& wr = list[i];
      wr.wr_id = detail::WrId::rdma(chain.get(), last).raw();
      wr.sg_list = &sges[wrs[i].firstSge];
      wr.num_sge = static_cast<int>(wrs[i].sgeCount);
      wr.opcode = op;
      wr.send_flags = last ? IBV_SEND_SIGNALED : 0;
      wr.wr.rdma.remote_addr = wrs[i].remoteAddr;
      wr.wr.rdma.rkey = wrs[i].rkey;
      wr.next = last ? nullptr : &list[i + 1];
    }
    postCollectedSends();  // messages posted before this chain go first
    ibv_send_wr* bad = nullptr;
    if (int rc = ::ibv_post_send(qp_.get(), list.data(), &bad); rc != 0) {
      if (bad == list.data()) {
        rdmaTokens_.release(n);
      } else {
        // The posted prefix is unsignaled: its flush completions still name
        // the chain, which therefore lives as long as the queue pair.
        orphans_.push_back(std::move(chain));
      }
      enterError(systemError(rc));
      co_return systemError(rc);
    }
    ++pendingSignaled_;
    {
      // Posted work cannot be recalled: a stop fails the queue pair, whose
      // flush completes the chain (the NIC is then done with its buffers).
      const std::stop_callback cancel(stop, [this] { failPostedWork(); });
      co_await chain->done;
    }
    if (chain->status == IBV_WC_SUCCESS) co_return Result<void>{};
    if (chain->status == IBV_WC_WR_FLUSH_ERR && stop.stop_requested()) co_return std::errc::operation_canceled;
    co_return completionError(chain->status);
  }

  // A message-path work request (SEND, ACK, CLOSE; at most one SGE). While
  // the watcher reaps the CQ it is collected, and goes out with the others
  // the resumed coroutines post, in one ibv_post_send (one doorbell: a
  // system call on rxe) when the reaping ends.
  Result<void> postSend(ibv_send_wr& wr, bool signalled) {
    COIO_ASSERT(wr.num_sge <= 1 && wr.next == nullptr, "message work requests are single, with at most one SGE");
    if (signalled) ++pendingSignaled_;
    if (collectingSends_) {
      // No allocation: bounded by send buffers, ACK slots and one CLOSE (see init()).
      collectedSends_.push_back({wr, wr.num_sge > 0 ? *wr.sg_list : ibv_sge{}});
      return {};
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = ::ibv_post_send(qp_.get(), &wr, &bad); rc != 0) {
      if (signalled) --pendingSignaled_;
      enterError(systemError(rc));
      return systemError(rc);
    }
    return {};
  }

  // Posts the collected message work requests, in order, as one chain.
  void postCollectedSends() noexcept {
    if (collectedSends_.empty()) return;
    for (std::size_t i = 0; i < collectedSends_.size(); ++i) {
      CollectedSend& c = collectedSends_[i];
      c.wr.sg_list = c.wr.num_sge > 0 ? &c.sge : nullptr;
      c.wr.next = i + 1 < collectedSends_.size() ? &collectedSends_[i + 1].wr : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = ::ibv_post_send(qp_.get(), &collectedSends_.front().wr, &bad); rc != 0) {
      // From `bad` on nothing was posted, so nothing will complete.
      for (ibv_send_wr* w = bad ? bad : &collectedSends_.front().wr; w != nullptr; w = w->next) {
        if (w->send_flags & IBV_SEND_SIGNALED) --pendingSignaled_;
      }
      enterError(systemError(rc));
    }
    collectedSends_.clear();
  }

  // Reaps the CQ with `reap` (drain or poll), collecting the sends it
  // triggers, and posts them.
  template <typename Reap>
  Result<std::size_t> reapCollectingSends(Reap reap) {
    collectingSends_ = true;
    Result<std::size_t> found = reap();
    collectingSends_ = false;
    postCollectedSends();
    return found;
  }

  Result<void> postRecv(std::uint32_t index) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(recvBuffer(index)), config_.messageSize, messageMr_->lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = detail::WrId::recv(index).raw();
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ::ibv_post_recv(qp_.get(), &wr, &bad); rc != 0) return systemError(rc);
    return {};
  }

  // Returns credits for consumed messages, ackBatch at a time, while ACK
  // slots are free (an ACK completing frees one and calls this again).
  void sendAcks() {
    while (state_ == QueuePairState::ready && ackOwed_ >= config_.ackBatch && acksInFlight_ < sizes_.ackSlots) {
      ibv_send_wr wr{};
      wr.wr_id = detail::WrId::ack().raw();
      wr.opcode = IBV_WR_SEND_WITH_IMM;
      wr.imm_data = htonl(detail::Immediate::ack(ackOwed_).host());
      wr.send_flags = IBV_SEND_SIGNALED;
      if (!postSend(wr, true)) return;
      ++acksInFlight_;
      ackOwed_ = 0;
    }
  }

  // --- completions ---------------------------------------------------------------

  // Tracks whether the watcher's frame exists: the reactor may destroy it
  // unfinished (when the reactor itself goes), and then nobody waits for it.
  // A parameter of the watcher, so that it lives from the spawn on: a
  // QueuePair destroyed before its watcher first ran is caught too.
  class WatcherLife {
   public:
    explicit WatcherLife(QueuePair& qp) noexcept : qp_(&qp) { qp.watcherAlive_ = true; }
    WatcherLife(WatcherLife&& other) noexcept : qp_(std::exchange(other.qp_, nullptr)) {}
    WatcherLife& operator=(WatcherLife&&) = delete;
    ~WatcherLife() { end(); }
    void end() noexcept {
      if (qp_) std::exchange(qp_, nullptr)->watcherAlive_ = false;
    }

   private:
    QueuePair* qp_;
  };

  Task<void> watchCompletions(WatcherLife life) {
    for (;;) {
      Result<void> ready = co_await reactor_.readable(cq_->fd(), stopWatcher_.get_token());
      if (!ready) {
        if (ready.error() != std::errc::operation_canceled) enterError(ready.error());
        break;
      }
      auto handle = [this](const ibv_wc& wc) { onCompletion(wc); };
      Result<std::size_t> found = reapCollectingSends([&] { return cq_->drain(handle); });
      // After a drain that found work, poll once per loop iteration (then
      // up to config.spinPolls more times while the CQ is empty) until
      // config.pollBeforeSleep iterations in a row found none (see there).
      if (found && *found > 0) {
        for (std::uint32_t empty = 0; found && empty < config_.pollBeforeSleep && !stopWatcher_.stop_requested();) {
          if (pendingSignaled_ == 0) idle_.post();
          co_await reactor_.schedule();
          std::uint32_t spin = 0;
          do {
            found = reapCollectingSends([&] { return cq_->poll(handle); });
          } while (found && *found == 0 && spin++ < config_.spinPolls);
          empty = found && *found > 0 ? 0 : empty + 1;
        }
      }
      if (!found) enterError(found.error());
      if (pendingSignaled_ == 0) idle_.post();
    }
    life.end();
    watcherDone_.post();  // close() may destroy *this from here on
  }

  void onCompletion(const ibv_wc& wc) {
    const detail::WrId id = detail::WrId::fromRaw(wc.wr_id);
    const bool ok = wc.status == IBV_WC_SUCCESS;
    if (!ok && wc.status != IBV_WC_WR_FLUSH_ERR) enterError(completionError(wc.status));
    switch (id.type()) {
      case detail::WrType::recv:
        if (ok) onReceive(wc, id.bufferIndex());
        break;
      case detail::WrType::send:
        if (id.signalCount() > 0) {
          --pendingSignaled_;
          if (ok) sendBuffers_.release(id.signalCount());
        }
        break;
      case detail::WrType::ack:
        --pendingSignaled_;
        --acksInFlight_;
        if (ok) sendAcks();
        break;
      case detail::WrType::close:
        --pendingSignaled_;
        break;
      case detail::WrType::rdma:
        static_cast<detail::RdmaChain*>(id.context())->fail(wc.status);  // only failures complete
        break;
      case detail::WrType::rdmaLast: {
        auto* chain = static_cast<detail::RdmaChain*>(id.context());
        if (!ok) chain->fail(wc.status);
        --pendingSignaled_;
        rdmaTokens_.release(chain->workRequests);
        chain->done.post();  // the awaiting coroutine frees the chain
        break;
      }
    }
  }

  void onReceive(const ibv_wc& wc, std::uint32_t index) {
    if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
      inbox_.push_back({index, wc.byte_len});
      received_.release();
      return;
    }
    const auto imm = detail::Immediate::fromHost(ntohl(wc.imm_data));
    if (imm.kind() == detail::Immediate::Kind::close) {
      peerClosed_ = true;
      if (state_ == QueuePairState::ready) {
        moveTo(QueuePairState::close);
        abort_.request_stop();
      }
      return;
    }
    if (state_ == QueuePairState::ready) {
      if (Result<void> r = postRecv(index); !r) {
        enterError(r.error());
        return;
      }
    }
    credits_.release(imm.count());
  }

  // --- state -----------------------------------------------------------------------

  void moveTo(QueuePairState s) noexcept {
    COIO_ASSERT(canTransition(state_, s), "invalid QueuePair state transition");
    state_ = s;
  }

  void enterError(std::error_code ec) {
    if (!canTransition(state_, QueuePairState::error)) return;
    state_ = QueuePairState::error;
    error_ = ec;
    moveQpToError();
    abort_.request_stop();  // queued operations resume now, with the error
  }

  // A posted operation was stopped: fails the queue pair (ready), or just
  // flushes what close() is draining.
  void failPostedWork() {
    if (state_ == QueuePairState::ready) {
      enterError(std::make_error_code(std::errc::operation_canceled));
    } else {
      moveQpToError();
    }
  }

  // Flushes all outstanding work: each work request completes (with
  // IBV_WC_WR_FLUSH_ERR) and the watcher consumes it.
  void moveQpToError() noexcept {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    (void)::ibv_modify_qp(qp_.get(), &a, IBV_QP_STATE);
  }

  std::error_code stateError() const noexcept {
    switch (state_) {
      case QueuePairState::init:
      case QueuePairState::connecting: return make_error_code(RdmaErrc::notConnected);
      case QueuePairState::error: return make_error_code(RdmaErrc::queuePairError);
      case QueuePairState::ready:
      case QueuePairState::close: break;
    }
    return make_error_code(peerClosed_ && !closeStarted_ ? Errc::eof : Errc::closed);
  }

  // `acquire(token)` for one token of `s`.
  static auto one(Semaphore& s) noexcept {
    return [&s](std::stop_token token) { return s.acquire(std::move(token)); };
  }

  // Waits for `acquire(token)` until the queue pair leaves `ready` or the
  // caller's `stop` is requested (only then is a combined token needed).
  template <typename Acquire>
  Task<bool> acquireUnlessStopped(Acquire acquire, const std::stop_token& stop) {
    if (!stop.stop_possible()) co_return co_await acquire(abort_.get_token());
    std::stop_source either;
    const auto forward = [&either] { either.request_stop(); };
    const std::stop_callback onAbort(abort_.get_token(), forward);
    const std::stop_callback onStop(stop, forward);
    co_return co_await acquire(either.get_token());
  }

  // Why a wait gave up: the caller's stop, else the queue pair's state.
  std::error_code waitError(const std::stop_token& stop) const noexcept {
    if (stop.stop_requested() && state_ == QueuePairState::ready) return std::make_error_code(std::errc::operation_canceled);
    return stateError();
  }

  // True once no signalled work is outstanding; false after drainTimeout.
  Task<bool> waitIdle() {
    if (pendingSignaled_ == 0) co_return true;
    idle_.reset();
    std::stop_source timer;
    bool timedOut = false;
    co_await collectAll(awaitIdle(timer), postIdleWhenDue(timer.get_token(), timedOut));
    co_return !timedOut && pendingSignaled_ == 0;
  }
  Task<void> awaitIdle(std::stop_source& timer) {
    co_await idle_;
    timer.request_stop();
  }
  Task<void> postIdleWhenDue(std::stop_token stop, bool& timedOut) {
    const bool due = co_await reactor_.sleepFor(config_.drainTimeout, std::move(stop));
    if (due) {
      timedOut = true;
      idle_.post();
    }
  }

  struct DestroyQp {
    void operator()(ibv_qp* q) const noexcept { ::ibv_destroy_qp(q); }
  };

  R& reactor_;
  const Device& device_;
  QueuePairConfig config_;
  QueuePairSizes sizes_;
  QueuePairState state_ = QueuePairState::init;
  std::error_code error_;
  bool peerClosed_ = false;
  bool closeStarted_ = false;
  std::uint32_t psn_ = 0;

  // Destroyed in reverse: the QP, then its CQ, the registration, the
  // memory, and last the chains whose flush completions may still be queued.
  std::vector<std::unique_ptr<detail::RdmaChain>> orphans_;
  std::unique_ptr<std::byte, detail::FreeMemory> memory_;
  std::optional<MemoryRegion> messageMr_;
  std::optional<CompletionQueue> cq_;
  std::unique_ptr<ibv_qp, DestroyQp> qp_;

  std::stop_source abort_;  // requested when leaving `ready`: queued operations give up
  BatchSemaphore rdmaTokens_;
  Semaphore credits_;      // messages the peer has buffers for
  Semaphore sendBuffers_;  // free send buffers
  Semaphore received_;     // messages in inbox_
  struct Arrived {
    std::uint32_t index;
    std::uint32_t length;
  };
  std::deque<Arrived> inbox_;
  std::uint32_t sendHead_ = 0;
  std::uint32_t unsignaled_ = 0;
  std::uint32_t ackOwed_ = 0;
  std::uint64_t acksInFlight_ = 0;
  std::uint64_t pendingSignaled_ = 0;  // signalled work requests not completed yet (or collected)
  struct CollectedSend {
    ibv_send_wr wr;
    ibv_sge sge;  // wr's, if any; linked when posted
  };
  std::vector<CollectedSend> collectedSends_;
  bool collectingSends_ = false;  // the watcher is reaping: postSend collects

  Baton idle_;
  std::stop_source stopWatcher_;
  Baton watcherDone_;
  bool watcherAlive_ = false;
};

}  // namespace coio::rdma
