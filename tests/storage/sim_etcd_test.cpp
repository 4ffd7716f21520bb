// The simulated etcd (sim_etcd.hpp) against the real EtcdClient on
// coio::sim: the client tests' behaviours (etcd_client_test.cpp, there
// against a real etcd), here exact in virtual time: KV, transactions,
// leases that expire at their TTL, watches and compaction, and the etcd
// node paused, killed and restarted, a lease lost.
#include "etcd/etcd_client.hpp"
#include "etcd_client_cases.hpp"
#include "sim_etcd.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/with_timeout.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using namespace storage::etcd;
using coio::Result;
using coio::Task;
using coio::sim::KillMode;
using coio::sim::SimReactor;

namespace {

constexpr auto kEtcdLatency = 1ms;  // each way, between the client and etcd
constexpr auto kEtcdTimeout = 2s;
constexpr const char* kEtcdHost = "10.0.0.100";

// A simulation with etcd as a node and a client of it on the runner.
struct EtcdWorld {
  SimReactor sim;
  SimEtcdStore store;
  coio::sim::Node& etcd;
  std::vector<std::string> log;
  std::unique_ptr<EtcdClient<SimReactor>> client;

  explicit EtcdWorld(std::uint64_t seed = 1) : sim(seed), etcd(sim.startNode(kEtcdHost, simEtcd(store))) {
    sim.setLink({.latency = kEtcdLatency});
    EtcdOptions o;
    o.endpoints = {std::string("http://") + kEtcdHost + ":2379"};
    o.log = [this](const std::string& line) { log.push_back(line); };
    auto made = EtcdClient<SimReactor>::create(sim, std::move(o));
    REQUIRE(made);
    client = std::move(*made);
  }

  // Runs `body()` to its end, then stops etcd (its tasks end as when
  // killed), even if the body failed an assertion.
  template <typename Body>
  void run(Body body) {
    struct Stop {
      EtcdWorld& w;
      ~Stop() {
        w.client.reset();
        w.etcd.kill();
      }
    } stop{*this};
    sim.runUntil(body());
  }

  // ok(result): the value, or a failure that shows the client's log.
  auto ok() const {
    return [this](auto result) { return etcdOk(std::move(result), *this); };
  }

  std::string logText() const {
    std::string text;
    for (const std::string& line : log) text += line + "\n";
    return text;
  }
};

// The value, or a failure that shows the client's log.
template <typename T>
T etcdOk(Result<T> r, const EtcdWorld& w) {
  if (!r) {
    INFO("error: " << r.error().message() << "; log:\n" << w.logText());
    REQUIRE(r);
  }
  return std::move(*r);
}

// keepLeaseAlive's outcome into `out` (a named coroutine: its arguments live in its frame).
Task<void> keepAliveInto(Result<void>& out, EtcdClient<SimReactor>& client, std::int64_t lease,
                    std::chrono::seconds ttl, std::stop_token stop) {
  out = co_await keepLeaseAlive(client, lease, ttl, std::move(stop));
}

// Reads batches until `count` events came (each within kEtcdTimeout).
Task<std::vector<Event>> collectEvents(EtcdWatch<SimReactor>& watch, std::size_t count, const EtcdWorld& w) {
  return cases::collectEvents(watch, count, w.ok(), kEtcdTimeout);
}

}  // namespace

TEST_CASE("sim etcd: put, range, delete, revisions", "[sim-etcd]") {
  EtcdWorld w;
  w.run([&] { return cases::putRangeDelete(*w.client, w.ok(), kEtcdTimeout); });
}

TEST_CASE("sim etcd: a transaction runs the branch its compares choose", "[sim-etcd]") {
  EtcdWorld w;
  w.run([&] { return cases::transactions(*w.client, w.ok(), kEtcdTimeout); });
}

