#pragma once
// coio-storage-server serve, once its settings are checked: one
// StorageServer per reactor thread (a shard), one of them accepting for
// all, the --metrics page, the --etcd registration and routing, the stall
// report, and the signals (SIGUSR1: a line of figures; SIGINT/SIGTERM:
// leave etcd, drain, stop).
#include "cluster/chain_table.hpp"
#include "cluster/cluster_manager.hpp"
#include "metrics/metrics_http.hpp"
#include "programs/server/etcd_session.hpp"
#include "programs/server/on_loop.hpp"
#include "protocol/crc32c.hpp"
#include "server/server_metrics.hpp"
#include "server/storage_server.hpp"
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/net/tcp_listener.hpp>
#include <coio/reactor/reactor_kind.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace storage::cli {

/// serve's settings, as parsed and checked (serve.cpp).
struct ServeSettings {
  std::vector<storage::TargetSpec> targets;
  coio::SocketAddress listen;
  std::size_t reactors = 1;  // --reactors; its default: usableCpus()
  coio::ReactorKind kind = coio::ReactorKind::uring;
  storage::ServerOptions server;
  std::optional<std::uint64_t> maxConnections;  // in all; default: from the fd limit
  std::uint64_t fdLimit = 0;
  std::string transport = "tcp";
  std::optional<coio::SocketAddress> metrics;  // --metrics
  std::chrono::milliseconds stallThreshold{0};  // --stall-threshold-ms; 0: no stall report
  std::chrono::milliseconds injectStall{0};     // --inject-stall-ms; 0: SIGUSR2 is not taken
  std::optional<storage::ChainTable> routing;   // --chains: the targets' chain versions
  std::vector<std::string> etcd;                // --etcd: register and follow the routing there
  std::string name;                             // --name; default: the listen address
  std::int64_t ttl = 3;                         // --ttl: the registration's lease, seconds
#if COIO_STORAGE_RDMA
  std::string rdmaDevice;
  std::size_t rdmaWrites = 256;
  std::unique_ptr<coio::rdma::Device> device;  // opened when the transport is rdma
#endif
};

// Opens a shard on its own loop thread (its Disk belongs to that thread),
// with its transport.
template <coio::Reactor R>
coio::Task<void> openShard(R& reactor, const ServeSettings& settings,
                           coio::Result<std::unique_ptr<storage::StorageServer<R>>>& out, std::string& problem) {
  out = storage::StorageServer<R>::open(reactor, settings.targets, settings.server);
  if (!out) problem = "cannot open the targets' data files: " + out.error().message();
  if (out && settings.routing) (*out)->updateRouting(*settings.routing);
#if COIO_STORAGE_RDMA
  if (out && settings.device) {
    const std::size_t writes = (settings.rdmaWrites + settings.reactors - 1) / settings.reactors;
    auto transport = storage::RdmaTransport<R>::create(reactor, *settings.device, (*out)->bufferMemory(), writes);
    if (!transport) {
      problem = "cannot register the read-buffer pool with " + settings.device->name() + ": " +
                transport.error().message() + " (is `ulimit -l` large enough for --pool?)";
      out = transport.error();
      co_return;
    }
    (*out)->useTransport(std::move(*transport));
  }
#endif
  co_return;
}

template <coio::Reactor R>
coio::Task<void> startAccepting(R& reactor, const ServeSettings& settings, std::vector<storage::StorageServer<R>*> shards,
                                std::optional<coio::TcpListener<R>>& listener, std::error_code& error) {
  coio::Result<coio::TcpListener<R>> bound = coio::TcpListener<R>::bind(reactor, settings.listen);
  if (!bound) {
    error = bound.error();
    co_return;
  }
  listener.emplace(std::move(*bound));
  shards.front()->serve(*listener, std::move(shards));
}

// Closes the listener on its loop thread (where its reactor registration lives).
template <coio::Reactor R>
coio::Task<void> closeOnLoop(std::optional<coio::TcpListener<R>>& listener) {
  listener.reset();
  co_return;
}

template <coio::Reactor R>
std::vector<const storage::StorageServer<R>*> shardsOf(const std::vector<std::unique_ptr<storage::StorageServer<R>>>& shards) {
  std::vector<const storage::StorageServer<R>*> all;
  for (const auto& s : shards) all.push_back(s.get());
  return all;
}

