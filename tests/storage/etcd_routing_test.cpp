// A ClusterClient whose routing comes from etcd (EtcdRouting): a real etcd
// on loopback (one member, or three), storage servers in child processes
// (cluster_fixture.hpp), and the test playing the cluster manager: it
// writes the routing records and marks targets offline in etcd.
#include "cluster_fixture.hpp"
#include "etcd_fixture.hpp"
#include "client/etcd_routing.hpp"

#include <algorithm>
#include <cstdlib>

namespace {

using storage::testing::EtcdCluster;
template <typename R>
using Etcd = storage::etcd::EtcdClient<R>;
template <typename R>
using Routing = storage::EtcdRouting<R>;

template <typename R>
std::unique_ptr<Etcd<R>> etcdClient(R& reactor, std::vector<std::string> endpoints) {
  storage::etcd::EtcdOptions o;
  o.endpoints = std::move(endpoints);
  o.backoffMax = 200ms;  // back soon after an outage
  auto made = Etcd<R>::create(reactor, std::move(o));
  REQUIRE(made);
  return std::move(*made);
}

// Writes `value` at `key`, again until etcd takes it (as a manager would:
// a write during a leader election can come back unavailable); its revision.
template <typename R>
Task<std::int64_t> put(Etcd<R>& etcd, std::string key, std::string value) {
  Result<storage::etcd::PutResponse> done = coio::Errc::invalidArgument;
  for (int attempt = 0; attempt < 3 && !done; ++attempt) {
    done = co_await etcd.put(storage::etcd::PutRequest(key, value), 10s);
  }
  INFO(key << ": " << etcd.lastError());
  REQUIRE(done);
  co_return done->header.revision;
}

// Sets `flag` when it goes, however its scope ends: the readers stop even
// if the task driving the test fails an assertion.
struct SetOnExit {
  bool& flag;
  ~SetOnExit() { flag = true; }
};

// Writes every record of `records`, as a cluster manager would.
template <typename R>
Task<void> seed(Etcd<R>& etcd, storage::RoutingRecords records) {
  (void)co_await put(etcd, storage::datasetKey(), storage::toJson(records.dataset));
  for (const storage::ServerRecord& s : records.servers) (void)co_await put(etcd, storage::serverKey(s.name), storage::toJson(s));
  for (const storage::ChainRecord& c : records.chains) (void)co_await put(etcd, storage::chainKey(c.id), storage::toJson(c));
}

// Marks target `targetId` offline in etcd (its chain record, version up by
// one, from the routing `table`); the write's revision.
template <typename R>
Task<std::int64_t> markOffline(Etcd<R>& etcd, const storage::ChainTable& table, std::uint32_t targetId) {
  const storage::ChainRecord chain = table.chainRecord(*table.chainIndexOfTarget(targetId));
  co_return co_await put(etcd, storage::chainKey(chain.id), storage::toJson(storage::markTargetOffline(chain, targetId)));
}

// The same routing, whatever the order of the servers (etcd lists them by
// name, a file by first mention).
bool sameRouting(const storage::ChainTable& a, const storage::ChainTable& b) {
  storage::RoutingRecords ra = a.records(), rb = b.records();
  for (storage::RoutingRecords* r : {&ra, &rb}) {
    std::sort(r->servers.begin(), r->servers.end(),
              [](const storage::ServerRecord& x, const storage::ServerRecord& y) { return x.name < y.name; });
  }
  return ra == rb;
}

// Reads of the cluster while `done` is false: whole chunks of every chain,
// one batch at a time; what came back.
struct ReadTally {
  std::uint64_t ok = 0, failed = 0;
};

template <typename F, typename C>
Task<void> readUntil(F& f, C& client, const bool& done, ReadTally& tally) {
  std::uint64_t next = 0;
  while (!done) {
    std::vector<ReadOp> ios = wholeChunks(next, 6, F::kChunks);
    next += 6;
    for (ReadOp& op : ios) op.into = f.buffer(op.length);
    const std::vector<ClusterOutcome> outcomes = co_await client.batchRead(ios);
    for (const ClusterOutcome& o : outcomes) ++(o.ok() ? tally.ok : tally.failed);
    co_await f.reactor.sleepFor(2ms);  // a steady load, not a spin on a shared machine
  }
}

// Reads the cluster (readUntil) while `drive()` runs, and until it ends,
// however it ends, counting in `tally`.
template <typename F, typename C>
Task<void> readWhile(F& f, C& client, ReadTally& tally, Task<void> drive) {
  bool done = false;
  auto driving = [&done](Task<void> task) -> Task<void> {
    const SetOnExit stopReads{done};
    co_await std::move(task);
  };
  std::vector<Task<void>> tasks;
  tasks.push_back(readUntil(f, client, done, tally));
  tasks.push_back(driving(std::move(drive)));
  co_await coio::collectAllRange(std::move(tasks));
}

template <typename C>
std::uint64_t timeouts(const C& client) {
  std::uint64_t n = 0;
  for (std::size_t s = 0; s < client.servers(); ++s) n += client.serverStats(s).timeouts;
  return n;
}

// The last lines of `log`, for a failure's message.
std::string lines(const std::vector<std::string>& log) {
  std::string all;
  for (std::size_t i = log.size() > 10 ? log.size() - 10 : 0; i < log.size(); ++i) all += log[i] + "\n";
  return all;
}

// The cluster, an etcd holding its routing, and a client following it.
template <typename S>
struct EtcdFixture {
  using R = typename S::R;
  using Client = typename Cluster<S>::Client;

