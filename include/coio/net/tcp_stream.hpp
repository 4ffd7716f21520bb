#pragma once
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/detail/transform_awaiter.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/detail/iovec.hpp>
#include <coio/reactor/reactor.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <span>
#include <stop_token>
#include <string_view>
#include <system_error>
#include <utility>

namespace coio {

namespace detail {

// A read of a non-empty buffer that returns 0 bytes met the end of stream.
struct ReadResult {
  bool wantedBytes;
  Result<std::size_t> operator()(Result<std::size_t> r) const {
    if (r && *r == 0 && wantedBytes) return Errc::eof;
    return r;
  }
};

// EPIPE: the peer is gone (it reset the connection, or closed it and our
// data drew a reset); report it as the reset it is.
struct WriteResult {
  Result<std::size_t> operator()(Result<std::size_t> r) const {
    if (!r && r.error() == std::errc::broken_pipe) return std::errc::connection_reset;
    return r;
  }
};

// Whether zeroCopySendOn(reactor, ...) avoids the copy.
template <typename R>
bool sendsZeroCopy(const R& reactor) noexcept {
  if constexpr (requires { reactor.zeroCopySend(); }) {
    return reactor.zeroCopySend();
  } else {
    return false;
  }
}

// The reactor's zero-copy send where it has one, else its gather write
// (which copies: the kernel is done with the memory when it resumes).
template <typename R>
auto zeroCopySendOn(R& reactor, int fd, std::span<const iovec> parts, std::stop_token stop) noexcept {
  if constexpr (requires { reactor.sendZeroCopy(fd, parts, stop); }) {
    return reactor.sendZeroCopy(fd, parts, std::move(stop));
  } else {
    return reactor.sendv(fd, parts, std::move(stop));
  }
}

// The address of `fd`'s end (or its peer's), as the reactor knows it.
template <typename R>
Result<SocketAddress> socketName(R& reactor, int fd, bool peer) {
  sockaddr_storage storage{};
  const Result<socklen_t> length = reactor.socketName(fd, peer, storage);
  if (!length) return length.error();
  return SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&storage), *length);
}

}  // namespace detail

/// Which direction TcpStream::shutdown ends.
enum class ShutdownHow { read = SHUT_RD, write = SHUT_WR, both = SHUT_RDWR };

/// A connected TCP socket (non-blocking) driven by a reactor of type R.
///
/// Guarantees:
/// - Every operation is awaited on the reactor's thread and resumes its
///   coroutine there (R's guarantee). One read and one write may be pending
///   at a time.
/// - Errors are values: orderly end of stream is Errc::eof (never a 0-byte
///   read), a reset by the peer is std::errc::connection_reset (on reads and
///   writes), a cancelled operation std::errc::operation_canceled.
/// - The socket is closed (and forgotten by the reactor) on destruction or
///   `close()`; no operation may be pending then.
/// - `writeZeroCopy` / `writeAllZeroCopy` resume once the kernel is done
///   with the buffers, on the loop thread: without a copy where the reactor
///   can (UringReactor::sendZeroCopy), else after a copying write.
///
/// Example (with TcpListener):
/// \snippet api_examples.cpp TcpStream
template <Reactor R>
class TcpStream {
 public:
  /// What read() returns. `co_await` it once, on the loop thread, where it
  /// resumes: it yields Result<std::size_t>, the bytes read, or Errc::eof
  /// at the end of the stream (see the class comment for the errors and
  /// the stop token).
  using ReadAwaitable = detail::TransformAwaiter<decltype(std::declval<R&>().recv(0, std::span<std::byte>{}, {})),
                                                 detail::ReadResult>;
  /// What write(buffer) returns: awaited as a ReadAwaitable, it yields
  /// Result<std::size_t>, the bytes written.
  using WriteAwaitable =
      detail::TransformAwaiter<decltype(std::declval<R&>().send(0, std::span<const std::byte>{}, {})),
                               detail::WriteResult>;
  /// What write(parts) returns: awaited as a ReadAwaitable, it yields
  /// Result<std::size_t>, the bytes written.
  using WritevAwaitable =
      detail::TransformAwaiter<decltype(std::declval<R&>().sendv(0, std::span<const iovec>{}, {})),
                               detail::WriteResult>;
  /// What writeZeroCopy() returns: awaited as a ReadAwaitable, it yields
  /// Result<std::size_t>, the bytes written, once the kernel is done with them.
  using ZeroCopyWriteAwaitable =
      detail::TransformAwaiter<decltype(detail::zeroCopySendOn(std::declval<R&>(), 0, std::span<const iovec>{}, {})),
                               detail::WriteResult>;
  // Their names before the ...Awaitable ones, kept for source compatibility.
  using ReadAwaiter = ReadAwaitable;
  using WriteAwaiter = WriteAwaitable;
  using WritevAwaiter = WritevAwaitable;
  using ZeroCopyWriteAwaiter = ZeroCopyWriteAwaitable;
  /// Adopts a connected non-blocking socket (a coio::FileDescriptor,
  /// <coio/reactor/file_descriptor.hpp>: what release() gives back).
  TcpStream(R& reactor, FileDescriptor fd) noexcept : reactor_(&reactor), fd_(std::move(fd)) {}
  /// Takes over `other`'s socket; `other` becomes closed.
  TcpStream(TcpStream&& other) noexcept = default;
  /// Closes the socket held, if any, and takes over `other`'s.
  TcpStream& operator=(TcpStream&& other) noexcept {
    if (this != &other) {
      close();
      reactor_ = other.reactor_;
      fd_ = std::move(other.fd_);
    }
    return *this;
  }
  ~TcpStream() { close(); }