// Every shard's snapshot, taken from reactor 0 (the caller's thread waits).
template <coio::Reactor R>
std::vector<storage::ShardSnapshot> snapshot(coio::ReactorPool<R>& pool,
                                             const std::vector<std::unique_ptr<storage::StorageServer<R>>>& shards) {
  std::vector<storage::ShardSnapshot> out;
  runOn(pool.reactor(0), [](std::vector<const storage::StorageServer<R>*> all, R& home,
                            std::vector<storage::ShardSnapshot>& into) -> coio::Task<void> {
    into = co_await storage::snapshotShards(std::move(all), home);
  }(shardsOf(shards), pool.reactor(0), out));
  return out;
}

// SIGUSR1: one line of figures, summed over the shards: requests served,
// connections open, read buffers in use out of the pool's, connections
// dropped because the client stopped reading, IOs answered corrupt.
inline void printStats(const std::vector<storage::ShardSnapshot>& shards) {
  const storage::ShardSnapshot total = storage::total(shards);
  std::printf("stats: requests=%llu connections=%zu buffers_in_use=%zu buffers=%zu send_timeouts=%llu "
              "corrupt_ios=%llu\n",
              static_cast<unsigned long long>(total.server.requests), total.server.connections, total.buffersInUse,
              total.buffers, static_cast<unsigned long long>(total.server.sendTimeouts),
              static_cast<unsigned long long>(total.server.corruptIos));
  std::fflush(stdout);
}

// --stall-threshold-ms: one line per stall on stderr (one write: lines of
// several reactors do not mix).
inline void reportStall(std::size_t reactor, std::chrono::milliseconds threshold, const coio::LoopStall& stall) {
  const auto ms = [](std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); };
  const auto at = [](coio::LoopPhase p) { return static_cast<std::size_t>(p); };
  const auto ran = [&](coio::LoopPhase p) { return static_cast<unsigned long long>(stall.ran[at(p)]); };
  std::fprintf(stderr,
               "coio-storage-server: stall: reactor %zu ran a %.1f ms turn (threshold %lld ms), %.1f ms of it in its "
               "%s phase; completions %.1f ms (%llu events), ready %.1f ms (%llu coroutines), timers %.1f ms "
               "(%llu fired)\n",
               reactor, ms(stall.duration), static_cast<long long>(threshold.count()), ms(stall.phases[at(stall.phase)]),
               std::string(coio::toString(stall.phase)).c_str(), ms(stall.phases[at(coio::LoopPhase::completions)]),
               ran(coio::LoopPhase::completions), ms(stall.phases[at(coio::LoopPhase::ready)]),
               ran(coio::LoopPhase::ready), ms(stall.phases[at(coio::LoopPhase::timers)]),
               ran(coio::LoopPhase::timers));
}

// On reactor `index`'s loop thread: the stall report, and loop timing for
// the metrics.
template <coio::Reactor R>
coio::Task<void> watchLoop(R& reactor, std::size_t index, const ServeSettings& settings) {
  if (settings.metrics) reactor.setLoopTiming(true);
  if (settings.stallThreshold.count() > 0) {
    const std::chrono::milliseconds threshold = settings.stallThreshold;
    reactor.setStallHandler(threshold, [index, threshold](const coio::LoopStall& stall) {
      reportStall(index, threshold, stall);
    });
  }
  co_return;
}

// --inject-stall-ms, on SIGUSR2 (debugging): keeps the loop thread busy, as
// a long computation done inline would.
inline coio::Task<void> busyWait(std::chrono::milliseconds duration) {
  const std::chrono::steady_clock::time_point until = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < until) {
  }
  co_return;
}

// The /metrics page, made on reactor 0.
template <coio::Reactor R>
coio::Task<std::string> metricsPage(std::vector<const storage::StorageServer<R>*> shards, R& home) {
  const std::vector<storage::ShardSnapshot> snapshots = co_await storage::snapshotShards(std::move(shards), home);
  co_return storage::renderMetrics(snapshots);
}

// --metrics: binds and starts the responder on reactor 0 (the caller's thread waits).
template <coio::Reactor R>
coio::Result<std::unique_ptr<storage::MetricsHttpServer<R>>> startMetrics(
    coio::ReactorPool<R>& pool, const std::vector<std::unique_ptr<storage::StorageServer<R>>>& shards,
    coio::SocketAddress address) {
  coio::Result<std::unique_ptr<storage::MetricsHttpServer<R>>> out = coio::Errc::closed;
  runOn(pool.reactor(0), [](R& home, std::vector<const storage::StorageServer<R>*> all, coio::SocketAddress at,
                            coio::Result<std::unique_ptr<storage::MetricsHttpServer<R>>>& server) -> coio::Task<void> {
    coio::Result<coio::TcpListener<R>> listener = coio::TcpListener<R>::bind(home, at);
    if (!listener) {
      server = listener.error();
      co_return;
    }
    auto page = [all, &home] { return metricsPage(all, home); };
    server = std::make_unique<storage::MetricsHttpServer<R>>(home, std::move(*listener), std::move(page),
                                                             typename storage::MetricsHttpServer<R>::Options{});
    (*server)->start();
  }(pool.reactor(0), shardsOf(shards), address, out));
  return out;
}

