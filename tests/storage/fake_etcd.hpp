#pragma once
// A fake etcd for the etcd client's tests: a coio TCP server, on any
// reactor (a real one, or coio::sim::SimReactor), that answers each request
// with the next scripted reply and records what it was asked, and when.
#include <coio/core/async_scope.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace storage::etcd::fake {

using coio::Result;
using coio::Task;

struct Reply {
  std::string bytes;
  bool close = false;  // close the connection after it (else serve the next request)
};

inline std::string withLength(std::string status, const std::string& body) {
  return status + "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}
inline std::string ok(const std::string& body) { return withLength("HTTP/1.1 200 OK", body); }
inline std::string chunk(const std::string& data) {
  char size[16];
  const auto end = std::to_chars(size, size + sizeof size, data.size(), 16).ptr;
  return std::string(size, end) + "\r\n" + data + "\r\n";
}
inline const std::string kChunkedHead =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

// Answers each request, on any connection, with the next scripted reply;
// with none left, closes the connection.
template <typename R>
struct FakeEtcd {
  R& reactor;
  coio::TcpListener<R> listener;
  std::deque<Reply> replies;
  std::vector<std::string> targets;  // the request lines' targets, in order
  std::vector<std::string> bodies;   // and their bodies
  std::vector<std::chrono::steady_clock::time_point> arrivals;  // when each was whole (reactor.now())
  coio::AsyncScope scope;

  explicit FakeEtcd(R& r) : reactor(r), listener(*coio::TcpListener<R>::bind(r, coio::SocketAddress::loopbackV4(0))) {
    scope.spawn(acceptAll());
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(listener.localAddress()->port()); }
  Task<void> stop() {
    scope.requestStop();
    co_await scope.join();
  }

  Task<void> acceptAll() {
    for (;;) {
      Result<coio::TcpStream<R>> stream = co_await listener.accept();
      if (!stream) co_return;
      scope.spawn(serve(std::move(*stream)));
    }
  }

  Task<void> serve(coio::TcpStream<R> stream) {
    std::string in;
    char buffer[4096];
    for (;;) {
      // A request: its head, then Content-Length bytes of body.
      std::size_t headEnd;
      while ((headEnd = in.find("\r\n\r\n")) == std::string::npos) {
        Result<std::size_t> n = co_await stream.read(std::as_writable_bytes(std::span(buffer)));
        if (!n) co_return;
        in.append(buffer, *n);
      }
      const std::size_t at = in.find("Content-Length: ");
      const std::size_t length = at < headEnd ? std::stoul(in.substr(at + 16)) : 0;
      while (in.size() < headEnd + 4 + length) {
        Result<std::size_t> n = co_await stream.read(std::as_writable_bytes(std::span(buffer)));
        if (!n) co_return;
        in.append(buffer, *n);
      }
      targets.push_back(in.substr(5, in.find(' ', 5) - 5));
      bodies.push_back(in.substr(headEnd + 4, length));
      arrivals.push_back(reactor.now());
      in.erase(0, headEnd + 4 + length);
      if (replies.empty()) co_return;
      const Reply reply = std::move(replies.front());
      replies.pop_front();
      Result<void> sent = co_await stream.writeAll(std::as_bytes(std::span(reply.bytes)));
      if (!sent || reply.close) co_return;
    }
  }
};

// Runs `body` against `peer` (a FakeEtcd, or any peer with a stop()),
// which is stopped afterwards even if the body failed an assertion.
template <typename Peer>
Task<void> guarded(Peer& peer, Task<void> body) {
  std::exception_ptr failure;
  try {
    co_await std::move(body);
  } catch (...) {
    failure = std::current_exception();
  }
  co_await peer.stop();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace storage::etcd::fake
