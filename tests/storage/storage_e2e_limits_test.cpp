// The server and client end to end: the server's limits and deadlines (--max-requests, the send,
// frame and idle timeouts and the client's reconnection, --max-connections, out of fds).
#include "storage_e2e_fixture.hpp"

TEMPLATE_LIST_TEST_CASE("more requests in flight than --max-requests is a protocol error for that connection only",
                        "[storage][e2e]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.maxRequestsPerConnection = 2;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    auto raw = co_await fx.channel();
    for (std::uint64_t id = 1; id <= 3; ++id) {
      const std::vector<std::byte> request = requestFrame(id, {{id, 0, 100, remoteOf(*raw, fx.buffer(100))}});
      co_await sendRaw(*raw, request);
    }
    bool sawError = false;
    for (int frames = 0; frames < 3 && !sawError; ++frames) {  // TransmitRequests may come first
      Result<storage::IncomingFrame> frame = co_await readRaw(*raw);
      REQUIRE(frame);
      if (frame->header.type != storage::proto::MessageType::error) continue;
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == storage::proto::ProtocolErrc::tooManyRequests);
      CHECK(frame->header.requestId == 3);
      sawError = true;
    }
    CHECK(sawError);
    co_await raw->close();
    auto& server = *fx.server;
    const bool closed = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 1; });
    CHECK(closed);
    CHECK(server.buffersInUse() == 0);
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *good, probe);
    CHECK(served[0].status == IoStatus::ok);
    co_await good->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a client that stops reading is dropped after the send timeout; buffers are freed",
                        "[storage][e2e]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.sendTimeout = 200ms;
  options.transmitTimeout = 100ms;
  // Zero copy (TCP): the stalled sends hold their buffers until the stop resets the connection.
  options.zeroCopySend = GENERATE(false, true);
  INFO((options.zeroCopySend ? "zero-copy sends" : "copying sends"));
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    if constexpr (TestType::rdma) {
      // 40 requests, nothing consumed: the server's TransmitRequests and
      // timedOut responses use up the credits we never return.
      for (std::uint64_t id = 1; id <= 40; ++id) {
        const std::vector<std::byte> request = requestFrame(id, {{id % kChunks, 0, 10, remoteOf(*raw, fx.buffer(10))}});
        co_await sendRaw(*raw, request);
      }
    } else {
      // Grant two 4 MiB requests, then read nothing: their data fills the socket buffers.
      const std::vector<storage::proto::ReadIo> whole(64, storage::proto::ReadIo{1, 0, kChunkSize, {}});
      co_await sendRaw(*raw, requestFrame(1, whole));
      co_await sendRaw(*raw, requestFrame(2, whole));
      // Both fit in the pool (2 x 256 pieces): both ask before either is granted.
      for (std::uint64_t id = 1; id <= 2; ++id) {
        Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
        REQUIRE(ask);
        REQUIRE(ask->header.type == storage::proto::MessageType::transmitRequest);
      }
      for (std::uint64_t id = 1; id <= 2; ++id) co_await sendGrant(*raw, id);
    }
    auto& server = *fx.server;
    const bool dropped = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(dropped);
    CHECK(server.stats().sendTimeouts >= 1);
    CHECK(server.buffersInUse() == 0);
    co_await raw->close();
  });
}

namespace {

using Clock = std::chrono::steady_clock;

// Reads `stream` until it ends (EOF, reset): what arrived, or nullopt if it
// is still open after 5 s.
template <typename R>
Task<std::optional<std::vector<std::byte>>> readUntilEnd(R& reactor, coio::TcpStream<R>& stream) {
  std::vector<std::byte> got;
  auto readAll = [&](std::stop_token stop) -> Task<Result<void>> {
    std::byte chunk[256];
    for (;;) {
      Result<std::size_t> n = co_await stream.read(chunk, stop);
      if (!n) co_return n.error();
      got.insert(got.end(), chunk, chunk + *n);
    }
  };
  const Result<void> end = co_await coio::withTimeout(reactor, readAll, 5s);
  if (end.error() == std::errc::timed_out) co_return std::nullopt;
  co_return std::move(got);
}

// The code of an Error frame (the test fails on anything else).
storage::proto::ProtocolErrc errorCode(const storage::IncomingFrame& frame) {
  REQUIRE(frame.header.type == storage::proto::MessageType::error);
  Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame.payload);
  REQUIRE(error);
  return error->code;
}

// How the server ended a dribbling connection.
struct Cut {
  bool ended = false;           // within 5 s
  Clock::duration after{};      // since just before the connect
  std::vector<std::byte> received;
};