TEST_CASE("sim etcd: a lease expires exactly at its TTL without keep-alives, stays with them, goes on revoke",
          "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    auto lapsing = etcdOk(co_await c.leaseGrant(2, kEtcdTimeout), w);
    // The grant was applied one latency before its reply came: it expires TTL after that.
    const auto granted = w.sim.now() - kEtcdLatency;
    CHECK(lapsing.ttl == 2);
    REQUIRE(w.store.deadline(lapsing.id));
    CHECK(*w.store.deadline(lapsing.id) == granted + 2s);
    auto kept = etcdOk(co_await c.leaseGrant(3, kEtcdTimeout), w);
    CHECK(kept.id != lapsing.id);
    (void)etcdOk(co_await c.put({"/lapsing", "x", lapsing.id}, kEtcdTimeout), w);
    (void)etcdOk(co_await c.put({"/kept", "y", kept.id}, kEtcdTimeout), w);
    auto bound = etcdOk(co_await c.range({"/kept"}, kEtcdTimeout), w);
    REQUIRE(bound.kvs.size() == 1);
    CHECK(bound.kvs[0].lease == kept.id);

    auto watch = etcdOk(co_await c.watch(WatchRequest{"/lapsing"}, kEtcdTimeout), w);
    coio::AsyncScope scope;
    Result<void> keeper = std::errc::interrupted;
    scope.spawn(keepAliveInto(keeper, c, kept.id, 3s, scope.stopToken()));
    // The deletion is made at the deadline and seen one latency later.
    std::vector<Event> expired = co_await collectEvents(*watch, 1, w);
    CHECK(w.sim.now() == granted + 2s + kEtcdLatency);
    REQUIRE(expired.size() == 1);
    CHECK(expired[0].type == Event::Type::del);
    CHECK(!w.store.deadline(lapsing.id));

    co_await w.sim.sleepFor(10s);  // over three TTLs of the kept lease
    auto stays = etcdOk(co_await c.range({"/kept"}, kEtcdTimeout), w);
    CHECK(stays.kvs.size() == 1);
    auto left = etcdOk(co_await c.leaseTimeToLive(kept.id, kEtcdTimeout), w);
    CHECK(left.ttl >= 1);
    CHECK(left.grantedTtl == 3);
    auto gone = etcdOk(co_await c.leaseTimeToLive(lapsing.id, kEtcdTimeout), w);
    CHECK(gone.ttl == -1);
    scope.requestStop();
    co_await scope.join();
    CHECK(keeper);  // stopped, not failed
    // Without keep-alives from here, it expires TTL after the last one.
    const auto last = *w.store.deadline(kept.id);
    co_await w.sim.sleepUntil(last - 1ns);
    CHECK(w.store.get("/kept"));
    co_await w.sim.sleepUntil(last + 1ns);
    CHECK(!w.store.get("/kept"));

    auto again = etcdOk(co_await c.leaseGrant(5, kEtcdTimeout), w);
    (void)etcdOk(co_await c.put({"/again", "z", again.id}, kEtcdTimeout), w);
    (void)etcdOk(co_await c.leaseRevoke(again.id, kEtcdTimeout), w);
    auto revoked = etcdOk(co_await c.range({"/again"}, kEtcdTimeout), w);
    CHECK(revoked.kvs.empty());
    Result<Lease> renewed = co_await c.leaseKeepAlive(again.id, kEtcdTimeout);
    CHECK(renewed.error() == EtcdErrc::leaseNotFound);
    Result<ResponseHeader> twice = co_await c.leaseRevoke(again.id, kEtcdTimeout);
    CHECK(twice.error() == EtcdErrc::leaseNotFound);
    Result<Lease> taken = co_await c.leaseGrant(5, kEtcdTimeout, kept.id + 1000);
    CHECK(taken);
    Result<Lease> clash = co_await c.leaseGrant(5, kEtcdTimeout, kept.id + 1000);
    CHECK(clash.error() == EtcdErrc::server);
    CHECK(c.lastError().find("lease already exists") != std::string::npos);
    // The helper reports a lease that is gone at its first tick.
    Result<void> lost = co_await keepLeaseAlive(c, lapsing.id, 1s, {});
    CHECK(lost.error() == EtcdErrc::leaseNotFound);
  });
}

TEST_CASE("sim etcd: a watch sees puts and deletes in order, and replays from a past revision", "[sim-etcd]") {
  EtcdWorld w;
  // Quiet for exactly its deadline: no slack in virtual time.
  w.run([&] { return cases::watchInOrder(*w.client, w.ok(), kEtcdTimeout, [&] { return w.sim.now(); }, 1ns); });
}

TEST_CASE("sim etcd: a watch from a compacted revision fails as EtcdClient reports it", "[sim-etcd]") {
  EtcdWorld w;
  w.run([&] {
    return cases::compactedWatch(*w.client, w.ok(), kEtcdTimeout, [&](std::int64_t revision) {
      CHECK(w.store.compact(revision));
      CHECK(!w.store.compact(revision - 1));  // not back
      CHECK_THROWS_AS(w.store.compact(revision + 1), std::invalid_argument);
    });
  });
}

