// TcpListener and TcpStream, unchanged, on coio::sim::SimReactor's network:
// connections, addresses, refusals, the backlog, resets and closes, in
// virtual time, the same for the same seed.
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/with_timeout.hpp>
#include <coio/testing/seed_driver.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using coio::sim::SimReactor;
using Listener = coio::TcpListener<SimReactor>;
using Stream = coio::TcpStream<SimReactor>;

namespace {

coio::SocketAddress address(const char* text) {
  coio::Result<coio::SocketAddress> a = coio::SocketAddress::parse(text);
  REQUIRE(a);
  return *a;
}

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + seed) >> 3);
  return out;
}

coio::Task<coio::Result<Stream>> acceptOne(Listener& listener) { co_return co_await listener.accept(); }

// Serves one connection: echoes what it reads until the end of the stream.
coio::Task<void> echoOnce(Listener& listener) {
  coio::Result<Stream> accepted = co_await listener.accept();
  REQUIRE(accepted);
  std::vector<std::byte> buffer(3000);
  for (;;) {
    const coio::Result<std::size_t> n = co_await accepted->read(buffer);
    if (!n) {
      REQUIRE(n.error() == coio::Errc::eof);
      break;
    }
    const coio::Result<void> w = co_await accepted->writeAll(std::span<const std::byte>(buffer.data(), *n));
    REQUIRE(w);
  }
}

// A client sends `bytes` bytes through an echo server at 10.0.0.1:7000 and
// reads them back; the virtual time it took and the run's trace hash.
std::pair<std::chrono::steady_clock::duration, std::uint64_t> echoRun(std::uint64_t seed, std::size_t bytes) {
  SimReactor reactor(seed);
  reactor.setLink({.latency = 1ms, .window = 16 * 1024});
  coio::Result<Listener> listener = Listener::bind(reactor, address("10.0.0.1:7000"));
  REQUIRE(listener);
  reactor.spawn(echoOnce(*listener));
  const auto took = reactor.runUntil([](SimReactor& r, std::size_t n, std::uint64_t s) -> coio::Task<std::chrono::steady_clock::duration> {
    const auto start = r.now();
    coio::Result<Stream> stream = co_await Stream::connect(r, address("10.0.0.1:7000"));
    REQUIRE(stream);
    const std::vector<std::byte> out = pattern(n, s);
    std::vector<std::byte> in(n);
    auto send = [](Stream& st, const std::vector<std::byte>& o) -> coio::Task<void> {
      const coio::Result<void> w = co_await st.writeAll(std::span<const std::byte>(o));
      REQUIRE(w);
      REQUIRE(st.shutdown());
    };
    auto receive = [](Stream& st, std::vector<std::byte>& i) -> coio::Task<void> {
      const coio::Result<void> r = co_await st.readExact(i);
      REQUIRE(r);
    };
    co_await coio::collectAll(send(*stream, out), receive(*stream, in));
    CHECK(in == out);
    co_return r.now() - start;
  }(reactor, bytes, seed));
  return {took, reactor.traceHash()};
}

}  // namespace

