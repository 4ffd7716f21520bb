// EtcdClient against a real etcd started by the test on loopback (one
// member, or three), on each reactor kind: KV, transactions, leases,
// watches across a restart, deadlines against a stopped etcd, failover
// across a cluster that loses a member. The HTTP/JSON layer's bad input
// comes from a fake peer (etcd_bad_reply_test.cpp).
#include "etcd/etcd_client.hpp"
#include "etcd_client_cases.hpp"
#include "etcd_fixture.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using namespace storage::etcd;
using coio::Result;
using coio::Task;
using storage::testing::EtcdCluster;

namespace {

using Reactors = std::tuple<coio::EpollReactor, coio::UringReactor>;

// Generous: ctest runs suites side by side on two cores.
constexpr auto kTimeout = 5s;
constexpr auto kSlack = 500ms;

template <typename R>
struct Fixture {
  R reactor;
  std::vector<std::string> log;
  std::unique_ptr<EtcdClient<R>> client;

  explicit Fixture(std::vector<std::string> endpoints) {
    EtcdOptions o;
    o.endpoints = std::move(endpoints);
    o.log = [this](const std::string& line) { log.push_back(line); };
    auto made = EtcdClient<R>::create(reactor, std::move(o));
    REQUIRE(made);
    client = std::move(*made);
  }

  // ok(result): the value, or a failure that shows the client's log.
  auto ok() const {
    return [this](auto result) { return expectOk(std::move(result), *this); };
  }