// Connects and sends the first `atOnce` bytes of a request frame (id 1),
// then one more every 20 ms up to `total` (over RDMA the bytes are taken
// for the start of the 48-byte handshake): never a whole frame. Returns
// when and how the server ended the connection.
template <typename S>
Task<Cut> dribble(Fixture<S>& fx, std::size_t atOnce, std::size_t total) {
  using R = typename S::R;
  const Clock::time_point start = Clock::now();
  Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(fx.reactor, fx.address);
  REQUIRE(stream);
  const std::vector<std::byte> frame = requestFrame(1, {{1, 0, 10, {}}});
  std::stop_source ended;
  auto send = [&]() -> Task<void> {
    for (std::size_t at = 0, n = atOnce; at < total && !ended.stop_requested(); at += n, n = 1) {
      const Result<void> sent = co_await stream->writeAll(std::span(frame).subspan(at, n));
      if (!sent) co_return;
      (void)co_await fx.reactor.sleepFor(20ms, ended.get_token());
    }
  };
  auto watch = [&]() -> Task<Cut> {
    std::optional<std::vector<std::byte>> received = co_await readUntilEnd(fx.reactor, *stream);
    ended.request_stop();
    co_return Cut{received.has_value(), Clock::now() - start, received.value_or(std::vector<std::byte>{})};
  };
  auto [unit, cut] = co_await coio::collectAll(send(), watch());
  (void)unit;
  co_return std::move(cut);
}

// `n` small reads in a row, once the dribblers have begun: how long they took.
template <typename S, typename Client>
Task<Clock::duration> readMany(Fixture<S>& fx, Client& client, std::uint32_t n) {
  co_await fx.reactor.sleepFor(20ms);
  const Clock::time_point start = Clock::now();
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::vector<ReadOp> ios = {{i % kChunks, 100 * i, 4096, {}}};
    const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, client, ios);
    CHECK(outcomes[0].status == IoStatus::ok);
  }
  co_return Clock::now() - start;
}

// Whether `stream` ends (EOF, reset) within 1 s, or stays open.
template <typename R>
Task<bool> endsSoon(R& reactor, coio::TcpStream<R>& stream) {
  std::byte byte[64];
  auto read = [&](std::stop_token stop) { return stream.read(byte, std::move(stop)); };
  const Result<std::size_t> n = co_await coio::withTimeout(reactor, read, 1s);
  co_return !n && n.error() != std::errc::timed_out;  // over RDMA an admitted one sends its handshake
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("peers that stall mid-frame are cut at the frame deadline; a good client keeps being served",
                        "[storage][e2e][deadline]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.frameTimeout = 200ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    // Three dribble a header; the last sends a header and 3 payload bytes, then 3 more.
    std::vector<Task<Cut>> dribblers;
    for (int i = 0; i < 3; ++i) dribblers.push_back(dribble(fx, 1, 20));
    dribblers.push_back(dribble(fx, storage::proto::kHeaderSize + 3, storage::proto::kHeaderSize + 6));
    auto [cuts, took] = co_await coio::collectAll(coio::collectAllRange(std::move(dribblers)), readMany(fx, *good, 50));
    CHECK(took < 2s);  // 50 reads while 4 connections dribble
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      const Cut& cut = cuts[i];
      CHECK(cut.ended);
      if (!cut.ended) continue;
      CHECK(cut.after >= 200ms);  // not before the deadline
      CHECK(cut.after < 3s);
      if constexpr (!TestType::rdma) {  // an Error frame, then the close
        REQUIRE(cut.received.size() >= storage::proto::kHeaderSize);
        Result<storage::proto::FrameHeader> header =
            storage::proto::decodeHeader(std::span(cut.received).first(storage::proto::kHeaderSize));
        REQUIRE(header);
        CHECK(header->requestId == (i == 3 ? 1u : 0u));  // once the header is in, the frame's
        const std::span<const std::byte> payload = std::span(cut.received).subspan(storage::proto::kHeaderSize);
        CHECK(errorCode({*header, {payload.begin(), payload.end()}}) == storage::proto::ProtocolErrc::frameTimeout);
      }
    }
    // Counted once the server is done with the connection: over RDMA after
    // the handshake's queue pair is closed, which may come after the peer
    // saw its stream end.
    auto& server = *fx.server;
    const std::size_t expected = cuts.size();
    const bool counted = co_await eventually(fx.reactor, [&] { return server.stats().frameTimeouts == expected; });
    INFO(server.stats().frameTimeouts << " frame timeouts counted");
    CHECK(counted);
    CHECK(fx.server->stats().protocolErrors == 0);
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *good, probe);
    CHECK(served[0].status == IoStatus::ok);
    co_await good->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a connection with nothing in flight is closed after the idle timeout, with Error(idleTimeout)",
                        "[storage][e2e][deadline]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.idleTimeout = 200ms;
  options.transmitTimeout = 2s;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    using storage::proto::MessageType;
    const Clock::time_point start = Clock::now();
    auto idle = co_await fx.channel();
    auto busy = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(100);
    const std::vector<std::byte> request = requestFrame(1, {{1, 0, 100, remoteOf(*busy, into)}});
    co_await sendRaw(*busy, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*busy);
    REQUIRE(ask);
    REQUIRE(ask->header.type == MessageType::transmitRequest);

    Result<storage::IncomingFrame> told = co_await readWithin(fx.reactor, *idle, 5s);
    const Clock::duration after = Clock::now() - start;
    INFO(told.error().message());
    REQUIRE(told);
    CHECK(errorCode(*told) == storage::proto::ProtocolErrc::idleTimeout);
    CHECK(told->header.requestId == 0);
    CHECK(after >= 200ms);
    CHECK(after < 3s);
    Result<storage::IncomingFrame> end = co_await readWithin(fx.reactor, *idle, 5s);
    CHECK_FALSE(end);
    CHECK(end.error() != std::errc::timed_out);  // closed

    // A request waiting for its grant longer than the idle timeout keeps its connection.
    co_await fx.reactor.sleepFor(100ms);
    const Clock::time_point granted = Clock::now();
    co_await sendGrant(*busy, 1);
    std::size_t delivered = 0;
    const auto [id, result] = co_await readOneResult(*busy, into, delivered);
    CHECK(id == 1);
    CHECK(result.status == IoStatus::ok);
    if (!TestType::rdma) CHECK(delivered == into.size());
    CHECK(storage::matchesChunkBytes(1, 0, into));
    // ... and its idle time counts from the end of that request.
    Result<storage::IncomingFrame> busyTold = co_await readWithin(fx.reactor, *busy, 5s);
    REQUIRE(busyTold);
    CHECK(errorCode(*busyTold) == storage::proto::ProtocolErrc::idleTimeout);
    CHECK(Clock::now() - granted >= 200ms);
    CHECK(fx.server->stats().idleTimeouts == 2);
    CHECK(fx.server->stats().protocolErrors == 0);
    co_await idle->close();
    co_await busy->close();
  });
}