TEST_CASE("SimReactor network: TcpListener and TcpStream carry a stream through an echo server, in virtual time",
          "[sim]") {
  const auto [took, hash] = echoRun(1, 200'000);
  // 200 KB through a 16 KiB window at 1 ms each way: at least a round trip
  // per window's worth, and no wall-clock time in it.
  CHECK(took >= 2ms * (200'000 / (16 * 1024)));
  CHECK(took < 2s);
  // The same seed, the same run.
  CHECK(echoRun(1, 200'000) == std::pair{took, hash});
}

TEST_CASE("SimReactor network: addresses as the kernel gives them (bind, port 0, the peer's, EADDRINUSE)", "[sim]") {
  SimReactor reactor(3);
  coio::Result<Listener> listener = Listener::bind(reactor, address("0.0.0.0:0"));
  REQUIRE(listener);
  const coio::Result<coio::SocketAddress> bound = listener->localAddress();
  REQUIRE(bound);
  CHECK(bound->port() >= 32768);
  // The same address again: taken.
  const coio::Result<Listener> twice = Listener::bind(reactor, *bound);
  CHECK(twice.error() == std::errc::address_in_use);
  reactor.runUntil([](SimReactor& r, Listener& l, std::uint16_t port) -> coio::Task<void> {
    const coio::SocketAddress to = address(("192.168.7.9:" + std::to_string(port)).c_str());
    auto [client, server] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(l));
    REQUIRE(client);
    REQUIRE(server);
    // The client sees the address it dialled; the server the client's.
    CHECK(client->peerAddress()->toString() == to.toString());
    CHECK(server->localAddress()->toString() == to.toString());
    CHECK(server->peerAddress()->toString() == client->localAddress()->toString());
    CHECK(client->localAddress()->toString().starts_with("127.0.0.1:"));
    CHECK(client->setNoDelay(true));  // options are taken (and ignored)
  }(reactor, *listener, bound->port()));
}

TEST_CASE("SimReactor network: connect to an address nobody listens on is refused one round trip later", "[sim]") {
  SimReactor reactor(4);
  reactor.setLink({.latency = 5ms});
  reactor.runUntil([](SimReactor& r) -> coio::Task<void> {
    const auto start = r.now();
    coio::Result<Stream> stream = co_await Stream::connect(r, address("10.0.0.2:80"));
    CHECK(stream.error() == std::errc::connection_refused);
    CHECK(r.now() - start == 10ms);
    CHECK(r.stats().inFlight == 0);
  }(reactor));
}

TEST_CASE("SimReactor network: a full backlog drops SYNs, which come again after 1, 2, 4 s; then ETIMEDOUT", "[sim]") {
  SimReactor reactor(5);
  reactor.setLink({.latency = 1ms});
  coio::Result<Listener> listener = Listener::bind(reactor, address("10.0.0.1:9000"), 1);
  REQUIRE(listener);
  reactor.runUntil([](SimReactor& r, Listener& l) -> coio::Task<void> {
    const coio::SocketAddress to = address("10.0.0.1:9000");
    coio::Result<Stream> first = co_await Stream::connect(r, to);  // queued: the backlog is full now
    REQUIRE(first);
    const auto start = r.now();
    // Accepted 2.5 s on: the SYN sent at 0 s and again at 1 s and 3 s gets in the third time.
    auto acceptLater = [](SimReactor& re, Listener& li) -> coio::Task<coio::Result<Stream>> {
      co_await re.sleepFor(2500ms);
      co_return co_await li.accept();
    };
    auto [second, accepted] = co_await coio::collectAll(Stream::connect(r, to), acceptLater(r, l));
    REQUIRE(second);
    REQUIRE(accepted);
    CHECK(r.now() - start == 3s + 2ms);
    // Nobody accepts again: the third connection times out after six retries (1 + 2 + ... + 64 s).
    const auto third = r.now();
    coio::Result<Stream> late = co_await Stream::connect(r, to);
    CHECK(late.error() == std::errc::timed_out);
    CHECK(r.now() - third == 127s + 2ms);
  }(reactor, *listener));
}

TEST_CASE("SimReactor network: resets: abort(), a close with unread bytes, a listener closed on its queue", "[sim]") {
  SimReactor reactor(6);
  reactor.setLink({.latency = 1ms});
  std::optional<Listener> listener;
  coio::Result<Listener> bound = Listener::bind(reactor, address("10.0.0.1:9001"));
  REQUIRE(bound);
  listener.emplace(std::move(*bound));
  reactor.runUntil([](SimReactor& r, std::optional<Listener>& l) -> coio::Task<void> {
    const coio::SocketAddress to = address("10.0.0.1:9001");
    std::byte buffer[64];
    {  // abort(): the peer's pending read fails with ECONNRESET.
      auto [client, server] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(*l));
      REQUIRE(client);
      REQUIRE(server);
      CHECK(client->abort());
      const coio::Result<std::size_t> n = co_await server->read(buffer);
      CHECK(n.error() == std::errc::connection_reset);
      const coio::Result<std::size_t> mine = co_await client->write(std::as_bytes(std::span(buffer)));
      CHECK(!mine);
    }
    {  // closed with bytes it never read: an RST, not a FIN.
      auto [client, server] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(*l));
      REQUIRE(client);
      REQUIRE(server);
      const coio::Result<void> sent = co_await client->writeAll(std::as_bytes(std::span(buffer)));
      REQUIRE(sent);
      co_await r.sleepFor(5ms);  // arrived, unread
      server->close();
      const coio::Result<std::size_t> n = co_await client->read(buffer);
      CHECK(n.error() == std::errc::connection_reset);
    }
    {  // a connection the listener made but nobody accepted is reset when it closes.
      coio::Result<Stream> client = co_await Stream::connect(r, to);
      REQUIRE(client);
      l.reset();
      const coio::Result<std::size_t> n = co_await client->read(buffer);
      CHECK(n.error() == std::errc::connection_reset);
      coio::Result<Stream> again = co_await Stream::connect(r, to);
      CHECK(again.error() == std::errc::connection_refused);
    }
  }(reactor, listener));
}

TEST_CASE("SimReactor network: a connect stopped before its SYN arrived leaves nothing in flight, nothing to accept",
          "[sim]") {
  SimReactor reactor(7);
  reactor.setLink({.latency = 10ms});
  coio::Result<Listener> listener = Listener::bind(reactor, address("10.0.0.1:9002"));
  REQUIRE(listener);
  reactor.runUntil([](SimReactor& r, Listener& l) -> coio::Task<void> {
    const coio::SocketAddress to = address("10.0.0.1:9002");
    coio::Result<Stream> stream = co_await coio::withTimeout(r, Stream::connect(r, to), 5ms);
    CHECK(stream.error() == std::errc::timed_out);
    CHECK(r.stats().inFlight == 0);
    coio::Result<Stream> accepted =
        co_await coio::withTimeout(r, [&](std::stop_token stop) { return l.accept(stop); }, 100ms);
    CHECK(accepted.error() == std::errc::timed_out);
    // The listener still serves the next one.
    auto [client, server] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(l));
    CHECK(client);
    CHECK(server);
  }(reactor, *listener));
}

namespace {

// How long a connect from the loopback host to `to` takes on `reactor`.
std::chrono::steady_clock::duration connectTime(SimReactor& reactor, const char* to) {
  coio::Result<Listener> listener = Listener::bind(reactor, address(to));
  REQUIRE(listener);
  return reactor.runUntil([](SimReactor& r, Listener& l, const char* at) -> coio::Task<std::chrono::steady_clock::duration> {
    const auto start = r.now();
    auto [client, server] = co_await coio::collectAll(Stream::connect(r, address(at)), acceptOne(l));
    REQUIRE(client);
    REQUIRE(server);
    co_return r.now() - start;
  }(reactor, *listener, to));
}

}  // namespace

TEST_CASE("SimReactor links: a latency per pair of hosts, a default for the others, and links drawn from the seed",
          "[sim]") {
  {
    SimReactor reactor(8);
    reactor.setLink("10.0.0.1", "127.0.0.1", {.latency = 20ms});
    CHECK(connectTime(reactor, "10.0.0.1:1") == 40ms);  // SYN there, its answer back
    CHECK(connectTime(reactor, "10.0.0.2:1") == 100us);  // the default link: 50 us each way
  }
  // Drawn: the same for a seed, different across seeds, within the range.
  std::set<std::chrono::steady_clock::duration> seen;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    std::chrono::steady_clock::duration took[2];
    for (auto& t : took) {
      SimReactor reactor(seed);
      reactor.drawLinks({.latency = 1ms}, {.latency = 100ms});
      t = connectTime(reactor, "10.0.0.1:1");
    }
    CHECK(took[0] == took[1]);
    CHECK(took[0] >= 2ms);
    CHECK(took[0] <= 200ms);
    seen.insert(took[0]);
  }
  CHECK(seen.size() > 10);
}