TEST_CASE("sim etcd: a watch whose stream was lost resumes from its next revision; compacted meanwhile, it fails as "
          "such",
          "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    auto live = etcdOk(co_await c.watch(WatchRequest::prefix("/r/"), kEtcdTimeout), w);
    (void)etcdOk(co_await c.put({"/r/1", "a"}, kEtcdTimeout), w);
    std::vector<Event> one = co_await collectEvents(*live, 1, w);
    w.etcd.restart();  // the stream is reset; the store stays
    auto second = etcdOk(co_await c.put({"/r/2", "b"}, kEtcdTimeout), w);
    std::vector<Event> resumed = co_await collectEvents(*live, 1, w);
    CHECK(resumed[0].kv.modRevision == second.header.revision);
    w.etcd.restart();
    (void)etcdOk(co_await c.put({"/r/3", "c"}, kEtcdTimeout), w);
    auto latest = etcdOk(co_await c.put({"/r/4", "d"}, kEtcdTimeout), w);
    w.store.compact(latest.header.revision);  // past the watch's next revision (/r/3's)
    Result<WatchBatch> lost = co_await live->next(kEtcdTimeout);
    CHECK(lost.error() == EtcdErrc::compacted);
    CHECK(live->compactRevision() == latest.header.revision);
  });
}

TEST_CASE("sim etcd: paused, calls time out within their deadline, then work once resumed", "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    (void)etcdOk(co_await c.put({"/d", "1"}, kEtcdTimeout), w);
    w.etcd.pause();
    for (auto deadline : {50ms, 300ms}) {
      const auto started = w.sim.now();
      Result<RangeResponse> hung = co_await c.range({"/d"}, deadline);
      CHECK(hung.error() == std::errc::timed_out);
      CHECK(w.sim.now() - started == deadline);
    }
    const auto started = w.sim.now();
    Result<PutResponse> write = co_await c.put({"/d", "2"}, 300ms);
    CHECK(write.error() == std::errc::timed_out);
    CHECK(w.sim.now() - started == 300ms);
    CHECK(w.store.get("/d")->value == "1");
    w.etcd.resume();
    auto back = etcdOk(co_await c.range({"/d"}, kEtcdTimeout), w);
    REQUIRE(back.kvs.size() == 1);
    // The put that timed out had reached etcd: applied once it ran again (as etcd may: a lost reply is no lost write).
    CHECK(back.kvs[0].value == "2");
  });
}

TEST_CASE("sim etcd: killed, calls fail within their deadline; restarted, its state and leases are back",
          "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    auto lease = etcdOk(co_await c.leaseGrant(2, kEtcdTimeout), w);
    auto put = etcdOk(co_await c.put({"/s", "1", lease.id}, kEtcdTimeout), w);
    for (KillMode mode : {KillMode::reset, KillMode::silent}) {
      w.etcd.kill(mode);
      const auto started = w.sim.now();
      Result<RangeResponse> down = co_await c.range({"/s"}, 300ms);
      CHECK(down.error() == std::errc::timed_out);
      CHECK(w.sim.now() - started == 300ms);
      if (mode == KillMode::reset) CHECK(c.lastError().find("refused") != std::string::npos);
      co_await w.sim.sleepFor(5s);  // longer than the lease's TTL: no lease expires while etcd is down
      w.etcd.restart();
      const auto restarted = w.sim.now();
      auto back = etcdOk(co_await c.range({"/s"}, kEtcdTimeout), w);
      REQUIRE(back.kvs.size() == 1);
      CHECK(back.kvs[0].modRevision == put.header.revision);
      CHECK(back.header.revision == put.header.revision);
      CHECK(back.header.raftTerm > put.header.raftTerm);  // a new term
      REQUIRE(w.store.deadline(lease.id));
      CHECK(*w.store.deadline(lease.id) == restarted + 2s);  // a full TTL from the restart
      (void)etcdOk(co_await c.leaseKeepAlive(lease.id, kEtcdTimeout), w);
    }
  });
}

TEST_CASE("sim etcd: without a leader, calls are refused as Unavailable and no lease expires; with one again, "
          "every lease has its full TTL",
          "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    auto lease = etcdOk(co_await c.leaseGrant(2, kEtcdTimeout), w);
    (void)etcdOk(co_await c.put({"/leader", "x", lease.id}, kEtcdTimeout), w);
    auto watch = etcdOk(co_await c.watch(WatchRequest{"/leader"}, kEtcdTimeout), w);
    w.store.setNoLeader(true, w.sim.now());
    // A write is not sent again: Unavailable at once. A read is, until its deadline.
    const auto started = w.sim.now();
    Result<PutResponse> write = co_await c.put({"/other", "y"}, kEtcdTimeout);
    CHECK(write.error() == EtcdErrc::unavailable);
    CHECK(w.sim.now() - started == 4 * kEtcdLatency);  // a connect and one exchange (the watch took the pooled connection)
    Result<RangeResponse> read = co_await c.range({"/leader"}, 300ms);
    CHECK(read.error() == std::errc::timed_out);
    CHECK(c.lastError().find("no leader") != std::string::npos);
    Result<Lease> renewed = co_await c.leaseKeepAlive(lease.id, 300ms);
    CHECK(renewed.error() == std::errc::timed_out);
    co_await w.sim.sleepFor(5s);  // past the lease's deadline: no leader, no expiry
    CHECK(w.store.get("/leader"));
    w.store.setNoLeader(false, w.sim.now());
    const auto back = w.sim.now();
    CHECK(*w.store.deadline(lease.id) == back + 2s);
    Result<WatchBatch> expired = co_await watch->next(5s);  // the open watch sees it
    REQUIRE(expired);
    CHECK(expired->events.at(0).type == Event::Type::del);
    CHECK(w.sim.now() == back + 2s + kEtcdLatency);
    auto after = etcdOk(co_await c.range({"/leader"}, kEtcdTimeout), w);
    CHECK(after.kvs.empty());
  });
}