TEMPLATE_LIST_TEST_CASE("after the server closes an idle connection the client reconnects: no error reaches the caller",
                        "[storage][e2e][deadline]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.idleTimeout = 200ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    int connects = 0;
    auto connected = co_await storage::StorageClient<typename TestType::R>::connect(
        [&fx, &connects](std::stop_token stop) {
          ++connects;
          return fx.connectChannel(fx.address, std::move(stop));
        },
        fx.limiter, {.verifyChecksums = true});
    REQUIRE(connected);
    auto& client = **connected;
    const std::vector<ReadOp> ios = {{2, 10, 3000, {}}};
    const std::vector<ReadOutcome> first = co_await readAndCheck(fx, client, ios);
    CHECK(first[0].status == IoStatus::ok);
    auto& server = *fx.server;
    const bool closed = co_await eventually(
        fx.reactor, [&server] { return server.stats().idleTimeouts == 1 && server.admittedConnections() == 0; });
    CHECK(closed);
    CHECK_FALSE(client.failure());
    // Three at once share one new connection.
    std::vector<Task<std::vector<ReadOutcome>>> reads;
    for (int i = 0; i < 3; ++i) reads.push_back(readAndCheck(fx, client, ios));
    const std::vector<std::vector<ReadOutcome>> again = co_await coio::collectAllRange(std::move(reads));
    for (const auto& outcomes : again) CHECK(outcomes[0].status == IoStatus::ok);
    CHECK(connects == 2);
    CHECK(server.stats().idleTimeouts == 1);
    CHECK(server.admittedConnections() == 1);
    co_await client.close();
  });
}