TEST_CASE("SimReactor links: bytes go out at the link's bandwidth", "[sim]") {
  SimReactor reactor(9);
  reactor.setLink({.latency = 1ms, .window = 1 << 20, .bandwidth = 1'000'000});
  coio::Result<Listener> listener = Listener::bind(reactor, address("10.0.0.1:7001"));
  REQUIRE(listener);
  reactor.runUntil([](SimReactor& r, Listener& l) -> coio::Task<void> {
    auto [client, server] = co_await coio::collectAll(Stream::connect(r, address("10.0.0.1:7001")), acceptOne(l));
    REQUIRE(client);
    REQUIRE(server);
    const std::vector<std::byte> out = pattern(100'000, 9);
    std::vector<std::byte> in(out.size());
    const auto start = r.now();
    auto send = [](Stream& s, const std::vector<std::byte>& o) -> coio::Task<void> {
      const coio::Result<void> w = co_await s.writeAll(std::span<const std::byte>(o));
      REQUIRE(w);
    };
    auto receive = [](Stream& s, std::vector<std::byte>& i) -> coio::Task<void> {
      const coio::Result<void> rd = co_await s.readExact(i);
      REQUIRE(rd);
    };
    co_await coio::collectAll(send(*client, out), receive(*server, in));
    CHECK(in == out);
    // 100 KB at 1 MB/s, plus the latency of the last byte.
    const auto took = r.now() - start;
    CHECK(took >= 101ms);
    CHECK(took < 110ms);
  }(reactor, *listener));
}

TEST_CASE("SimReactor faults: a partition stops bytes and connects without a reset; healed, they arrive in order",
          "[sim]") {
  SimReactor reactor(10);
  reactor.setLink({.latency = 1ms});
  coio::Result<Listener> listener = Listener::bind(reactor, address("10.0.0.1:7002"));
  REQUIRE(listener);
  reactor.runUntil([](SimReactor& r, Listener& l) -> coio::Task<void> {
    const coio::SocketAddress to = address("10.0.0.1:7002");
    auto [client, server] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(l));
    REQUIRE(client);
    REQUIRE(server);
    r.partition("127.0.0.1", "10.0.0.1");
    const std::vector<std::byte> out = pattern(5000, 10);
    const coio::Result<void> sent = co_await client->writeAll(std::span<const std::byte>(out));
    REQUIRE(sent);  // the window took it
    std::vector<std::byte> in(out.size());
    Stream& receiver = *server;  // clang 14: a lambda cannot capture a structured binding
    coio::Result<std::size_t> early =
        co_await coio::withTimeout(r, [&](std::stop_token stop) { return receiver.read(in, stop); }, 2s);
    CHECK(early.error() == std::errc::timed_out);  // silence, not a reset
    coio::Result<Stream> during = co_await coio::withTimeout(r, Stream::connect(r, to), 500ms);
    CHECK(during.error() == std::errc::timed_out);
    const auto healed = r.now();
    r.heal("127.0.0.1", "10.0.0.1");
    const coio::Result<void> got = co_await server->readExact(in);
    REQUIRE(got);
    CHECK(in == out);
    CHECK(r.now() - healed == 1ms);
    // The connection works both ways again.
    const coio::Result<void> back = co_await server->writeAll(std::span<const std::byte>(out.data(), 10));
    CHECK(back);
    const coio::Result<void> read = co_await client->readExact(std::span(in.data(), 10));
    CHECK(read);
  }(reactor, *listener));
}

