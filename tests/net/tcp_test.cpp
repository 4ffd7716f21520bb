// TCP over real loopback sockets, on every reactor.
#include "../reactor/test_reactors.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

using coio::Result;
using coio::SocketAddress;
using coio::Task;
using coio::testing::TcpTestReactors;

namespace {

template <typename R>
using Listener = coio::TcpListener<R>;
template <typename R>
using Stream = coio::TcpStream<R>;

std::span<const std::byte> bytesOf(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

// Echoes everything back until the peer closes.
template <typename R>
Task<void> echoConnection(Stream<R> stream) {
  std::vector<std::byte> buffer(64 * 1024);
  for (;;) {
    Result<std::size_t> n = co_await stream.read(buffer);
    if (!n) co_return;
    Result<void> written = co_await stream.writeAll(std::span(buffer).first(*n));
    if (!written) co_return;
  }
}

// Accepts `count` connections, each echoed by its own spawned task.
template <typename R>
Task<void> echoServer(R& reactor, Listener<R>& listener, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    Result<Stream<R>> stream = co_await listener.accept();
    REQUIRE(stream.hasValue());
    reactor.spawn(echoConnection<R>(std::move(*stream)));
  }
}

template <typename R>
Listener<R> listen(R& reactor, const SocketAddress& address) {
  Result<Listener<R>> listener = Listener<R>::bind(reactor, address);
  REQUIRE(listener.hasValue());
  return std::move(*listener);
}

template <typename R>
Task<std::string> echoOnce(R& reactor, SocketAddress server, std::string message) {
  Result<Stream<R>> stream = co_await Stream<R>::connect(reactor, server);
  REQUIRE(stream.hasValue());
  REQUIRE(stream->setNoDelay(true).hasValue());
  Result<void> written = co_await stream->writeAll(bytesOf(message));
  REQUIRE(written.hasValue());
  std::string reply(message.size(), '\0');
  Result<void> read = co_await stream->readExact(std::as_writable_bytes(std::span(reply.data(), reply.size())));
  REQUIRE(read.hasValue());
  co_return reply;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("TCP echo round trip over IPv4 and IPv6", "[net][tcp]", TcpTestReactors) {
  TestType reactor;
  for (const SocketAddress& any : {SocketAddress::loopbackV4(), SocketAddress::loopbackV6()}) {
    Listener<TestType> listener = listen(reactor, any);
    Result<SocketAddress> bound = listener.localAddress();
    REQUIRE(bound.hasValue());
    CHECK(bound->family() == any.family());
    CHECK(bound->port() != 0);
    reactor.spawn(echoServer(reactor, listener, 1));
    auto client = [&](TestType& r) -> Task<void> {
      Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, *bound);
      REQUIRE(stream.hasValue());
      Result<SocketAddress> peer = stream->peerAddress();
      CHECK(peer.hasValue());
      CHECK(*peer == *bound);
      for (const std::string& message : {std::string("hello"), std::string("coio"), std::string(10000, 'x')}) {
        Result<void> written = co_await stream->writeAll(bytesOf(message));
        REQUIRE(written.hasValue());
        std::string reply(message.size(), '\0');
        Result<void> read = co_await stream->readExact(std::as_writable_bytes(std::span(reply.data(), reply.size())));
        REQUIRE(read.hasValue());
        CHECK(reply == message);
      }
    };
    reactor.runUntil(client(reactor));
  }
}

TEMPLATE_LIST_TEST_CASE("1000 concurrent connections on one reactor", "[net][tcp]", TcpTestReactors) {
  coio::testing::raiseFdLimit();
  const std::size_t fdsBefore = coio::testing::openFdCount();
  {
    TestType reactor;
    constexpr std::size_t kConnections = 1000;
    Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
    const SocketAddress server = *listener.localAddress();
    reactor.spawn(echoServer(reactor, listener, kConnections));
    std::vector<Task<std::string>> clients;
    for (std::size_t i = 0; i < kConnections; ++i) {
      clients.push_back(echoOnce(reactor, server, "message " + std::to_string(i)));
    }
    std::vector<std::string> replies = reactor.runUntil(coio::collectAllRange(std::move(clients)));
    for (std::size_t i = 0; i < kConnections; ++i) CHECK(replies[i] == "message " + std::to_string(i));
  }
  CHECK(coio::testing::openFdCount() == fdsBefore);
}

TEMPLATE_LIST_TEST_CASE("large transfers survive partial reads and writes", "[net][tcp]", TcpTestReactors) {
  TestType reactor;
  Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
  const SocketAddress server = *listener.localAddress();
  reactor.spawn(echoServer(reactor, listener, 1));
  constexpr std::size_t kBytes = 32 << 20;
  std::vector<std::byte> payload(kBytes);
  std::mt19937 rng(42);
  for (auto& b : payload) b = static_cast<std::byte>(rng());
  std::vector<std::byte> received(kBytes);
  std::size_t shortReads = 0;

  auto test = [&](TestType& r) -> Task<void> {
    Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, server);
    REQUIRE(stream.hasValue());
    auto writer = [](Stream<TestType>& s, std::span<const std::byte> data) -> Task<Result<void>> {
      co_return co_await s.writeAll(data);
    };
    // Reads with plain read() to see the short ones.
    auto reader = [&](Stream<TestType>& s) -> Task<Result<void>> {
      std::span<std::byte> rest(received);
      while (!rest.empty()) {
        Result<std::size_t> n = co_await s.read(rest.first(std::min<std::size_t>(rest.size(), 1 << 20)));
        if (!n) co_return n.error();
        if (*n < std::min<std::size_t>(rest.size(), 1 << 20)) ++shortReads;
        rest = rest.subspan(*n);
      }
      co_return Result<void>{};
    };
    auto [wrote, read] = co_await coio::collectAll(writer(*stream, payload), reader(*stream));
    CHECK(wrote.hasValue());
    CHECK(read.hasValue());
  };
  reactor.runUntil(test(reactor));
  CHECK(shortReads > 0);  // the loopback buffers are far smaller than 1 MiB reads
  CHECK(received == payload);
}

