#pragma once
// The example storage cluster on the simulation (coio::sim): three servers,
// a ClusterClient, a fault schedule, and what a run did. Shared by the
// seeds' tests (sim_storage_test.cpp) and the simulation's benchmark
// (tests/bench/storage/sim_cluster_bench.cpp); no test framework here:
// a run that cannot go on throws.
#include "client/cluster_client.hpp"
#include "cluster/chain_table.hpp"
#include "server/storage_server.hpp"
#include "store/chunk_store.hpp"

#include <coio/core/cancellation.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/testing/seed_driver.hpp>
#include <coio/testing/sim_disk.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace storage::simcluster {

using namespace std::chrono_literals;
using R = coio::sim::SimReactor;
using coio::Result;
using coio::Task;

/// A chunk store in a fresh temporary directory, removed at the end.
struct Dataset {
  std::filesystem::path path;
  explicit Dataset(ChunkStoreLayout layout) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coio-sim-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
    if (!createChunkStore(path, layout)) throw std::runtime_error("cannot create a chunk store in " + tmpl);
  }
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;
  ~Dataset() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

/// With COIO_SIM_LOG set, `line` to stderr at `r`'s virtual time (for a
/// replay: it draws nothing from the seed, so the run stays the same).
inline void simLog(const R& r, const std::string& line) {
  if (std::getenv("COIO_SIM_LOG") == nullptr) return;
  std::fprintf(stderr, "%10.6f %s\n", std::chrono::duration<double>(r.now().time_since_epoch()).count(), line.c_str());
}