// Takes `routing`'s chain versions on `shard`'s loop thread.
template <coio::Reactor R>
coio::Task<void> applyRouting(storage::StorageServer<R>& shard, storage::ChainTable routing) {
  shard.updateRouting(routing);
  co_return;
}

// Revokes the registration's lease, so that the manager moves the routing
// away at once rather than at the lease's expiry.
template <coio::Reactor R>
coio::Task<void> leaveEtcd(storage::etcd::EtcdClient<R>& client, std::int64_t lease) {
  if (lease == 0) co_return;
  coio::Result<storage::etcd::ResponseHeader> revoked = co_await client.leaseRevoke(lease, std::chrono::seconds(1));
  if (revoked) {
    std::printf("left etcd (lease %lld revoked)\n", static_cast<long long>(lease));
  } else {
    logEtcd("cannot revoke the lease (it expires on its own): " + client.lastError());
  }
}

// --etcd: registers the server and follows its chains' versions, on reactor 0.
template <coio::Reactor R>
void joinEtcd(const ServeSettings& settings, coio::ReactorPool<R>& pool,
              std::vector<std::unique_ptr<storage::StorageServer<R>>>& shards, storage::etcd::EtcdClient<R>& client,
              storage::ServerRecord record, std::int64_t& lease, Background<R>& background) {
  auto apply = [&pool, &shards](const storage::ChainTable& routing) {
    for (std::size_t i = 0; i < shards.size(); ++i) pool.reactor(i).spawn(applyRouting(*shards[i], routing));
  };
  std::printf("  registering in etcd as %s, lease of %llds\n", record.name.c_str(), static_cast<long long>(settings.ttl));
  background.start(storage::registerServer(client, std::move(record), settings.ttl, &lease, logEtcd, background.token()));
  background.start(storage::followRouting(client, std::function<void(const storage::ChainTable&)>(apply), logEtcd,
                                          background.token()));
}

