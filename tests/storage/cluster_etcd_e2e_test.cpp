// The storage cluster in etcd end to end: a real etcd on loopback
// (etcd_fixture.hpp), the real coio-storage-server binary as `cluster
// load`, `mgmtd`s and `serve --etcd` child processes, and the chains read
// from etcd in this process. A server killed with SIGKILL has its targets
// offline within its lease's TTL + 1 s, one SIGTERMed at once, a restarted
// one serves again; one whose lease is revoked behind its back registers
// again by itself within ttl/3 + 1 s; the leading manager killed, the other
// leads within the TTL and handles the next death; every chain's history is
// versions 1, 2, 3, ... with no gap and no duplicate. One file (about 740
// lines): every case drives the same Cluster (below) through a server's or
// a manager's life, and the frozen-member cases run as a CTest test of
// their own (SPLIT frozen) from this one binary.
#include "cluster/cluster_manager.hpp"
#include "etcd_fixture.hpp"
#include "client/storage_client.hpp"

#include "../killed_at_end.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/reactor/epoll_reactor.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using R = coio::EpollReactor;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::int64_t kServerTtl = 3;   // seconds: SIGTERM must be much faster
constexpr std::int64_t kManagerTtl = 2;  // seconds
constexpr auto kSlack = 1s;              // what the issue allows past a TTL

std::int64_t ms(Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

// A child process of the server binary (or of `program`), its stdout and
// stderr into `log`; SIGKILLed and reaped at the end of the test whatever
// happens.
struct Child {
  Child(std::vector<std::string> args, const std::string& log, const char* program = COIO_STORAGE_SERVER_BIN)
      : log(log) {
    const pid_t parent = ::getpid();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(120);
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (out < 0 || ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(out, STDERR_FILENO) < 0) ::_exit(121);
      std::vector<char*> argv{const_cast<char*>(program)};
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(122);
    }
    guard.emplace(pid);
  }

  // Sends `signal` and reaps the child (within 20 s); its exit status.
  int stop(int signal) {
    REQUIRE(::kill(pid, signal) == 0);
    for (int i = 0; i < 2000; ++i) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        guard.reset();
        return status;
      }
      ::usleep(10000);
    }
    FAIL("child did not end within 20 s of signal " << signal << "; its log:\n" << output());
    return -1;
  }

  std::string output() const {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  pid_t pid = 0;
  std::string log;
  std::optional<coio::testing::KilledAtEnd> guard;
};

