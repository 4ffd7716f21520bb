#pragma once
// The TCP transport: frames on a byte stream, a response's data inline
// right after its frame.
#include "channel.hpp"
#include "frame_io.hpp"

#include <coio/net/tcp_stream.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace storage {

/// A Channel over a connected TcpStream (see Channel for the guarantees).
template <coio::Reactor R>
class TcpChannel final : public Channel<R> {
 public:
  explicit TcpChannel(coio::TcpStream<R> stream)
      : stream_(std::move(stream)), reader_(stream_, kReadAhead), writer_(stream_) {}

  std::string_view name() const noexcept override { return "tcp"; }
  R& reactor() const noexcept override { return stream_.reactor(); }
  bool writesRemote() const noexcept override { return false; }
  std::uint32_t maxIosPerFrame() const noexcept override { return proto::kMaxIosPerFrame; }
  bool broken() const noexcept override { return writer_.broken(); }

  coio::Task<coio::Result<IncomingFrame>> readFrame(ReadFailure& failure, std::stop_token stop) override {
    return storage::readFrame(reader_, failure, std::move(stop), frameStartedAt_);
  }
  std::optional<std::chrono::steady_clock::time_point> frameStartedAt() const noexcept override {
    return frameStartedAt_;
  }
  coio::Task<coio::Result<void>> send(std::span<const std::byte> frame, std::stop_token stop) override {
    return writer_.send(frame, std::move(stop));
  }
  coio::Task<coio::Result<void>> sendResponse(std::span<const std::byte> frame, std::span<const OutgoingData> data,
                                              std::stop_token stop) override {
    // Runs of small pieces (small IOs) are copied together, so that a batch
    // of 4 KiB IOs is a few writes, not one per IO; large pieces go as they are.
    std::vector<std::span<const std::byte>> parts;
    std::vector<std::byte> merged;
    std::size_t mergedBytes = frame.size();
    for (const OutgoingData& io : data) {
      for (std::span<const std::byte> piece : io.pieces) {
        if (piece.size() < kMergeBelow) mergedBytes += piece.size();
      }
    }
    merged.reserve(mergedBytes);  // exact: `parts` holds spans into it, so it must never reallocate
    std::size_t runStart = 0;  // where the run of small pieces being merged starts in `merged`
    const auto endRun = [&] {
      if (merged.size() > runStart) parts.push_back(std::span(merged).subspan(runStart));
      runStart = merged.size();
    };
    merged.insert(merged.end(), frame.begin(), frame.end());
    for (const OutgoingData& io : data) {
      for (std::span<const std::byte> piece : io.pieces) {
        if (piece.size() < kMergeBelow) {
          merged.insert(merged.end(), piece.begin(), piece.end());
        } else {
          endRun();
          parts.push_back(piece);
        }
      }
    }
    endRun();
    co_return co_await writer_.send(parts, std::move(stop));
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
  static constexpr std::size_t kMergeBelow = 16 * 1024;
  // Frames and several small IOs' data per receive; larger reads bypass it.
  static constexpr std::size_t kReadAhead = 32 * 1024;

  coio::TcpStream<R> stream_;
  BufferedReader<R> reader_;
  FrameWriter<R> writer_;
  std::optional<std::chrono::steady_clock::time_point> frameStartedAt_;
};

/// Serves connections over the accepted TCP streams themselves.
template <coio::Reactor R>
class TcpTransport final : public Transport<R> {
 public:
  std::string_view name() const noexcept override { return "tcp"; }
  // No handshake: the server's frame and idle deadlines cover the stream from the start.
  coio::Task<coio::Result<std::unique_ptr<Channel<R>>>> accept(coio::TcpStream<R> stream, std::stop_token,
                                                              std::chrono::steady_clock::duration) override {
    co_return std::unique_ptr<Channel<R>>(std::make_unique<TcpChannel<R>>(std::move(stream)));
  }
};

}  // namespace storage
