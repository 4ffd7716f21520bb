// Nodes of a simulation (coio::sim::Node): processes at their own
// addresses, killed (reset or silent), paused, restarted, on a fault
// schedule (SimReactor::at), and the errors of that API.
#include <coio/core/baton.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/with_timeout.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using coio::sim::KillMode;
using coio::sim::SimReactor;
using Listener = coio::TcpListener<SimReactor>;
using Stream = coio::TcpStream<SimReactor>;
using Clock = std::chrono::steady_clock;

namespace {

coio::SocketAddress endpoint(const std::string& text) {
  coio::Result<coio::SocketAddress> a = coio::SocketAddress::parse(text);
  REQUIRE(a);
  return *a;
}

// What the server nodes below record, kept outside them (a node's own
// state is in its frames and is gone when it dies).
struct Record {
  int starts = 0;      // mains started
  int ended = 0;       // mains' frames destroyed (a guard's destructor)
  int served = 0;      // connections accepted
  int ticks = 0;       // timer turns of the ticking node
  std::string peer;    // the last accepted connection's peer address
};

struct Guard {
  int& ended;
  ~Guard() { ++ended; }
};

// A node's main: listens on port 7000 of every address (= the node's),
// answers each byte it reads with the same byte, until stopped.
SimReactor::NodeMain echoServer(Record& record) {
  return [&record](SimReactor& r) -> coio::Task<void> {
    ++record.starts;
    Guard guard{record.ended};
    coio::Result<Listener> listener = Listener::bind(r, endpoint("0.0.0.0:7000"));
    REQUIRE(listener);
    const std::stop_token stop = co_await coio::currentStopToken();
    for (;;) {
      coio::Result<Stream> s = co_await listener->accept(stop);
      if (!s) break;
      ++record.served;
      record.peer = s->peerAddress()->toString();
      std::byte b{};
      for (;;) {
        const coio::Result<std::size_t> n = co_await s->read({&b, 1}, stop);
        if (!n) break;
        const coio::Result<void> w = co_await s->writeAll({&b, 1}, stop);
        if (!w) break;
      }
    }
  };
}

// One byte there and back on `s`: the errc of the first failure, or none.
coio::Task<std::error_code> ping(Stream& s, std::stop_token stop = {}) {
  std::byte b{42};
  const coio::Result<void> w = co_await s.writeAll({&b, 1}, stop);
  if (!w) co_return w.error();
  const coio::Result<void> r = co_await s.readExact({&b, 1}, stop);
  if (!r) co_return r.error();
  REQUIRE(b == std::byte{42});
  co_return std::error_code{};
}

}  // namespace

TEST_CASE("sim nodes: a node's sockets are at its address, both ways", "[sim][nodes]") {
  SimReactor sim(1);
  Record server;
  sim.startNode("10.0.0.1", echoServer(server));
  std::string local;
  sim.startNode("10.0.0.2", [&local](SimReactor& r) -> coio::Task<void> {
    coio::Result<Stream> s = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE(s);
    local = s->localAddress()->toString();
    const std::error_code e = co_await ping(*s);
    REQUIRE(!e);
  });
  sim.runUntil([](SimReactor& r) -> coio::Task<void> { co_await r.sleepFor(1s); }(sim));
  CHECK(server.served == 1);
  CHECK(server.peer.rfind("10.0.0.2:", 0) == 0);
  CHECK(local.rfind("10.0.0.2:", 0) == 0);
  CHECK_FALSE(sim.node("10.0.0.2").alive());  // its main returned
  CHECK(sim.node("10.0.0.1").alive());
  sim.node("10.0.0.1").kill();
  CHECK(server.ended == 1);
}

TEST_CASE("sim nodes: a killed node's frames are gone at once, its peers get an RST, then refusals",
          "[sim][nodes]") {
  SimReactor sim(2);
  sim.setLink({.latency = 5ms});
  Record server;
  coio::sim::Node& node = sim.startNode("10.0.0.1", echoServer(server));
  sim.runUntil([](SimReactor& r, coio::sim::Node& n, Record& rec) -> coio::Task<void> {
    coio::Result<Stream> s = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE(s);
    const std::error_code first = co_await ping(*s);
    REQUIRE(!first);
    const Clock::time_point killedAt = r.now();
    n.kill(KillMode::reset);
    CHECK(rec.ended == 1);  // before kill() returned
    CHECK_FALSE(n.alive());
    CHECK_THROWS_AS(n.reactor(), std::logic_error);
    std::byte b{};
    const coio::Result<std::size_t> read = co_await s->read({&b, 1});
    REQUIRE_FALSE(read);
    CHECK(read.error() == std::errc::connection_reset);
    CHECK(r.now() - killedAt == 5ms);  // the RST's latency
    coio::Result<Stream> again = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE_FALSE(again);
    CHECK(again.error() == std::errc::connection_refused);
  }(sim, node, server));
}

