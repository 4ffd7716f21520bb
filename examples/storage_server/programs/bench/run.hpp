#pragma once
// coio-storage-bench's runs: --depth workers keeping a batch in flight
// each, on StorageClients of one server or on one ClusterClient, and the
// live line.
#include "client/cluster_client.hpp"
#include "client/etcd_routing.hpp"
#include "client/storage_client.hpp"
#include "programs/bench/report.hpp"
#include "programs/bench/settings.hpp"
#include "store/chunk_store.hpp"
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/core/collect_all.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace storage::bench {

// A new batch of random IOs, landing in `memory`.
inline void randomBatch(std::mt19937_64& random, const Settings& settings, std::span<std::byte> memory,
                 std::vector<storage::ReadOp>& ios) {
  for (std::size_t i = 0; i < ios.size(); ++i) {
    ios[i].chunkId = settings.layout.chunkAt(random() % settings.layout.chunks);
    const std::uint64_t slots = (settings.layout.chunkSize - settings.ioSize) / settings.align + 1;
    ios[i].offset = static_cast<std::uint32_t>(random() % slots * settings.align);
    ios[i].length = settings.ioSize;
    ios[i].into = std::span(memory).subspan(i * settings.ioSize, settings.ioSize);
    ios[i].targetId = settings.target;
  }
}

// One batch on one server into `done`; a request that fails as a whole is
// counted (and logged) and leaves `done` empty. False once the connection is gone.
template <coio::Reactor R>
coio::Task<bool> readBatch(storage::StorageClient<R>& client, const Settings& settings,
                           std::span<const storage::ReadOp> ios, Tally& tally, FailureLog& failures,
                           std::vector<IoDone>& done) {
  coio::Result<std::vector<storage::ReadOutcome>> outcomes = co_await client.batchRead(ios);
  if (!outcomes) {
    ++(outcomes.error() == std::errc::timed_out ? tally.timedOutRequests : tally.failedRequests);
    failures.note("a batchRead of " + std::to_string(ios.size()) + " IOs from target " +
                  std::to_string(settings.target) + " on " + settings.server.toString() +
                  " failed: " + outcomes.error().message());
    co_return !client.failure();
  }
  for (const storage::ReadOutcome& o : *outcomes) {
    done.push_back({o.status, o.bytes, o.checksumMismatch, {}, settings.target, &settings.server, {}, 1, {}});
  }
  co_return true;
}

// One batch on a cluster: it never fails as a whole, each IO has its outcome.
template <coio::Reactor R>
coio::Task<bool> readBatch(storage::ClusterClient<R>& client, const Settings&, std::span<const storage::ReadOp> ios,
                           Tally&, FailureLog&, std::vector<IoDone>& done) {
  const std::vector<storage::ClusterOutcome> outcomes = co_await client.batchRead(ios);
  const storage::ChainTable& table = client.table();
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    const storage::ClusterOutcome& o = outcomes[i];
    const storage::Chain& chain = table.chains()[table.chainIndexOf(ios[i].chunkId)];
    done.push_back({o.status, o.bytes, o.checksumMismatch, o.error, o.target,
                    o.server == SIZE_MAX ? nullptr : &client.serverAddress(o.server), chain.id, o.attempts, {}});
    if (o.ok() || o.target) continue;
    for (const storage::Replica& r : chain.replicas) {
      done.back().replicas += (done.back().replicas.empty() ? "target " : ", target ") + std::to_string(r.targetId) +
                              " on " + table.servers()[r.server].toString() +
                              (r.state == storage::ReplicaState::offline ? " (offline)" : "");
    }
  }
  co_return true;
}

// Keeps one batch in flight on `client` (a StorageClient or a ClusterClient)
// until `end`, on the reactor's clock (virtual time in a simulation).
template <coio::Reactor R, typename Client>
coio::Task<void> worker(R& reactor, Client& client, const Settings& settings, Clock::time_point end,
                        std::uint64_t seed, std::span<std::byte> memory, Tally& tally, FailureLog& failures) {
  std::mt19937_64 random(seed);
  std::vector<storage::ReadOp> ios(settings.batch);
  std::vector<IoDone> done;
  while (reactor.now() < end) {
    randomBatch(random, settings, memory, ios);
    const Clock::time_point start = reactor.now();
    done.clear();
    const bool usable = co_await readBatch(client, settings, ios, tally, failures, done);
    if (!usable) co_return;  // the connection is gone: this worker is done
    if (done.empty()) continue;
    tally.batchDone(reactor.now() - start, !settings.latencyLog.empty());
    for (std::size_t i = 0; i < ios.size(); ++i) {
      const std::string problem = tally.io(settings, ios[i], done[i]);
      if (!problem.empty()) failures.io(ios[i], done[i], problem);
    }
  }
}

