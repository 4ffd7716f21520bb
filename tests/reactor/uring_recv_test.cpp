// UringReactor's receive modes (RecvMode): multishot recvs with provided
// buffers, the adaptive switch between them and plain recvs, and recvAll
// (the TCP suite also runs on every mode).
#include "test_reactors.hpp"
#include "uring_streams.hpp"

#if COIO_TEST_URING
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <stop_token>
#include <span>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using coio::UringReactor;
using coio::RecvMode;
using coio::FileDescriptor;
using coio::testing::StreamPair;
using coio::testing::connectPair;
using coio::testing::patternByte;
using coio::testing::writeAllOf;

TEST_CASE("multishot recv: a reader that falls behind stops the socket draining, and loses nothing",
          "[uring][multishot]") {
  UringReactor reactor(UringReactor::Options{.recvMode = RecvMode::multishot});
  REQUIRE(reactor.recvMode() == RecvMode::multishot);  // Linux 6.0+: CI's kernels have it
  auto test = [](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    std::byte first[1];
    // The first read arms the multishot recv; it stays armed from then on.
    REQUIRE(::send(pair.client.fd(), "\x00", 1, 0) == 1);
    coio::Result<std::size_t> n = co_await pair.server.read(first);
    REQUIRE(n.hasValue());
    // Nobody reads now. The armed recv takes data off the socket until it
    // holds kRecvBacklogLimit, then lets go: the socket fills and the
    // writer is held back (without the limit it would take everything).
    constexpr std::size_t kMax = 64 << 20;
    std::vector<std::byte> chunk(64 * 1024);
    std::size_t sent = 0;
    for (int stalls = 0; sent < kMax && stalls < 50;) {
      for (std::size_t k = 0; k < chunk.size(); ++k) chunk[k] = patternByte(sent + k);
      const ssize_t w = ::send(pair.client.fd(), chunk.data(), chunk.size(), MSG_DONTWAIT);
      if (w > 0) {
        sent += static_cast<std::size_t>(w);
        stalls = 0;
      } else {
        REQUIRE(errno == EAGAIN);
        ++stalls;
        co_await r.sleepFor(1ms);  // the loop reaps whatever the recv took meanwhile
      }
    }
    CHECK(sent < kMax);
    // Everything arrives, in order, once the reader reads again.
    std::vector<std::byte> got(sent);
    coio::Result<void> all = co_await pair.server.readExact(got);
    REQUIRE(all.hasValue());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < sent; ++i) wrong += got[i] != patternByte(i);
    CHECK(wrong == 0);
  };
  reactor.runUntil(test(reactor));
}

TEST_CASE("multishot recv: connections sharing too few provided buffers (ENOBUFS) still get every byte",
          "[uring][multishot]") {
  // One 64-byte buffer for all sockets: their recvs keep running out
  // (ENOBUFS ends a multishot recv) and are re-armed when a reader waits.
  UringReactor reactor(UringReactor::Options{.recvMode = RecvMode::multishot, .recvBuffers = 1, .recvBufferSize = 64});
  REQUIRE(reactor.recvMode() == RecvMode::multishot);
  auto oneConnection = [](UringReactor& r, std::size_t bytes) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    std::vector<std::byte> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = patternByte(i);
    auto reader = [](coio::TcpStream<UringReactor>& s, std::size_t size) -> Task<std::vector<std::byte>> {
      std::vector<std::byte> out(size);
      coio::Result<void> got = co_await s.readExact(out);
      CHECK(got.hasValue());
      co_return out;
    };
    auto [unit, received] = co_await coio::collectAll(writeAllOf(pair.client, data), reader(pair.server, bytes));
    (void)unit;
    CHECK(received == data);
  };
  auto test = [&](UringReactor& r) -> Task<void> {
    std::vector<Task<void>> connections;
    for (int i = 0; i < 4; ++i) connections.push_back(oneConnection(r, 256 * 1024));
    co_await coio::collectAllRange(std::move(connections));
  };
  reactor.runUntil(test(reactor));
}

TEST_CASE("multishot recv: a read left pending by stop() is destroyed after its socket, safely",
          "[uring][multishot]") {
  // Roots are destroyed newest first: the task owning the socket goes
  // before the reader suspended on it, whose receiver is freed with the
  // socket (ASan would see the reader's frame touch it afterwards).
  std::optional<UringReactor> reactor(std::in_place, UringReactor::Options{.recvMode = RecvMode::multishot});
  std::optional<coio::TcpStream<UringReactor>> slot;
  bool readerStarted = false;
  auto test = [&](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    slot.emplace(std::move(pair.server));
    r.spawn([](coio::TcpStream<UringReactor>& s, bool& started) -> Task<void> {
      started = true;
      std::byte byte[1];
      (void)co_await s.read(byte);  // never completes: nothing is sent
    }(*slot, readerStarted));
    r.spawn([](UringReactor& rr, std::optional<coio::TcpStream<UringReactor>>& from) -> Task<void> {
      coio::TcpStream<UringReactor> owned = std::move(*from);  // the pending read keeps only the fd
      co_await rr.sleepFor(1h);
    }(r, slot));
    co_await r.sleepFor(20ms);
    r.stop();
  };
  reactor->runUntil(test(*reactor));
  CHECK(readerStarted);
  reactor.reset();  // destroys the owner, then the reader
  CHECK_FALSE(reactor.has_value());
}

