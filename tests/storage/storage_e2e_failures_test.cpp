// The server and client end to end: peers that go away (a client disconnecting or killed, a server
// killed or shut down under load, a request that cannot be sent).
#include "storage_e2e_fixture.hpp"

#include <stdexcept>

TEMPLATE_LIST_TEST_CASE("a client that disconnects mid-request gets every buffer freed", "[storage][e2e]",
                        Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto& server = *fx.server;
    {
      // Granted with their requests, more data than the pool and the socket
      // buffers together hold (4 × 3 MiB; pool 8 MiB), and never read: over
      // TCP the server's sends stall with the buffers.
      auto raw = co_await fx.channel();
      const std::span<std::byte> into = fx.buffer(kChunkSize);  // shared: its contents do not matter here
      for (std::uint64_t id = 1; id <= 4; ++id) {
        std::vector<storage::proto::ReadIo> ios;
        for (std::uint64_t i = 0; i < 48; ++i) ios.push_back({i % kChunks, 0, kChunkSize, remoteOf(*raw, into)});
        co_await sendRaw(*raw, requestFrame(id, std::move(ios), true));
      }
      co_await eventually(fx.reactor, [&server] { return server.buffersInUse() > 0; });
      co_await fx.reactor.sleepFor(100ms);  // the sends stall
      if (!TestType::rdma) CHECK(server.buffersInUse() > 0);  // RDMA writes need nothing of the client: may be done
      co_await raw->close();
    }
    const bool closed = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(closed);
    CHECK(server.buffersInUse() == 0);
  });
}

#if COIO_E2E_RDMA
// A forked child's own device (not the parent's context); exit code 2 if none.
template <typename S>
std::unique_ptr<coio::rdma::Device> childDevice() {
  auto device = coio::rdma::Device::open({.name = Fixture<S>::deviceName()});
  if (!device) ::_exit(2);
  return std::move(*device);
}
#endif

// In a forked child, with its own reactor (and device): connects a channel
// of the setup's transport to `address`, writes a byte to `ready`, then
// waits to be killed. Never returns; no Catch2 here (exit codes instead).
template <typename S>
[[noreturn]] void runDoomedClient(coio::SocketAddress address, int ready) {
  using R = typename S::R;
#if COIO_E2E_RDMA
  const std::unique_ptr<coio::rdma::Device> device = childDevice<S>();
#endif
  R reactor;
  auto connectThenWait = [&](R& r) -> Task<void> {
    Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, address);
    if (!stream) ::_exit(3);
#if COIO_E2E_RDMA
    Result<std::unique_ptr<storage::Channel<R>>> channel =
        co_await storage::RdmaChannel<R>::connect(r, *device, std::move(*stream), {}, 10s);
    if (!channel) ::_exit(4);
#endif
    const char byte = 1;
    if (::write(ready, &byte, 1) != 1) ::_exit(5);
    for (;;) ::pause();  // connected, silent, until SIGKILL
  };
  reactor.runUntil(connectThenWait(reactor));
  ::_exit(6);
}

TEMPLATE_LIST_TEST_CASE("a client process killed while connected is dropped at once", "[storage][e2e]", Setups) {
  // Over RDMA an idle queue pair never learns that its peer died: the
  // server watches the bootstrap TCP stream, which the kernel closes.
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    int pipeFds[2];
    REQUIRE(::pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) == 0);
    coio::FileDescriptor readyRead(pipeFds[0]), readyWrite(pipeFds[1]);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) runDoomedClient<TestType>(fx.address, readyWrite.get());
    readyWrite.reset();
    // The server (this loop) serves the child's handshake meanwhile.
    const Result<void> readable = co_await fx.reactor.readable(readyRead.get());
    char byte = 0;
    const bool connected = readable && ::read(readyRead.get(), &byte, 1) == 1;
    fx.reactor.forget(readyRead.get());
    auto& server = *fx.server;
    // The child's side of the handshake may finish before the server's
    // (same loop, next events): wait for the server to count it.
    bool whileAlive = false;
    if (connected) whileAlive = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 1; });
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(connected);  // else the child exited early: its exit code says where
    CHECK(whileAlive);
    CHECK(WIFSIGNALED(status));
    const bool dropped = co_await eventually(fx.reactor, [&server] { return server.stats().connections == 0; });
    CHECK(dropped);
  });
}

