#pragma once
// Frames over a TcpStream, shared by the server and the client: reading one
// frame (header checked before the payload is read), and a writer that keeps
// whole frames (and a response's trailing data) from interleaving.
#include "transport/channel.hpp"
#include "protocol/protocol.hpp"

#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/group_commit.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/splice.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>
#include <stop_token>
#include <system_error>
#include <utility>
#include <vector>

namespace storage {

/// Reads a TcpStream through a read-ahead buffer, so that a batch's frames
/// and small data pieces come out of a few receives instead of one each.
/// A read that finds the buffer empty and is at least as large as it goes
/// straight into the caller's memory (no copy for large data). The fill
/// after such a read asks for `afterLarge` bytes only (the frame header
/// that usually precedes more large data), not a whole buffer's worth, of
/// which all but the header would be copied twice. Every read of the
/// stream must go through it: it may hold bytes past the current frame.
/// Awaited on the stream's loop thread, one read at a time.
template <coio::Reactor R>
class BufferedReader {
 public:
  BufferedReader(coio::TcpStream<R>& stream, std::size_t capacity, std::size_t afterLarge = 0)
      : stream_(stream), buffer_(capacity), afterLarge_(afterLarge == 0 ? capacity : std::min(afterLarge, capacity)) {}

  R& reactor() const noexcept { return stream_.reactor(); }
  /// Unread bytes in the buffer.
  std::size_t buffered() const noexcept { return end_ - begin_; }
  /// With the buffer empty: waits for the stream's next bytes and buffers them.
  coio::Task<coio::Result<void>> fill(std::stop_token stop) {
    const std::size_t want = std::exchange(wentDirect_, false) ? afterLarge_ : buffer_.size();
    coio::Result<std::size_t> got = co_await stream_.read(std::span(buffer_).first(want), std::move(stop));
    if (!got) co_return got.error();
    begin_ = 0;
    end_ = *got;
    co_return coio::Result<void>{};
  }

  coio::Task<coio::Result<void>> readExact(std::span<std::byte> into, std::stop_token stop) {
    for (;;) {
      const std::size_t n = std::min(into.size(), end_ - begin_);
      if (n > 0) std::memcpy(into.data(), buffer_.data() + begin_, n);
      begin_ += n;
      into = into.subspan(n);
      if (into.empty()) co_return coio::Result<void>{};
      begin_ = end_ = 0;  // drained
      if (into.size() >= buffer_.size()) {
        wentDirect_ = true;
        co_return co_await stream_.readExact(into, std::move(stop));
      }
      coio::Result<void> filled = co_await fill(stop);
      if (!filled) co_return filled;
    }
  }