  /// Connects to `address`.
  static Task<Result<TcpStream>> connect(R& reactor, SocketAddress address, std::stop_token stop = {}) {
    Result<int> fd = reactor.openSocket(address.family());
    if (!fd) co_return fd.error();
    TcpStream stream(reactor, FileDescriptor(*fd));
    Result<void> connected = co_await reactor.connect(stream.fd(), address.data(), address.size(), std::move(stop));
    if (!connected) co_return connected.error();
    co_return std::move(stream);
  }

  /// Reads what is available, at most `buffer.size()` bytes (at least 1 for
  /// a non-empty buffer).
  ReadAwaitable read(std::span<std::byte> buffer, std::stop_token stop = {}) noexcept {
    return ReadAwaitable{reactor_->recv(fd(), buffer, std::move(stop)), detail::ReadResult{!buffer.empty()}};
  }

  /// Writes some of `buffer`: the byte count written, possibly short.
  WriteAwaitable write(std::span<const std::byte> buffer, std::stop_token stop = {}) noexcept {
    return WriteAwaitable{reactor_->send(fd(), buffer, std::move(stop)), detail::WriteResult{}};
  }

  /// Writes some of `parts` in one system call (at most IOV_MAX parts):
  /// the byte count written, possibly short. `parts` must stay valid until
  /// the co_await returns.
  WritevAwaitable write(std::span<const iovec> parts, std::stop_token stop = {}) noexcept {
    return WritevAwaitable{reactor_->sendv(fd(), parts, std::move(stop)), detail::WriteResult{}};
  }

  /// Writes some of `parts` (at most IOV_MAX) without copying them into the
  /// socket where the reactor can (writesZeroCopy()), else as write(parts)
  /// does: the byte count written, possibly short (a zero-copy send is
  /// short only after an error or a stop).
  ///
  /// Resumes once the kernel is done with the buffers, on the loop thread:
  /// the memory may be reused or freed as soon as the co_await returns, and
  /// must stay untouched until then. Without a copy that is when the peer
  /// has acknowledged the data, not when the socket took it: a peer that
  /// stopped reading holds the write, even a cancelled one, until the
  /// connection is reset (abort()). A reactor that copies (EpollReactor;
  /// UringReactor without zero-copy sends) keeps the guarantee trivially:
  /// the kernel holds a copy once the write resumes.
  ZeroCopyWriteAwaitable writeZeroCopy(std::span<const iovec> parts, std::stop_token stop = {}) noexcept {
    return ZeroCopyWriteAwaitable{detail::zeroCopySendOn(*reactor_, fd(), parts, std::move(stop)),
                                detail::WriteResult{}};
  }

  /// Whether writeZeroCopy avoids the copy on this stream's reactor
  /// (UringReactor::zeroCopySend()).
  bool writesZeroCopy() const noexcept { return detail::sendsZeroCopy(*reactor_); }

  /// Fills `buffer` completely; Errc::eof if the stream ends first (the
  /// bytes read so far are then in the buffer but not counted). Where the
  /// reactor can (UringReactor::recvAll), one receive asks for all of it.
  Task<Result<void>> readExact(std::span<std::byte> buffer, std::stop_token stop = {}) {
    while (!buffer.empty()) {
      Result<std::size_t> n = co_await readMost(buffer, stop);
      if (!n) co_return n.error();
      buffer = buffer.subspan(*n);
    }
    co_return Result<void>{};
  }

  /// Writes all of `buffer`, across as many partial writes as it takes.
  Task<Result<void>> writeAll(std::span<const std::byte> buffer, std::stop_token stop = {}) {
    while (!buffer.empty()) {
      Result<std::size_t> n = co_await write(buffer, stop);
      if (!n) co_return n.error();
      buffer = buffer.subspan(*n);
    }
    co_return Result<void>{};
  }