  // Runs `body()` (a Task<void>) to its end on the reactor.
  template <typename Body>
  void run(Body body) {
    reactor.runUntil(body());
  }
};

// keepLeaseAlive's outcome into `out` (a named coroutine: a lambda's
// captures would die with the temporary closure before the task ends).
template <typename R>
Task<void> keepInto(Result<void>& out, EtcdClient<R>& client, std::int64_t lease, std::stop_token stop) {
  out = co_await keepLeaseAlive(client, lease, 2s, std::move(stop));
}

// The value, or a failure that shows the client's log.
template <typename T, typename R>
T expectOk(Result<T> r, const Fixture<R>& f) {
  if (!r) {
    std::string log;
    for (const std::string& line : f.log) log += line + "\n";
    INFO("error: " << r.error().message() << "; log:\n" << log);
    REQUIRE(r);
  }
  return std::move(*r);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("etcd: put, range and delete", "[etcd]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  f.run([&] { return cases::putRangeDelete(*f.client, f.ok(), kTimeout); });
}

TEMPLATE_LIST_TEST_CASE("etcd: a transaction runs the branch its compares choose", "[etcd]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  f.run([&] { return cases::transactions(*f.client, f.ok(), kTimeout); });
}

TEMPLATE_LIST_TEST_CASE("etcd: a leased key expires without keep-alives, stays with them, goes on revoke",
                        "[etcd]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  auto& c = *f.client;
  f.run([&]() -> Task<void> {
    auto lapsing = expectOk(co_await c.leaseGrant(1, kTimeout), f);
    auto kept = expectOk(co_await c.leaseGrant(2, kTimeout), f);  // renewed every 2/3 s: slack for a busy machine
    CHECK(lapsing.ttl == 1);
    CHECK(lapsing.id != kept.id);
    (void)expectOk(co_await c.put({"/lapsing", "x", lapsing.id}, kTimeout), f);
    (void)expectOk(co_await c.put({"/kept", "y", kept.id}, kTimeout), f);
    auto bound = expectOk(co_await c.range({"/kept"}, kTimeout), f);
    REQUIRE(bound.kvs.size() == 1);
    CHECK(bound.kvs[0].lease == kept.id);

    coio::AsyncScope scope;
    Result<void> keeper = std::errc::interrupted;
    scope.spawn(keepInto(keeper, c, kept.id, scope.stopToken()));
    co_await f.reactor.sleepFor(2500ms);  // over twice the lapsing lease's TTL, more than the kept one's
    auto gone = expectOk(co_await c.range({"/lapsing"}, kTimeout), f);
    CHECK(gone.kvs.empty());
    auto stays = expectOk(co_await c.range({"/kept"}, kTimeout), f);
    CHECK(stays.kvs.size() == 1);
    auto left = expectOk(co_await c.leaseTimeToLive(kept.id, kTimeout), f);
    CHECK(left.ttl >= 0);
    CHECK(left.grantedTtl == 2);
    auto expired = expectOk(co_await c.leaseTimeToLive(lapsing.id, kTimeout), f);
    CHECK(expired.ttl == -1);
    scope.requestStop();
    co_await scope.join();
    CHECK(keeper);  // stopped, not failed

    (void)expectOk(co_await c.leaseRevoke(kept.id, kTimeout), f);
    auto revoked = expectOk(co_await c.range({"/kept"}, kTimeout), f);
    CHECK(revoked.kvs.empty());
    Result<Lease> again = co_await c.leaseKeepAlive(kept.id, kTimeout);
    REQUIRE(!again);
    CHECK(again.error() == EtcdErrc::leaseNotFound);
    Result<ResponseHeader> twice = co_await c.leaseRevoke(kept.id, kTimeout);
    REQUIRE(!twice);
    CHECK(twice.error() == EtcdErrc::leaseNotFound);
    // The helper reports a lease that is gone at its first tick.
    Result<void> lost = co_await keepLeaseAlive(c, lapsing.id, 1s, {});
    CHECK(lost.error() == EtcdErrc::leaseNotFound);
  });
}

TEMPLATE_LIST_TEST_CASE("etcd: a heartbeat keeps its lease across an etcd restart", "[etcd][restart]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  auto& c = *f.client;
  f.run([&]() -> Task<void> {
    auto lease = expectOk(co_await c.leaseGrant(2, kTimeout), f);
    (void)expectOk(co_await c.put({"/servers/1", "alive", lease.id}, kTimeout), f);
    coio::AsyncScope scope;
    Result<void> keeper = std::errc::interrupted;
    scope.spawn(keepInto(keeper, c, lease.id, scope.stopToken()));
    co_await f.reactor.sleepFor(1s);
    etcd.stop(0, SIGKILL);  // blocks the loop, as a stalled server would
    etcd.start(0);
    co_await f.reactor.sleepFor(2500ms);  // longer than the TTL: renewals must have gone on
    auto still = expectOk(co_await c.range({"/servers/1"}, kTimeout), f);
    CHECK(still.kvs.size() == 1);
    CHECK(keeper.error() == std::errc::interrupted);  // still running
    scope.requestStop();
    co_await scope.join();
    CHECK(keeper);
  });
}

namespace {

// Reads batches until `count` events came (each within kTimeout).
template <typename R>
Task<std::vector<Event>> collect(EtcdWatch<R>& watch, std::size_t count, const Fixture<R>& f) {
  return cases::collectEvents(watch, count, f.ok(), kTimeout);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("etcd: a watch sees puts and deletes in order", "[etcd]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  f.run([&] { return cases::watchInOrder(*f.client, f.ok(), kTimeout, [] { return Clock::now(); }, kSlack); });
}

TEMPLATE_LIST_TEST_CASE("etcd: a watch survives etcd restarts and misses no event", "[etcd][restart]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  auto& c = *f.client;
  f.run([&]() -> Task<void> {
    auto watch = expectOk(co_await c.watch(WatchRequest::prefix("/r/"), kTimeout), f);
    std::vector<std::int64_t> written;
    int n = 0;
    const auto write = [&](int count) -> Task<void> {
      for (int i = 0; i < count; ++i, ++n) {
        auto put = expectOk(co_await c.put({"/r/" + std::to_string(n), std::to_string(n)}, kTimeout), f);
        written.push_back(put.header.revision);
      }
    };
    co_await write(3);
    std::vector<Event> seen = co_await collect(*watch, 3, f);
    // A clean stop, then a crash, each with writes before the watch reads again.
    for (int signal : {SIGTERM, SIGKILL}) {
      etcd.stop(0, signal);  // blocks the loop: the watch is idle meanwhile
      etcd.start(0);
      co_await write(4);
      std::vector<Event> more = co_await collect(*watch, 4, f);
      seen.insert(seen.end(), more.begin(), more.end());
    }
    REQUIRE(seen.size() == written.size());
    for (std::size_t i = 0; i < seen.size(); ++i) {
      INFO("event " << i);
      CHECK(seen[i].kv.key == "/r/" + std::to_string(i));
      CHECK(seen[i].kv.modRevision == written[i]);
      if (i > 0) CHECK(seen[i].kv.modRevision == seen[i - 1].kv.modRevision + 1);  // contiguous: no gap
    }
    bool reconnected = false;
    for (const std::string& line : f.log) {
      reconnected = reconnected || line.find("watch stream lost") != std::string::npos;
    }
    CHECK(reconnected);
  });
}

TEMPLATE_LIST_TEST_CASE("etcd: a watch from a compacted revision fails as such", "[etcd]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  // Compaction is outside the client's subset: etcd's own tool does it.
  const auto compact = [&etcd](std::int64_t revision) {
    const std::string command = "ETCDCTL_API=3 etcdctl --endpoints=" + etcd.endpoint(0) + " compact " +
                                std::to_string(revision) + " >/dev/null 2>&1";
    REQUIRE(std::system(command.c_str()) == 0);
  };
  f.run([&] { return cases::compactedWatch(*f.client, f.ok(), kTimeout, compact); });
}

TEMPLATE_LIST_TEST_CASE("etcd: calls to a stopped etcd fail within their deadline, and work once it is back",
                        "[etcd][restart]", Reactors) {
  EtcdCluster etcd;
  Fixture<TestType> f(etcd.endpoints());
  auto& c = *f.client;
  f.run([&]() -> Task<void> {
    (void)expectOk(co_await c.put({"/d", "1"}, kTimeout), f);
    // Gone: connections refused (the pooled one closed).
    etcd.stop(0);
    for (auto deadline : {50ms, 300ms}) {
      const auto started = Clock::now();
      Result<RangeResponse> refused = co_await c.range({"/d"}, deadline);
      const auto took = Clock::now() - started;
      REQUIRE(!refused);
      CHECK(refused.error() == std::errc::timed_out);
      CHECK(took >= deadline);
      CHECK(took < deadline + kSlack);
    }
    CHECK(c.lastError().find("refused") != std::string::npos);  // what the last attempt met
    Result<PutResponse> write = co_await c.put({"/d", "2"}, 300ms);
    CHECK(write.error() == std::errc::timed_out);
    etcd.start(0);
    auto back = expectOk(co_await c.range({"/d"}, kTimeout), f);
    REQUIRE(back.kvs.size() == 1);
    CHECK(back.kvs[0].value == "1");

    // Hung (SIGSTOP): connected, never answered; the deadline holds too.
    etcd.signal(0, SIGSTOP);
    const auto started = Clock::now();
    Result<PutResponse> hung = co_await c.put({"/d", "3"}, 300ms);
    const auto took = Clock::now() - started;
    etcd.signal(0, SIGCONT);
    CHECK(hung.error() == std::errc::timed_out);
    CHECK(took < 300ms + kSlack);
    auto after = expectOk(co_await c.put({"/d", "4"}, kTimeout), f);
    CHECK(after.header.revision > 0);
  });
}

TEMPLATE_LIST_TEST_CASE("etcd: a three-member cluster loses a member, calls and watches go on", "[etcd]",
                        Reactors) {
  EtcdCluster etcd(3);
  // The victim is a follower: a write to etcd while its leader is being
  // replaced can hang for etcd's request timeout (about 6 s) and come
  // back Unavailable, whichever member it went to.
  const std::size_t victim = (etcd.leader() + 1) % 3;
  std::vector<std::string> endpoints{etcd.endpoint(victim)};  // the client prefers the first
  for (std::size_t i = 0; i < 3; ++i) {
    if (i != victim) endpoints.push_back(etcd.endpoint(i));
  }
  Fixture<TestType> f(endpoints);
  auto& c = *f.client;
  f.run([&]() -> Task<void> {
    auto watch = expectOk(co_await c.watch(WatchRequest::prefix("/c/"), kTimeout), f);
    auto before = expectOk(co_await c.put({"/c/0", "before"}, kTimeout), f);
    etcd.stop(victim, SIGKILL);
    std::vector<std::int64_t> written{before.header.revision};
    for (int i = 1; i <= 5; ++i) {
      auto put = expectOk(co_await c.put({"/c/" + std::to_string(i), "after"}, kTimeout), f);
      written.push_back(put.header.revision);
    }
    auto all = expectOk(co_await c.range(RangeRequest::prefix("/c/"), kTimeout), f);
    CHECK(all.count == 6);
    CHECK(all.header.memberId != before.header.memberId);
    std::vector<Event> events = co_await collect(*watch, 6, f);
    REQUIRE(events.size() == 6);
    for (std::size_t i = 0; i < events.size(); ++i) CHECK(events[i].kv.modRevision == written[i]);
    // And back: the member rejoins; the others keep serving meanwhile.
    etcd.start(victim);
    auto later = expectOk(co_await c.range({"/c/5"}, kTimeout), f);
    CHECK(later.kvs.size() == 1);
  });
}

TEMPLATE_LIST_TEST_CASE("etcd: a member that accepts and never answers costs a read one share of its deadline; "
                        "later calls and a watch move to the others",
                        "[etcd]", Reactors) {
  EtcdCluster etcd(3);
  // The frozen member is a follower: no election is under way to slow the others.
  const std::size_t frozen = (etcd.leader() + 1) % 3;
  std::vector<std::string> endpoints{etcd.endpoint(frozen)};  // the client starts at the first
  for (std::size_t i = 0; i < 3; ++i) {
    if (i != frozen) endpoints.push_back(etcd.endpoint(i));
  }
  Fixture<TestType> f(endpoints);
  auto& c = *f.client;
  f.run([&]() -> Task<void> {
    auto watch = expectOk(co_await c.watch(WatchRequest::prefix("/f/"), kTimeout), f);  // on the frozen member
    auto first = expectOk(co_await c.put({"/f/0", "before"}, kTimeout), f);
    auto asked = expectOk(co_await c.range({"/f/0"}, kTimeout), f);  // (not in CHECK: g++ would await it thrice)
    CHECK(asked.header.memberId == first.header.memberId);
    etcd.signal(frozen, SIGSTOP);
    // A read: one attempt of 900 / 3 ms on the frozen member, then the next.
    const auto started = Clock::now();
    auto read = expectOk(co_await c.range({"/f/0"}, 900ms), f);
    const auto took = Clock::now() - started;
    CHECK(read.kvs.size() == 1);
    CHECK(read.header.memberId != first.header.memberId);
    CHECK(took >= 300ms);
    CHECK(took < 300ms + kSlack);
    // Later calls start elsewhere: a write too (a write's attempt is never cut short).
    const auto writing = Clock::now();
    auto put = expectOk(co_await c.put({"/f/1", "frozen"}, 900ms), f);
    CHECK(Clock::now() - writing < kSlack);
    // The watch's stream sits on the frozen member: its next next() moves it,
    // from the revision after the last event, so the put is seen.
    std::vector<Event> events = co_await collect(*watch, 2, f);
    REQUIRE(events.size() == 2);
    CHECK(events[0].kv.modRevision == first.header.revision);
    CHECK(events[1].kv.modRevision == put.header.revision);
    etcd.signal(frozen, SIGCONT);
  });
  bool moved = false;
  for (const std::string& line : f.log) moved = moved || line.find("watch moved") != std::string::npos;
  CHECK(moved);
}
