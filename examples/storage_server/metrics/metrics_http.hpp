#pragma once
// MetricsHttpServer: the smallest HTTP/1.0 responder that serves a metrics
// page (`serve --metrics ADDR:PORT`, GET /metrics) over coio's TCP: one
// request per connection, answered, then closed.
#include <coio/core/async_scope.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>

namespace storage {

/// Answers `GET /metrics` with the page `page()` makes (text/plain, the
/// Prometheus exposition format's content type); any other path 404, any
/// other method 405, a malformed or oversized request head 400.
///
/// Guarantees:
/// - Runs on `reactor`'s loop thread: construct it, start() and shutdown()
///   there; page() is awaited there and must resume there.
/// - A client cannot hold a connection or memory for long: the request head
///   is read into a fixed buffer of maxHeadBytes, the whole exchange
///   (request, answer, and the lingering close that lets the answer reach a
///   client that sent more than it read) ends within `timeout`, and at most
///   maxConnections are served at once (more are closed at accept). Nothing
///   here blocks the loop: a slow or malformed client disturbs no other work
///   of the reactor.
/// - `co_await shutdown()` stops accepting, cuts every exchange and resumes
///   once all are gone; it must complete before destruction.
template <coio::Reactor R>
class MetricsHttpServer {
 public:
  /// Makes the page body, on the loop thread.
  using Page = std::function<coio::Task<std::string>()>;

  struct Options {
    std::size_t maxHeadBytes = 8192;
    std::chrono::steady_clock::duration timeout = std::chrono::seconds(5);
    std::size_t maxConnections = 16;
  };

  MetricsHttpServer(R& reactor, coio::TcpListener<R> listener, Page page, Options options)
      : reactor_(reactor), listener_(std::move(listener)), page_(std::move(page)), options_(options) {}
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  /// Where it listens.
  coio::Result<coio::SocketAddress> address() const { return listener_.localAddress(); }

  /// Starts accepting.
  void start() { scope_.spawn(acceptLoop()); }

  coio::Task<void> shutdown() {
    scope_.requestStop();
    co_await scope_.join();
  }

 private:
  coio::Task<void> acceptLoop() {
    const std::stop_token stop = co_await coio::currentStopToken();
    while (!stop.stop_requested()) {
      coio::Result<coio::TcpStream<R>> stream = co_await listener_.accept();
      if (!stream) {
        // e.g. EMFILE: back off rather than spin on an error that repeats at once.
        co_await reactor_.sleepFor(std::chrono::milliseconds(10));  // ends early at shutdown
      } else if (active_ < options_.maxConnections) {
        scope_.spawn(serve(std::move(*stream)));
      }  // else: closed here, at once
    }
  }

  coio::Task<void> serve(coio::TcpStream<R> stream) {
    ++active_;
    const coio::Result<void> done = co_await coio::withTimeout(reactor_, exchange(stream), options_.timeout);
    (void)done;  // timed out, cut, or the client went away: it is closed all the same
    stream.close();
    --active_;
  }

  // Reads the request head, answers, then closes lingering: the write side
  // first, then what the client still sends is read and dropped until it
  // closes (bounded by the timeout), so that the answer is not lost to the
  // reset a close with unread data would send.
  coio::Task<coio::Result<void>> exchange(coio::TcpStream<R>& stream) {
    std::array<char, 512> scratch;
    std::string head(options_.maxHeadBytes, '\0');
    std::size_t got = 0;
    bool complete = false;
    while (!complete && got < head.size()) {
      coio::Result<std::size_t> n = co_await stream.read(std::as_writable_bytes(std::span(head).subspan(got)));
      if (!n && n.error() == coio::Errc::eof && got > 0) break;  // a truncated head: 400
      if (!n) co_return n.error();
      const std::size_t searchFrom = got < 3 ? 0 : got - 3;
      got += *n;
      const std::string_view seen(head.data(), got);
      complete = seen.find("\r\n\r\n", searchFrom) != std::string_view::npos ||
                 seen.find("\n\n", searchFrom) != std::string_view::npos;
    }
    std::string answer;
    if (complete) {
      answer = co_await respond(std::string_view(head.data(), got));
    } else {
      answer = status("400 Bad Request", "a request head ends with an empty line, within " +
                                             std::to_string(options_.maxHeadBytes) + " bytes\n");
    }
    coio::Result<void> sent = co_await stream.writeAll(std::as_bytes(std::span(answer)));
    if (!sent) co_return sent;
    (void)stream.shutdown();
    for (std::size_t drained = 0; drained < (64u << 10);) {
      coio::Result<std::size_t> n = co_await stream.read(std::as_writable_bytes(std::span(scratch)));
      if (!n) break;  // eof: the client read the answer and closed
      drained += *n;
    }
    co_return coio::Result<void>{};
  }

  // The answer to a complete request head.
  coio::Task<std::string> respond(std::string_view head) {
    const std::string_view line = head.substr(0, head.find_first_of("\r\n"));
    const std::size_t space1 = line.find(' ');
    const std::size_t space2 = space1 == std::string_view::npos ? space1 : line.find(' ', space1 + 1);
    if (space2 == std::string_view::npos || line.find(' ', space2 + 1) != std::string_view::npos ||
        !line.substr(space2 + 1).starts_with("HTTP/1.") || space1 == 0 || space2 == space1 + 1) {
      co_return status("400 Bad Request", "expected: GET /metrics HTTP/1.0\n");
    }
    const std::string_view method = line.substr(0, space1);
    const std::string_view target = line.substr(space1 + 1, space2 - space1 - 1);
    if (method != "GET") co_return status("405 Method Not Allowed", "only GET\n", "Allow: GET\r\n");
    if (target != "/metrics" && !target.starts_with("/metrics?")) co_return status("404 Not Found", "try /metrics\n");
    const std::string page = co_await page_();
    co_return status("200 OK", page, "", "text/plain; version=0.0.4; charset=utf-8");
  }

  static std::string status(std::string_view code, const std::string& body, std::string_view extra = "",
                            std::string_view type = "text/plain; charset=utf-8") {
    std::string out = "HTTP/1.0 ";
    out.append(code).append("\r\nContent-Type: ").append(type);
    out.append("\r\nContent-Length: ").append(std::to_string(body.size()));
    out.append("\r\nConnection: close\r\n").append(extra).append("\r\n");
    return out + body;
  }

  R& reactor_;
  coio::TcpListener<R> listener_;
  Page page_;
  Options options_;
  std::size_t active_ = 0;  // exchanges under way
  coio::AsyncScope scope_;  // the accept loop and the exchanges
};

}  // namespace storage
