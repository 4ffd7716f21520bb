// Zero-copy writes (TcpStream::writeZeroCopy over UringReactor::sendZeroCopy)
// to a peer that does not read: the write resumes only once the kernel is
// done with the memory, also when cancelled or when the reactor stops. On
// the reactors that copy (epoll, a UringReactor told not to use zero copy)
// the same tests hold, the write resuming as soon as the socket took a copy.
#include "../reactor/test_reactors.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>

#include <catch2/catch.hpp>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <random>
#include <stop_token>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::SocketAddress;
using coio::Task;

namespace {

template <typename R>
using Listener = coio::TcpListener<R>;
template <typename R>
using Stream = coio::TcpStream<R>;

#if COIO_TEST_URING
// sendZeroCopy's fallback, on a kernel that has zero-copy sends.
class CopyingUringReactor : public coio::UringReactor {
 public:
  CopyingUringReactor() : UringReactor(Options{.zeroCopySend = false}) {}
};
using ZeroCopyTestReactors = std::tuple<coio::EpollReactor, coio::UringReactor, CopyingUringReactor>;
#else
using ZeroCopyTestReactors = std::tuple<coio::EpollReactor>;
#endif

// What the loopback connection below holds back: the peer's receive buffer
// is small, the sender's send buffer large, so that a write of `bytes`
// fits in the sender's socket while the peer reads nothing. The copying
// reactors' writes then resume at once, which shows that it fit.
constexpr int kPeerReceiveBuffer = 64 * 1024;
constexpr int kSenderSendBuffer = 1 << 20;

template <typename R>
struct Connection {
  Stream<R> sender;
  Stream<R> peer;  // reads only when told
  std::size_t bytes;  // what a write may send with the peer stalled
  std::size_t socketHolds;  // the sender's send buffer: a write larger than that stalls
};

template <typename R>
Task<Connection<R>> connectStalled(R& reactor) {
  Result<Listener<R>> listener = Listener<R>::bind(reactor, SocketAddress::loopbackV4());
  REQUIRE(listener);
  const SocketAddress address = *listener->localAddress();
  coio::FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  // Before connect: the window offered in the handshake follows it.
  REQUIRE(::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &kPeerReceiveBuffer, sizeof kPeerReceiveBuffer) == 0);
  Stream<R> peer(reactor, std::move(fd));
  const Result<void> connected = co_await reactor.connect(peer.fd(), address.data(), address.size());
  REQUIRE(connected);
  Result<Stream<R>> sender = co_await listener->accept();
  REQUIRE(sender);
  // Beyond net.core.wmem_max only with CAP_NET_ADMIN: what was granted sets the size.
  if (::setsockopt(sender->fd(), SOL_SOCKET, SO_SNDBUFFORCE, &kSenderSendBuffer, sizeof kSenderSendBuffer) != 0) {
    REQUIRE(::setsockopt(sender->fd(), SOL_SOCKET, SO_SNDBUF, &kSenderSendBuffer, sizeof kSenderSendBuffer) == 0);
  }
  int granted = 0;
  socklen_t length = sizeof granted;
  REQUIRE(::getsockopt(sender->fd(), SOL_SOCKET, SO_SNDBUF, &granted, &length) == 0);
  const std::size_t bytes = std::min<std::size_t>(512 * 1024, static_cast<std::size_t>(granted) / 2);
  REQUIRE(bytes > 2 * static_cast<std::size_t>(kPeerReceiveBuffer));  // more than the peer can buffer
  co_return Connection<R>{std::move(*sender), std::move(peer), bytes, static_cast<std::size_t>(granted)};
}

std::vector<std::byte> randomBytes(std::size_t n) {
  std::vector<std::byte> bytes(n);
  std::mt19937 rng(19);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

// `bytes` cut into `count` parts (the last takes the rest).
std::vector<iovec> partsOf(std::span<std::byte> bytes, std::size_t count) {
  std::vector<iovec> parts;
  const std::size_t each = bytes.size() / count;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t size = i + 1 == count ? bytes.size() - i * each : each;
    parts.push_back({bytes.data() + i * each, size});
  }
  return parts;
}