TEST_CASE("SimReactor: bad input to the simulation API is a clear error", "[sim]") {
  SimReactor reactor(11);
  CHECK_THROWS_AS(reactor.partition("10.0.0.1", "not-a-host"), std::invalid_argument);
  CHECK_THROWS_AS(reactor.setLink("10.0.0.300", "10.0.0.1", {}), std::invalid_argument);
  // Seeds from the environment: a number, or a clear error naming the variable.
  ::setenv("COIO_SIM_SEEDS", "12x", 1);
  CHECK_THROWS_WITH(coio::sim::SeedRange::fromEnvironment(5), Catch::Contains("COIO_SIM_SEEDS='12x'"));
  ::setenv("COIO_SIM_SEEDS", "7", 1);
  ::setenv("COIO_SIM_FIRST_SEED", "100", 1);
  const coio::sim::SeedRange range = coio::sim::SeedRange::fromEnvironment(5);
  CHECK((range.first == 100 && range.count == 7));
  ::setenv("COIO_SIM_SEED", "42", 1);  // one seed: a replay
  const coio::sim::SeedRange one = coio::sim::SeedRange::fromEnvironment(5);
  CHECK((one.first == 42 && one.count == 1));
  ::unsetenv("COIO_SIM_SEED");
  ::unsetenv("COIO_SIM_SEEDS");
  ::unsetenv("COIO_SIM_FIRST_SEED");
  CHECK(coio::sim::SeedRange::fromEnvironment(5).count == 5);
  // runSeeds: a failing seed is reported with its replay line, the others run.
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* log = ::open_memstream(&text, &size);
  const coio::sim::SeedReport report = coio::sim::runSeeds(
      {.first = 1, .count = 4},
      [](std::uint64_t seed) -> std::uint64_t {
        if (seed == 3) throw coio::sim::Deadlock("stuck");
        return seed;
      },
      "./t '[x]'", log);
  std::fclose(log);
  const std::string written(text, size);
  std::free(text);
  CHECK(report.runs == 4);
  REQUIRE(report.failures.size() == 1);
  CHECK(report.failures[0].seed == 3);
  CHECK(report.failures[0].what == "stuck");
  CHECK(written.find("replay: COIO_SIM_SEED=3 COIO_SIM_TRACE=") != std::string::npos);
  CHECK(written.find(" ./t '[x]'") != std::string::npos);

  // A replay checks the trace: a failed run's is in its replay line (the
  // trace its reactor had when the run threw), and a run whose trace is not
  // the one asked for fails, saying the seed no longer replays.
  const auto simulated = [](std::uint64_t seed) -> std::uint64_t {
    SimReactor r(seed);
    r.runUntil([](SimReactor& sim) -> coio::Task<void> {
      co_await sim.sleepFor(std::chrono::milliseconds(sim.random().below(100)));
    }(r));
    if (seed == 8) throw std::runtime_error("seed 8 breaks an invariant");
    return r.traceHash();
  };
  const std::uint64_t seven = simulated(7);
  CHECK(coio::sim::runSeeds({.first = 7, .count = 1, .expectedTrace = seven}, simulated, "t", nullptr).failures.empty());
  const coio::sim::SeedReport changed =
      coio::sim::runSeeds({.first = 7, .count = 1, .expectedTrace = seven + 1}, simulated, "t", nullptr);
  REQUIRE(changed.failures.size() == 1);
  CHECK_THAT(changed.failures[0].what, Catch::Contains("this seed no longer replays the run asked for") &&
                                           Catch::Contains("this run passed"));
  char* text8 = nullptr;
  std::size_t size8 = 0;
  std::FILE* log8 = ::open_memstream(&text8, &size8);
  const coio::sim::SeedReport eight = coio::sim::runSeeds({.first = 8, .count = 1}, simulated, "t", log8);
  std::fclose(log8);
  const std::string written8(text8, size8);
  std::free(text8);
  REQUIRE(eight.failures.size() == 1);
  char expected[64];
  std::snprintf(expected, sizeof expected, "COIO_SIM_TRACE=%016llx",
                static_cast<unsigned long long>(coio::sim::lastTraceHash()));
  CHECK(written8.find(expected) != std::string::npos);
  // ... and replaying it with that trace fails the same way, not as changed.
  const coio::sim::SeedReport again =
      coio::sim::runSeeds({.first = 8, .count = 1, .expectedTrace = coio::sim::lastTraceHash()}, simulated, "t", nullptr);
  REQUIRE(again.failures.size() == 1);
  CHECK(again.failures[0].what == "seed 8 breaks an invariant");
  ::setenv("COIO_SIM_SEED", "8", 1);
  ::setenv("COIO_SIM_TRACE", "0x12g", 1);
  CHECK_THROWS_WITH(coio::sim::SeedRange::fromEnvironment(5), Catch::Contains("COIO_SIM_TRACE='0x12g' is not a trace hash"));
  ::setenv("COIO_SIM_TRACE", "00ff", 1);
  CHECK(coio::sim::SeedRange::fromEnvironment(5).expectedTrace == 0xffu);
  ::unsetenv("COIO_SIM_SEED");
  ::unsetenv("COIO_SIM_TRACE");
}