TEST_CASE("sim etcd: a lost lease ends its keep-alive and deletes its keys", "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    auto lease = etcdOk(co_await c.leaseGrant(3, kEtcdTimeout), w);
    (void)etcdOk(co_await c.put({"/live/a", "a", lease.id}, kEtcdTimeout), w);
    (void)etcdOk(co_await c.put({"/live/b", "b", lease.id}, kEtcdTimeout), w);
    auto watch = etcdOk(co_await c.watch(WatchRequest::prefix("/live/"), kEtcdTimeout), w);
    CHECK(!w.store.loseLease(lease.id + 1));
    const auto lostAt = w.sim.now() + 2500ms;
    w.sim.at(lostAt, [&] { CHECK(w.store.loseLease(lease.id)); });
    Result<void> kept = co_await keepLeaseAlive(c, lease.id, 3s, {});
    CHECK(kept.error() == EtcdErrc::leaseNotFound);
    CHECK(w.sim.now() < lostAt + 1s + kEtcdTimeout);  // at the first tick after: every second
    std::vector<Event> gone = co_await collectEvents(*watch, 2, w);
    CHECK(gone[0].type == Event::Type::del);
    CHECK(gone[1].type == Event::Type::del);
    CHECK(gone[0].kv.modRevision == gone[1].kv.modRevision);  // one revision
  });
}

namespace {

// Sends `request` on a fresh connection to the simulated etcd; what came back until it closed (or 1 s passed).
Task<std::string> exchangeRaw(SimReactor& sim, std::string request) {
  Result<coio::TcpStream<SimReactor>> stream =
      co_await coio::TcpStream<SimReactor>::connect(sim, *coio::SocketAddress::parse(std::string(kEtcdHost) + ":2379"));
  REQUIRE(stream);
  Result<void> sent = co_await stream->writeAll(std::as_bytes(std::span(request)));
  REQUIRE(sent);
  std::string reply;
  char buffer[4096];
  for (;;) {
    Result<std::size_t> n = co_await coio::withTimeout(
        sim, [&](std::stop_token stop) { return stream->read(std::as_writable_bytes(std::span(buffer)), stop); }, 1s);
    if (!n || *n == 0) co_return reply;
    reply.append(buffer, *n);
  }
}

}  // namespace

TEST_CASE("sim etcd: bad requests get the gateway's error replies, and it goes on serving", "[sim-etcd]") {
  EtcdWorld w;
  auto& c = *w.client;
  w.run([&]() -> Task<void> {
    const std::string notHttp = co_await exchangeRaw(w.sim, "hello\r\n\r\n");
    CHECK(notHttp.starts_with("HTTP/1.1 400"));
    const std::string unknown =
        co_await exchangeRaw(w.sim, "POST /v3/nothing HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
    CHECK(unknown.starts_with("HTTP/1.1 404"));
    const std::string notJson =
        co_await exchangeRaw(w.sim, "POST /v3/kv/put HTTP/1.1\r\nContent-Length: 5\r\n\r\n{key:");
    CHECK(notJson.starts_with("HTTP/1.1 400"));
    CHECK(notJson.find("\"code\":3") != std::string::npos);
    const std::string wrongShape =
        co_await exchangeRaw(w.sim, "POST /v3/kv/put HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"key\":\"!!\"}");
    CHECK(wrongShape.find("put.key is not base64") != std::string::npos);
    const std::string tooLong = co_await exchangeRaw(w.sim, "POST /v3/kv/put HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n");
    CHECK(tooLong.starts_with("HTTP/1.1 400"));
    auto still = etcdOk(co_await c.put({"/after", "bad input"}, kEtcdTimeout), w);
    CHECK(still.header.revision == 2);  // nothing bad was applied
  });
}