TEMPLATE_LIST_TEST_CASE("a gather write of thousands of parts arrives whole and in order", "[net][tcp]",
                        TcpTestReactors) {
  // More parts than IOV_MAX, of sizes from 0 to 16 KiB, more bytes than the
  // socket buffers hold: writeAll(iovecs) must split, resume partial writes
  // mid-part and skip empty parts without losing or reordering a byte.
  TestType reactor;
  Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
  const SocketAddress server = *listener.localAddress();
  reactor.spawn(echoServer(reactor, listener, 1));
  std::mt19937 rng(7);
  std::vector<std::byte> payload(24 << 20);
  for (auto& b : payload) b = static_cast<std::byte>(rng());
  std::vector<iovec> parts;
  for (std::size_t at = 0; at < payload.size();) {
    const std::size_t size = std::min<std::size_t>(payload.size() - at, rng() % 3 == 0 ? 0 : rng() % (16 << 10));
    parts.push_back({payload.data() + at, size});
    at += size;
  }
  REQUIRE(parts.size() > 2 * IOV_MAX);
  std::vector<std::byte> received(payload.size());
  auto test = [&](TestType& r) -> Task<void> {
    Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, server);
    REQUIRE(stream.hasValue());
    auto writer = [&](Stream<TestType>& s) -> Task<Result<void>> { co_return co_await s.writeAll(parts); };
    auto reader = [&](Stream<TestType>& s) -> Task<Result<void>> { co_return co_await s.readExact(received); };
    auto [wrote, read] = co_await coio::collectAll(writer(*stream), reader(*stream));
    CHECK(wrote.hasValue());
    CHECK(read.hasValue());
  };
  reactor.runUntil(test(reactor));
  CHECK(received == payload);
}

TEMPLATE_LIST_TEST_CASE("connect to a closed port is refused", "[net][tcp]", TcpTestReactors) {
  TestType reactor;
  SocketAddress closedPort;
  {
    Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
    closedPort = *listener.localAddress();
  }
  auto test = [&](TestType& r) -> Task<std::error_code> {
    Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, closedPort);
    co_return stream.error();
  };
  CHECK(reactor.runUntil(test(reactor)) == std::errc::connection_refused);
}

