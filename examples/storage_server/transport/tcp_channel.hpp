#pragma once
// The TCP transport: frames on a byte stream, each piece of data inline
// right after its IoData frame.
#include "transport/channel.hpp"
#include "transport/frame_io.hpp"

#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/splice.hpp>

#include <sys/uio.h>

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace storage {

/// A Channel over a connected TcpStream (see Channel for the guarantees).
/// On a coio::SpliceReactor it splices pieces whose bytes are in pipes
/// (splicesData()).
/// With `zeroCopySend`, sendData sends the piece's bytes straight from its
/// buffers (FrameWriter's zero copy, where the reactor can) and resumes once
/// the kernel is done with them.
template <coio::Reactor R>
class TcpChannel final : public Channel<R> {
 public:
  explicit TcpChannel(coio::TcpStream<R> stream, bool zeroCopySend = false)
      : stream_(std::move(stream)), reader_(stream_, kReadAhead, proto::kHeaderSize + proto::kIoDataPayload),
        writer_(stream_), zeroCopySend_(zeroCopySend) {}

  std::string_view name() const noexcept override { return "tcp"; }
  R& reactor() const noexcept override { return stream_.reactor(); }
  bool writesRemote() const noexcept override { return false; }
  std::uint32_t maxIosPerFrame() const noexcept override { return proto::kMaxIosPerFrame; }
  bool broken() const noexcept override { return writer_.broken(); }
  bool sendsInOrder() const noexcept override { return true; }
  bool splicesData() const noexcept override { return coio::SpliceReactor<R>; }

  coio::Task<coio::Result<IncomingFrame>> readFrame(ReadFailure& failure, std::stop_token stop) override {
    return storage::readFrame(reader_, failure, std::move(stop), frameStartedAt_);
  }
  std::optional<std::chrono::steady_clock::time_point> frameStartedAt() const noexcept override {
    return frameStartedAt_;
  }
  coio::Task<coio::Result<void>> send(std::span<const std::byte> frame, std::stop_token stop) override {
    return writer_.send(frame, std::move(stop));
  }
  coio::Task<coio::Result<void>> sendData(const OutgoingPiece& piece, std::stop_token stop) override {
    std::vector<std::byte> frame;
    frame.reserve(proto::kHeaderSize + proto::kIoDataPayload);
    proto::encode(frame, piece.requestId, piece.where);
    std::vector<iovec> parts;
    parts.reserve(1 + piece.buffers.size());
    parts.push_back({frame.data(), frame.size()});
    if constexpr (coio::SpliceReactor<R>) {
      if (!piece.piped.empty()) co_return co_await writer_.sendSpliced(parts, piece.piped, std::move(stop));
    }
    for (std::span<std::byte> buffer : piece.buffers) parts.push_back({buffer.data(), buffer.size()});
    co_return co_await writer_.send(parts, std::move(stop), zeroCopySend_);
  }
  coio::Task<coio::Result<void>> receiveData(std::span<std::byte> into, std::stop_token stop) override {
    return reader_.readExact(into, std::move(stop));
  }
  coio::Result<proto::RemoteBuffer> remoteBuffer(std::span<std::byte>) const override { return proto::RemoteBuffer{}; }
  coio::Result<void> registerMemory(std::span<std::byte>) override { return {}; }
  void abort() noexcept override { (void)stream_.shutdown(coio::ShutdownHow::both); }
  coio::Task<void> sendError(const ReadFailure& failure, std::chrono::steady_clock::duration grace) override {
    return sendErrorAndDrain(stream_, writer_, failure, grace);
  }
  // readFrame sees the stream end itself.
  coio::Task<void> watchPeer(std::stop_token) override { co_return; }

  coio::Task<void> close() override {
    stream_.close();
    co_return;
  }

 private:
  // Frames and several small IOs' data per receive; larger reads bypass it,
  // and the receive after one takes just an IoData frame.
  static constexpr std::size_t kReadAhead = 32 * 1024;

  coio::TcpStream<R> stream_;
  BufferedReader<R> reader_;
  FrameWriter<R> writer_;
  bool zeroCopySend_;
  std::optional<std::chrono::steady_clock::time_point> frameStartedAt_;
};

/// Serves connections over the accepted TCP streams themselves, sending
/// data zero-copy if asked (see TcpChannel).
template <coio::Reactor R>
class TcpTransport final : public Transport<R> {
 public:
  explicit TcpTransport(bool zeroCopySend = false) noexcept : zeroCopySend_(zeroCopySend) {}
  std::string_view name() const noexcept override { return "tcp"; }
  // No handshake: the server's frame and idle deadlines cover the stream from the start.
  coio::Task<coio::Result<std::unique_ptr<Channel<R>>>> accept(coio::TcpStream<R> stream, std::stop_token,
                                                              std::chrono::steady_clock::duration) override {
    co_return std::unique_ptr<Channel<R>>(std::make_unique<TcpChannel<R>>(std::move(stream), zeroCopySend_));
  }

 private:
  bool zeroCopySend_;
};

}  // namespace storage