TEST_CASE("multishot recv: invalid buffer options are a programming error", "[uring][multishot]") {
  using Options = UringReactor::Options;
  CHECK_THROWS_AS(UringReactor(Options{.recvMode = RecvMode::multishot, .recvBuffers = 3}), std::invalid_argument);
  CHECK_THROWS_AS(UringReactor(Options{.recvMode = RecvMode::multishot, .recvBufferSize = 0}), std::invalid_argument);
  CHECK_NOTHROW(UringReactor(Options{.recvMode = RecvMode::plain, .recvBuffers = 3}));  // unused then
}

namespace {

// One byte from `from` to `to`, read through the reactor.
Task<void> oneByte(coio::TcpStream<UringReactor>& from, coio::TcpStream<UringReactor>& to) {
  REQUIRE(::send(from.fd(), "x", 1, 0) == 1);
  std::byte got[64];
  coio::Result<std::size_t> n = co_await to.read(got);
  REQUIRE(n.hasValue());
  CHECK(*n == 1);
}

// Runs the loop until `fd` is no longer read ahead (a cancelled recv's last
// completion may still be on its way); false if that takes over a second.
Task<bool> settlesDirect(UringReactor& r, int fd) {
  for (int i = 0; i < 1000 && r.readsAhead(fd); ++i) co_await r.sleepFor(1ms);
  co_return !r.readsAhead(fd);
}

}  // namespace

TEST_CASE("adaptive recv: short reads switch a socket to a multishot recv, a stream switches it back, bytes in order",
          "[uring][adaptive]") {
  UringReactor reactor;  // RecvMode::adaptive is the default
  REQUIRE(reactor.recvMode() == RecvMode::adaptive);
  auto test = [](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    const int fd = pair.server.fd();
    for (int round = 0; round < 2; ++round) {
      // Direct reads (a plain recv each, nothing armed between them) until
      // kRecvModeSwitch of them came back short...
      for (unsigned i = 0; i < UringReactor::kRecvModeSwitch; ++i) {
        co_await oneByte(pair.client, pair.server);
        // Round 1 follows a stream, whose last read may have come back short
        // too (the writer's last piece): it may switch a read earlier.
        if (round == 0) CHECK_FALSE(r.readsAhead(fd));
      }
      // ...then the next read arms a multishot recv, which stays armed.
      co_await oneByte(pair.client, pair.server);
      CHECK(r.readsAhead(fd));
      co_await oneByte(pair.client, pair.server);
      CHECK(r.readsAhead(fd));

      // A stream fills whole provided buffers: back to direct reads, and
      // every byte arrives in order across the switch.
      constexpr std::size_t kBytes = 4 << 20;
      std::vector<std::byte> data(kBytes);
      for (std::size_t i = 0; i < kBytes; ++i) data[i] = patternByte(i + round);
      auto reader = [](coio::TcpStream<UringReactor>& s) -> Task<std::vector<std::byte>> {
        std::vector<std::byte> out(kBytes);
        std::span<std::byte> rest(out);
        while (!rest.empty()) {  // 64 KiB reads, as a streaming reader's
          coio::Result<std::size_t> n = co_await s.read(rest.first(std::min<std::size_t>(rest.size(), 65536)));
          REQUIRE(n.hasValue());
          rest = rest.subspan(*n);
        }
        co_return out;
      };
      auto [unit, received] = co_await coio::collectAll(writeAllOf(pair.client, data), reader(pair.server));
      (void)unit;
      CHECK(received == data);
      const bool direct = co_await settlesDirect(r, fd);
      CHECK(direct);
    }
    // A stream read in pieces smaller than a provided buffer: each read gets
    // all it asked for, which says nothing about the socket; it stays direct.
    constexpr std::size_t kPiece = 1024;
    std::vector<std::byte> chunk(64 * kPiece, std::byte{7});
    REQUIRE(::send(pair.client.fd(), chunk.data(), chunk.size(), 0) == static_cast<ssize_t>(chunk.size()));
    std::size_t switched = 0;
    for (std::size_t got = 0; got < chunk.size();) {
      std::byte piece[kPiece];
      coio::Result<std::size_t> n = co_await pair.server.read(piece);
      REQUIRE(n.hasValue());
      got += *n;
      switched += r.readsAhead(fd);
    }
    CHECK(switched == 0);
  };
  reactor.runUntil(test(reactor));
}