/// Flips the bits of `mask` in the byte at `offset` of `file` (a corrupt replica).
inline void flipBits(const std::filesystem::path& file, std::uint64_t offset, std::byte mask) {
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  std::byte b{};
  const bool done = fd >= 0 && ::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1 &&
                    (b ^= mask, ::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  if (fd >= 0) ::close(fd);
  if (!done) throw std::runtime_error("cannot flip a bit of " + file.string());
}

// What a run did: IOs read right, IOs failed (by status name), bytes wrong
// (must be 0), the virtual time it took, its trace.
struct RunReport {
  std::uint64_t ok = 0;
  std::map<std::string, std::uint64_t> failed;
  std::uint64_t wrongBytes = 0;
  std::chrono::steady_clock::duration took{};
  std::chrono::steady_clock::duration longestBatch{};  // a batchRead's, call to return
  std::size_t buffersInUse = 0;                        // the servers' read buffers once the client is gone
  std::uint64_t inFlight = 0;                          // the reactor's operations at the end
  ClusterStats cluster{};                     // the client's: what the faults made it do
  std::uint64_t requests = 0;                          // the client's requests to the servers
  std::uint64_t trace = 0;
  bool operator==(const RunReport& o) const {
    return ok == o.ok && failed == o.failed && wrongBytes == o.wrongBytes && took == o.took &&
           longestBatch == o.longestBatch && buffersInUse == o.buffersInUse && inFlight == o.inFlight &&
           trace == o.trace;
  }
};

// A batch of IOs drawn from `random`, one per `chunkSize` of `arena`:
// whole chunks and random ranges of them, of `chunks` chunks.
inline std::vector<ReadOp> drawIos(coio::sim::Random& random, std::span<std::byte> arena, std::uint64_t chunks,
                                     std::uint32_t chunkSize) {
  std::vector<ReadOp> ios;
  for (std::size_t i = 0; i < arena.size() / chunkSize; ++i) {
    ReadOp op;
    op.chunkId = random.below(chunks);
    const bool whole = random.below(2) == 0;
    op.offset = whole ? 0 : static_cast<std::uint32_t>(random.below(chunkSize - 1));
    op.length = whole ? chunkSize : 1 + static_cast<std::uint32_t>(random.below(chunkSize - op.offset));
    op.into = arena.subspan(i * chunkSize, op.length);
    ios.push_back(op);
  }
  return ios;
}

/// How many seeds of `report` failed, and the first one's seed and failure.
inline std::string failedSeeds(const coio::sim::SeedReport& report) {
  std::string s = std::to_string(report.failures.size()) + " of " + std::to_string(report.runs) + " seeds failed";
  if (!report.failures.empty()) {
    s += "; the first: seed " + std::to_string(report.failures[0].seed) + ": " + report.failures[0].what;
  }
  return s;
}

inline std::string describe(const RunReport& r) {
  std::string s = "ok " + std::to_string(r.ok) + ", wrong bytes " + std::to_string(r.wrongBytes) + ", failed:";
  for (const auto& [status, n] : r.failed) s += " " + status + " " + std::to_string(n);
  return s;
}

// Three servers on 10.0.0.1..3 in a ring: chain k has target 10k+1 on
// server k and target 10k'+2 on server k' = k+1 (mod 3), so each chain has
// a replica on two servers, and chunk c is on chain c mod 3.
constexpr std::size_t kServers = 3;
constexpr std::uint32_t kClusterChunk = 16 * 1024;
constexpr std::uint64_t kClusterChunks = 60;

inline std::string host(std::size_t s) { return "10.0.0." + std::to_string(s + 1); }
inline std::uint32_t firstTarget(std::size_t s) { return static_cast<std::uint32_t>(10 * s + 1); }
inline std::uint32_t secondTarget(std::size_t s) { return static_cast<std::uint32_t>(10 * s + 2); }

inline std::string tableText() {
  std::string text = "coio-chains 1\nchunks " + std::to_string(kClusterChunks) + "\nchunk-size 16K\n";
  for (std::size_t k = 0; k < kServers; ++k) {
    const std::size_t next = (k + 1) % kServers;
    text += "chain " + std::to_string(k + 1) + " " + host(k) + ":9000/" + std::to_string(firstTarget(k)) + " " +
            host(next) + ":9000/" + std::to_string(secondTarget(next)) + "\n";
  }
  return text;
}

// The datasets of the six targets, made once (runs only read them, but
// for the corruption a run flips and flips back).
struct ClusterData {
  ClusterData() {
    const ChainTable shape = *ChainTable::parse(tableText(), "shape");
    for (std::size_t s = 0; s < kServers; ++s) {
      for (const std::uint32_t t : {firstTarget(s), secondTarget(s)}) {
        dirs.emplace(t, std::make_unique<Dataset>(*shape.targetLayout(t, 8)));
      }
    }
  }
  // Whether `bytes` are chunk `chunkId`'s from `offset` on (a comparison
  // with its bytes made once: the per-byte generator would cost a run more
  // than the simulation does).
  bool matches(std::uint64_t chunkId, std::uint32_t offset, std::span<const std::byte> bytes) {
    if (chunks.empty()) {
      chunks.resize(kClusterChunks, std::vector<std::byte>(kClusterChunk));
      for (std::uint64_t c = 0; c < kClusterChunks; ++c) fillChunkBytes(c, 0, chunks[c]);
    }
    return offset + bytes.size() <= kClusterChunk &&
           std::memcmp(bytes.data(), chunks.at(chunkId).data() + offset, bytes.size()) == 0;
  }
  std::vector<TargetSpec> targetsOf(std::size_t s) const {
    return {{firstTarget(s), dirs.at(firstTarget(s))->path.string()},
            {secondTarget(s), dirs.at(secondTarget(s))->path.string()}};
  }
  std::map<std::uint32_t, std::unique_ptr<Dataset>> dirs;
  std::vector<std::vector<std::byte>> chunks;  // every chunk's bytes, for matches()
};

struct ClusterFaults {
  bool partitions = false;   // the network's fault schedule (drawn): partitions, resets, slow links
  bool corruptOne = false;   // one replica of one chunk has a flipped bit (drawn)
  coio::sim::DiskFaults disk{};
  // Tight budgets: a small read-buffer pool (16 pieces), 2 transmissions
  // per server, a 100 ms transmit grant, 30 ms request deadlines, hedges
  // after 5 ms: the faults meet the backpressure paths.
  bool tight = false;
};

// Server s while its process runs (null while it is down).
using LiveServers = std::array<StorageServer<R>*, kServers>;

// The three servers, each a node (a process of its own) at 10.0.0.1..3
// serving on port 9000 until it is killed: then it shuts down, as a
// stopped process does. A restart opens its targets afresh.
inline void startServers(R& reactor, ClusterData& data, const ServerOptions& options, LiveServers& live) {
  for (std::size_t s = 0; s < kServers; ++s) {
    live[s] = nullptr;
    reactor.startNode(host(s), [&data, options, s, &live](R& r) -> Task<void> {
      auto server = StorageServer<R>::open(r, data.targetsOf(s), options);
      if (!server) throw std::runtime_error("server " + host(s) + ": " + server.error().message());
      auto bound = coio::TcpListener<R>::bind(r, *coio::SocketAddress::parse("0.0.0.0:9000"));
      if (!bound) throw std::runtime_error("listen on " + host(s) + ": " + bound.error().message());
      (*server)->serve(*bound);
      live[s] = server->get();
      const std::stop_token killed = co_await coio::currentStopToken();
      co_await r.sleepFor(std::chrono::hours(24 * 365), killed);
      live[s] = nullptr;
      co_await (*server)->shutdown();
    });
  }
}

// A ClusterClient's connections: TCP streams on the simulated network.
inline ClusterClient<R>::ConnectorFactory tcpChannels(R& r) {
  return [&r](const coio::SocketAddress& to) -> ChannelConnector<R> {
    return [&r, to](std::stop_token stop) -> Task<Result<std::unique_ptr<Channel<R>>>> {
      Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, to, stop);
      if (!stream) co_return stream.error();
      co_return std::unique_ptr<Channel<R>>(std::make_unique<TcpChannel<R>>(std::move(*stream)));
    };
  };
}