TEMPLATE_LIST_TEST_CASE("orderly close reads as eof, a reset as connection_reset", "[net][tcp]", TcpTestReactors) {
  TestType reactor;
  Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
  const SocketAddress server = *listener.localAddress();
  const bool reset = GENERATE(false, true);
  auto serverSide = [&](TestType&) -> Task<void> {
    Result<Stream<TestType>> stream = co_await listener.accept();
    REQUIRE(stream.hasValue());
    Result<void> written = co_await stream->writeAll(bytesOf("partial"));
    REQUIRE(written.hasValue());
    if (reset) {
      const linger abortive{1, 0};  // close sends RST
      REQUIRE(::setsockopt(stream->fd(), SOL_SOCKET, SO_LINGER, &abortive, sizeof abortive) == 0);
    }
    stream->close();
  };
  auto client = [&](TestType& r) -> Task<void> {
    r.spawn(serverSide(r));
    Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, server);
    REQUIRE(stream.hasValue());
    co_await r.sleepFor(std::chrono::milliseconds(20));  // let the server finish first
    std::byte buffer[64];
    if (reset) {
      Result<std::size_t> n = co_await stream->read(buffer);
      while (n) n = co_await stream->read(buffer);  // data that came before the RST may still be read
      CHECK(n.error() == std::errc::connection_reset);
      Result<std::size_t> w = co_await stream->write(std::as_bytes(std::span(buffer)));
      CHECK(w.error() == std::errc::connection_reset);
    } else {
      Result<std::size_t> n = co_await stream->read(buffer);
      REQUIRE(n.hasValue());
      CHECK(*n == 7);
      Result<std::size_t> end = co_await stream->read(buffer);
      CHECK(end.error() == coio::Errc::eof);
      Result<void> exact = co_await stream->readExact(buffer);
      CHECK(exact.error() == coio::Errc::eof);
    }
  };
  reactor.runUntil(client(reactor));
}

TEMPLATE_LIST_TEST_CASE("stop with TCP operations pending destroys every frame and leaks no fd", "[net][tcp]",
                        TcpTestReactors) {
  const std::size_t fdsBefore = coio::testing::openFdCount();
  {
    TestType reactor;
    Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
    const SocketAddress server = *listener.localAddress();
    // Server connections wait in reads, clients wait in reads, one accept pends.
    reactor.spawn(echoServer(reactor, listener, 11));
    auto idleClient = [](TestType& r, SocketAddress to) -> Task<void> {
      Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, to);
      REQUIRE(stream.hasValue());
      std::byte buffer[16];
      (void)co_await stream->read(buffer);
      FAIL("resumed after stop");
    };
    for (int i = 0; i < 10; ++i) reactor.spawn(idleClient(reactor, server));
    auto stopper = [](TestType& r) -> Task<void> {
      co_await r.sleepFor(std::chrono::milliseconds(20));
      r.stop();
    };
    reactor.spawn(stopper(reactor));
    reactor.run();
    CHECK(coio::testing::openFdCount() >= fdsBefore + 21);
    // The listener goes first, while tasks still wait on the stopped reactor.
  }
  CHECK(coio::testing::openFdCount() == fdsBefore);
}