// The live line, on a terminal only.
template <coio::Reactor R>
coio::Task<void> progress(R& reactor, Clock::time_point begin, Clock::time_point end,
                          const std::vector<Tally>& tallies) {
  if (!::isatty(STDERR_FILENO)) co_return;
  while (reactor.now() < end) {
    co_await reactor.sleepFor(std::min<Clock::duration>(std::chrono::seconds(1), end - reactor.now()));
    const double elapsed = std::chrono::duration<double>(reactor.now() - begin).count();
    std::uint64_t ios = 0, bytes = 0, errors = 0;
    for (const Tally& t : tallies) {
      ios += t.ios;
      bytes += t.bytes;
      errors += t.errors();
    }
    std::fprintf(stderr, "\r  %5.1f s  %8.3f GiB/s  %10.0f IOPS  errors %llu   ", elapsed,
                 static_cast<double>(bytes) / elapsed / (1u << 30), static_cast<double>(ios) / elapsed,
                 static_cast<unsigned long long>(errors));
  }
  std::fputs("\n", stderr);
}

#if COIO_STORAGE_RDMA
// A queue pair brought up over a new TCP connection: how an RDMA client
// connects, and reconnects after an idle close.
template <coio::Reactor R>
coio::Task<coio::Result<std::unique_ptr<storage::Channel<R>>>> connectRdma(R& reactor, const Settings& settings,
                                                                           coio::SocketAddress server,
                                                                           std::stop_token stop) {
  coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, server, stop);
  if (!stream) co_return stream.error();
  co_return co_await storage::RdmaChannel<R>::connect(reactor, *settings.device, std::move(*stream), std::move(stop),
                                                      std::chrono::seconds(10));
}
#endif

// When a run that began at `begin` ends: --duration later.
inline Clock::time_point endOfRun(const Settings& settings, Clock::time_point begin) {
  return begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings.duration));
}

// A worker (its index w of --depth: its seed and slice of the memory) and its client.
template <typename Client>
using WorkerOn = std::pair<std::size_t, Client*>;

// Runs `workers` until `end`, each keeping a batch in flight on its client
// with its slice of `memory`, and the live line if `live`; the seconds
// since `begin`.
template <coio::Reactor R, typename Client>
coio::Task<double> runWorkers(R& reactor, const Settings& settings, std::vector<WorkerOn<Client>> workers,
                              std::span<std::byte> memory, std::vector<Tally>& tallies, Clock::time_point begin,
                              Clock::time_point end, bool live) {
  FailureLog failures;
  std::vector<coio::Task<void>> tasks;
  const std::size_t slice = settings.batch * settings.ioSize;
  for (const auto& [w, client] : workers) {
    tasks.push_back(worker(reactor, *client, settings, end, 1000 + w, memory.subspan(w * slice, slice), tallies[w],
                           failures));
  }
  if (live) tasks.push_back(progress(reactor, begin, end, tallies));
  co_await coio::collectAllRange(std::move(tasks));
  co_return std::chrono::duration<double>(reactor.now() - begin).count();
}

// One client over the chosen transport; `memory` is where its IOs land.
template <coio::Reactor R>
coio::Task<coio::Result<std::unique_ptr<storage::StorageClient<R>>>> connect(R& reactor, const Settings& settings,
                                                                             storage::TransmissionLimiter& limiter,
                                                                             std::span<std::byte> memory) {
  const storage::ClientOptions options{.timeout = settings.timeout,
                                       .verifyChecksums = settings.verify || settings.checksums};
#if COIO_STORAGE_RDMA
  if (settings.device) {
    coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await storage::StorageClient<R>::connect(
        [&reactor, &settings](std::stop_token stop) {
          return connectRdma(reactor, settings, settings.server, std::move(stop));
        },
        limiter, options);
    if (!client) co_return client.error();
    if (coio::Result<void> registered = (*client)->registerMemory(memory); !registered) {
      co_await (*client)->close();
      co_return registered.error();
    }
    co_return std::move(*client);
  }
#endif
  (void)memory;  // TCP reads into any memory
  co_return co_await storage::StorageClient<R>::connect(reactor, settings.server, limiter, options);
}