// Runs the binary to its end; its exit code (and output in `out`).
int runTool(std::vector<std::string> args, const std::string& log, std::string* out = nullptr) {
  Child tool(std::move(args), log);
  for (int i = 0; i < 2000; ++i) {
    int status = 0;
    if (::waitpid(tool.pid, &status, WNOHANG) == tool.pid) {
      tool.guard.reset();
      if (out != nullptr) *out = tool.output();
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    ::usleep(10000);
  }
  FAIL("tool did not end within 20 s: " << tool.output());
  return -1;
}

// A cluster of two servers (each two targets) and two chains of two
// replicas, its data in a temporary directory, etcd on loopback, and a
// client of that etcd in this process.
struct Cluster {
  storage::testing::EtcdCluster etcd;
  std::filesystem::path dir;
  std::vector<std::string> addresses;  // server 0, server 1
  // What the servers, managers and tools get as --etcd: the first member
  // alone, unless a test sets it (the first in the list is where they start).
  std::string etcdUrls;
  R reactor;
  std::unique_ptr<storage::etcd::EtcdClient<R>> client;

  explicit Cluster(std::size_t members = 1) : etcd(members), etcdUrls(etcd.endpoint(0)) {
    std::string tmpl = (std::filesystem::exists("/dev/shm") ? std::string("/dev/shm") : std::string("/tmp")) +
                       "/coio-cluster-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
    for (int i = 0; i < 2; ++i) {
      addresses.push_back("127.0.0.1:" + std::to_string(storage::testing::freeLoopbackPort()));
    }
    std::ofstream(dir / "chains") << "coio-chains 1\nchunks 40\nchunk-size 4K\n"
                                  << "chain 1 " << addresses[0] << "/11 " << addresses[1] << "/21\n"
                                  << "chain 2 " << addresses[1] << "/22 " << addresses[0] << "/12\n";
    for (const int target : {11, 12, 21, 22}) {
      const std::string data = (dir / std::to_string(target)).string();
      REQUIRE(runTool({"init", "--chains", (dir / "chains").string(), "--target", std::to_string(target), "--dir", data},
                      (dir / "init.log").string()) == 0);
    }
    storage::etcd::EtcdOptions options;
    options.endpoints = etcd.endpoints();
    auto made = storage::etcd::EtcdClient<R>::create(reactor, std::move(options));
    REQUIRE(made);
    client = std::move(*made);
  }
  ~Cluster() {
    client.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }

  int load(bool force, std::string* out = nullptr) {
    std::vector<std::string> args{"cluster", "load", (dir / "chains").string(), "--etcd", etcdUrls};
    if (force) args.push_back("--force");
    return runTool(args, (dir / "load.log").string(), out);
  }

  std::unique_ptr<Child> server(int index) {
    const std::string a = std::to_string(index == 0 ? 11 : 21), b = std::to_string(index == 0 ? 12 : 22);
    return std::make_unique<Child>(
        std::vector<std::string>{"serve", "--target", a + "=" + (dir / a).string(), "--target", b + "=" + (dir / b).string(),
                                 "--listen", addresses[index], "--buffered", "--reactor", "epoll", "--etcd",
                                 etcdUrls, "--ttl", std::to_string(kServerTtl)},
        (dir / ("server" + std::to_string(index) + ".log")).string());
  }

  std::unique_ptr<Child> manager(const std::string& id) {
    return std::make_unique<Child>(
        std::vector<std::string>{"mgmtd", "--etcd", etcdUrls, "--id", id, "--ttl", std::to_string(kManagerTtl)},
        (dir / ("mgmtd-" + id + ".log")).string());
  }

  // What etcd holds now.
  storage::StoredRouting read() {
    coio::Result<storage::StoredRouting> stored = coio::Errc::closed;
    std::string why;
    reactor.runUntil([](storage::etcd::EtcdClient<R>& c, coio::Result<storage::StoredRouting>& out, std::string& w) -> Task<void> {
      out = co_await storage::readRouting(c, &w);
    }(*client, stored, why));
    INFO(why);
    REQUIRE(stored);
    return std::move(*stored);
  }

  // The leader key's value ("" if none).
  std::string leader() {
    coio::Result<storage::etcd::RangeResponse> got = coio::Errc::closed;
    reactor.runUntil([](storage::etcd::EtcdClient<R>& c, coio::Result<storage::etcd::RangeResponse>& out) -> Task<void> {
      out = co_await c.range({storage::leaderKey()}, 2s);
    }(*client, got));
    REQUIRE(got);
    return got->kvs.empty() ? std::string() : got->kvs.front().value;
  }

  // The lease server `name`'s registration is bound to (0: not registered).
  std::int64_t liveLease(const std::string& name) {
    coio::Result<storage::etcd::RangeResponse> got = coio::Errc::closed;
    reactor.runUntil([](storage::etcd::EtcdClient<R>& c, std::string key, coio::Result<storage::etcd::RangeResponse>& out) -> Task<void> {
      out = co_await c.range({std::move(key)}, 2s);
    }(*client, storage::liveKey(name), got));
    REQUIRE(got);
    return got->kvs.empty() ? 0 : got->kvs.front().lease;
  }

  // Revokes `lease` as an operator (or an expiry) would, behind its holder's back.
  void revoke(std::int64_t lease) {
    coio::Result<storage::etcd::ResponseHeader> revoked = coio::Errc::closed;
    reactor.runUntil([](storage::etcd::EtcdClient<R>& c, std::int64_t id, coio::Result<storage::etcd::ResponseHeader>& out) -> Task<void> {
      out = co_await c.leaseRevoke(id, 2s);
    }(*client, lease, revoked));
    REQUIRE(revoked);
  }

  // Polls (every 20 ms, up to `limit`) until server `name` is registered
  // under a lease other than `old`; that lease.
  std::int64_t waitForNewLease(const std::string& name, std::int64_t old, Clock::duration limit) {
    const Clock::time_point start = Clock::now();
    for (;;) {
      const std::int64_t lease = liveLease(name);
      if (lease != 0 && lease != old) return lease;
      if (Clock::now() - start > limit) {
        FAIL("server " << name << " not registered again within " << ms(limit) << " ms");
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  // Every version chain `id`'s key had, from its creation on (a watch from
  // its create revision up to its current mod revision).
  std::vector<std::uint32_t> history(std::uint32_t id) {
    std::vector<std::uint32_t> versions;
    reactor.runUntil([](storage::etcd::EtcdClient<R>& c, std::uint32_t chain, std::vector<std::uint32_t>& out) -> Task<void> {
      coio::Result<storage::etcd::RangeResponse> now = co_await c.range({storage::chainKey(chain)}, 2s);
      REQUIRE(now);
      REQUIRE(now->kvs.size() == 1);
      const storage::etcd::KeyValue last = now->kvs.front();
      auto watch = co_await c.watch({storage::chainKey(chain), {}, last.createRevision}, 2s);
      REQUIRE(watch);
      for (std::int64_t seen = 0; seen < last.modRevision;) {
        coio::Result<storage::etcd::WatchBatch> batch = co_await (*watch)->next(2s);
        REQUIRE(batch);
        for (const storage::etcd::Event& event : batch->events) {
          REQUIRE(event.type == storage::etcd::Event::Type::put);
          coio::Result<storage::ChainRecord> record = storage::parseChainRecord(event.kv.value);
          REQUIRE(record);
          out.push_back(record->version);
          seen = event.kv.modRevision;
        }
      }
    }(*client, id, versions));
    return versions;
  }

  // The status of one read of 100 bytes of `chunk` from `target` on
  // `server`, routed with chain version `version` (ioError: no connection).
  storage::proto::IoStatus readAt(const std::string& server, std::uint32_t target, std::uint64_t chunk,
                                  std::uint32_t version) {
    storage::proto::IoStatus status = storage::proto::IoStatus::ioError;
    reactor.runUntil([](R& r, coio::SocketAddress at, storage::ReadOp op, storage::proto::IoStatus& out) -> Task<void> {
      storage::TransmissionLimiter limiter;
      coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await storage::StorageClient<R>::connect(r, at, limiter);
      if (!client) co_return;
      std::vector<std::byte> buffer(op.length);
      op.into = buffer;
      coio::Result<std::vector<storage::ReadOutcome>> outcomes = co_await (*client)->batchRead(std::span(&op, 1));
      co_await (*client)->close();
      REQUIRE(outcomes);
      out = outcomes->front().status;
    }(reactor, *coio::SocketAddress::parse(server), storage::ReadOp{chunk, 0, 100, {}, target, version}, status));
    return status;
  }

  // Polls etcd (every 20 ms, up to `limit`) until `done(routing)`; the time it took.
  Clock::duration waitFor(const std::function<bool(const storage::StoredRouting&)>& done, Clock::duration limit,
                          const std::string& what) {
    const Clock::time_point start = Clock::now();
    for (;;) {
      const storage::StoredRouting now = read();
      if (done(now)) return Clock::now() - start;
      if (Clock::now() - start > limit) {
        std::ostringstream chains;
        for (const storage::ChainRecord& c : now.records.chains) chains << storage::toJson(c) << "\n";
        FAIL("not within " << std::chrono::duration_cast<std::chrono::milliseconds>(limit).count() << " ms: " << what
                           << "\nchains:\n" << chains.str());
      }
      std::this_thread::sleep_for(20ms);
    }
  }
};

// Whether every target of server `name` is in `state`.
bool targetsOf(const storage::StoredRouting& r, const std::string& name, storage::ReplicaState state) {
  for (const storage::ChainRecord& chain : r.records.chains) {
    for (const storage::TargetRecord& t : chain.targets) {
      if (t.server == name && t.state != state) return false;
    }
  }
  return true;
}

bool allServing(const storage::StoredRouting& r) {
  for (const storage::ChainRecord& chain : r.records.chains) {
    for (const storage::TargetRecord& t : chain.targets) {
      if (t.state != storage::ReplicaState::serving) return false;
    }
  }
  return true;
}

// Every chain's history is 1, 2, 3, ... up to its version now.
void checkHistories(Cluster& cluster) {
  for (const storage::ChainRecord& chain : cluster.read().records.chains) {
    const std::vector<std::uint32_t> versions = cluster.history(chain.id);
    INFO("chain " << chain.id);
    REQUIRE(versions.size() == chain.version);
    for (std::size_t i = 0; i < versions.size(); ++i) CHECK(versions[i] == i + 1);
  }
}

// Races two managers in this process: server 0's registration comes and
// goes every few ms, and the leader key is deleted now and then, so that
// the leadership moves while changes are in flight (a deposed leader's
// write must fail, the new one's must not be lost). Ends with server 0
// registered and every target serving; stops the managers.
Task<void> churn(storage::etcd::EtcdClient<R>& client, const std::vector<std::string>& servers,
                 std::stop_source& managers) {
  storage::ServerRecord record{servers[0], *coio::SocketAddress::parse(servers[0]), {11, 12}};
  storage::ServerRecord other{servers[1], *coio::SocketAddress::parse(servers[1]), {21, 22}};
  coio::Result<storage::etcd::PutResponse> put = co_await client.put({storage::liveKey(other.name), storage::toJson(other)}, 2s);
  REQUIRE(put);
  for (int round = 0; round < 40; ++round) {
    if (round % 2 == 0) {
      put = co_await client.put({storage::liveKey(record.name), storage::toJson(record)}, 2s);
      REQUIRE(put);
    } else {
      coio::Result<storage::etcd::DeleteResponse> gone = co_await client.deleteRange({storage::liveKey(record.name)}, 2s);
      REQUIRE(gone);
    }
    if (round % 5 == 4) {
      coio::Result<storage::etcd::DeleteResponse> deposed = co_await client.deleteRange({storage::leaderKey()}, 2s);
      REQUIRE(deposed);
    }
    co_await client.reactor().sleepFor(std::chrono::milliseconds(15 + 10 * (round % 3)));
  }
  put = co_await client.put({storage::liveKey(record.name), storage::toJson(record)}, 2s);
  REQUIRE(put);
  const Clock::time_point start = Clock::now();
  for (;;) {
    coio::Result<storage::StoredRouting> now = co_await storage::readRouting(client);
    REQUIRE(now);
    if (allServing(*now)) break;
    REQUIRE(Clock::now() - start < 10s);
    co_await client.reactor().sleepFor(20ms);
  }
  managers.request_stop();
}

}  // namespace

TEST_CASE("cluster load writes the table once, status prints it", "[etcd][cluster]") {
  Cluster cluster;
  std::string out;
  REQUIRE(cluster.load(false, &out) == 0);
  CHECK(out.find("loaded 2 chains and 2 servers") != std::string::npos);
  const storage::StoredRouting first = cluster.read();
  REQUIRE(first.records.chains.size() == 2);
  REQUIRE(cluster.load(false, &out) == 1);  // chains exist: refused, nothing written
  CHECK(out.find("--force") != std::string::npos);
  CHECK(cluster.read().revision == first.revision);
  REQUIRE(cluster.load(true) == 0);
  CHECK(cluster.read().revision > first.revision);
  // --force with a table of one chain on one server: the other chain's and server's records go.
  std::ofstream(cluster.dir / "one") << "coio-chains 1\nchunks 4\nchunk-size 4K\nchain 7 " << cluster.addresses[0] << "/11\n";
  REQUIRE(runTool({"cluster", "load", (cluster.dir / "one").string(), "--etcd", cluster.etcd.endpoints().front(), "--force"},
                  (cluster.dir / "one.log").string()) == 0);
  const storage::StoredRouting one = cluster.read();
  REQUIRE(one.records.chains.size() == 1);
  CHECK(one.records.chains[0].id == 7);
  REQUIRE(one.records.servers.size() == 1);
  CHECK(one.records.servers[0].name == cluster.addresses[0]);
  // A bad table: the parser's error, naming the line, and etcd untouched.
  std::ofstream(cluster.dir / "bad") << "coio-chains 1\nchunks 4\nchunk-size 4K\nchain 1 nowhere/1\n";
  const storage::StoredRouting before = cluster.read();
  REQUIRE(runTool({"cluster", "load", (cluster.dir / "bad").string(), "--etcd", cluster.etcd.endpoints().front()},
                  (cluster.dir / "bad.log").string(), &out) == 1);
  CHECK(out.find("bad:4:") != std::string::npos);
  CHECK(cluster.read().revision == before.revision);
  REQUIRE(runTool({"cluster", "status", "--etcd", cluster.etcd.endpoints().front()}, (cluster.dir / "status.log").string(),
                  &out) == 0);
  CHECK(out.find("CHAIN  VERSION") != std::string::npos);
  CHECK(out.find("registered: none") != std::string::npos);
}

TEST_CASE("servers register; killed, stopped and restarted servers move their targets", "[etcd][cluster]") {
  Cluster cluster;
  REQUIRE(cluster.load(false) == 0);
  auto manager = cluster.manager("m1");
  auto a = cluster.server(0);
  auto b = cluster.server(1);
  cluster.waitFor([&](const auto& r) { return r.live.size() == 2 && allServing(r); }, 10s, "both servers serving");
  // (The manager may have marked the targets offline before the servers
  // registered: the versions now are whatever that took.)
  const storage::StoredRouting settled = cluster.read();

  // kill -9: offline once the lease expires, within TTL + 1 s.
  a->stop(SIGKILL);
  const Clock::duration killed = cluster.waitFor(
      [&](const auto& r) { return targetsOf(r, cluster.addresses[0], storage::ReplicaState::offline); },
      std::chrono::seconds(kServerTtl) + kSlack, "the killed server's targets offline");
  INFO("killed -> offline in " << ms(killed) << " ms");
  const storage::StoredRouting afterKill = cluster.read();
  for (std::size_t c = 0; c < 2; ++c) {
    CHECK(afterKill.records.chains[c].version == settled.records.chains[c].version + 1);
    CHECK(afterKill.records.chains[c].targets.back().server == cluster.addresses[0]);  // moved to the end
  }
  // The surviving server follows: an IO routed with chain 1's old version
  // is answered staleRouting (once its watch delivered the change), the
  // new version is read.
  const std::uint32_t before = settled.records.chains[0].version, now = afterKill.records.chains[0].version;
  const Clock::time_point asked = Clock::now();
  while (cluster.readAt(cluster.addresses[1], 21, 0, before) != storage::proto::IoStatus::staleRouting) {
    REQUIRE(Clock::now() - asked < 2s);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(cluster.readAt(cluster.addresses[1], 21, 0, now) == storage::proto::IoStatus::ok);

  // Restarted: serving again.
  a = cluster.server(0);
  cluster.waitFor([&](const auto& r) { return allServing(r); }, 10s, "the restarted server's targets serving");

  // SIGTERM: offline at once (the lease is revoked before the drain).
  const Clock::time_point term = Clock::now();
  REQUIRE(::kill(b->pid, SIGTERM) == 0);
  cluster.waitFor([&](const auto& r) { return targetsOf(r, cluster.addresses[1], storage::ReplicaState::offline); },
                  std::chrono::seconds(kServerTtl), "the stopped server's targets offline");
  const Clock::duration stopped = Clock::now() - term;
  INFO("SIGTERM -> offline in " << ms(stopped) << " ms");
  CHECK(stopped < 1s);
  const int status = b->stop(SIGTERM);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(b->output().find("left etcd") != std::string::npos);

  checkHistories(cluster);
  CHECK(manager->stop(SIGTERM) == 0);
}

TEST_CASE("a server whose lease is lost registers again by itself and serves again", "[etcd][cluster]") {
  Cluster cluster;
  REQUIRE(cluster.load(false) == 0);
  auto manager = cluster.manager("m1");
  auto a = cluster.server(0);
  auto b = cluster.server(1);
  cluster.waitFor([&](const auto& r) { return r.live.size() == 2 && allServing(r) && r.leaderLease != 0; }, 10s,
                  "both servers serving, a leader");
  const std::string& name = cluster.addresses[0];
  // The server learns the lease is gone at its next keep-alive (one every
  // ttl/3) and registers at once: a new lease within ttl/3 + the slack.
  const Clock::duration bound = std::chrono::seconds(kServerTtl) / 3 + kSlack;

  // Revoked while it runs.
  const std::int64_t first = cluster.liveLease(name);
  REQUIRE(first != 0);
  const Clock::time_point revoked = Clock::now();
  cluster.revoke(first);
  const std::int64_t second = cluster.waitForNewLease(name, first, bound);
  INFO("revoked -> registered again in " << ms(Clock::now() - revoked) << " ms");
  cluster.waitFor([&](const auto& r) { return allServing(r); }, 2s, "every target serving again");
  CHECK(a->output().find("the lease was lost: registering again") != std::string::npos);

  // Revoked while it is stopped (SIGSTOP: as if cut off from etcd past its
  // TTL), so that it cannot register again before the manager has moved
  // its targets: they go offline, and serve again once it is back.
  const storage::StoredRouting before = cluster.read();
  REQUIRE(::kill(a->pid, SIGSTOP) == 0);
  cluster.revoke(second);
  cluster.waitFor([&](const auto& r) { return targetsOf(r, name, storage::ReplicaState::offline); }, 2s,
                  "the targets of the server whose lease was revoked offline");
  CHECK(cluster.liveLease(name) == 0);
  const Clock::time_point resumed = Clock::now();
  REQUIRE(::kill(a->pid, SIGCONT) == 0);
  cluster.waitForNewLease(name, second, bound);
  INFO("resumed -> registered again in " << ms(Clock::now() - resumed) << " ms");
  cluster.waitFor([&](const auto& r) { return allServing(r); }, 2s, "every target serving again");
  const storage::StoredRouting after = cluster.read();
  for (std::size_t c = 0; c < after.records.chains.size(); ++c) {  // offline, then serving: two versions at least
    CHECK(after.records.chains[c].version >= before.records.chains[c].version + 2);
  }
  // It serves the new versions, and answers staleRouting to the old ones.
  const std::uint32_t version = after.records.chains[0].version;
  CHECK(cluster.readAt(name, 11, 0, version) == storage::proto::IoStatus::ok);
  const Clock::time_point asked = Clock::now();
  while (cluster.readAt(name, 11, 0, version - 1) != storage::proto::IoStatus::staleRouting) {
    REQUIRE(Clock::now() - asked < 2s);
    std::this_thread::sleep_for(20ms);
  }

  checkHistories(cluster);
  CHECK(b->stop(SIGTERM) == 0);
  CHECK(manager->stop(SIGTERM) == 0);
}

TEST_CASE("the leading manager killed: the other leads within the TTL, no update is lost", "[etcd][cluster]") {
  Cluster cluster;
  REQUIRE(cluster.load(false) == 0);
  std::map<std::string, std::unique_ptr<Child>> managers;
  managers["m1"] = cluster.manager("m1");
  managers["m2"] = cluster.manager("m2");
  auto a = cluster.server(0);
  auto b = cluster.server(1);
  cluster.waitFor([&](const auto& r) { return r.live.size() == 2 && allServing(r) && r.leaderLease != 0; }, 10s,
                  "both servers serving, a leader");

  // Churn while both managers run: the leader acts, the follower must not.
  for (int round = 0; round < 2; ++round) {
    b->stop(SIGTERM);
    cluster.waitFor([&](const auto& r) { return targetsOf(r, cluster.addresses[1], storage::ReplicaState::offline); },
                    std::chrono::seconds(kServerTtl), "the stopped server's targets offline");
    b = cluster.server(1);
    cluster.waitFor([&](const auto& r) { return allServing(r); }, 10s, "all serving again");
  }

  const std::string leader = cluster.leader();
  REQUIRE(managers.contains(leader));
  const std::string other = leader == "m1" ? "m2" : "m1";
  managers[leader]->stop(SIGKILL);
  const Clock::time_point killed = Clock::now();
  for (;;) {
    if (cluster.leader() == other) break;
    REQUIRE(Clock::now() - killed < std::chrono::seconds(kManagerTtl) + kSlack);
    std::this_thread::sleep_for(20ms);
  }
  INFO(other << " leads " << ms(Clock::now() - killed) << " ms after the leader's SIGKILL");

  // The new leader handles the next death.
  a->stop(SIGKILL);
  cluster.waitFor([&](const auto& r) { return targetsOf(r, cluster.addresses[0], storage::ReplicaState::offline); },
                  std::chrono::seconds(kServerTtl) + kSlack, "the killed server's targets offline under the new leader");
  a = cluster.server(0);
  cluster.waitFor([&](const auto& r) { return allServing(r); }, 10s, "all serving again");

  checkHistories(cluster);
  CHECK(managers[other]->output().find(other + ": leading") != std::string::npos);
}

TEST_CASE("two managers racing on the chains lose no update", "[etcd][cluster]") {
  Cluster cluster;
  REQUIRE(cluster.load(false) == 0);
  std::vector<std::string> log;
  const auto keep = [&log](const std::string& line) { log.push_back(line); };
  // No grace after a takeover: the leadership moves faster than any grace.
  storage::ClusterManager<R> first(*cluster.client, "first", kManagerTtl, keep, 0s);
  storage::ClusterManager<R> second(*cluster.client, "second", kManagerTtl, keep, 0s);
  std::stop_source managers;
  cluster.reactor.runUntil(coio::collectAll(first.run(managers.get_token()), second.run(managers.get_token()),
                                            churn(*cluster.client, cluster.addresses, managers)));
  std::string lines;
  for (const std::string& line : log) lines += line + "\n";
  INFO("the managers' log:\n" << lines);
  // Every committed change is one version, and every version one change:
  // the histories are 1, 2, 3, ... and their steps what the managers counted.
  checkHistories(cluster);
  std::uint64_t versions = 0;
  for (const storage::ChainRecord& chain : cluster.read().records.chains) versions += chain.version - 1;
  CHECK(first.changes() + second.changes() == versions);
  CHECK(versions >= 4);
  CHECK(lines.find("first: leading") != std::string::npos);
  CHECK(lines.find("second: leading") != std::string::npos);
}

// A manager that takes over while a server's registration is missing (as
// after etcd lost its leader: the server is renewing it) waits one TTL
// before it marks the server's targets offline, then does.
TEST_CASE("a manager that takes over marks a missing server offline only after a grace of one TTL", "[etcd][cluster]") {
  Cluster cluster;
  REQUIRE(cluster.load(false) == 0);
  const storage::ServerRecord record{cluster.addresses[1], *coio::SocketAddress::parse(cluster.addresses[1]), {21, 22}};
  std::vector<std::string> log;
  storage::ClusterManager<R> manager(*cluster.client, "m", kManagerTtl, [&log](const std::string& line) { log.push_back(line); });
  std::stop_source stop;
  Clock::duration leadingToOffline{};
  cluster.reactor.runUntil(coio::collectAll(
      manager.run(stop.get_token()),
      [](Cluster& c, const storage::ServerRecord& registered, storage::ClusterManager<R>& m, std::stop_source& done,
         Clock::duration& took) -> Task<void> {
        // Server 1 registered (no lease: this test stands in for it), server 0 not.
        coio::Result<storage::etcd::PutResponse> put =
            co_await c.client->put({storage::liveKey(registered.name), storage::toJson(registered)}, 2s);
        REQUIRE(put);
        while (!m.leading()) co_await c.reactor.sleepFor(5ms);
        // The manager's own clock of it: the test may see it lead late (a
        // stalled process), which must not shorten the grace measured.
        const Clock::time_point leading = m.leadingSince();
        for (;;) {
          coio::Result<storage::StoredRouting> now = co_await storage::readRouting(*c.client);
          REQUIRE(now);
          if (targetsOf(*now, c.addresses[0], storage::ReplicaState::offline)) break;
          REQUIRE(Clock::now() - leading < std::chrono::seconds(kManagerTtl) + kSlack);
          co_await c.reactor.sleepFor(20ms);
        }
        took = Clock::now() - leading;
        done.request_stop();
      }(cluster, record, manager, stop, leadingToOffline)));
  INFO("leading -> offline in " << ms(leadingToOffline) << " ms");
  CHECK(leadingToOffline >= std::chrono::seconds(kManagerTtl));  // the grace
  CHECK(targetsOf(cluster.read(), cluster.addresses[1], storage::ReplicaState::serving));
  checkHistories(cluster);
}

TEST_CASE("reads never wait on etcd: a server serves while etcd is down, registers once it is back", "[etcd][cluster]") {
  Cluster cluster;
  REQUIRE(cluster.load(false) == 0);
  auto b = cluster.server(1);
  cluster.waitFor([&](const auto& r) { return r.live.contains(cluster.addresses[1]); }, 10s, "the server registered");
  // Chain 1 at version 2 (as a manager would write it): the server learns
  // it by its watch, and version 1 is stale from then on.
  const storage::ChainRecord moved = storage::markTargetOffline(cluster.read().records.chains[0], 11);
  const std::uint32_t version = moved.version;
  REQUIRE(version == 2);
  coio::Result<storage::etcd::PutResponse> put = coio::Errc::closed;
  cluster.reactor.runUntil([](storage::etcd::EtcdClient<R>& c, const storage::ChainRecord& chain,
                              coio::Result<storage::etcd::PutResponse>& out) -> Task<void> {
    out = co_await c.put({storage::chainKey(chain.id), storage::toJson(chain)}, 2s);
  }(*cluster.client, moved, put));
  REQUIRE(put);
  const Clock::time_point asked = Clock::now();
  while (cluster.readAt(cluster.addresses[1], 21, 0, version - 1) != storage::proto::IoStatus::staleRouting) {
    REQUIRE(Clock::now() - asked < 2s);
    std::this_thread::sleep_for(20ms);
  }

  // etcd gone: the server keeps serving with the routing it has.
  cluster.etcd.stop(0, SIGKILL);
  CHECK(cluster.readAt(cluster.addresses[1], 21, 0, version) == storage::proto::IoStatus::ok);
  CHECK(cluster.readAt(cluster.addresses[1], 21, 0, version - 1) == storage::proto::IoStatus::staleRouting);

  // A server started while etcd is down serves at once, and registers once etcd is back.
  auto a = cluster.server(0);
  const Clock::time_point started = Clock::now();
  while (cluster.readAt(cluster.addresses[0], 11, 0, 0) != storage::proto::IoStatus::ok) {
    REQUIRE(Clock::now() - started < 5s);
    std::this_thread::sleep_for(50ms);
  }
  cluster.etcd.start(0);
  cluster.waitFor([&](const auto& r) { return r.live.size() == 2; }, 10s, "both servers registered after etcd's restart");
}

// The way issue 37 found it: an etcd member that accepts connections and
// never answers (SIGSTOP), first in every process's endpoint list, for
// more than twice the leases' TTL, under verified reads from a client that
// follows the routing in etcd. The servers' and the leading manager's
// keep-alives move to the other members within a share of one call, so no
// lease expires while it is stopped, no target is marked offline and no
// read fails. Once with the frozen member leading (etcd elects another
// meanwhile), once with it a follower.
//
// After SIGCONT a member that led revokes the leases that expired in its
// own view (it saw no renewal while stopped) before it learns that it no
// longer leads: etcd issue 15247, fixed in 3.4.28 and 3.5.11 (Debian 12
// has 3.4.23). Then every holder registers again, and what must hold is
// that no target went offline and no read failed; after a follower's
// SIGCONT the leases are the same too.
TEST_CASE("a frozen etcd member first in every endpoint list: no lease lost, no target offline, no read failed",
          "[etcd][cluster][frozen]") {
  const bool leader = GENERATE(true, false);
  Cluster cluster(3);
  const std::size_t frozen = leader ? cluster.etcd.leader() : (cluster.etcd.leader() + 1) % 3;
  cluster.etcdUrls = cluster.etcd.endpoint(frozen);
  for (std::size_t i = 0; i < 3; ++i) {
    if (i != frozen) cluster.etcdUrls += "," + cluster.etcd.endpoint(i);
  }
  INFO("the frozen member " << frozen << (leader ? " leads" : " follows") << "; --etcd " << cluster.etcdUrls);
  REQUIRE(cluster.load(false) == 0);
  auto m1 = cluster.manager("m1");
  auto m2 = cluster.manager("m2");
  auto a = cluster.server(0);
  auto b = cluster.server(1);
  cluster.waitFor([&](const auto& r) { return r.live.size() == 2 && allServing(r) && r.leaderLease != 0; }, 10s,
                  "both servers serving, a leading manager");
  std::this_thread::sleep_for(std::chrono::seconds(kServerTtl));  // past the manager's grace: it would act now
  const storage::StoredRouting before = cluster.read();
  const std::int64_t leaseA = cluster.liveLease(cluster.addresses[0]), leaseB = cluster.liveLease(cluster.addresses[1]);
  REQUIRE(leaseA != 0);
  REQUIRE(leaseB != 0);
  const auto sameVersions = [&before](const storage::StoredRouting& now) {
    REQUIRE(now.records.chains.size() == before.records.chains.size());
    for (std::size_t c = 0; c < now.records.chains.size(); ++c) {
      CHECK(now.records.chains[c].version == before.records.chains[c].version);
    }
  };

  constexpr auto kFrozen = std::chrono::seconds(2 * kServerTtl + 1);
  constexpr auto kAfter = std::chrono::seconds(kServerTtl + 1);  // a manager that took over would act by then
  const std::string report = (cluster.dir / "bench.log").string();
  Child bench({"--etcd", cluster.etcdUrls, "--verify", "--json", "--duration",
               std::to_string((1s + kFrozen + kAfter).count()), "--io-size", "4K", "--batch", "8",
               "--depth", "4", "--request-timeout-ms", "1000", "--reactor", "epoll"},
              report, COIO_STORAGE_BENCH_BIN);
  std::this_thread::sleep_for(1s);
  cluster.etcd.signal(frozen, SIGSTOP);
  std::this_thread::sleep_for(kFrozen);
  // Still stopped, past twice the TTL: the same leases, the same leader, the same versions.
  const storage::StoredRouting frozenNow = cluster.read();
  CHECK(cluster.liveLease(cluster.addresses[0]) == leaseA);
  CHECK(cluster.liveLease(cluster.addresses[1]) == leaseB);
  CHECK(frozenNow.leaderLease == before.leaderLease);
  sameVersions(frozenNow);
  CHECK(a->output().find("the lease was lost") == std::string::npos);
  CHECK(b->output().find("the lease was lost") == std::string::npos);
  cluster.etcd.signal(frozen, SIGCONT);

  const int status = bench.stop(0);  // signal 0: waits for its end
  const std::string out = bench.output();
  INFO("the bench's output:\n" << out);
  INFO("server 0's log:\n" << a->output());
  INFO("the managers' logs:\n" << m1->output() << m2->output());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::size_t json = out.find("{\"transport\"");
  REQUIRE(json != std::string::npos);
  const nlohmann::json figures = nlohmann::json::parse(out.substr(json, out.find('\n', json) - json));
  CHECK(figures["ios"].get<std::uint64_t>() > 0);
  CHECK(figures["errors"]["total"].get<std::uint64_t>() == 0);

  // Resumed: no target offline, both servers registered; a follower's SIGCONT changes nothing at all.
  const storage::StoredRouting after =
      cluster.read();  // (kAfter has passed: a manager that took over would have acted by now)
  sameVersions(after);
  CHECK(after.live.size() == 2);
  if (!leader) {
    CHECK(cluster.liveLease(cluster.addresses[0]) == leaseA);
    CHECK(cluster.liveLease(cluster.addresses[1]) == leaseB);
    CHECK(after.leaderLease == before.leaderLease);
  }
  CHECK(a->stop(SIGTERM) == 0);
  CHECK(b->stop(SIGTERM) == 0);
}