// In a forked child, with its own reactor (and device): serves `dir` on
// 127.0.0.1 (any port) over the setup's transport, writes the port to
// `ready`, then serves until killed. Never returns; no Catch2 here.
template <typename S>
[[noreturn]] void runDoomedServer(const std::filesystem::path& dir, int ready) {
  using R = typename S::R;
#if COIO_E2E_RDMA
  const std::unique_ptr<coio::rdma::Device> device = childDevice<S>();
#endif
  R reactor;
  auto server = storage::StorageServer<R>::open(reactor, dir.string(), Fixture<S>::small());
  if (!server) ::_exit(3);
#if COIO_E2E_RDMA
  auto transport = storage::RdmaTransport<R>::create(reactor, *device, (*server)->bufferMemory(), 256);
  if (!transport) ::_exit(4);
  (*server)->useTransport(std::move(*transport));
#endif
  auto listener = coio::TcpListener<R>::bind(reactor, coio::SocketAddress::loopbackV4());
  if (!listener) ::_exit(5);
  (*server)->serve(*listener);
  const std::uint16_t port = listener->localAddress()->port();
  if (::write(ready, &port, sizeof port) != sizeof port) ::_exit(6);
  reactor.runUntil([](R& r) -> Task<void> {
    for (;;) co_await r.sleepFor(1h);  // serving, until SIGKILL
  }(reactor));
  ::_exit(7);
}

#if COIO_E2E_RDMA
// How many memory regions this process has registered, as the kernel counts
// them (iproute2's `rdma resource show mr`); -1 if that cannot be run.
int registeredRegions() {
  FILE* rdma = ::popen("rdma -j resource show mr", "r");
  if (!rdma) return -1;
  std::string out;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, rdma)) > 0;) out.append(buffer, n);
  if (::pclose(rdma) != 0) return -1;
  const std::string mine = "\"pid\":" + std::to_string(::getpid());
  int count = 0;
  for (std::size_t at = out.find(mine); at != std::string::npos; at = out.find(mine, at + 1)) {
    const std::size_t end = at + mine.size();
    count += end == out.size() || std::isdigit(static_cast<unsigned char>(out[end])) == 0;
  }
  return count;
}
#endif

TEMPLATE_LIST_TEST_CASE("a server process killed under load: every request ends in time, no memory stays registered",
                        "[storage][e2e]", Setups) {
  // Over RDMA the client learns it from the transport (work the dead server
  // never acknowledges fails within transportFailureBound()) or from a
  // request's timeout; either way every request ends within its timeout,
  // and a timed-out one is retried until the connection fails.
  using Clock = std::chrono::steady_clock;
  constexpr auto kSlack = 2s;  // a TCG guest on a loaded host
  Fixture<TestType> f;
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    int pipeFds[2];
    REQUIRE(::pipe2(pipeFds, O_CLOEXEC | O_NONBLOCK) == 0);
    coio::FileDescriptor readyRead(pipeFds[0]), readyWrite(pipeFds[1]);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) runDoomedServer<TestType>(fx.dir.path, readyWrite.get());
    readyWrite.reset();
    const coio::testing::KilledAtEnd reap(child);
    const Result<void> readable = co_await fx.reactor.readable(readyRead.get());
    std::uint16_t port = 0;
    const bool serving = readable && ::read(readyRead.get(), &port, sizeof port) == sizeof port;
    fx.reactor.forget(readyRead.get());
    REQUIRE(serving);  // else the child exited early: its exit code says where