// What one reactor of a run does (`part` of --reactors): connects the
// clients c with c % reactors == part, runs the workers w whose client
// (w % connections) is one of them for --duration from the moment its
// clients are connected, closes its clients. Runs on `reactor`'s thread.
// How long its workers ran, or the failed connect's error.
template <coio::Reactor R>
coio::Task<coio::Result<double>> runPart(R& reactor, const Settings& settings, std::size_t part,
                                         std::span<std::byte> memory, std::vector<Tally>& tallies) {
  // --max-transmissions is the client's, split between the reactors (a limiter is one thread's).
  storage::TransmissionLimiter limiter((settings.maxTransmissions + settings.reactors - 1) / settings.reactors);
  std::vector<std::unique_ptr<storage::StorageClient<R>>> clients;
  std::error_code failed;
  for (std::size_t c = part; c < settings.connections; c += settings.reactors) {
    coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await connect(reactor, settings, limiter, memory);
    if (!client) {
      std::fprintf(stderr, "coio-storage-bench: cannot connect to %s over %s: %s (is coio-storage-server running%s?)\n",
                   settings.server.toString().c_str(), settings.transport.c_str(), client.error().message().c_str(),
                   settings.transport == "rdma" ? " with --transport rdma" : "");
      failed = client.error();
      break;
    }
    clients.push_back(std::move(*client));
  }
  double elapsed = 0;
  if (!failed) {
    // Worker w's client is connection w % connections: this part's (w % connections) / reactors-th.
    std::vector<WorkerOn<storage::StorageClient<R>>> workers;
    for (std::size_t w = 0; w < settings.depth; ++w) {
      const std::size_t c = w % settings.connections;
      if (c % settings.reactors == part) workers.emplace_back(w, clients[c / settings.reactors].get());
    }
    const Clock::time_point begin = reactor.now();
    elapsed = co_await runWorkers(reactor, settings, std::move(workers), memory, tallies, begin,
                                  endOfRun(settings, begin), settings.reactors == 1);
  }
  for (auto& open : clients) co_await open->close();
  if (failed) co_return failed;
  co_return elapsed;
}

// One server: --connections spread over --reactors reactor threads, this
// one (`reactor`, part 0) and a pool of the others. Each part hops to its
// reactor, runs there, and hops back: tallies are merged on this thread,
// over the longest part's time (the parts connect at once, each timing its
// own run from its last connect).
template <coio::Reactor R>
coio::Task<int> run(R& reactor, const Settings& settings) {
  // Every worker's destinations, in one allocation that each client registers once (RDMA).
  std::vector<std::byte> memory(settings.depth * settings.batch * settings.ioSize);
  std::vector<Tally> tallies(settings.depth);
  std::optional<coio::ReactorPool<R>> others;
  if (settings.reactors > 1) others.emplace(settings.reactors - 1);
  const auto part = [&](std::size_t p) -> coio::Task<coio::Result<double>> {
    if (p > 0) co_await others->reactor(p - 1).schedule();
    coio::Result<double> ran =
        co_await runPart(p > 0 ? others->reactor(p - 1) : reactor, settings, p, memory, tallies);
    if (p > 0) co_await reactor.schedule();
    co_return ran;
  };
  std::vector<coio::Task<coio::Result<double>>> parts;
  for (std::size_t p = 0; p < settings.reactors; ++p) parts.push_back(part(p));
  double elapsed = 0;
  bool connected = true;
  for (const coio::Result<double>& ran : co_await coio::collectAllRange(std::move(parts))) {
    connected = connected && ran.hasValue();
    if (ran) elapsed = std::max(elapsed, *ran);
  }
  if (!connected) co_return 1;
  co_return finish(settings, tallies, elapsed, nullptr);
}

