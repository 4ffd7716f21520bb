#pragma once
// What carries a connection's frames. The server and the client speak
// PROTOCOL.md through a Channel: TcpChannel (transport/tcp_channel.hpp) sends each
// piece of data inline after an IoData frame, RdmaChannel (transport/rdma_channel.hpp)
// writes it into the client's registered memory and sends the frames as
// RDMA messages.
#include "protocol/protocol.hpp"

#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string_view>
#include <system_error>
#include <vector>

namespace storage {

/// A frame read off a channel; the payload is not decoded yet.
struct IncomingFrame {
  proto::FrameHeader header;
  std::vector<std::byte> payload;
};

/// What ended a connection's read side: a transport error (EOF, reset,
/// cancellation) or a protocol error, with the requestId it concerns.
struct ReadFailure {
  std::error_code error;
  std::uint64_t requestId = 0;
  bool isProtocolError() const noexcept { return error.category() == proto::protocolCategory(); }
};

/// Bytes waiting in a pipe to be spliced into a socket: the pipe's read
/// end, and how many bytes it holds (exactly: a splice out of it waits for
/// any byte it lacks).
struct PipedBytes {
  int pipe;
  std::size_t length;
};

/// One piece of an IO's data: where it goes (`remote`, the IO's buffer:
/// RDMA only), which bytes of the IO it is, and where they are: in order,
/// in one or more of the server's read buffers, or (a channel whose
/// splicesData() is true) in pipes, spliced there from a file's page cache.
struct OutgoingPiece {
  std::uint64_t requestId;
  proto::RemoteBuffer remote;
  proto::IoData where;  // ioIndex, offset within the IO, length = the buffers' (or pipes') total
  std::span<const std::span<std::byte>> buffers;
  std::span<const PipedBytes> piped;  // instead of buffers
};

/// One connection's frames, over TCP or RDMA.
///
/// Guarantees (both transports):
/// - Used on its reactor's loop thread; every awaitable resumes there.
/// - Whole frames: concurrent senders never interleave, and a piece's data
///   is never split from its IoData frame. Sends start in the order they
///   are called (so one sender's pieces go out in the order it sent them).
/// - A send that fails breaks the channel: broken() is then true and every
///   later send fails at once.
/// - `co_await close()` once, after every other use has ended, before
///   destruction.
template <coio::Reactor R>
class Channel {
 public:
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  virtual ~Channel() = default;

  /// "tcp" or "rdma".
  virtual std::string_view name() const noexcept = 0;
  virtual R& reactor() const noexcept = 0;
  /// True if IOs name the client's memory (ReadIo::remote) and the data
  /// goes there, not inline.
  virtual bool writesRemote() const noexcept = 0;
  /// Most IOs one BatchReadRequest frame may carry on this channel.
  virtual std::uint32_t maxIosPerFrame() const noexcept = 0;
  virtual bool broken() const noexcept = 0;
  /// True if a frame sent after a piece (sendData) reaches the peer after
  /// it as soon as that piece's send has started (TCP: one byte stream,
  /// sends in call order); false if the piece's send must complete first
  /// (RDMA: the WRITE must be posted before the SEND that announces it).
  virtual bool sendsInOrder() const noexcept = 0;
  /// True if sendData takes a piece whose bytes are in pipes
  /// (OutgoingPiece::piped) and splices them into the connection (TCP on a
  /// coio::SpliceReactor); false if only buffers will do.
  virtual bool splicesData() const noexcept = 0;