#if COIO_E2E_RDMA
    const int registeredBefore = registeredRegions();
    REQUIRE(registeredBefore > 0);  // the fixture's own server: the count works
#endif
    const storage::ClientOptions options{.timeout = 1500ms, .verifyChecksums = true};
    auto client = co_await fx.client(options, coio::SocketAddress::loopbackV4(port));

    struct Reader {
      std::size_t served = 0;
      std::size_t timedOut = 0;  // and retried
      std::error_code error;     // the connection's, that ended it
      Clock::duration longest{};
    };
    std::size_t servedSoFar = 0;
    Clock::time_point giveUp = Clock::time_point::max();  // set at the kill
    auto reader = [&](std::span<std::byte> into) -> Task<Reader> {
      Reader r;
      const ReadOp op{1, 0, static_cast<std::uint32_t>(into.size()), into};
      while (Clock::now() < giveUp) {
        const Clock::time_point start = Clock::now();
        Result<std::vector<ReadOutcome>> got = co_await client->batchRead(std::span(&op, 1));
        r.longest = std::max(r.longest, Clock::now() - start);
        if (got) {
          ++r.served;
          ++servedSoFar;
        } else if (got.error() == std::errc::timed_out) {
          ++r.timedOut;
        } else {
          r.error = got.error();
          break;
        }
      }
      co_return r;
    };
    auto killUnderLoad = [&]() -> Task<Reader> {
      // Once the load flows (a TCG guest takes a while to start serving).
      for (int i = 0; i < 1000 && servedSoFar < 32; ++i) co_await fx.reactor.sleepFor(10ms);
      CHECK(servedSoFar >= 32);
      giveUp = Clock::now() + 2 * options.timeout;
      ::kill(child, SIGKILL);
      co_return Reader{};
    };
    std::vector<Task<Reader>> tasks;
    for (int i = 0; i < 8; ++i) tasks.push_back(reader(fx.buffer(16 * 1024)));
    tasks.push_back(killUnderLoad());
    std::vector<Reader> readers = co_await coio::collectAllRange(std::move(tasks));
    readers.pop_back();
    for (const Reader& r : readers) {
      INFO("served " << r.served << ", timed out " << r.timedOut << ", ended by \"" << r.error.message()
                     << "\"; longest request " << r.longest / 1ms << " ms");
      CHECK(r.longest <= options.timeout + kSlack);
    }
    const Clock::time_point closing = Clock::now();
    co_await client->close();
    CHECK(Clock::now() - closing < kSlack);
    client.reset();
#if COIO_E2E_RDMA
    CHECK(registeredRegions() == registeredBefore);  // the client's registrations went with it
#endif
  });
}