// --etcd: the routing read from etcd; the dataset's shape taken from it.
template <coio::Reactor R>
coio::Task<std::unique_ptr<storage::EtcdRouting<R>>> loadEtcdRouting(storage::etcd::EtcdClient<R>& etcd,
                                                                     Settings& settings) {
  std::string why;
  coio::Result<std::unique_ptr<storage::EtcdRouting<R>>> routing = co_await storage::EtcdRouting<R>::load(
      etcd, std::chrono::seconds(5), [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
      &why);
  if (!routing) {
    std::fprintf(stderr, "coio-storage-bench: no routing from etcd: %s\n", why.c_str());
    co_return nullptr;
  }
  const storage::ChainTable& table = (*routing)->table();
  if (settings.ioSize > table.chunkSize()) {
    std::fprintf(stderr, "coio-storage-bench: --io-size is larger than a chunk (%u bytes)\n", table.chunkSize());
    co_return nullptr;
  }
  settings.layout = {table.chunks(), table.chunkSize(), 1};
  settings.table = table;
  co_return std::move(*routing);
}

// --cluster: every server of the table (a file's, or etcd's) through one ClusterClient.
template <coio::Reactor R>
coio::Task<int> runCluster(R& reactor, Settings& settings) {
  storage::ClusterOptions options;
  options.connection.timeout = settings.timeout;
  options.requestTimeout = settings.requestTimeout;
  options.hedgeAfter = settings.hedge;
  options.retryFor = settings.retryFor;
  options.maxTransmissionsPerServer = settings.maxTransmissions;
  std::ofstream routingLog;
  if (!settings.routingLog.empty()) {
    routingLog.open(settings.routingLog, std::ios::trunc);
    if (!routingLog) {
      std::fprintf(stderr, "coio-storage-bench: cannot write %s\n", settings.routingLog.c_str());
      co_return 1;
    }
    options.routingApplied = [&routingLog](const storage::ChainTable& table) { logRouting(routingLog, table); };
  }
  std::unique_ptr<storage::etcd::EtcdClient<R>> etcd;
  std::unique_ptr<storage::EtcdRouting<R>> routing;
  if (!settings.etcdEndpoints.empty()) {
    storage::etcd::EtcdOptions etcdOptions;
    etcdOptions.endpoints = settings.etcdEndpoints;
    coio::Result<std::unique_ptr<storage::etcd::EtcdClient<R>>> created =
        storage::etcd::EtcdClient<R>::create(reactor, std::move(etcdOptions));
    if (!created) {
      std::fprintf(stderr, "coio-storage-bench: --etcd takes http://IP:PORT[,...]\n");
      co_return 2;
    }
    etcd = std::move(*created);
    routing = co_await loadEtcdRouting(*etcd, settings);
    if (!routing) co_return 1;
    options.refreshRouting = routing->refresher(settings.requestTimeout);
  } else {
    // A server with a newer chain version (serve --chains): the file, read again.
    options.refreshRouting = [&settings]() -> coio::Task<coio::Result<storage::ChainTable>> {
      co_return storage::ChainTable::load(settings.clusterFile);
    };
  }
  typename storage::ClusterClient<R>::ConnectorFactory factory;
#if COIO_STORAGE_RDMA
  if (settings.device) {
    factory = [&reactor, &settings](const coio::SocketAddress& server) -> storage::ChannelConnector<R> {
      return [&reactor, &settings, server](std::stop_token stop) {
        return connectRdma(reactor, settings, server, std::move(stop));
      };
    };
  }
#endif
  std::unique_ptr<storage::ClusterClient<R>> client =
      co_await storage::ClusterClient<R>::connect(reactor, *settings.table, options, std::move(factory));
  if (routing) routing->follow(*client);
  std::vector<std::byte> memory(settings.depth * settings.batch * settings.ioSize);
  coio::Result<void> registered = client->registerMemory(memory);
  std::vector<Tally> tallies(settings.depth);
  double elapsed = 0;
  if (registered) {
    std::vector<WorkerOn<storage::ClusterClient<R>>> workers;
    for (std::size_t w = 0; w < settings.depth; ++w) workers.emplace_back(w, client.get());
    const Clock::time_point begin = reactor.now();
    elapsed = co_await runWorkers(reactor, settings, std::move(workers), memory, tallies, begin,
                                  endOfRun(settings, begin), true);
  }
  ClusterFigures figures{settings.clusterFile, settings.table->chains().size(), client->stats(), {}, {}, {}};
  if (routing) {
    co_await routing->close();
    figures.etcd = routing->stats();
    figures.etcdAt = reactor.now();
    figures.source = "etcd " + settings.etcdEndpoints.front() + (settings.etcdEndpoints.size() > 1 ? ",..." : "");
  }
  if (!registered) {
    std::fprintf(stderr, "coio-storage-bench: cannot register memory: %s\n", registered.error().message().c_str());
    co_await client->close();
    co_return 1;
  }
  for (std::size_t s = 0; s < client->servers(); ++s) {
    figures.servers.emplace_back(client->serverAddress(s).toString(), client->serverStats(s));
  }
  co_await client->close();
  co_return finish(settings, tallies, elapsed, &figures);
}

}  // namespace storage::bench