// `maxGap`: batches are drawn 0 to maxGap apart (0: back to back), in
// steps of `gapStep` (below maxGap: 0, 1, ... 99 ms by default).
inline RunReport clusterRun(std::uint64_t seed, ClusterData& data, const ClusterFaults& faults, int batches = 20,
                            std::chrono::microseconds maxGap = 100ms, std::chrono::microseconds gapStep = 1ms) {
  R reactor(seed);
  reactor.drawLinks({.latency = 20us, .window = 64 * 1024}, {.latency = 1ms, .window = 1 << 20});
  reactor.setDiskFaults(faults.disk);
  // The corrupt replica: a chunk's bytes in one of its two targets.
  std::optional<std::pair<std::filesystem::path, std::uint64_t>> flipped;
  if (faults.corruptOne) {
    const std::size_t s = reactor.random().below(kServers);
    const std::uint32_t t = reactor.random().below(2) == 0 ? firstTarget(s) : secondTarget(s);
    const std::filesystem::path dir = data.dirs.at(t)->path;
    std::filesystem::path file;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename().string().starts_with("data")) file = entry.path();
    }
    if (file.empty()) throw std::runtime_error("no data file in " + dir.string());
    const std::uint64_t at = reactor.random().below(std::filesystem::file_size(file));
    flipBits(file, at, std::byte{0x10});
    flipped.emplace(file, at);
    simLog(reactor, "corrupt: target " + std::to_string(t) + ", " + file.filename().string() + " byte " + std::to_string(at));
  }
  ServerOptions options;
  // Buffered: the simulated disk does each read at once on the real file,
  // and with O_DIRECT that is a real device read on the loop thread (125 us
  // each here: most of a run's wall time). The single-server runs keep
  // O_DIRECT, so that path is simulated too.
  options.directIo = false;
  options.pieceSize = 16 * 1024;
  options.poolBytes = faults.tight ? 256u << 10 : 2u << 20;
  options.transmitTimeout = faults.tight ? 100ms : 2s;
  LiveServers servers;
  startServers(reactor, data, options, servers);
  ChainTable table = *ChainTable::parse(tableText(), "cluster");
  RunReport report;
  const auto start = reactor.now();

  // The fault schedule, beside the reads: every 0-200 ms the client loses
  // one server for 50-500 ms (one at a time: each chain keeps a replica),
  // or its connections to one server are reset, or one server's process
  // crashes (its connections reset, or its machine silent) and restarts
  // 50-500 ms later with nothing of its state, or it stops (SIGSTOP) for
  // as long, or its link to one gets slow (100-400 ms each way) for a
  // while.
  auto partitions = [](R& r, std::stop_token stop) -> Task<void> {
    while (co_await r.sleepFor(std::chrono::milliseconds(r.random().below(200)), stop)) {
      const std::string server = host(r.random().below(kServers));
      switch (r.random().below(5)) {
        case 0:
          simLog(r, "fault: connections to " + server + " reset");
          (void)r.resetConnections("127.0.0.1", server);
          continue;
        case 2: {
          const bool silent = r.random().below(2) == 0;
          simLog(r, "fault: " + server + (silent ? " goes silent (its machine is gone)" : " crashes"));
          coio::sim::Node& node = r.node(server);
          node.kill(silent ? coio::sim::KillMode::silent : coio::sim::KillMode::reset);
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          node.restart();
          simLog(r, "fault: " + server + " restarted");
          if (!on) co_return;
          continue;
        }
        case 3: {
          simLog(r, "fault: " + server + " stops (SIGSTOP)");
          coio::sim::Node& node = r.node(server);
          node.pause();
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          node.resume();
          simLog(r, "fault: " + server + " goes on");
          if (!on) co_return;
          continue;
        }
        case 1: {
          const auto slow = std::chrono::milliseconds(100 + r.random().below(300));
          simLog(r, "fault: the link to " + server + " slows to " + std::to_string(slow.count()) + " ms");
          r.setLink("127.0.0.1", server, {.latency = slow});
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          r.setLink("127.0.0.1", server, {.latency = 100us});
          simLog(r, "fault: the link to " + server + " is fast again");
          if (!on) co_return;
          continue;
        }
        default: {
          simLog(r, "fault: partition from " + server);
          r.partition("127.0.0.1", server);
          const bool on = co_await r.sleepFor(std::chrono::milliseconds(50 + r.random().below(450)), stop);
          r.heal("127.0.0.1", server);
          simLog(r, "fault: partition from " + server + " healed");
          if (!on) co_return;
        }
      }
    }
  };
  auto reads = [](R& r, ChainTable t, ClusterData& d, int n, std::chrono::microseconds gap,
                  std::chrono::microseconds step, bool tight, RunReport& out) -> Task<void> {
    using Client = ClusterClient<R>;
    typename Client::ConnectorFactory factory = tcpChannels(r);
    ClusterOptions o;
    o.requestTimeout = tight ? 30ms : 300ms;
    if (tight) o.maxTransmissionsPerServer = 2;
    o.reconnectMin = 20ms;
    o.reconnectMax = 200ms;
    o.retryFor = 3s;  // longer than a partition: an IO whose good replica is cut off waits for it
    o.hedgeAfter = r.random().below(2) == 0 ? std::chrono::steady_clock::duration{} : tight ? 5ms : 50ms;
    o.log = [&r](const std::string& line) { simLog(r, line); };  // the outcomes tell; a replay may want it
    std::unique_ptr<Client> client = co_await Client::connect(r, std::move(t), o, std::move(factory));
    std::vector<std::byte> arena(16 * kClusterChunk);
    for (int b = 0; b < n; ++b) {
      // Batches 0-100 ms apart by default: the run spans a second or so of
      // virtual time, in which the fault schedule strikes several times.
      if (gap >= step) co_await r.sleepFor(step * r.random().below(static_cast<std::uint64_t>(gap / step)));
      const std::vector<ReadOp> ios = drawIos(r.random(), arena, kClusterChunks, kClusterChunk);
      const auto called = r.now();
      const std::vector<ClusterOutcome> outcomes = co_await client->batchRead(ios);
      out.longestBatch = std::max(out.longestBatch, r.now() - called);
      if (outcomes.size() != ios.size()) throw std::logic_error("batchRead: one outcome per IO");
      for (std::size_t i = 0; i < ios.size(); ++i) {
        const ClusterOutcome& o = outcomes[i];
        if (!o.ok()) {
          simLog(r, "IO failed: chunk " + std::to_string(ios[i].chunkId) + " (chain " +
                        std::to_string(ios[i].chunkId % kServers + 1) + "), " + std::string(proto::toString(o.status)) +
                        ", " + o.error.message() + ", " + std::to_string(o.attempts) + " attempt(s)");
          ++out.failed[std::string(proto::toString(o.status))];
          continue;
        }
        if (o.bytes != ios[i].length ||
            !d.matches(ios[i].chunkId, ios[i].offset, ios[i].into.first(o.bytes))) {
          out.wrongBytes += o.bytes;
          continue;
        }
        ++out.ok;
      }
    }
    out.cluster = client->stats();
    for (std::size_t i = 0; i < client->servers(); ++i) out.requests += client->serverStats(i).requests;
    co_await client->close();
  };
  auto body = [](R& r, Task<void> readAll, std::optional<Task<void>> faultsOf) -> Task<void> {
    if (!faultsOf) co_return co_await std::move(readAll);
    std::stop_source stopFaults;
    auto thenStop = [](Task<void> t, std::stop_source& s) -> Task<void> {
      struct Stop {
        std::stop_source& s;
        ~Stop() { s.request_stop(); }
      } stopAtEnd{s};
      co_await std::move(t);
    };
    (void)r;
    co_await coio::collectAll(thenStop(std::move(readAll), stopFaults),
                              coio::withStopToken(stopFaults.get_token(), std::move(*faultsOf)));
  };

  std::exception_ptr failure;
  reactor.runUntil([](R& r, Task<void> b, LiveServers& live, std::exception_ptr& f, RunReport& out) -> Task<void> {
    try {
      co_await std::move(b);
    } catch (...) {
      f = std::current_exception();
    }
    // The client is gone: a second on, every server has its read buffers
    // back (a request of a closed connection, even one whose disk read
    // hangs, lets go of them), before anything is shut down.
    co_await r.sleepFor(1s);
    for (StorageServer<R>* server : live) {
      if (server == nullptr) throw std::logic_error("a server is down at the end of a run");
      out.buffersInUse += server->buffersInUse();
    }
    for (std::size_t s = 0; s < kServers; ++s) r.node(host(s)).kill();
  }(reactor, body(reactor, reads(reactor, std::move(table), data, batches, maxGap, gapStep, faults.tight, report),
                  faults.partitions ? std::optional<Task<void>>(partitions(reactor, {})) : std::nullopt),
    servers, failure, report));
  if (flipped) flipBits(flipped->first, flipped->second, std::byte{0x10});  // as it was
  if (failure) std::rethrow_exception(failure);
  report.inFlight = reactor.stats().inFlight;
  report.took = reactor.now() - start;
  report.trace = reactor.traceHash();
  return report;
}

inline std::uint64_t failures(const RunReport& r) {
  std::uint64_t n = 0;
  for (const auto& [status, count] : r.failed) n += count;
  return n;
}


}  // namespace storage::simcluster