TEMPLATE_LIST_TEST_CASE("a request that cannot even be sent ends within its timeout", "[storage][e2e]", Setups) {
  // A server that accepts and never reads: over RDMA the client's credits
  // run out (they are never returned), over TCP the socket buffers fill.
  // The timeout used to start once the request was sent: those waited forever.
  using R = typename TestType::R;
  using Clock = std::chrono::steady_clock;
  constexpr auto kSlack = 2s;
  Fixture<TestType> f;
  f.run([&](Fixture<TestType>& fx) -> Task<void> {
    auto silent = coio::TcpListener<R>::bind(fx.reactor, coio::SocketAddress::loopbackV4());
    REQUIRE(silent);
    auto acceptSilently = [&]() -> Task<std::unique_ptr<storage::Channel<R>>> {
      Result<coio::TcpStream<R>> stream = co_await silent->accept();
      REQUIRE(stream);
#if COIO_E2E_RDMA
      Result<std::unique_ptr<storage::Channel<R>>> c =
          co_await storage::RdmaChannel<R>::connect(fx.reactor, *fx.device, std::move(*stream), {}, 10s);
      REQUIRE(c);
      co_return std::move(*c);
#else
      co_return std::make_unique<storage::TcpChannel<R>>(std::move(*stream));
#endif
    };
    const storage::ClientOptions options{.timeout = 300ms};
    auto ends = co_await coio::collectAll(acceptSilently(), fx.client(options, *silent->localAddress()));
    std::unique_ptr<storage::Channel<R>>& peer = std::get<0>(ends);  // not bindings: lambdas use them (clang 14)
    std::unique_ptr<storage::StorageClient<R>>& client = std::get<1>(ends);
    // RDMA: more requests than credits (32). TCP: 1 MiB frames, more than the socket buffers hold.
    const std::size_t ios = TestType::rdma ? 8 : storage::proto::kMaxIosPerFrame;
    const std::size_t requests = TestType::rdma ? 40 : 32;
    const std::vector<ReadOp> batch(ios, ReadOp{1, 0, 1, fx.buffer(1)});
    auto request = [&]() -> Task<std::pair<std::error_code, Clock::duration>> {
      const Clock::time_point start = Clock::now();
      Result<std::vector<ReadOutcome>> r = co_await client->batchRead(batch);
      co_return std::pair{r ? std::error_code{} : r.error(), Clock::now() - start};
    };
    std::vector<Task<std::pair<std::error_code, Clock::duration>>> tasks;
    for (std::size_t i = 0; i < requests; ++i) tasks.push_back(request());
    // Were a request stuck, this ends it (Errc::closed), failing the test, not hanging it.
    std::stop_source done;
    bool closed = false;
    auto unstick = [&]() -> Task<void> {
      const bool due = co_await fx.reactor.sleepFor(options.timeout + kSlack + 1s, done.get_token());
      if (due) {  // bound first: g++ 12 and `if (co_await ...)`
        closed = true;
        co_await client->close();
      }
    };
    auto allThenDone = [&]() -> Task<std::vector<std::pair<std::error_code, Clock::duration>>> {
      auto results = co_await coio::collectAllRange(std::move(tasks));
      done.request_stop();
      co_return results;
    };
    auto [results, unit] = co_await coio::collectAll(allThenDone(), unstick());
    (void)unit;
    std::size_t timedOut = 0;
    for (const auto& [error, took] : results) {
      INFO(error.message() << " after " << took / 1ms << " ms");
      CHECK(error);
      CHECK(took <= options.timeout + kSlack);
      // RDMA: a request sent (granted with it) that times out aborts the
      // queue pair, as the server may be writing; the rest then fail with
      // the connection. Those still waiting for a credit sent nothing.
      if constexpr (TestType::rdma) CHECK((error == std::errc::timed_out || error == client->failure()));
      timedOut += error == std::errc::timed_out;
    }
    CHECK(timedOut > 0);
    if (!closed) co_await client->close();
    co_await peer->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a server shut down under load fails its clients' requests, no hang", "[storage][e2e]",
                        Setups) {
  Fixture<TestType> f;
  f.reactor.runUntil([](Fixture<TestType>& fx) -> Task<void> {
    auto client = co_await fx.client();
    std::vector<std::span<std::byte>> buffers;
    for (int i = 0; i < 32; ++i) buffers.push_back(fx.buffer(kChunkSize));
    auto reader = [](storage::StorageClient<typename TestType::R>& c,
                     std::span<std::byte> into) -> Task<Result<std::size_t>> {
      std::size_t done = 0;
      for (;;) {
        const ReadOp op{1, 0, kChunkSize, into};
        Result<std::vector<ReadOutcome>> r = co_await c.batchRead(std::span(&op, 1));
        if (!r) co_return r.error();
        ++done;
      }
    };
    auto stopLater = [](Fixture<TestType>& self) -> Task<Result<std::size_t>> {
      co_await self.reactor.sleepFor(50ms);
      co_await self.server->shutdown();
      co_return std::size_t{0};
    };
    std::vector<Task<Result<std::size_t>>> tasks;
    for (auto& b : buffers) tasks.push_back(reader(*client, b));
    tasks.push_back(stopLater(fx));
    std::vector<Result<std::size_t>> results = co_await coio::collectAllRange(std::move(tasks));
    for (std::size_t i = 0; i + 1 < results.size(); ++i) CHECK_FALSE(results[i]);
    CHECK(client->failure());
    CHECK(fx.server->buffersInUse() == 0);
    co_await client->close();
  }(f));
}

TEMPLATE_LIST_TEST_CASE("shutdown drains: a request in flight completes, new ones are answered unavailable",
                        "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.reactor.runUntil([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(5000);
    const std::vector<std::byte> request = requestFrame(1, {{3, 100, 5000, remoteOf(*raw, into)}});
    co_await sendRaw(*raw, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    REQUIRE(ask->header.type == storage::proto::MessageType::transmitRequest);

    // Shut down while request 1 waits for its grant; then ask for more and grant 1.
    co_await coio::collectAll(shutdownServer(*fx.server), grantWhileDraining(fx, *raw, into));
    CHECK(fx.server->buffersInUse() == 0);
    co_await raw->close();
  }(f));
}

TEMPLATE_LIST_TEST_CASE("once accepting has stopped the listener may close: a new connection is refused at once, "
                        "one with a request in flight is still served",
                        "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    using storage::proto::MessageType;
    auto raw = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(5000);
    const std::vector<std::byte> request = requestFrame(1, {{3, 100, 5000, remoteOf(*raw, into)}});
    co_await sendRaw(*raw, request);  // (not inline: g++ 12 fails on a braced list inside co_await)
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    REQUIRE(ask->header.type == MessageType::transmitRequest);

    co_await fx.server->stopAccepting();
    fx.listener.reset();  // as `serve` does on SIGTERM, before the drain
    auto late = co_await fx.connectChannel(fx.address);
    REQUIRE(!late);
    CHECK(late.error() == std::errc::connection_refused);

    co_await sendGrant(*raw, 1);
    std::size_t delivered = 0;
    const auto [id, result] = co_await readOneResult(*raw, into, delivered);
    CHECK(id == 1);
    CHECK(result.status == IoStatus::ok);
    CHECK(storage::matchesChunkBytes(3, 100, into));
    co_await raw->close();
  });
}