TEST_CASE("sim nodes: a silent node answers nothing; restarted, it serves again from a fresh main",
          "[sim][nodes]") {
  SimReactor sim(3);
  sim.setLink({.latency = 1ms});
  Record server;
  coio::sim::Node& node = sim.startNode("10.0.0.1", echoServer(server));
  sim.runUntil([](SimReactor& r, coio::sim::Node& n, Record& rec) -> coio::Task<void> {
    coio::Result<Stream> s = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE(s);
    n.kill(KillMode::silent);
    CHECK(rec.ended == 1);
    // No RST: the read waits until its own deadline.
    std::byte b{};
    const coio::Result<std::size_t> read =
        co_await coio::withTimeout(r, [&](std::stop_token stop) { return s->read({&b, 1}, stop); }, 10s);
    REQUIRE_FALSE(read);
    CHECK(read.error() == std::errc::timed_out);
    // A connect is not refused: its SYNs go unanswered until ETIMEDOUT
    // (1 + 2 + ... + 64 s of retries).
    const Clock::time_point start = r.now();
    coio::Result<Stream> lost = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE_FALSE(lost);
    CHECK(lost.error() == std::errc::timed_out);
    CHECK(r.now() - start >= 127s);
    n.restart();
    CHECK(n.alive());
    coio::Result<Stream> fresh = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE(fresh);
    CHECK(rec.starts == 2);  // its main started in its first turn, before the SYN arrived
    const std::error_code e = co_await ping(*fresh);
    CHECK(!e);
    CHECK(rec.served == 2);
    n.kill();
    CHECK(rec.ended == 2);
  }(sim, node, server));
}

TEST_CASE("sim nodes: a paused node runs nothing and its timers wait; its peers see silence", "[sim][nodes]") {
  SimReactor sim(4);
  sim.setLink({.latency = 1ms});
  Record server;
  coio::sim::Node& node = sim.startNode("10.0.0.1", echoServer(server));
  Record ticking;
  coio::sim::Node& ticker = sim.startNode("10.0.0.2", [&ticking](SimReactor& r) -> coio::Task<void> {
    const std::stop_token stop = co_await coio::currentStopToken();
    for (bool on = co_await r.sleepFor(10ms, stop); on; on = co_await r.sleepFor(10ms, stop)) ++ticking.ticks;
  });
  sim.runUntil([](SimReactor& r, coio::sim::Node& n, coio::sim::Node& t, Record& ticks) -> coio::Task<void> {
    coio::Result<Stream> s = co_await Stream::connect(r, endpoint("10.0.0.1:7000"));
    REQUIRE(s);
    co_await r.sleepFor(95ms);
    CHECK(ticks.ticks == 9);
    n.pause();
    t.pause();
    CHECK(n.paused());
    // The echo waits for the resume, 200 ms on.
    r.after(200ms, [&n, &t] {
      n.resume();
      t.resume();
    });
    const Clock::time_point start = r.now();
    const std::error_code e = co_await ping(*s);
    CHECK(!e);
    CHECK(r.now() - start >= 200ms);
    CHECK(r.now() - start < 210ms);
    CHECK(ticks.ticks == 10);  // the tick due during the pause fired at the resume, once
    co_await r.sleepFor(50ms);
    CHECK(ticks.ticks >= 14);
    n.kill();
    t.kill();
  }(sim, node, ticker, ticking));
}

TEST_CASE("sim nodes: a fault schedule runs at its virtual times", "[sim][nodes]") {
  SimReactor sim(5);
  Record server;
  sim.startNode("10.0.0.1", echoServer(server));
  std::vector<double> at;
  const auto seconds = [&sim] { return std::chrono::duration<double>(sim.now().time_since_epoch()).count(); };
  sim.at(Clock::time_point(3s), [&] {
    at.push_back(seconds());
    sim.node("10.0.0.1").kill();
  });
  sim.at(Clock::time_point(1s), [&] { at.push_back(seconds()); });
  // Due at the same instant: it runs inside the first kill's drain, on a
  // node being killed: nothing more to do.
  sim.at(Clock::time_point(3s), [&] { sim.node("10.0.0.1").kill(KillMode::silent); });
  sim.at(Clock::time_point(5s), [&] {
    at.push_back(seconds());
    sim.node("10.0.0.1").restart();
  });
  sim.runUntil([](SimReactor& r) -> coio::Task<void> { co_await r.sleepFor(10s); }(sim));
  CHECK(at == std::vector<double>{1, 3, 5});
  CHECK(server.starts == 2);
  CHECK(server.ended == 1);
  CHECK(sim.node("10.0.0.1").alive());
  sim.node("10.0.0.1").kill();
}

