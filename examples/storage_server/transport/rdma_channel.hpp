#pragma once
// The RDMA transport: a reliable-connected queue pair per connection,
// connected over the TCP connection the client opened (which then stays
// open, silent: its end tells each side the other is gone). Frames travel
// as RDMA messages (one frame per message); each piece of data is
// RDMA-written straight from the server's read buffers into the client's
// registered memory.
#include "transport/channel.hpp"

#include <coio/core/batch_semaphore.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/net/group_commit.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/rdma/rdma.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/event.hpp>
#include <coio/reactor/wait_for.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace storage {

/// The queue-pair settings both ends use (the handshake insists that the
/// message layer matches): 16 KiB messages hold a BatchReadRequest of up
/// to 408 IOs.
inline coio::rdma::QueuePairConfig rdmaQueuePairConfig() { return {}; }

/// A shard's budget of RDMA WRITE work requests in flight (the issue's
/// "server-wide BatchSemaphore per device", split between the reactors so
/// that a released token never resumes a coroutine of another thread).
struct RdmaWriteBudget {
  explicit RdmaWriteBudget(std::size_t writes) : tokens(writes) {}
  coio::BatchSemaphore tokens;
};

/// A Channel over a connected queue pair (see Channel for the guarantees).
/// Server side it sends from `local` (the registration of the read-buffer
/// pool: every piece must lie in it) and takes write tokens from `budget`;
/// client side it registers the memory IOs land in.
template <coio::Reactor R>
class RdmaChannel final : public Channel<R> {
 public:
  using QueuePair = coio::rdma::QueuePair<R>;

  /// Creates a queue pair on `device` and connects it over `stream` (whose
  /// peer does the same); gives up after `timeout` or when `stop` is
  /// requested. Errors: the queue pair's (RdmaErrc::deviceTooSmall, the
  /// handshake's), std::errc::timed_out. On success the channel keeps the
  /// stream open, silent, for its whole life: its end tells the peer that
  /// this side is gone (watchPeer); on failure it is closed.
  static coio::Task<coio::Result<std::unique_ptr<Channel<R>>>> connect(
      R& reactor, const coio::rdma::Device& device, coio::TcpStream<R> stream, std::stop_token stop,
      std::chrono::steady_clock::duration timeout, const coio::rdma::MemoryRegion* local = nullptr,
      RdmaWriteBudget* budget = nullptr) {
    coio::Result<std::unique_ptr<QueuePair>> qp = QueuePair::create(reactor, device, rdmaQueuePairConfig());
    if (!qp) co_return qp.error();
    // The handshake reads the stream: shutting it down ends a stuck one.
    coio::Event done;
    bool expired = false;
    auto [connected, unit] = co_await coio::collectAll(connectThenSet(**qp, stream, done),
                                                       shutdownWhenDue(reactor, stream, stop, done, timeout, expired));
    (void)unit;
    if (!connected) {
      stream.close();
      (void)co_await (*qp)->close();
      co_return expired ? std::make_error_code(std::errc::timed_out) : connected.error();
    }
    co_return std::unique_ptr<Channel<R>>(new RdmaChannel(std::move(*qp), std::move(stream), local, budget));
  }

  std::string_view name() const noexcept override { return "rdma"; }
  R& reactor() const noexcept override { return qp_->reactor(); }
  bool writesRemote() const noexcept override { return true; }
  std::uint32_t maxIosPerFrame() const noexcept override {
    return static_cast<std::uint32_t>((qp_->config().messageSize - proto::kHeaderSize - 8) / proto::kIoSize);
  }
  bool broken() const noexcept override {
    return broken_ || writes_.broken() || qp_->state() != coio::rdma::QueuePairState::ready;
  }
  bool sendsInOrder() const noexcept override { return false; }
  bool splicesData() const noexcept override { return false; }

  coio::Task<coio::Result<IncomingFrame>> readFrame(ReadFailure& failure, std::stop_token stop) override {
    coio::Result<std::size_t> n = co_await qp_->recv(inbox_, std::move(stop));
    if (!n) {
      failure = {n.error(), 0};
      co_return n.error();
    }
    const std::span<const std::byte> message(inbox_.data(), *n);
    if (message.size() < proto::kHeaderSize) {
      failure = {proto::ProtocolErrc::truncated, 0};
      co_return failure.error;
    }
    coio::Result<proto::FrameHeader> header = proto::decodeHeader(message.first(proto::kHeaderSize));
    if (!header) {
      failure = headerFailure(message, header.error());
      co_return header.error();
    }
    const std::span<const std::byte> payload = message.subspan(proto::kHeaderSize);
    if (payload.size() != header->payloadLength) {
      failure = {payload.size() < header->payloadLength ? proto::ProtocolErrc::truncated
                                                        : proto::ProtocolErrc::trailingBytes,
                 header->requestId};
      co_return failure.error;
    }
    co_return IncomingFrame{*header, std::vector<std::byte>(payload.begin(), payload.end())};
  }
  // One message is one whole frame: it never stalls half-way.
  std::optional<std::chrono::steady_clock::time_point> frameStartedAt() const noexcept override { return {}; }