TEMPLATE_LIST_TEST_CASE("a request that crosses the server's idle close is sent again on a new connection",
                        "[storage][e2e][deadline]", Setups) {
  using R = typename TestType::R;
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    // The first connection goes to a stand-in server that reads the request
    // and answers Error(idleTimeout), as the real one does when it decided
    // the connection was idle just before the request came.
    auto bound = coio::TcpListener<R>::bind(fx.reactor, *coio::SocketAddress::parse("127.0.0.1:0"));
    REQUIRE(bound);
    const coio::SocketAddress standIn = *bound->localAddress();
    int connects = 0;
    auto connectClient = [&]() -> Task<Result<std::unique_ptr<storage::StorageClient<R>>>> {
      co_return co_await storage::StorageClient<R>::connect(
          [&](std::stop_token stop) {
            return fx.connectChannel(connects++ == 0 ? standIn : fx.address, std::move(stop));
          },
          fx.limiter,
          {.verifyChecksums = true});
    };
    auto acceptStandIn = [&]() -> Task<Result<std::unique_ptr<storage::Channel<R>>>> {
      Result<coio::TcpStream<R>> stream = co_await bound->accept();
      if (!stream) co_return stream.error();
      co_return co_await fx.acceptChannel(std::move(*stream));
    };
    auto [client, standInChannel] = co_await coio::collectAll(connectClient(), acceptStandIn());
    REQUIRE(client);
    REQUIRE(standInChannel);
    auto answerIdle = [&](storage::Channel<R>& channel) -> Task<void> {
      Result<storage::IncomingFrame> request = co_await readRaw(channel);
      REQUIRE(request);
      CHECK(request->header.type == storage::proto::MessageType::batchReadRequest);
      co_await channel.sendError({storage::proto::ProtocolErrc::idleTimeout, 0}, 1s);
    };
    const std::vector<ReadOp> ios = {{3, 7, 2000, {}}};
    auto [outcomes, unit] = co_await coio::collectAll(readAndCheck(fx, **client, ios), answerIdle(**standInChannel));
    (void)unit;
    CHECK(outcomes[0].status == IoStatus::ok);
    CHECK(connects == 2);
    CHECK_FALSE((*client)->failure());
    co_await (*standInChannel)->close();
    co_await (*client)->close();
  });
}

TEMPLATE_LIST_TEST_CASE("connections over --max-connections are closed at once; open ones keep working; new ones are "
                        "served after the flood", "[storage][e2e][limit]", Setups) {
  using R = typename TestType::R;
  storage::ServerOptions options = Fixture<TestType>::small();
  options.maxConnections = 8;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    std::vector<coio::TcpStream<R>> flood;
    for (int i = 0; i < 20; ++i) {
      Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(fx.reactor, fx.address);
      REQUIRE(stream);
      flood.push_back(std::move(*stream));
    }
    auto& server = *fx.server;
    const bool refused = co_await eventually(fx.reactor, [&server] { return server.stats().refusedConnections == 13; });
    CHECK(refused);
    CHECK(server.admittedConnections() == 8);
    std::vector<Task<bool>> probes;
    for (coio::TcpStream<R>& stream : flood) probes.push_back(endsSoon(fx.reactor, stream));
    const std::vector<bool> ended = co_await coio::collectAllRange(std::move(probes));
    CHECK(std::count(ended.begin(), ended.end(), true) == 13);
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    const std::vector<ReadOutcome> during = co_await readAndCheck(fx, *good, probe);
    CHECK(during[0].status == IoStatus::ok);

    flood.clear();
    const bool drained = co_await eventually(fx.reactor, [&server] { return server.admittedConnections() == 1; });
    REQUIRE(drained);
    auto late = co_await fx.client();
    const std::vector<ReadOutcome> after = co_await readAndCheck(fx, *late, probe);
    CHECK(after[0].status == IoStatus::ok);
    CHECK(server.stats().refusedConnections == 13);
    co_await late->close();
    co_await good->close();
  });
}

#if !COIO_E2E_RDMA
namespace {

// Lowers the fd limit to 64 past the lowest free fd and takes every fd
// left under it; restores both on destruction.
struct FdSqueeze {
  FdSqueeze() {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    coio::FileDescriptor null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(null.valid());
    rlimit low = saved;
    low.rlim_cur = static_cast<rlim_t>(null.get()) + 64;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    for (int fd; (fd = ::fcntl(null.get(), F_DUPFD_CLOEXEC, 0)) >= 0;) dummies.emplace_back(fd);
    REQUIRE(errno == EMFILE);
    dummies.emplace_back(std::move(null));
  }
  ~FdSqueeze() { release(); }
  void release() {
    dummies.clear();
    (void)::setrlimit(RLIMIT_NOFILE, &saved);
  }
  rlimit saved{};
  std::vector<coio::FileDescriptor> dummies;
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("out of fds the accept loop backs off, without spinning, and serves again once fds are free",
                        "[storage][e2e][limit]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    FdSqueeze squeeze;
    squeeze.dummies.pop_back();  // one fd left: the client's socket; none for the server's accept
    const std::uint64_t before = fx.server->stats().acceptErrors;
    auto client = co_await fx.client();
    const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
    std::vector<ReadOutcome> served;
    auto read = [&]() -> Task<void> { served = co_await readAndCheck(fx, *client, probe); };
    auto freeLater = [&]() -> Task<void> {
      co_await fx.reactor.sleepFor(300ms);
      squeeze.release();
    };
    co_await coio::collectAll(read(), freeLater());
    const std::uint64_t errors = fx.server->stats().acceptErrors - before;
    CHECK(errors >= 1);
    CHECK(errors <= 60);  // a retry per 10 ms at most; a busy loop makes thousands
    REQUIRE(served.size() == 1);
    CHECK(served[0].status == IoStatus::ok);
    co_await client->close();
  });
}
#endif