  explicit EtcdFixture(std::size_t members = 1) : etcdCluster(members) {
    etcd = etcdClient(f.reactor, etcdCluster.endpoints());
    f.reactor.runUntil(seed(*etcd, f.table.records()));
    std::string why;
    auto loaded = f.reactor.runUntil(
        Routing<R>::load(*etcd, 10s, [this](const std::string& line) { f.log.push_back(line); }, &why));
    INFO(why);
    REQUIRE(loaded);
    routing = std::move(*loaded);
    REQUIRE(sameRouting(routing->table(), f.table));
  }

  // Runs `body(client)` with a client on etcd's routing, following it;
  // the follower stopped and the client closed afterwards, even if the
  // body fails an assertion.
  template <typename Body>
  void run(Body body) {
    storage::ClusterOptions o = f.options();
    o.refreshRouting = routing->refresher(o.requestTimeout);
    f.run(std::move(o), [this, body](Client& client) -> Task<void> {
      routing->follow(client);
      std::exception_ptr failure;
      try {
        co_await body(client);
      } catch (...) {
        failure = std::current_exception();
      }
      co_await routing->close();
      if (failure) std::rethrow_exception(failure);
    });
  }

  // Waits until the follower is at `revision` (15 s at most: a watch
  // moving to another member during an election); how long it took.
  Task<Clock::duration> seen(std::int64_t revision) {
    const Clock::time_point start = Clock::now();
    bool reached = false;
    for (int i = 0; i < 3 && !reached; ++i) {
      reached = co_await f.eventually([&] { return routing->stats().revision >= revision; });
    }
    INFO("the follower is at revision " << routing->stats().revision << ", waiting for " << revision << "; "
                                        << routing->lastError() << "; log: " << lines(f.log));
    REQUIRE(reached);
    co_return Clock::now() - start;
  }

  EtcdCluster etcdCluster;  // first: outlives the client's connections
  Cluster<S> f;
  std::unique_ptr<Etcd<R>> etcd;
  std::unique_ptr<Routing<R>> routing;
};

// Server 1's targets: 11 (chain 2, with server 2) and 12 (chain 1, with server 0).
constexpr std::size_t kDead = 1;

}  // namespace