  coio::Task<coio::Result<void>> send(std::span<const std::byte> frame, std::stop_token stop) override {
    if (broken_) co_return coio::Errc::closed;
    coio::Result<void> sent = co_await qp_->send(frame, std::move(stop));
    if (!sent && sent.error() != std::errc::operation_canceled) broken_ = true;  // a cancelled send sent nothing
    co_return sent;
  }

  // Pieces sent in one turn of the loop go out as one chain of RDMA WRITEs
  // (GroupCommit): one post, one doorbell (with Soft-RoCE one system call,
  // which runs the whole packet pipeline), one completion, instead of one
  // of each per piece. Up to kWriteChains chains are under way at once: a
  // chain ends only when the peer has acknowledged all of it, and pieces
  // read meanwhile need not wait for that (one at a time gave 0.85-1.00 of
  // the throughput at 4 MiB over one connection in the Soft-RoCE guest,
  // medians of four boots; docs/benchmarks.md).
  coio::Task<coio::Result<void>> sendData(const OutgoingPiece& piece, std::stop_token stop) override {
    if (broken_) co_return coio::Errc::closed;
    co_return co_await writes_.submit(&piece, piece.buffers.size(), std::move(stop));
  }

  coio::Task<coio::Result<void>> receiveData(std::span<std::byte>, std::stop_token) override {
    co_return proto::ProtocolErrc::unexpectedMessage;  // no IoData over RDMA: the data is written
  }

  coio::Result<proto::RemoteBuffer> remoteBuffer(std::span<std::byte> into) const override {
    for (const coio::rdma::MemoryRegion& region : regions_) {
      if (region.contains(into)) {
        const coio::rdma::RemoteBuffer r = region.remote(into);
        return proto::RemoteBuffer{r.addr, static_cast<std::uint32_t>(std::min<std::uint64_t>(r.length, UINT32_MAX)),
                                   r.rkey};
      }
    }
    return coio::Errc::invalidArgument;
  }

  coio::Result<void> registerMemory(std::span<std::byte> memory) override {
    coio::Result<coio::rdma::MemoryRegion> region = coio::rdma::MemoryRegion::create(
        qp_->device(), memory, coio::rdma::Access::localWrite | coio::rdma::Access::remoteWrite);
    if (!region) return region.error();
    regions_.push_back(std::move(*region));
    return {};
  }

  void abort() noexcept override {
    broken_ = true;
    qp_->abort();
  }

  coio::Task<void> sendError(const ReadFailure& failure, std::chrono::steady_clock::duration grace) override {
    if (broken()) co_return;
    const std::vector<std::byte> frame = errorFrame(failure);
    auto sendFrame = [this, &frame](std::stop_token stop) { return qp_->send(frame, std::move(stop)); };
    // close() then sends CLOSE behind it: the peer reads the Error frame first.
    (void)co_await coio::withTimeout(qp_->reactor(), sendFrame, grace);
  }

  coio::Task<void> watchPeer(std::stop_token stop) override {
    // Nothing is ever written to the bootstrap stream after the handshake:
    // its end (EOF, a reset) or a stray byte means the peer is gone.
    std::byte byte[1];
    coio::Result<std::size_t> n = co_await bootstrap_.read(byte, std::move(stop));
    if (!n && n.error() == std::errc::operation_canceled) co_return;
    abort();
  }

  // The queue pair first (its CLOSE reaches the peer), then the stream with
  // the channel.
  coio::Task<void> close() override { (void)co_await qp_->close(); }

 private:
  RdmaChannel(std::unique_ptr<QueuePair> qp, coio::TcpStream<R> bootstrap, const coio::rdma::MemoryRegion* local,
              RdmaWriteBudget* budget)
      : qp_(std::move(qp)), bootstrap_(std::move(bootstrap)), local_(local), budget_(budget),
        inbox_(qp_->config().messageSize),
        writes_(qp_->reactor(), qp_->config().maxRdmaWrPerPost, WritePieces{this}, kWriteChains) {}

  // Bounds the coroutines a connection's writes hold; the write budget and
  // the queue pair's work-request tokens bound the work requests.
  static constexpr std::size_t kWriteChains = 8;