// Zero-copy writes of `data` until all of it went or one failed, and what
// became of them. As soon as they are over the writer scribbles over its
// memory, as a pool handing the buffer to the next request would: bytes
// the kernel still had to send would change.
struct Write {
  explicit Write(std::vector<std::byte> bytes) : data(std::move(bytes)) {}
  std::vector<std::byte> data;
  std::size_t sent = 0;
  std::error_code error;
  bool done = false;

  template <typename R>
  Task<void> run(Stream<R>& stream, std::size_t partCount, std::stop_token stop = {}) {
    std::vector<iovec> parts = partsOf(data, partCount);
    for (std::span<iovec> rest(parts); !rest.empty();) {
      const Result<std::size_t> n = co_await stream.writeZeroCopy(rest, stop);
      if (!n) {
        error = n.error();
        break;
      }
      sent += *n;
      rest = coio::detail::advance(rest, *n);
    }
    std::fill(data.begin(), data.end(), std::byte{0xEE});
    done = true;
  }
};

// Reads exactly `into.size()` bytes off `peer`.
template <typename R>
Task<void> readAll(Stream<R>& peer, std::span<std::byte> into) {
  const Result<void> read = co_await peer.readExact(into);
  REQUIRE(read);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("a zero-copy write resumes only once the kernel is done with its memory",
                        "[net][tcp][zerocopy]", ZeroCopyTestReactors) {
  const std::size_t partCount = GENERATE(1, 3);  // IORING_OP_SEND_ZC, SENDMSG_ZC
  INFO(partCount << " part(s)");
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    Connection<TestType> c = co_await connectStalled(r);
    const bool zeroCopy = c.sender.writesZeroCopy();
    const std::vector<std::byte> expected = randomBytes(c.bytes);
    Write write{expected};
    coio::AsyncScope scope;
    scope.spawn(write.run(c.sender, partCount));
    co_await r.sleepFor(100ms);
    // The socket took all of it (a copy is done), but the peer has read
    // nothing: without a copy the kernel still references the memory.
    CHECK(write.done == !zeroCopy);
    std::vector<std::byte> received(c.bytes);
    co_await readAll(c.peer, received);
    co_await scope.join();
    CHECK(write.done);
    CHECK_FALSE(write.error);
    CHECK(write.sent == c.bytes);
    CHECK(received == expected);  // none of the scribbling went out
  };
  reactor.runUntil(test(reactor));
}

#if COIO_TEST_URING
TEST_CASE("UringReactor says whether it sends without a copy", "[net][tcp][zerocopy]") {
  coio::UringReactor probing;
  // Linux 6.1 has both opcodes.
  CHECK(probing.zeroCopySend() == coio::detail::kernelAtLeast(6, 1));
  CopyingUringReactor copying;
  CHECK_FALSE(copying.zeroCopySend());
  coio::EpollReactor epoll;
  const Stream<coio::EpollReactor> stream(epoll, coio::FileDescriptor{});
  CHECK_FALSE(stream.writesZeroCopy());
}
#endif