TEMPLATE_LIST_TEST_CASE("stop with an accept pending and its connection arrived leaks no fd", "[net][tcp]",
                        TcpTestReactors) {
  // The accept is prepared but not submitted at the stop (io_uring: it goes
  // to the kernel with the stop's cancel and takes the waiting connection
  // at once), or waits in the kernel when the connection arrives (the
  // cancel must still win or close what the accept made).
  const bool submitted = GENERATE(false, true);
  const std::size_t fdsBefore = coio::testing::openFdCount();
  {
    TestType reactor;
    Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
    const SocketAddress server = *listener.localAddress();
    coio::FileDescriptor client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(client.valid());
    auto arrive = [&] {  // a connection, queued for accept (no loop runs)
      REQUIRE(::connect(client.get(), server.data(), server.size()) == 0);
      pollfd queued{listener.fd(), POLLIN, 0};
      REQUIRE(::poll(&queued, 1, 10000) == 1);
    };
    std::size_t unsubmitted = 0;  // SQEs prepared but not submitted before the accept
    auto acceptOne = [&](TestType& r) -> Task<void> {
      unsubmitted = r.stats().unsubmitted;
      (void)co_await listener.accept();
    };
    if (submitted) {
      // Two turns: the accept reaches the kernel, which finds no connection.
      auto armAccept = [&](TestType& r) -> Task<void> {
        r.spawn(acceptOne(r));
        co_await r.schedule();
        co_await r.schedule();
      };
      reactor.runUntil(armAccept(reactor));
      if constexpr (requires { reactor.ring(); }) CHECK(reactor.stats().unsubmitted == 0);
      arrive();
      reactor.stop();
    } else {
      arrive();
      auto stopper = [&](TestType& r) -> Task<void> {
        // io_uring: the accept's SQE is prepared, not submitted yet.
        if constexpr (requires { r.ring(); }) CHECK(r.stats().unsubmitted == unsubmitted + 1);
        r.stop();
        co_return;
      };
      reactor.spawn(acceptOne(reactor));  // first: its accept is prepared when the stop comes
      reactor.spawn(stopper(reactor));
    }
    reactor.run();
  }
  CHECK(coio::testing::openFdCount() == fdsBefore);
}

TEMPLATE_LIST_TEST_CASE("an echo server on a ReactorPool: accept on one reactor, serve on all", "[net][tcp][threads]",
                        TcpTestReactors) {
  coio::ReactorPool<TestType> pool(2);
  TestType& acceptor = pool.reactor(0);
  Result<Listener<TestType>> bound = Listener<TestType>::bind(acceptor, SocketAddress::loopbackV4());
  REQUIRE(bound.hasValue());
  Listener<TestType> listener = std::move(*bound);
  const SocketAddress server = *listener.localAddress();
  constexpr std::size_t kConnections = 50;
  std::atomic<int> acceptFailures{0};
  // Runs on a pool thread: no Catch2 assertions there (they are not thread-safe).
  auto acceptLoop = [&](TestType& r) -> Task<void> {
    (void)r;
    for (std::size_t i = 0; i < kConnections; ++i) {
      Result<Stream<TestType>> stream = co_await listener.accept();
      if (!stream) {
        ++acceptFailures;
        continue;
      }
      TestType& worker = pool.next();  // hand the socket to a worker reactor
      Result<coio::FileDescriptor> fd = stream->release();  // not read yet: cannot fail
      worker.spawn(echoConnection<TestType>(Stream<TestType>(worker, std::move(*fd))));
    }
  };
  acceptor.spawn(acceptLoop(acceptor));

  TestType clientReactor;  // driven by this thread
  std::vector<Task<std::string>> clients;
  for (std::size_t i = 0; i < kConnections; ++i) {
    clients.push_back(echoOnce(clientReactor, server, "pooled " + std::to_string(i)));
  }
  std::vector<std::string> replies = clientReactor.runUntil(coio::collectAllRange(std::move(clients)));
  for (std::size_t i = 0; i < kConnections; ++i) CHECK(replies[i] == "pooled " + std::to_string(i));
  pool.stop();
  CHECK(acceptFailures == 0);
}

TEMPLATE_LIST_TEST_CASE("setCongestionControl: an available algorithm is taken, an unknown one refused",
                        "[net][tcp]", TcpTestReactors) {
  TestType reactor;
  Listener<TestType> listener = listen(reactor, SocketAddress::loopbackV4());
  auto test = [&](TestType& r) -> Task<void> {
    Result<Stream<TestType>> stream = co_await Stream<TestType>::connect(r, *listener.localAddress());
    REQUIRE(stream.hasValue());
    // reno is always built in (the kernel's fallback); the current one may be anything.
    CHECK(stream->setCongestionControl("reno").hasValue());
    char name[16] = {};
    socklen_t length = sizeof name;
    REQUIRE(::getsockopt(stream->fd(), IPPROTO_TCP, TCP_CONGESTION, name, &length) == 0);
    CHECK(std::string(name) == "reno");
    CHECK(stream->setCongestionControl("no-such-algorithm").error() == std::errc::no_such_file_or_directory);
  };
  reactor.runUntil(test(reactor));
}