 private:
  coio::TcpStream<R>& stream_;
  std::vector<std::byte> buffer_;
  std::size_t afterLarge_;
  std::size_t begin_ = 0, end_ = 0;  // unread bytes: [begin_, end_)
  bool wentDirect_ = false;          // the last read bypassed the buffer
};

/// Reads one frame from `source`. A header that fails validation is a
/// protocol error before any payload byte is read, so an absurd length
/// never allocates. `startedAt` holds when (on the reactor's clock) the
/// frame's first byte was there, until the frame is read or fails.
template <coio::Reactor R>
coio::Task<coio::Result<IncomingFrame>> readFrame(BufferedReader<R>& source, ReadFailure& failure,
                                                  std::stop_token stop,
                                                  std::optional<std::chrono::steady_clock::time_point>& startedAt) {
  struct Ended {
    std::optional<std::chrono::steady_clock::time_point>& startedAt;
    ~Ended() { startedAt.reset(); }
  };
  const Ended ended{startedAt};
  std::byte raw[proto::kHeaderSize];
  coio::Result<void> got;
  if (source.buffered() == 0) got = co_await source.fill(stop);  // between frames: the idle wait
  if (got) {
    startedAt = source.reactor().now();
    got = co_await source.readExact(raw, stop);
  }
  if (!got) {
    failure = {got.error(), 0};
    co_return got.error();
  }
  coio::Result<proto::FrameHeader> header = proto::decodeHeader(raw);
  if (!header) {
    failure = headerFailure(raw, header.error());
    co_return header.error();
  }
  IncomingFrame frame{*header, std::vector<std::byte>(header->payloadLength)};
  got = co_await source.readExact(frame.payload, stop);
  if (!got) {
    failure = {got.error(), header->requestId};
    co_return got.error();
  }
  co_return std::move(frame);
}

/// Serialises writers on one stream: each send() writes all its parts
/// back to back, so a frame and the data after it are never split by
/// another frame. Sends go out in the order they were called. Awaited on
/// the stream's loop thread, which resumes every send.
///
/// Group commit (coio::GroupCommit, <coio/net/group_commit.hpp>, where leading, cancellation and breaking are
/// explained): the sends made in one turn of the loop, or queued while a
/// write is under way, go out in one gather write (IOV_MAX parts per batch,
/// or a larger send alone) instead of one write each. A send cancelled
/// while queued puts none of its bytes on the stream, which stays usable.
/// A write that fails or is cancelled part-way leaves the byte stream cut
/// mid-frame: the writer is then broken and every later send fails at once.
///
/// Splice: a send made with sendSpliced() ends the gather write it is in;
/// its pipes' bytes are then spliced into the stream, and the next sends
/// go in a gather write of their own.
///
/// Zero copy: a send made with `zeroCopy` takes its bytes straight from its
/// memory (TcpStream::writeAllZeroCopy, where the reactor can), and so does
/// the whole write it goes out in: every send in that write resumes once the
/// kernel is done with the write's memory, that is once the peer has
/// acknowledged it. A stop during such a write resets the connection (the
/// stop breaks the stream anyway), else a peer that stopped reading would
/// hold the write, and its buffers, for as long as it likes.
template <coio::Reactor R>
class FrameWriter {
 public:
  explicit FrameWriter(coio::TcpStream<R>& stream)
      : stream_(stream), commit_(stream.reactor(), IOV_MAX, WriteSends{this}) {}
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

  coio::Task<coio::Result<void>> send(std::span<const iovec> parts, std::stop_token stop, bool zeroCopy = false) {
    return commit_.submit(Send{parts, zeroCopy, {}}, parts.size(), std::move(stop));
  }

  /// Sends `parts`, then splices each of `piped`'s pipes into the stream
  /// behind them (a coio::SpliceReactor only): the bytes never enter this
  /// process. Whole, like any send: no other send's bytes go in between.
  /// Each pipe must hold exactly the bytes it names; it is empty once this
  /// resumes with success.
  coio::Task<coio::Result<void>> sendSpliced(std::span<const iovec> parts, std::span<const PipedBytes> piped,
                                             std::stop_token stop)
    requires coio::SpliceReactor<R>
  {
    return commit_.submit(Send{parts, false, piped}, parts.size(), std::move(stop));
  }

  coio::Task<coio::Result<void>> send(std::span<const std::byte> frame, std::stop_token stop) {
    const iovec parts[] = {{const_cast<std::byte*>(frame.data()), frame.size()}};
    co_return co_await send(parts, std::move(stop));
  }

  bool broken() const noexcept { return commit_.broken(); }

 private:
  struct Send {
    std::span<const iovec> parts;
    bool zeroCopy;
    std::span<const PipedBytes> piped;  // spliced in after the parts
  };