TEMPLATE_LIST_TEST_CASE("etcd routing: a server's targets marked offline in etcd: the client reroutes on the watch "
                        "before any request times out, and nothing more reaches the dead server",
                        "[storage][etcd]", Setups) {
  EtcdFixture<TestType> e;
  auto& f = e.f;
  e.run([&](typename EtcdFixture<TestType>::Client& client) -> Task<void> {
    (void)co_await f.readAll(client, wholeChunks(0, 9, Cluster<TestType>::kChunks));  // every server read
    CHECK(client.serverStats(kDead).requests > 0);
    // The server dies; the manager (this test) takes its targets out.
    f.servers[kDead].kill();
    const storage::ChainTable before = e.routing->table();
    (void)co_await markOffline(*e.etcd, before, Cluster<TestType>::firstTarget(kDead));
    const std::int64_t changed = co_await markOffline(*e.etcd, before, Cluster<TestType>::secondTarget(kDead));
    const Clock::duration took = co_await e.seen(changed);
    CHECK(took < f.options().requestTimeout);
    CHECK(e.routing->stats().updates >= 1);
    CHECK(e.routing->stats().lastUpdate > Clock::time_point{});
    CHECK(e.routing->stats().badRecords == 0);
    const std::uint64_t deadRequests = client.serverStats(kDead).requests;
    const std::uint64_t deadTargetIos = client.iosSentTo(Cluster<TestType>::firstTarget(kDead)) +
                                        client.iosSentTo(Cluster<TestType>::secondTarget(kDead));
    // Every chain's chunks, again and again: all from the other replicas.
    for (int round = 0; round < 20; ++round) {
      const std::vector<ClusterOutcome> read =
          co_await f.readAll(client, wholeChunks(static_cast<std::uint64_t>(round) * 9, 9, Cluster<TestType>::kChunks));
      for (const ClusterOutcome& o : read) CHECK(o.server != kDead);
    }
    CHECK(client.serverStats(kDead).requests == deadRequests);
    CHECK(client.iosSentTo(Cluster<TestType>::firstTarget(kDead)) +
              client.iosSentTo(Cluster<TestType>::secondTarget(kDead)) ==
          deadTargetIos);
    CHECK(client.serverStats(kDead).failedRequests == 0);
    CHECK(timeouts(client) == 0);
    CHECK(client.stats().failedIos == 0);
    const storage::ChainTable& now = client.table();
    CHECK(now == e.routing->table());
    for (const storage::Chain& chain : now.chains()) {
      for (const storage::Replica& r : chain.replicas) {
        if (r.server == *now.serverIndexOf(f.table.serverName(kDead))) CHECK(r.state == storage::ReplicaState::offline);
      }
    }
  });
}

TEST_CASE("etcd routing: etcd down (SIGTERM) for 10 s under continuous reads: no read fails; once it is back a "
          "routing change is followed again",
          "[storage][etcd]") {
  using S = storage::testing::Setup<coio::UringReactor, false>;
  EtcdFixture<S> e;
  auto& f = e.f;
  e.run([&](EtcdFixture<S>::Client& client) -> Task<void> {
    ReadTally tally;
    std::uint64_t duringOutage = 0;
    auto outage = [&]() -> Task<void> {
      co_await f.reactor.sleepFor(300ms);
      e.etcdCluster.stop(0, SIGTERM);
      const std::uint64_t okBefore = tally.ok;
      co_await f.reactor.sleepFor(10s);  // the outage
      duringOutage = tally.ok - okBefore;
      // On the loop thread (a member started from another thread would die
      // with it: PR_SET_PDEATHSIG), blocking it until etcd is healthy, well
      // under the requests' deadline: the reads pause, nothing times out.
      e.etcdCluster.start(0);
      co_await f.reactor.sleepFor(300ms);
    };
    co_await readWhile(f, client, tally, outage());
    CHECK(tally.failed == 0);
    CHECK(duringOutage > 100);  // the reads went on, unhindered
    CHECK(timeouts(client) == 0);
    // A change made once etcd is back reaches the client through the watch.
    const std::uint64_t updates = e.routing->stats().updates;
    const std::int64_t changed =
        co_await markOffline(*e.etcd, e.routing->table(), Cluster<S>::secondTarget(kDead));
    (void)co_await e.seen(changed);
    CHECK(e.routing->stats().updates == updates + 1);
    const std::vector<ClusterOutcome> read = co_await f.readAll(client, wholeChunks(0, 9, Cluster<S>::kChunks));
    CHECK(client.table().chains()[0].replicas.back().state == storage::ReplicaState::offline);
    CHECK(read.size() == 9);
  });
}