  // The pieces of one GroupCommit batch as one RdmaBatch: a chain of
  // WRITEs (RdmaBatch splits it past maxRdmaWrPerPost), admitted by the
  // shard's write budget. Resumes once the NIC has read the buffers; a stop
  // (the connection ending) fails the queue pair under posted writes, which
  // cannot be recalled.
  coio::Task<coio::Result<void>> writePieces(std::span<const OutgoingPiece* const> pieces, std::stop_token stop) {
    coio::rdma::RdmaBatch<R> batch = qp_->rdmaBatch(coio::rdma::RdmaOp::write);
    std::vector<coio::rdma::LocalBuffer> locals;
    for (const OutgoingPiece* piece : pieces) {
      locals.clear();
      for (std::span<std::byte> buffer : piece->buffers) {
        if (!buffer.empty()) locals.push_back(local_->local(buffer));
      }
      const proto::RemoteBuffer& io = piece->remote;
      // The server checked that the IO's buffer holds the IO: this piece lies inside it.
      coio::Result<void> added =
          batch.add({io.addr + piece->where.offset, io.length - piece->where.offset, io.rkey}, locals);
      if (!added) co_return added;
    }
    const std::size_t weight = std::min(batch.workRequests(), budget_->tokens.capacity());
    const bool admitted = co_await budget_->tokens.acquire(weight, stop);
    if (!admitted) co_return std::errc::operation_canceled;
    coio::Result<void> written = co_await batch.post(stop);
    budget_->tokens.release(weight);
    co_return written;
  }
  struct WritePieces {
    RdmaChannel* channel;
    coio::Task<coio::Result<void>> operator()(std::span<const OutgoingPiece* const> pieces, std::stop_token stop) const {
      return channel->writePieces(pieces, std::move(stop));
    }
  };

  static coio::Task<coio::Result<void>> connectThenSet(QueuePair& qp, coio::TcpStream<R>& stream,
                                                       coio::Event& done) {
    coio::Result<void> r = co_await qp.connect(stream);
    done.set();
    co_return r;
  }
  static coio::Task<void> shutdownWhenDue(R& reactor, coio::TcpStream<R>& stream, std::stop_token stop,
                                          coio::Event& done, std::chrono::steady_clock::duration timeout,
                                          bool& expired) {
    // Ends early when the handshake does, or `stop` is requested.
    const coio::Result<void> ended = co_await coio::withStopToken(std::move(stop), coio::waitFor(reactor, done, timeout));
    if (!ended) {
      expired = ended.error() == std::errc::timed_out;
      (void)stream.shutdown(coio::ShutdownHow::both);
    }
  }

  std::unique_ptr<QueuePair> qp_;
  coio::TcpStream<R> bootstrap_;  // the handshake's stream, open while the channel lives
  const coio::rdma::MemoryRegion* local_;
  RdmaWriteBudget* budget_;
  std::vector<coio::rdma::MemoryRegion> regions_;  // client: where IOs may land
  std::vector<std::byte> inbox_;                   // one received message
  bool broken_ = false;
  coio::GroupCommit<R, const OutgoingPiece*, WritePieces> writes_;  // server: the pieces' RDMA WRITEs
};

/// Serves connections over RDMA: registers a shard's read-buffer pool once
/// and connects a queue pair over each accepted TCP stream.
template <coio::Reactor R>
class RdmaTransport final : public Transport<R> {
 public:
  /// `pool` (the shard's whole read-buffer mapping) is registered for local
  /// access; `writes` is this shard's share of the device's write budget.
  static coio::Result<std::unique_ptr<RdmaTransport>> create(R& reactor, const coio::rdma::Device& device,
                                                             std::span<std::byte> pool, std::size_t writes) {
    coio::Result<coio::rdma::MemoryRegion> region =
        coio::rdma::MemoryRegion::create(device, pool, coio::rdma::Access::localWrite);
    if (!region) return region.error();
    return std::unique_ptr<RdmaTransport>(new RdmaTransport(reactor, device, std::move(*region), writes));
  }

  std::string_view name() const noexcept override { return "rdma"; }
  coio::Task<coio::Result<std::unique_ptr<Channel<R>>>> accept(
      coio::TcpStream<R> stream, std::stop_token stop, std::chrono::steady_clock::duration handshakeTimeout) override {
    return RdmaChannel<R>::connect(reactor_, device_, std::move(stream), std::move(stop), handshakeTimeout, &pool_,
                                   &budget_);
  }

 private:
  RdmaTransport(R& reactor, const coio::rdma::Device& device, coio::rdma::MemoryRegion pool, std::size_t writes)
      : reactor_(reactor), device_(device), pool_(std::move(pool)), budget_(std::max<std::size_t>(writes, 1)) {}

  R& reactor_;
  const coio::rdma::Device& device_;
  coio::rdma::MemoryRegion pool_;
  RdmaWriteBudget budget_;
};

}  // namespace storage
