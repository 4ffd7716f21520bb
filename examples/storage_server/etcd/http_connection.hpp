#pragma once
// One HTTP/1.1 client connection over coio's TCP: a POST out, its response
// (head, then the body as it comes) back through ResponseParser.
#include "http1.hpp"

#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace storage::http1 {

/// A keep-alive HTTP/1.1 connection that carries one exchange at a time:
/// post(), readHead(), then readBody() until it says the response is
/// complete; then, if reusable(), the next post().
///
/// Guarantees:
/// - Used on its reactor's loop thread; every awaitable resumes there.
/// - Every operation runs under the stop token of the awaiting coroutine
///   (coio::currentStopToken: e.g. a withTimeout deadline), which cancels
///   it with std::errc::operation_canceled. A cancelled read loses nothing:
///   bytes are consumed only when a read completes, and what was read stays
///   buffered for the next call (a streamed body goes on where it stopped).
/// - Errors: the transport's (connection refused, reset, Errc::eof before a
///   response byte), or an HttpErrc for a response outside the subset
///   (ResponseParser; HttpErrc::truncated when the peer closes inside one).
///   After an error the connection is not reusable().
template <coio::Reactor R>
class HttpConnection {
 public:
  HttpConnection(coio::TcpStream<R> stream, Limits limits) noexcept
      : stream_(std::move(stream)), limits_(limits), parser_(limits) {}

  /// Connects to `to`, with TCP_NODELAY (requests are single small writes).
  static coio::Task<coio::Result<HttpConnection>> connect(R& reactor, coio::SocketAddress to, Limits limits = {}) {
    coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, to);
    if (!stream) co_return stream.error();
    (void)stream->setNoDelay(true);
    co_return HttpConnection(std::move(*stream), limits);
  }

  /// Sends `POST target` with a JSON `body` to `host` (the Host header).
  /// A `streamed` reply (a watch) has no bound on its body as a whole: its
  /// reader bounds each message.
  coio::Task<coio::Result<void>> post(std::string_view host, std::string_view target, std::string_view body,
                                      bool streamed = false) {
    parser_ = ResponseParser(streamed ? Limits{limits_.maxHeadBytes, std::numeric_limits<std::size_t>::max()}
                                      : limits_);
    body_.clear();
    heard_ = false;
    failed_ = false;
    std::string head;
    head.reserve(128 + host.size() + target.size());
    head.append("POST ").append(target).append(" HTTP/1.1\r\nHost: ").append(host);
    head.append("\r\nContent-Type: application/json\r\nContent-Length: ").append(std::to_string(body.size()));
    head.append("\r\n\r\n");
    std::array<iovec, 2> parts{iovec{head.data(), head.size()},
                               iovec{const_cast<char*>(body.data()), body.size()}};  // writev does not write it
    coio::Result<void> sent = co_await stream_.writeAll(std::span<iovec>(parts));
    if (!sent) failed_ = true;
    co_return sent;
  }

  /// Reads until the response's status line and headers are in: its status.
  coio::Task<coio::Result<int>> readHead() {
    while (!parser_.headComplete()) {
      coio::Result<void> more = co_await fill();
      if (!more) co_return more.error();
    }
    co_return parser_.status();
  }

  /// Appends the body bytes that came (at least one, unless the response
  /// is complete) to `into`: whether the response is complete. Call after
  /// readHead().
  coio::Task<coio::Result<bool>> readBody(std::string& into) {
    while (body_.empty() && !parser_.complete()) {
      coio::Result<void> more = co_await fill();
      if (!more) co_return more.error();
    }
    into.append(body_);
    body_.clear();
    co_return parser_.complete();
  }

  /// The whole body (readHead() first), at most Limits::maxBodyBytes.
  coio::Task<coio::Result<std::string>> readWholeBody() {
    std::string body;
    for (;;) {
      coio::Result<bool> done = co_await readBody(body);
      if (!done) co_return done.error();
      if (*done) co_return std::move(body);
    }
  }

  /// Whether another request may follow on this connection: the response
  /// is complete, the server keeps the connection, nothing failed, and no
  /// unasked-for bytes followed.
  bool reusable() const noexcept {
    return !failed_ && parser_.complete() && parser_.keepAlive() && begin_ == end_;
  }

  /// Whether any byte of the current response came: a reused connection
  /// that ends before one was closed by the server while idle, so the
  /// request was never read.
  bool heardBack() const noexcept { return heard_; }

 private:
  // Feeds buffered bytes, else reads more: progress of the parser, or the error.
  coio::Task<coio::Result<void>> fill() {
    if (begin_ == end_) {
      if (buffer_.empty()) buffer_.resize(kReadSize);
      coio::Result<std::size_t> n = co_await stream_.read(std::as_writable_bytes(std::span(buffer_)));
      if (!n) {
        // A cancelled read consumed nothing: a stream may go on after it.
        if (n.error() != std::errc::operation_canceled) failed_ = true;
        if (n.error() == coio::Errc::eof && heard_) co_return parser_.finish().error();
        co_return n.error();
      }
      heard_ = true;
      begin_ = 0;
      end_ = *n;
    }
    coio::Result<std::size_t> used =
        parser_.feed(std::string_view(buffer_.data() + begin_, end_ - begin_), body_);
    if (!used) {
      failed_ = true;
      co_return used.error();
    }
    begin_ += *used;
    co_return coio::Result<void>{};
  }

  static constexpr std::size_t kReadSize = 16 * 1024;

  coio::TcpStream<R> stream_;
  Limits limits_;
  ResponseParser parser_;
  std::vector<char> buffer_;  // bytes read; [begin_, end_) not yet fed
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::string body_;  // body bytes fed, not yet handed out
  bool heard_ = false;
  bool failed_ = false;
};

}  // namespace storage::http1