TEST_CASE("SimReactor faults: a host whose processes crash: its connections reset, connects refused until it is up",
          "[sim]") {
  SimReactor reactor(12);
  reactor.setLink({.latency = 1ms});
  coio::Result<Listener> listener = Listener::bind(reactor, address("10.0.0.1:7003"));
  REQUIRE(listener);
  reactor.runUntil([](SimReactor& r, Listener& l) -> coio::Task<void> {
    const coio::SocketAddress to = address("10.0.0.1:7003");
    auto [client, server] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(l));
    REQUIRE(client);
    REQUIRE(server);
    r.hostDown("10.0.0.1");
    std::byte buffer[8];
    const coio::Result<std::size_t> mine = co_await client->read(buffer);
    CHECK(mine.error() == std::errc::connection_reset);
    const coio::Result<std::size_t> theirs = co_await server->read(buffer);
    CHECK(theirs.error() == std::errc::connection_reset);
    coio::Result<Stream> refused = co_await Stream::connect(r, to);
    CHECK(refused.error() == std::errc::connection_refused);
    r.hostUp("10.0.0.1");  // the listener accepts again, as a restarted server's would
    auto [again, accepted] = co_await coio::collectAll(Stream::connect(r, to), acceptOne(l));
    CHECK(again);
    CHECK(accepted);
  }(reactor, *listener));
}