/// Serves on reactors of kind R until SIGINT or SIGTERM (blocked in every
/// thread: `signals`, which this thread sigwaits for); the exit code.
template <coio::Reactor R>
int serveWith(const ServeSettings& settings, const sigset_t& signals) {
  coio::ReactorPool<R> pool(settings.reactors);
  std::vector<std::unique_ptr<storage::StorageServer<R>>> shards;
  int status = 0;
  for (std::size_t i = 0; i < pool.size() && status == 0; ++i) {
    coio::Result<std::unique_ptr<storage::StorageServer<R>>> shard = coio::Errc::closed;
    std::string problem;
    runOn(pool.reactor(i), openShard(pool.reactor(i), settings, shard, problem));
    if (!shard) {
      std::fprintf(stderr, "coio-storage-server: %s\n", problem.c_str());
      status = 1;
    } else {
      shards.push_back(std::move(*shard));
    }
  }
  std::optional<coio::TcpListener<R>> listener;
  if (status == 0) {
    std::vector<storage::StorageServer<R>*> all;
    for (auto& s : shards) all.push_back(s.get());
    std::error_code error;
    runOn(pool.reactor(0), startAccepting(pool.reactor(0), settings, all, listener, error));
    if (error) {
      std::fprintf(stderr, "coio-storage-server: cannot listen on %s: %s\n", settings.listen.toString().c_str(),
                   error.message().c_str());
      status = 1;
    }
  }
  std::unique_ptr<storage::MetricsHttpServer<R>> metrics;
  if (status == 0 && settings.metrics) {
    coio::Result<std::unique_ptr<storage::MetricsHttpServer<R>>> started = startMetrics(pool, shards, *settings.metrics);
    if (started) {
      metrics = std::move(*started);
    } else {
      std::fprintf(stderr, "coio-storage-server: cannot serve --metrics on %s: %s\n",
                   settings.metrics->toString().c_str(), started.error().message().c_str());
      status = 1;
    }
  }
  std::unique_ptr<storage::etcd::EtcdClient<R>> etcd;
  std::int64_t lease = 0;  // the registration's, once granted (reactor 0's thread writes it)
  Background<R> background(pool.reactor(0));
  if (status == 0 && !settings.etcd.empty()) {
    etcd = connectEtcd(pool.reactor(0), settings.etcd);
    if (!etcd) status = 1;
  }
  if (status == 0) {
    for (std::size_t i = 0; i < pool.size(); ++i) runOn(pool.reactor(i), watchLoop(pool.reactor(i), i, settings));
    std::printf("coio-storage-server: %zu target(s), %s, %zu %s reactor(s)\n", settings.targets.size(),
                settings.transport.c_str(), pool.size(), std::string(coio::toString(settings.kind)).c_str());
    for (const storage::TargetSpec& target : settings.targets) {
      const storage::ChunkStoreLayout layout = storage::loadChunkStoreIndex(target.dir)->layout;  // checked
      std::printf("  target %u: %llu chunks of %u bytes from %s, checked in blocks of %u\n", target.id,
                  static_cast<unsigned long long>(layout.chunks), layout.chunkSize, target.dir.c_str(),
                  layout.blockSize);
    }
    const std::string_view crc32c = storage::crc32cImplementation();  // picked (timed) before serving
    std::printf("  block checks: CRC32C by %.*s\n", static_cast<int>(crc32c.size()), crc32c.data());
    std::printf("  %s\n", shards.front()->note().c_str());
    std::printf("  at most %llu connections (fd limit %llu)\n",
                static_cast<unsigned long long>(*settings.maxConnections),
                static_cast<unsigned long long>(settings.fdLimit));
    if (settings.stallThreshold.count() > 0) {
      std::printf("  stalls over %lld ms reported on stderr\n", static_cast<long long>(settings.stallThreshold.count()));
    }
    if (settings.injectStall.count() > 0) {
      std::printf("  debugging: SIGUSR2 stalls each loop for %lld ms\n", static_cast<long long>(settings.injectStall.count()));
    }
    std::printf("listening on %s\n", listener->localAddress()->toString().c_str());
    if (metrics) std::printf("metrics on http://%s/metrics\n", metrics->address()->toString().c_str());
    if (etcd) {
      storage::ServerRecord record{settings.name.empty() ? listener->localAddress()->toString() : settings.name,
                                   *listener->localAddress(), {}};
      for (const storage::TargetSpec& target : settings.targets) record.targets.push_back(target.id);
      joinEtcd(settings, pool, shards, *etcd, std::move(record), lease, background);
    }
    std::fflush(stdout);
    int signal = 0;
    while (sigwait(&signals, &signal) == 0 && (signal == SIGUSR1 || signal == SIGUSR2)) {
      if (signal == SIGUSR1) {
        printStats(snapshot(pool, shards));
      } else {
        for (std::size_t i = 0; i < pool.size(); ++i) pool.reactor(i).spawn(busyWait(settings.injectStall));
      }
    }
    std::printf("%s: stopping\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  }
  // Out of the routing before the drain: clients move to the other replicas meanwhile.
  background.stop();
  if (etcd) {
    runOn(pool.reactor(0), leaveEtcd(*etcd, lease));
    std::fflush(stdout);
    disconnectEtcd(pool.reactor(0), etcd);
  }
  if (metrics) runOn(pool.reactor(0), metrics->shutdown());
  // No more accepting, and the listener closed before the drain: connections
  // made meanwhile are refused at once rather than reset when it ends.
  if (!shards.empty()) runOn(pool.reactor(0), shards.front()->stopAccepting());
  runOn(pool.reactor(0), closeOnLoop(listener));
  // The accepting shard first, so that no connection is handed to a stopped one.
  storage::ServerStats total;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    runOn(pool.reactor(i), shards[i]->shutdown());
    storage::addStats(total, shards[i]->stats());
  }
  pool.stop();
  shards.clear();  // no loop runs now: the Disks may go
  metrics.reset();
  if (status == 0) {
    std::printf("stopped after %llu requests (connections: %llu refused over the limit, %llu cut at the frame "
                "deadline, %llu closed idle)\n",
                static_cast<unsigned long long>(total.requests),
                static_cast<unsigned long long>(total.refusedConnections),
                static_cast<unsigned long long>(total.frameTimeouts),
                static_cast<unsigned long long>(total.idleTimeouts));
  }
  if (total.taskFailures > 0) {  // each told on stderr as it happened
    std::fprintf(stderr, "%llu connection task(s) failed with an exception: a bug in the server\n",
                 static_cast<unsigned long long>(total.taskFailures));
    status = 1;
  }
  return status;
}
}  // namespace storage::cli