  /// Reads the next frame. On failure `failure` says why (and for which
  /// request id); a header that fails validation is a protocol error.
  virtual coio::Task<coio::Result<IncomingFrame>> readFrame(ReadFailure& failure, std::stop_token stop) = 0;
  /// While readFrame waits for the rest of a frame: when its first byte
  /// was there, on the reactor's clock (a frame deadline counts from it). Empty between frames,
  /// and always over RDMA, where a frame arrives whole.
  virtual std::optional<std::chrono::steady_clock::time_point> frameStartedAt() const noexcept = 0;
  /// Sends one frame.
  virtual coio::Task<coio::Result<void>> send(std::span<const std::byte> frame, std::stop_token stop) = 0;
  /// Server: one piece of data. TCP: its IoData frame and bytes in one
  /// gather write (piped bytes: the frame, then a splice out of each pipe
  /// into the socket, with no other frame in between). RDMA: an RDMA WRITE
  /// to remote.addr + where.offset.
  /// Resumes once the piece's buffer may be reused (TCP: the kernel took
  /// the bytes, or with zero-copy sends let go of the buffer; its pipes are
  /// empty; RDMA: the write completed, so a response sent after it arrives
  /// after the data). A send that fails part-way may leave bytes in a pipe.
  virtual coio::Task<coio::Result<void>> sendData(const OutgoingPiece& piece, std::stop_token stop) = 0;
  /// Client, TCP: takes the `into.size()` bytes that follow an IoData frame.
  virtual coio::Task<coio::Result<void>> receiveData(std::span<std::byte> into, std::stop_token stop) = 0;
  /// Client: the ReadIo::remote field for an IO landing in `into`. TCP:
  /// zero. RDMA: `into` must lie in memory given to registerMemory(),
  /// else Errc::invalidArgument.
  virtual coio::Result<proto::RemoteBuffer> remoteBuffer(std::span<std::byte> into) const = 0;
  /// Client: registers memory that IOs may land in (RDMA; TCP: nothing to do).
  virtual coio::Result<void> registerMemory(std::span<std::byte> memory) = 0;
  /// Drops the connection at once: nothing is sent or received on it any
  /// more (RDMA: the QP goes to ERR, so no peer write lands after this).
  virtual void abort() noexcept = 0;
  /// After a protocol error (best effort, within `grace`): sends an Error
  /// frame and lets the peer read it before the connection goes.
  virtual coio::Task<void> sendError(const ReadFailure& failure, std::chrono::steady_clock::duration grace) = 0;
  /// Server, beside the reader: watches for a peer gone without a word on
  /// the channel (RDMA: the client's bootstrap TCP stream ended, e.g. its
  /// process died; an idle queue pair alone never notices) and then
  /// aborts the channel, which fails the pending readFrame. Ends there, when
  /// `stop` is requested, or at once where readFrame sees the end itself (TCP).
  virtual coio::Task<void> watchPeer(std::stop_token stop) = 0;
  virtual coio::Task<void> close() = 0;
};

/// How a server shard turns an accepted TCP connection into a Channel:
/// TcpTransport uses the stream itself, RdmaTransport uses it to connect a
/// queue pair. accept() runs on the shard's loop thread; `stop` (the
/// server's shutdown) ends a handshake in progress, and so does
/// `handshakeTimeout` (std::errc::timed_out): a peer that stalls in the
/// handshake cannot hold its connection.
template <coio::Reactor R>
class Transport {
 public:
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  virtual ~Transport() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual coio::Task<coio::Result<std::unique_ptr<Channel<R>>>> accept(
      coio::TcpStream<R> stream, std::stop_token stop, std::chrono::steady_clock::duration handshakeTimeout) = 0;
};

/// The failure for a frame header that did not validate. The request id
/// of a frame whose magic is wrong means nothing: it is reported as 0.
inline ReadFailure headerFailure(std::span<const std::byte> raw, std::error_code error) {
  std::uint64_t id = 0;
  for (std::size_t i = 0; error != proto::ProtocolErrc::badMagic && i < 8 && 8 + i < raw.size(); ++i) {
    id |= std::uint64_t{static_cast<std::uint8_t>(raw[8 + i])} << (8 * i);
  }
  return {error, id};
}

/// The Error frame for a protocol failure.
inline std::vector<std::byte> errorFrame(const ReadFailure& failure) {
  std::vector<std::byte> frame;
  proto::encode(frame, failure.requestId,
                proto::ErrorFrame{static_cast<proto::ProtocolErrc>(failure.error.value()), failure.error.message()});
  return frame;
}

}  // namespace storage