namespace {

// Which of a connection's tasks an injected bug throws in: the reader (its
// first readFrame) or the peer's watch, beside it.
enum class Thrower { reader, watch };

// A channel that throws where `Thrower` says: a bug in a connection's task,
// after the server has registered the connection. The rest is the real one's.
template <typename R>
class ThrowingChannel final : public storage::Channel<R> {
 public:
  ThrowingChannel(std::unique_ptr<storage::Channel<R>> inner, Thrower thrower)
      : inner_(std::move(inner)), thrower_(thrower) {}
  std::string_view name() const noexcept override { return inner_->name(); }
  R& reactor() const noexcept override { return inner_->reactor(); }
  bool writesRemote() const noexcept override { return inner_->writesRemote(); }
  std::uint32_t maxIosPerFrame() const noexcept override { return inner_->maxIosPerFrame(); }
  bool broken() const noexcept override { return inner_->broken(); }
  bool sendsInOrder() const noexcept override { return inner_->sendsInOrder(); }
  bool splicesData() const noexcept override { return inner_->splicesData(); }
  Task<Result<storage::IncomingFrame>> readFrame(storage::ReadFailure& failure, std::stop_token stop) override {
    if (thrower_ == Thrower::reader) throw std::logic_error("injected: a bug in the connection's reader");
    return inner_->readFrame(failure, std::move(stop));
  }
  std::optional<std::chrono::steady_clock::time_point> frameStartedAt() const noexcept override {
    return inner_->frameStartedAt();
  }
  Task<Result<void>> send(std::span<const std::byte> frame, std::stop_token stop) override {
    return inner_->send(frame, std::move(stop));
  }
  Task<Result<void>> sendData(const storage::OutgoingPiece& piece, std::stop_token stop) override {
    return inner_->sendData(piece, std::move(stop));
  }
  Task<Result<void>> receiveData(std::span<std::byte> into, std::stop_token stop) override {
    return inner_->receiveData(into, std::move(stop));
  }
  Result<storage::proto::RemoteBuffer> remoteBuffer(std::span<std::byte> into) const override {
    return inner_->remoteBuffer(into);
  }
  Result<void> registerMemory(std::span<std::byte> memory) override { return inner_->registerMemory(memory); }
  void abort() noexcept override { inner_->abort(); }
  Task<void> sendError(const storage::ReadFailure& failure, std::chrono::steady_clock::duration grace) override {
    return inner_->sendError(failure, grace);
  }
  Task<void> watchPeer(std::stop_token stop) override {
    if (thrower_ == Thrower::watch) co_await throwInjected();  // as the watch runs, not as it is made
    co_await inner_->watchPeer(std::move(stop));
  }
  Task<void> close() override { return inner_->close(); }