TEST_CASE("multishot recv: a read awaiter destroyed after its socket was closed does not touch the receiver",
          "[uring][multishot]") {
  // The end of the stream disarms the receiver, so close() frees it at once;
  // the awaiter, destroyed after that, used to reach back into it (ASan).
  UringReactor reactor(UringReactor::Options{.recvMode = RecvMode::multishot});
  auto test = [](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    std::byte buffer[16];
    auto read = pair.server.read(buffer);
    REQUIRE(pair.client.shutdown().hasValue());
    coio::Result<std::size_t> n = co_await read;
    CHECK(n.error() == coio::Errc::eof);
    pair.server.close();
  };  // `read` is destroyed here
  reactor.runUntil(test(reactor));
}

TEST_CASE("a recv on a negative fd fails with EBADF in every recv mode", "[uring][adaptive]") {
  for (const RecvMode mode : {RecvMode::plain, RecvMode::multishot, RecvMode::adaptive}) {
    UringReactor reactor(UringReactor::Options{.recvMode = mode});
    auto test = [](UringReactor& r) -> Task<coio::Result<std::size_t>> {
      std::byte buffer[8];
      co_return co_await r.recv(-1, buffer);
    };
    coio::Result<std::size_t> n = reactor.runUntil(test(reactor));
    CHECK(n.error() == std::errc::bad_file_descriptor);
    CHECK_FALSE(reactor.readsAhead(-1));
  }
}

TEST_CASE("adaptive recv: release refuses a socket whose data the reactor reads ahead; that data stays readable",
          "[uring][adaptive]") {
  UringReactor reactor;
  auto test = [](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    for (unsigned i = 0; i <= UringReactor::kRecvModeSwitch; ++i) co_await oneByte(pair.client, pair.server);
    REQUIRE(r.readsAhead(pair.server.fd()));
    REQUIRE(::send(pair.client.fd(), "hello", 5, 0) == 5);
    co_await r.sleepFor(20ms);  // the armed recv takes it off the socket
    coio::Result<FileDescriptor> refused = pair.server.release();
    CHECK(refused.error() == std::errc::device_or_resource_busy);
    REQUIRE(pair.server.isOpen());
    std::byte got[16];
    coio::Result<std::size_t> n = co_await pair.server.read(got);
    REQUIRE(n.hasValue());
    CHECK(std::string(reinterpret_cast<const char*>(got), *n) == "hello");

    // Released before its first read, a socket carries all its data along.
    StreamPair fresh = co_await connectPair(r);
    REQUIRE(::send(fresh.client.fd(), "bye", 3, 0) == 3);
    coio::Result<FileDescriptor> released = fresh.server.release();
    REQUIRE(released.hasValue());
    CHECK_FALSE(fresh.server.isOpen());
    char out[8] = {};
    CHECK(::recv(released->get(), out, sizeof out, 0) == 3);
    CHECK(std::string(out) == "bye");
  };
  reactor.runUntil(test(reactor));
}

TEST_CASE("recvAll fills the whole buffer in one completion as data trickles in; cancelled, it yields what it read",
          "[uring]") {
  const coio::RecvMode mode = GENERATE(coio::RecvMode::plain, coio::RecvMode::adaptive);
  UringReactor reactor(UringReactor::Options{.recvMode = mode});
  auto test = [](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    constexpr std::size_t kBytes = 64 * 1024, kChunk = 4096;
    std::vector<std::byte> data(kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) data[i] = patternByte(i);
    // 16 chunks 2 ms apart: a recv without MSG_WAITALL would return the first.
    auto trickle = [&](std::size_t chunks) -> Task<void> {
      for (std::size_t c = 0; c < chunks; ++c) {
        co_await r.sleepFor(2ms);
        coio::Result<void> w = co_await pair.server.writeAll(std::span(data).subspan(c * kChunk, kChunk));
        CHECK(w.hasValue());
      }
    };
    std::vector<std::byte> got(kBytes);
    auto whole = [&]() -> Task<coio::Result<std::size_t>> { co_return co_await r.recvAll(pair.client.fd(), got); };
    auto [written, read] = co_await coio::collectAll(trickle(kBytes / kChunk), whole());
    (void)written;
    REQUIRE(read.hasValue());
    CHECK(*read == kBytes);
    CHECK(got == data);

    // Half the data, then a stop: the recv yields the half, not operation_canceled.
    std::stop_source stop;
    auto stopLater = [&]() -> Task<void> {
      co_await trickle(kBytes / kChunk / 2);
      co_await r.sleepFor(20ms);
      stop.request_stop();
    };
    std::fill(got.begin(), got.end(), std::byte{0});
    auto partial = [&]() -> Task<coio::Result<std::size_t>> {
      co_return co_await r.recvAll(pair.client.fd(), got, stop.get_token());
    };
    auto [stopped, half] = co_await coio::collectAll(stopLater(), partial());
    (void)stopped;
    REQUIRE(half.hasValue());
    CHECK(*half == kBytes / 2);
    CHECK(std::equal(got.begin(), got.begin() + kBytes / 2, data.begin()));
  };
  reactor.runUntil(test(reactor));
}
#endif