  // One batch of sends as one gather write, zero copy if any send asked;
  // a send with piped bytes ends a gather write, and its pipes are
  // spliced in behind it before the next one.
  coio::Task<coio::Result<void>> writeSends(std::span<const Send> sends, std::stop_token stop) {
    gather_.clear();
    bool zeroCopy = false;
    for (const Send& s : sends) {
      gather_.insert(gather_.end(), s.parts.begin(), s.parts.end());
      zeroCopy = zeroCopy || s.zeroCopy;
      if constexpr (coio::SpliceReactor<R>) {  // (only sendSpliced, which needs one, pipes bytes)
        if (s.piped.empty()) continue;
        coio::Result<void> written = co_await writeGathered(std::exchange(zeroCopy, false), stop);
        for (std::size_t i = 0; written && i < s.piped.size(); ++i) written = co_await splice(s.piped[i], stop);
        if (!written) co_return written;
      }
    }
    co_return co_await writeGathered(zeroCopy, stop);
  }

  // Writes what gather_ holds and empties it.
  coio::Task<coio::Result<void>> writeGathered(bool zeroCopy, std::stop_token stop) {
    coio::Result<void> written;
    if (gather_.empty()) co_return written;
    if (zeroCopy) {
      const std::stop_callback abortOnStop(stop, AbortOnStop{&stream_});
      written = co_await stream_.writeAllZeroCopy(gather_, stop);
    } else {
      written = co_await stream_.writeAll(gather_, stop);
    }
    gather_.clear();
    co_return written;
  }

  // Moves all of a pipe's bytes into the stream.
  coio::Task<coio::Result<void>> splice(PipedBytes from, std::stop_token stop)
    requires coio::SpliceReactor<R>
  {
    for (std::size_t left = from.length; left > 0;) {
      const coio::Result<std::size_t> moved =
          co_await stream_.reactor().splice(from.pipe, coio::kNoOffset, stream_.fd(), coio::kNoOffset, left, stop);
      if (!moved) co_return moved.error();
      if (*moved == 0) co_return coio::Errc::closed;  // a pipe whose write end is gone: short of its bytes
      left -= *moved;
    }
    co_return coio::Result<void>{};
  }
  struct WriteSends {
    FrameWriter* writer;
    coio::Task<coio::Result<void>> operator()(std::span<const Send> sends, std::stop_token stop) const {
      return writer->writeSends(sends, std::move(stop));
    }
  };

  struct AbortOnStop {
    coio::TcpStream<R>* stream;
    void operator()() const noexcept { (void)stream->abort(); }
  };

  coio::TcpStream<R>& stream_;
  std::vector<iovec> gather_;  // the parts of the write under way (writeAll's scratch)
  coio::GroupCommit<R, Send, WriteSends> commit_;
};

/// Reads and discards until the stream ends or fails.
template <coio::Reactor R>
coio::Task<coio::Result<void>> drainUntilEnd(coio::TcpStream<R>& stream, std::stop_token stop) {
  std::byte sink[4096];
  for (;;) {
    coio::Result<std::size_t> n = co_await stream.read(sink, stop);
    if (!n) co_return n.error();
  }
}

/// Best effort on a connection being dropped for a protocol error: sends
/// an Error frame, half-closes, and drains what the peer still sends (so
/// that closing does not reset the connection before the peer has read
/// the Error frame), all within `grace`.
template <coio::Reactor R>
coio::Task<void> sendErrorAndDrain(coio::TcpStream<R>& stream, FrameWriter<R>& writer, const ReadFailure& failure,
                                   std::chrono::steady_clock::duration grace) {
  if (!writer.broken()) {
    const std::vector<std::byte> frame = errorFrame(failure);
    auto sendFrame = [&writer, &frame](std::stop_token stop) { return writer.send(frame, std::move(stop)); };
    coio::Result<void> sent = co_await coio::withTimeout(stream.reactor(), sendFrame, grace);
    if (!sent) co_return;
  }
  (void)stream.shutdown(coio::ShutdownHow::write);
  auto drain = [&stream](std::stop_token stop) { return drainUntilEnd(stream, std::move(stop)); };
  (void)co_await coio::withTimeout(stream.reactor(), drain, grace);
}

}  // namespace storage