  /// Writes all of `parts`, in order, with as few system calls as the
  /// socket allows (IOV_MAX parts per call): one gather write for a frame
  /// and its data. Uses `parts` as scratch: afterwards its iovecs describe
  /// what was left unwritten (nothing, unless an error came first).
  Task<Result<void>> writeAll(std::span<iovec> parts, std::stop_token stop = {}) {
    while (!parts.empty()) {  // a write of empty parts returns 0, and advance() drops them
      Result<std::size_t> n = co_await write(parts.first(std::min<std::size_t>(parts.size(), IOV_MAX)), stop);
      if (!n) co_return n.error();
      parts = detail::advance(parts, *n);
    }
    co_return Result<void>{};
  }

  /// writeAll(parts) through writeZeroCopy: resumes once all of `parts` went
  /// (or an error came first) and the kernel is done with every byte. Uses
  /// `parts` as scratch, as writeAll does.
  Task<Result<void>> writeAllZeroCopy(std::span<iovec> parts, std::stop_token stop = {}) {
    while (!parts.empty()) {
      Result<std::size_t> n =
          co_await writeZeroCopy(parts.first(std::min<std::size_t>(parts.size(), IOV_MAX)), stop);
      if (!n) co_return n.error();
      parts = detail::advance(parts, *n);
    }
    co_return Result<void>{};
  }

  /// Resets the connection now (RFC 793's ABORT: the peer gets a reset):
  /// the kernel drops the data it still queues to send, so zero-copy writes
  /// that wait for a peer that stopped reading resume. The socket stays
  /// open, unconnected, until close(); operations on it fail from now on.
  Result<void> abort() noexcept {
    return reactor_->resetSocket(fd());
  }

  /// shutdown(2): by default ends the writing side, so the peer reads end of stream.
  Result<void> shutdown(ShutdownHow how = ShutdownHow::write) noexcept {
    return reactor_->shutdownSocket(fd(), static_cast<int>(how));
  }

  /// TCP_NODELAY: send small writes at once instead of coalescing them.
  Result<void> setNoDelay(bool on) noexcept {
    const int value = on ? 1 : 0;
    return reactor_->setSocketOption(fd(), IPPROTO_TCP, TCP_NODELAY, &value, sizeof value);
  }

  /// TCP_CONGESTION: the congestion control algorithm of this connection's
  /// sends (e.g. "cubic", "bbr"; /proc/sys/net/ipv4/tcp_available_congestion_control
  /// lists them). Errors: ENOENT for an unknown name, EPERM for one not in
  /// tcp_allowed_congestion_control without CAP_NET_ADMIN.
  Result<void> setCongestionControl(std::string_view name) noexcept {
    return reactor_->setSocketOption(fd(), IPPROTO_TCP, TCP_CONGESTION, name.data(),
                                     static_cast<socklen_t>(name.size()));
  }

  /// This end's address.
  Result<SocketAddress> localAddress() const { return detail::socketName(*reactor_, fd(), false); }
  /// The peer's address.
  Result<SocketAddress> peerAddress() const { return detail::socketName(*reactor_, fd(), true); }

  /// Closes the socket now (idempotent).
  void close() noexcept {
    if (fd_.valid()) reactor_->closeSocket(fd_.release());
  }

  /// Gives the socket up, forgotten by this reactor, e.g. to serve it on
  /// another one: `if (auto fd = stream.release()) TcpStream(other,
  /// std::move(*fd))`. No operation may be pending. Fails with
  /// std::errc::device_or_resource_busy, the stream left as it was, while
  /// the reactor reads the socket ahead (UringReactor::readsAhead:
  /// forgetting it would drop data the peer sent); release before the first
  /// read, or on a reactor that does not read ahead.
  Result<FileDescriptor> release() noexcept {
    if constexpr (requires(const R& r) { r.readsAhead(0); }) {
      if (fd_.valid() && reactor_->readsAhead(fd_.get())) return systemError(EBUSY);
    }
    if (fd_.valid()) reactor_->forget(fd_.get());
    return std::move(fd_);
  }

  /// Whether the stream holds a socket.
  bool isOpen() const noexcept { return fd_.valid(); }
  /// The socket's file descriptor (-1 when closed).
  int fd() const noexcept { return fd_.get(); }
  /// The reactor the stream's operations run on.
  R& reactor() const noexcept { return *reactor_; }

 private:
  // read(), or where the reactor can, a read that asks for all of `buffer`.
  ReadAwaitable readMost(std::span<std::byte> buffer, std::stop_token stop) noexcept {
    if constexpr (requires(R& r) { r.recvAll(0, buffer, stop); }) {
      return ReadAwaitable{reactor_->recvAll(fd(), buffer, std::move(stop)), detail::ReadResult{!buffer.empty()}};
    } else {
      return read(buffer, std::move(stop));
    }
  }

  R* reactor_;
  FileDescriptor fd_;
};

}  // namespace coio