 private:
  static Task<void> throwInjected() {
    throw std::logic_error("injected: a bug in the connection's watch of its peer");
    co_return;
  }

  std::unique_ptr<storage::Channel<R>> inner_;
  Thrower thrower_;
};

// TCP, but the first connection's channel throws.
template <typename R>
class FirstThrowsTransport final : public storage::Transport<R> {
 public:
  explicit FirstThrowsTransport(Thrower thrower) : thrower_(thrower) {}
  std::string_view name() const noexcept override { return "tcp"; }
  Task<Result<std::unique_ptr<storage::Channel<R>>>> accept(coio::TcpStream<R> stream, std::stop_token stop,
                                                            std::chrono::steady_clock::duration timeout) override {
    Result<std::unique_ptr<storage::Channel<R>>> channel = co_await tcp_.accept(std::move(stream), stop, timeout);
    if (channel && accepted_++ == 0) {
      co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<ThrowingChannel<R>>(std::move(*channel), thrower_));
    }
    co_return channel;
  }

 private:
  storage::TcpTransport<R> tcp_;
  Thrower thrower_;
  int accepted_ = 0;
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("a connection task that throws ends that connection only: counted, and the server serves on",
                        "[storage][e2e]", Setups) {
  if constexpr (!TestType::rdma) {
    using R = typename TestType::R;
    const Thrower thrower = GENERATE(Thrower::reader, Thrower::watch);
    INFO((thrower == Thrower::reader ? "the reader throws" : "the peer's watch throws"));
    Fixture<TestType> f;
    f.server->useTransport(std::make_unique<FirstThrowsTransport<R>>(thrower));  // before the loop accepts anything
    f.run([](Fixture<TestType>& fx) -> Task<void> {
      auto& server = *fx.server;
      auto doomed = co_await fx.channel();
      // A task of it threw as it began: the connection ends, unanswered.
      Result<storage::IncomingFrame> ended = co_await readWithin(fx.reactor, *doomed, 5s);
      CHECK_FALSE(ended);
      CHECK(ended.error() != std::errc::timed_out);
      co_await doomed->close();
      const bool counted = co_await eventually(fx.reactor, [&server] {
        return server.stats().taskFailures == 1 && server.stats().connections == 0;  // unregistered too
      });
      INFO(server.stats().taskFailures << " task failures, " << server.stats().connections << " connections");
      CHECK(counted);
      // The next connection is served as usual.
      auto client = co_await fx.client();
      const std::vector<ReadOp> ios = {{3, 100, 5000, {}}};
      const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, *client, ios);
      CHECK(outcomes[0].status == IoStatus::ok);
      co_await client->close();
    });  // and the shutdown that follows neither throws nor touches the gone connection
  }
}