TEMPLATE_LIST_TEST_CASE("a cancelled zero-copy write resumes only after its notification, with what went",
                        "[net][tcp][zerocopy]", ZeroCopyTestReactors) {
  // The stop reaches the write as its own token, or as its Task's (given none).
  const bool inherited = GENERATE(false, true);
  INFO((inherited ? "the Task's token" : "its own token"));
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    Connection<TestType> c = co_await connectStalled(r);
    const bool zeroCopy = c.sender.writesZeroCopy();
    // More than the sender's socket holds: still under way when the stop comes.
    const std::vector<std::byte> expected = randomBytes(4 * c.socketHolds);
    Write write{expected};
    std::stop_source stop;
    coio::AsyncScope scope;
    if (inherited) {
      scope.spawn(coio::withStopToken(stop.get_token(), write.run(c.sender, 2)));
    } else {
      scope.spawn(write.run(c.sender, 2, stop.get_token()));
    }
    co_await r.sleepFor(50ms);
    REQUIRE_FALSE(write.done);
    stop.request_stop();
    co_await r.sleepFor(100ms);
    // What the socket took is still referenced until the peer has read it.
    CHECK(write.done == !zeroCopy);
    // The peer reads what went out; once the write is over the sender ends the stream.
    std::vector<std::byte> received(expected.size());
    auto reader = [&]() -> Task<std::size_t> {
      std::size_t got = 0;
      while (got < received.size()) {
        const Result<std::size_t> n = co_await c.peer.read(std::span(received).subspan(got));
        if (!n) co_return got;
        got += *n;
      }
      co_return got;
    };
    auto finish = [&]() -> Task<void> {
      co_await scope.join();
      REQUIRE(c.sender.shutdown().hasValue());
    };
    auto [got, finished] = co_await coio::collectAll(reader(), finish());
    (void)finished;
    CHECK(write.error == std::errc::operation_canceled);
    CHECK(write.sent < expected.size());
    CHECK(got == write.sent);
    CHECK(std::equal(received.begin(), received.begin() + static_cast<std::ptrdiff_t>(got), expected.begin()));
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("abort() releases a zero-copy write whose peer stopped reading", "[net][tcp][zerocopy]",
                        ZeroCopyTestReactors) {
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    Connection<TestType> c = co_await connectStalled(r);
    Write write{randomBytes(c.bytes)};
    coio::AsyncScope scope;
    scope.spawn(write.run(c.sender, 1));
    co_await r.sleepFor(100ms);
    CHECK(write.done == !c.sender.writesZeroCopy());
    REQUIRE(c.sender.abort().hasValue());
    co_await scope.join();  // hangs (until the test's timeout) if the kernel kept the data
    CHECK_FALSE(write.error);  // the socket had taken it all
    CHECK(write.sent == c.bytes);
    std::byte buffer[4096];
    Result<std::size_t> n = co_await c.peer.read(buffer);
    while (n) n = co_await c.peer.read(buffer);  // what arrived before the reset
    CHECK(n.error() == std::errc::connection_reset);
  };
  reactor.runUntil(test(reactor));
}

TEMPLATE_LIST_TEST_CASE("stopping or destroying a reactor with a zero-copy write in flight frees nothing early",
                        "[net][tcp][zerocopy]", ZeroCopyTestReactors) {
  // The write's frame owns its memory, and the peer never reads. The
  // reactor resets the connection so that the kernel lets go of the memory,
  // waits for the notification, and only then destroys the frame: ASan
  // would see a late completion reach freed memory, and without the reset
  // the wait would never end.
  const bool stopFirst = GENERATE(true, false);
  INFO((stopFirst ? "stop(), then destruction" : "destruction only"));
  auto reactor = std::make_unique<TestType>();
  // The connection lives in the frame too: the reactor destroys it last.
  auto writeStalled = [](TestType& r) -> Task<void> {
    Connection<TestType> c = co_await connectStalled(r);
    Write first{randomBytes(c.bytes)};
    co_await first.run(c.sender, 2);
    // A copy is done once the socket took it: the next write, larger than
    // the socket holds, waits for good.
    Write second{randomBytes(4 * c.socketHolds)};
    co_await second.run(c.sender, 2);
    FAIL("a write finished although its peer never read");
  };
  reactor->spawn(writeStalled(*reactor));
  auto wait = [](TestType& r) -> Task<void> { co_await r.sleepFor(100ms); };
  reactor->runUntil(wait(*reactor));
  if constexpr (requires { reactor->inFlight(); }) {
    CHECK(reactor->inFlight() == 2);  // the write and the wake-up poll
  }
  if (stopFirst) {
    reactor->stop();
    reactor->run();  // quiesces: returns once the kernel has let go of every operation
    if constexpr (requires { reactor->inFlight(); }) {
      CHECK(reactor->inFlight() == 0);
    }
  }
  reactor.reset();
}