TEMPLATE_LIST_TEST_CASE("etcd routing: a three-member etcd loses the member the client uses (SIGKILL) under "
                        "continuous reads: no read fails, a later routing change is followed",
                        "[storage][etcd]", Setups) {
  EtcdFixture<TestType> e(3);
  auto& f = e.f;
  e.run([&](typename EtcdFixture<TestType>::Client& client) -> Task<void> {
    ReadTally tally;
    std::uint64_t updates = 0;
    auto kill = [&]() -> Task<void> {
      co_await f.reactor.sleepFor(300ms);
      e.etcdCluster.stop(0, SIGKILL);  // the first endpoint: the one the client and its watch use
      co_await f.reactor.sleepFor(500ms);
      updates = e.routing->stats().updates;
      const std::int64_t changed = co_await markOffline(*e.etcd, e.routing->table(), Cluster<TestType>::secondTarget(kDead));
      (void)co_await e.seen(changed);
      co_await f.reactor.sleepFor(300ms);
    };
    co_await readWhile(f, client, tally, kill());
    CHECK(tally.failed == 0);
    CHECK(tally.ok > 0);
    CHECK(timeouts(client) == 0);
    CHECK(e.routing->stats().updates == updates + 1);
    CHECK(client.table() == e.routing->table());
  });
}

TEMPLATE_LIST_TEST_CASE("etcd routing: a bad record is refused and counted, the routing in use stays; a good one "
                        "after it is applied",
                        "[storage][etcd]", Setups) {
  EtcdFixture<TestType> e;
  auto& f = e.f;
  e.run([&](typename EtcdFixture<TestType>::Client& client) -> Task<void> {
    const storage::ChainTable before = client.table();
    // Not JSON; then a chain naming a server that has no record.
    (void)co_await put(*e.etcd, storage::chainKey(1), "{not json");
    storage::ChainRecord stranger = before.chainRecord(0);
    stranger.version += 1;
    stranger.targets[0].server = "nobody";
    const std::int64_t bad = co_await put(*e.etcd, storage::chainKey(1), storage::toJson(stranger));
    (void)co_await e.seen(bad);
    CHECK(e.routing->stats().badRecords >= 2);
    CHECK(e.routing->lastError().find("nobody") != std::string::npos);
    CHECK(client.table() == before);
    CHECK(e.routing->stats().updates == 0);
    (void)co_await f.readAll(client, wholeChunks(0, 9, Cluster<TestType>::kChunks));
    const std::int64_t good = co_await markOffline(*e.etcd, before, Cluster<TestType>::secondTarget(kDead));
    (void)co_await e.seen(good);
    CHECK(e.routing->stats().updates == 1);
    CHECK(client.table().chains()[0].version == before.chains()[0].version + 1);
  });
}

TEST_CASE("etcd routing: the revision after the load compacted away: everything is read again, the change applied",
          "[storage][etcd]") {
  using S = storage::testing::Setup<coio::UringReactor, false>;
  EtcdFixture<S> e;
  auto& f = e.f;
  // Changed and compacted before the client follows: the watch cannot
  // start at the load's revision + 1 any more.
  (void)f.reactor.runUntil(markOffline(*e.etcd, e.routing->table(), Cluster<S>::secondTarget(kDead)));
  // A key that is not routing (ignored), so that compacting at its
  // revision takes the change's away: etcd keeps the revision it compacts at.
  const std::int64_t later = f.reactor.runUntil(put(*e.etcd, "/coio/not-routing", "x"));
  const std::string compact = "ETCDCTL_API=3 etcdctl --endpoints=" + e.etcdCluster.endpoint(0) + " compact " +
                              std::to_string(later) + " > /dev/null";
  REQUIRE(std::system(compact.c_str()) == 0);
  e.run([&](EtcdFixture<S>::Client& client) -> Task<void> {
    (void)co_await e.seen(later);
    CHECK(e.routing->stats().reloads == 1);
    CHECK(e.routing->stats().badRecords == 0);
    CHECK(e.routing->stats().updates == 1);
    CHECK(client.table().chains()[0].replicas.back().state == storage::ReplicaState::offline);
    (void)co_await f.readAll(client, wholeChunks(0, 9, Cluster<S>::kChunks));
  });
}