TEST_CASE("sim nodes: bad input to the node API is a clear error", "[sim][nodes][bad-input]") {
  SimReactor sim(6);
  Record server;
  sim.startNode("10.0.0.1", echoServer(server));
  CHECK_THROWS_WITH(sim.node("10.0.0.9"), "coio::sim: no node at 10.0.0.9");
  CHECK_THROWS_AS(sim.startNode("10.0.0.1", echoServer(server)), std::invalid_argument);
  CHECK_THROWS_AS(sim.startNode("not-an-ip", echoServer(server)), std::invalid_argument);
  CHECK_THROWS_AS(sim.node("10.0.0.1").reactor().startNode("10.0.0.3", echoServer(server)), std::logic_error);
  sim.runUntil([](SimReactor& r) -> coio::Task<void> { co_await r.sleepFor(2s); }(sim));
  CHECK_THROWS_WITH(sim.at(Clock::time_point(1s), [] {}),
                    Catch::Contains("a fault at 1.000000 s, before now (2.000000 s)"));
  CHECK_THROWS_AS(sim.after(-1ms, [] {}), std::invalid_argument);

  // A node cannot kill itself from its own task.
  bool refused = false;
  sim.startNode("10.0.0.2", [&sim, &refused](SimReactor&) -> coio::Task<void> {
    try {
      sim.node("10.0.0.2").kill();
    } catch (const std::logic_error&) {
      refused = true;
    }
    co_return;
  });
  sim.runUntil([](SimReactor& r) -> coio::Task<void> { co_await r.sleepFor(1s); }(sim));
  CHECK(refused);

  // A node whose task ignores its stop cannot be killed: said, not a hang.
  sim.startNode("10.0.0.3", [](SimReactor&) -> coio::Task<void> {
    coio::Baton never;  // a wait no stop cancels
    co_await never;
  });
  sim.runUntil([](SimReactor& r) -> coio::Task<void> { co_await r.sleepFor(1s); }(sim));
  CHECK_THROWS_AS(sim.node("10.0.0.3").kill(), coio::sim::Deadlock);
  sim.node("10.0.0.1").kill();
}

TEST_CASE("sim nodes: a node's failure fails the run", "[sim][nodes]") {
  SimReactor sim(7);
  sim.startNode("10.0.0.1", [](SimReactor& r) -> coio::Task<void> {
    co_await r.sleepFor(1s);
    throw std::runtime_error("node failed");
  });
  CHECK_THROWS_WITH(sim.runUntil([](SimReactor& r) -> coio::Task<void> { co_await r.sleepFor(5s); }(sim)),
                    "node failed");
}

TEST_CASE("sim nodes: the same seed kills and restarts the same way", "[sim][nodes]") {
  const auto run = [](std::uint64_t seed) {
    SimReactor sim(seed);
    sim.drawLinks({.latency = 100us}, {.latency = 5ms});
    Record server;
    sim.startNode("10.0.0.1", echoServer(server));
    for (int c = 0; c < 3; ++c) {
      sim.startNode("10.0.1." + std::to_string(c + 1), [](SimReactor& r) -> coio::Task<void> {
        const std::stop_token stop = co_await coio::currentStopToken();
        for (bool on = true; on;) {
          coio::Result<Stream> s = co_await Stream::connect(r, endpoint("10.0.0.1:7000"), stop);
          for (std::error_code e = s ? std::error_code{} : s.error(); !e;) e = co_await ping(*s, stop);
          on = co_await r.sleepFor(std::chrono::milliseconds(r.random().below(50)), stop);
        }
      });
    }
    sim.runUntil([](SimReactor& r) -> coio::Task<void> {
      for (int i = 0; i < 10; ++i) {
        co_await r.sleepFor(std::chrono::milliseconds(1 + r.random().below(100)));
        coio::sim::Node& n = r.node("10.0.0.1");
        if (r.random().below(2) == 0) {
          n.restart();
        } else {
          n.kill(KillMode::silent);
          co_await r.sleepFor(20ms);
          n.restart();
        }
      }
      for (int c = 0; c < 3; ++c) r.node("10.0.1." + std::to_string(c + 1)).kill();
      r.node("10.0.0.1").kill();
    }(sim));
    CHECK(server.starts == 11);
    CHECK(server.ended == 11);
    return sim.traceHash();
  };
  CHECK(run(11) == run(11));
  CHECK(run(11) != run(12));
}

TEST_CASE("sim nodes: a run that fails still stops its nodes as a kill does", "[sim][nodes]") {
  bool shutDown = false;
  {
    SimReactor sim(8);
    sim.startNode("10.0.0.1", [&shutDown](SimReactor& r) -> coio::Task<void> {
      const std::stop_token stop = co_await coio::currentStopToken();
      co_await r.sleepFor(1h, stop);
      shutDown = true;  // its shutdown path: after the stop
    });
    CHECK_THROWS_WITH(sim.runUntil([](SimReactor& r) -> coio::Task<void> {
      co_await r.sleepFor(1s);
      throw std::runtime_error("an invariant broke");
    }(sim)),
                      "an invariant broke");
    CHECK_FALSE(shutDown);
  }
  CHECK(shutDown);
}
