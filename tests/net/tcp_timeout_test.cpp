// Timeouts and cancellation of TCP operations, on every reactor.
#include "../reactor/test_reactors.hpp"

#include <coio/core/task.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using coio::Result;
using coio::SocketAddress;
using coio::Task;
using coio::testing::TcpTestReactors;

namespace {

template <typename R>
struct Connected {
  coio::TcpListener<R> listener;
  coio::TcpStream<R> client;
  coio::TcpStream<R> server;
};

template <typename R>
Task<Connected<R>> connectPair(R& reactor) {
  Result<coio::TcpListener<R>> listener = coio::TcpListener<R>::bind(reactor, SocketAddress::loopbackV4());
  REQUIRE(listener.hasValue());
  Result<coio::TcpStream<R>> client = co_await coio::TcpStream<R>::connect(reactor, *listener->localAddress());
  REQUIRE(client.hasValue());
  Result<coio::TcpStream<R>> server = co_await listener->accept();
  REQUIRE(server.hasValue());
  co_return Connected<R>{std::move(*listener), std::move(*client), std::move(*server)};
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("accept with a timeout that fires, and one that does not", "[net][timeout]",
                        TcpTestReactors) {
  TestType reactor;
  Result<coio::TcpListener<TestType>> listener = coio::TcpListener<TestType>::bind(reactor, SocketAddress::loopbackV4());
  REQUIRE(listener.hasValue());
  auto accept = [&](std::stop_token stop) { return listener->accept(std::move(stop)); };
  auto test = [&](TestType& r) -> Task<void> {
    const auto start = Clock::now();
    Result<coio::TcpStream<TestType>> none = co_await coio::withTimeout(r, accept, 20ms);
    CHECK(none.error() == std::errc::timed_out);
    CHECK(Clock::now() - start >= 20ms);

    auto connectLater = [](TestType& rr, SocketAddress to) -> Task<void> {
      co_await rr.sleepFor(5ms);
      Result<coio::TcpStream<TestType>> c = co_await coio::TcpStream<TestType>::connect(rr, to);
      REQUIRE(c.hasValue());
      co_await rr.sleepFor(50ms);  // keep it open while the server side checks
    };
    r.spawn(connectLater(r, *listener->localAddress()));
    Result<coio::TcpStream<TestType>> one = co_await coio::withTimeout(r, accept, 10s);
    CHECK(one.hasValue());
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("a read that times out consumes nothing: the socket is reused", "[net][timeout]",
                        TcpTestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<void> {
    Connected<TestType> c = co_await connectPair(r);
    std::vector<std::byte> buffer(64);
    auto read = [&](std::stop_token stop) { return c.client.read(buffer, std::move(stop)); };
    for (int round = 0; round < 3; ++round) {
      Result<std::size_t> idle = co_await coio::withTimeout(r, read, 10ms);
      CHECK(idle.error() == std::errc::timed_out);
      const std::string message = "round " + std::to_string(round);
      Result<void> sent = co_await c.server.writeAll(std::as_bytes(std::span(message.data(), message.size())));
      REQUIRE(sent.hasValue());
      Result<std::size_t> got = co_await coio::withTimeout(r, read, 10s);
      REQUIRE(got.hasValue());
      CHECK(std::string(reinterpret_cast<const char*>(buffer.data()), *got) == message);
    }
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("a write blocked on a full socket times out, and the rest can still be written",
                        "[net][timeout]", TcpTestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<void> {
    Connected<TestType> c = co_await connectPair(r);
    std::vector<std::byte> chunk(1 << 20, std::byte{7});
    std::size_t written = 0;
    auto write = [&](std::stop_token stop) { return c.client.write(chunk, std::move(stop)); };
    for (;;) {  // fill the socket buffers: the peer does not read
      Result<std::size_t> n = co_await coio::withTimeout(r, write, 20ms);
      if (!n) {
        CHECK(n.error() == std::errc::timed_out);
        break;
      }
      written += *n;
    }
    CHECK(written > 0);
    // The peer drains everything that was written, then more flows.
    std::vector<std::byte> sink(written);
    Result<void> drained = co_await c.server.readExact(sink);
    REQUIRE(drained.hasValue());
    Result<std::size_t> more = co_await coio::withTimeout(r, write, 10s);
    CHECK(more.hasValue());
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("a connect cancelled before it starts yields operation_canceled", "[net][timeout]",
                        TcpTestReactors) {
  TestType reactor;
  auto test = [](TestType& r) -> Task<std::error_code> {
    std::stop_source source;
    source.request_stop();
    Result<coio::TcpStream<TestType>> s =
        co_await coio::TcpStream<TestType>::connect(r, SocketAddress::loopbackV4(9), source.get_token());
    co_return s.error();
  };
  CHECK(reactor.runUntil(test(reactor)) == std::errc::operation_canceled);
}
