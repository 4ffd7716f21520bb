// coio-storage-server: creates a chunk dataset (init) and serves batched
// reads of it (serve) over TCP or RDMA, one StorageServer per reactor thread.
#include "cluster/chain_table.hpp"
#include "store/chunk_store.hpp"
#include "cluster/cluster_manager.hpp"
#include "programs/cli.hpp"
#include "cluster/cluster_status.hpp"
#include "metrics/metrics_http.hpp"
#include "cluster/routing_json.hpp"
#include "server/server_metrics.hpp"
#include "server/storage_server.hpp"
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/net/tcp_listener.hpp>
#include <coio/reactor/reactor_kind.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr const char* kUsage = R"(usage:
  coio-storage-server init --dir D --chunks N --chunk-size S [--chunks-per-file K] [--block-size 4K]
      Creates a dataset in D (created if missing): N chunks of S bytes (a multiple
      of 4K; suffixes K, M, G), K per data file (default 64), deterministic
      content, and D/index with the CRC32C of each block of each chunk. The
      server checks every block a read covers against it before sending the
      bytes; --block-size (a power of two from 512 to S; --piece-size of the
      server must be a multiple of it) is the unit checked.
  coio-storage-server init --chains FILE --target ID --dir D [--chunks-per-file K] [--block-size 4K]
      Creates target ID's dataset in D for the chain table FILE (CHAINS.md):
      the chunks of its chain, the same bytes on every replica of the chain.
  coio-storage-server serve (--dir D | --target ID=DIR...) [--chains FILE] [--listen 127.0.0.1:9000]
      [--transport tcp|rdma] [--reactors 1] [--reactor uring|epoll] [--max-batch 256]
      [--max-batch-bytes 64M] [--transmit-timeout-ms 10000] [--max-requests 256] [--pool 128M]
      [--piece-size 128K]
      [--buffered] [--frame-timeout-ms 10000] [--idle-timeout-ms 60000] [--send-timeout-ms 10000]
      [--max-connections N] [--tcp-congestion NAME] [--zero-copy-send] [--poison-buffers]
      [--metrics ADDR:PORT] [--stall-threshold-ms N] [--inject-stall-ms N]
      [--rdma-device NAME] [--rdma-writes 256] [--etcd URL[,URL...] [--name NAME] [--ttl 3]]
      Serves D (as target 0), or each --target ID=DIR (repeat it: one dataset
      per target, typically one per disk, several per disk allowed; a request
      names the target of each IO; all targets share each reactor's ring and
      pool), until SIGINT/SIGTERM (requests in flight get up to 5 s to
      finish). SIGUSR1 prints a line of figures: "stats: requests=N
      connections=N buffers_in_use=N buffers=N send_timeouts=N corrupt_ios=N".
      --chains takes each target's chain version from the chain table FILE
      (CHAINS.md): an IO routed with an older one is answered staleRouting
      (PROTOCOL.md); without it no IO is stale.
      --metrics serves GET /metrics on ADDR:PORT (HTTP/1.0; port 0: any, as
      printed): the counters, latency histograms and each reactor's loop
      figures in Prometheus' text format; it also times the loops.
      --stall-threshold-ms logs a line to stderr for each turn of a loop
      that runs longer than N ms (and counts it: coio_loop_stalls_total).
      --inject-stall-ms (debugging only: it stalls the server on purpose)
      makes each reactor's loop busy-wait N ms once per SIGUSR2.
      --pool is the read-buffer pool per reactor, in buffers of --piece-size
      (a multiple of 4K): a larger read is read and sent in pieces of that
      size, each as soon as it is read; --buffered reads through the page
      cache instead of O_DIRECT; --max-requests bounds the requests in flight
      per connection. A frame must arrive whole within --frame-timeout-ms of
      its first byte (an RDMA handshake within it of the accept), a
      connection with nothing in flight is closed after --idle-timeout-ms,
      and one whose sends make no progress (the client stopped reading) is
      dropped within 1.25 x --send-timeout-ms. --max-connections bounds the
      connections (split between the reactors; more are accepted and closed
      at once); the default is 10000, or half of what the fd limit (raised
      to the hard limit at start) leaves, if less. --tcp-congestion sets the
      congestion control of the served connections (default: the system's;
      e.g. cubic: bbr reorders segments over loopback). --zero-copy-send
      sends the data over TCP straight from the read buffers (io_uring
      zero-copy sends, Linux 6.1+, --reactor uring; else it copies, as the
      banner says); a buffer goes back to the pool once the client has
      acknowledged its data. A loss over loopback, where the kernel copies
      to deliver anyway. --poison-buffers (debugging) fills and, under ASan,
      poisons every buffer given back to the pool. RDMA: clients connect
      over TCP to --listen and bring up a queue pair on it; --rdma-device
      picks the device (default: the first with an ACTIVE port),
      --rdma-writes bounds the RDMA WRITEs in flight on it (split between
      the reactors).
      --etcd registers the server in etcd (docs/etcd.md) as --name (default:
      its listen address, as a chain table names it) with its address and
      targets, under a lease of --ttl seconds kept alive while it runs
      (registered again if lost), and follows its chains' versions there;
      while etcd cannot be reached it serves with the versions it has and
      retries. SIGTERM revokes the lease first (its targets go offline at
      once), then drains.
  coio-storage-server mgmtd --etcd URL[,URL...] --id ID [--ttl 3]
      A cluster manager: one of those running leads (a key bound to its
      lease); the leader marks the targets of a server whose registration is
      gone offline (to the end of their chains) and those of a server back
      serving, one transaction per change (CHAINS.md). Runs until SIGTERM.
  coio-storage-server cluster load FILE --etcd URL[,URL...] [--force]
      Puts the chain table FILE (CHAINS.md) into etcd as records; refuses if
      chains are there already, unless --force (replaces them all).
  coio-storage-server cluster status --etcd URL[,URL...]
      Prints the routing in etcd: servers (registered or not), targets and
      chains with their states and versions.
  coio-storage-server routing --chains FILE [--keys]
      Prints the routing of the chain table FILE (CHAINS.md): its servers,
      targets and chains with their states and versions; with --keys, one
      line per record instead, "KEY JSON", as a cluster manager stores them
      (CHAINS.md, "Routing in a cluster manager").
)";

int usage(const char* problem = nullptr) {
  if (problem) std::fprintf(stderr, "coio-storage-server: %s\n", problem);
  std::fputs(kUsage, problem ? stderr : stdout);
  return problem ? 2 : 0;
}

// --name value pairs after the subcommand, in order (an option may repeat:
// --target); nullopt on a malformed line.
using Options = std::vector<std::pair<std::string, std::string>>;
std::optional<Options> parseOptions(int argc, char** argv, int first, std::vector<std::string> flags) {
  Options options;
  for (int i = first; i < argc; ++i) {
    const std::string name = argv[i];
    if (name.rfind("--", 0) != 0) return std::nullopt;
    if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
      options.emplace_back(name, "1");
    } else if (i + 1 < argc) {
      options.emplace_back(name, argv[++i]);
    } else {
      return std::nullopt;
    }
  }
  return options;
}

// init --chains FILE --target ID: the target's share of the table's dataset
// in `layout` (chunks per file kept), or prints why not and returns false.
bool chainLayout(const std::string& chains, std::optional<std::uint32_t> target, storage::ChunkStoreLayout& layout) {
  std::string why;
  coio::Result<storage::ChainTable> table = storage::ChainTable::load(chains, &why);
  if (!table) {
    std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
    return false;
  }
  std::optional<storage::ChunkStoreLayout> shape = table->targetLayout(*target, layout.chunksPerFile);
  if (!shape) {
    std::fprintf(stderr, "coio-storage-server: target %u is in no chain of %s\n", *target, chains.c_str());
    return false;
  }
  layout = *shape;
  return true;
}

int init(const Options& options) {
  storage::ChunkStoreLayout layout;
  layout.chunksPerFile = 64;
  std::string dir, chains;
  std::optional<std::uint32_t> target;
  std::uint32_t blockSize = storage::kDefaultBlockSize;
  for (const auto& [name, value] : options) {
    std::optional<std::uint64_t> id;
    if (name == "--dir") {
      dir = value;
    } else if (name == "--chains") {
      chains = value;
    } else if (name == "--target" && (id = storage::cli::parseCount(value)) && *id <= UINT32_MAX) {
      target = static_cast<std::uint32_t>(*id);
    } else if (name == "--chunks") {
      layout.chunks = storage::cli::parseCount(value).value_or(0);
    } else if (name == "--chunk-size") {
      layout.chunkSize = static_cast<std::uint32_t>(std::min<std::uint64_t>(storage::cli::parseSize(value).value_or(0), UINT32_MAX));
    } else if (name == "--chunks-per-file") {
      layout.chunksPerFile = static_cast<std::uint32_t>(storage::cli::parseCount(value).value_or(0));
    } else if (name == "--block-size") {
      blockSize = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(storage::cli::parseSize(value).value_or(0), UINT32_MAX));
    } else {
      return usage(("unknown option " + name + " for init").c_str());
    }
  }
  if (layout.chunksPerFile == 0) return usage("--chunks-per-file must be at least 1");
  if (!chains.empty() || target) {
    if (chains.empty() || !target || dir.empty() || layout.chunks != 0 || layout.chunkSize != 0) {
      return usage("init --chains FILE takes --target ID and --dir D (the table gives the chunks and their size)");
    }
    if (!chainLayout(chains, target, layout)) return 1;
  }
  if (dir.empty() || layout.chunks == 0 || layout.chunkSize == 0) return usage("init needs --dir, --chunks and --chunk-size");
  if (layout.chunkSize % 4096 != 0) return usage("--chunk-size must be a multiple of 4K (O_DIRECT)");
  layout.blockSize = blockSize;
  if (!storage::validBlockSize(layout.chunkSize, layout.blockSize)) {
    return usage("--block-size must be a power of two from 512 bytes to the chunk size");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "coio-storage-server: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  coio::Result<storage::ChunkStoreIndex> index = storage::createChunkStore(dir, layout);
  if (!index) {
    std::fprintf(stderr, "coio-storage-server: cannot write the dataset in %s: %s\n", dir.c_str(),
                 index.error().message().c_str());
    return 1;
  }
  std::printf("created %s: %llu chunks of %u bytes in %u data file(s), a CRC32C per %u bytes", dir.c_str(),
              static_cast<unsigned long long>(layout.chunks), layout.chunkSize, layout.files(), layout.blockSize);
  if (target) {
    std::printf(", target %u: chunk ids %llu, %llu, ...", *target, static_cast<unsigned long long>(layout.chunkAt(0)),
                static_cast<unsigned long long>(layout.chunkAt(1)));
  }
  std::printf("\n");
  return 0;
}

struct ServeSettings {
  std::vector<storage::TargetSpec> targets;
  coio::SocketAddress listen;
  std::size_t reactors = 1;
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

// Runs `task` on `reactor`'s loop thread and waits for it (from another thread).
template <coio::Reactor R>
void runOn(R& reactor, coio::Task<void> task) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  reactor.spawn([](coio::Task<void> t, std::promise<void>& signal) -> coio::Task<void> {
    co_await std::move(t);
    signal.set_value();
  }(std::move(task), done));
  finished.get();
}

// Coroutines run in the background on one reactor's loop thread, each
// given the same stop token; stop() (from another thread) requests the stop
// on that loop thread and waits for every one to return.
template <coio::Reactor R>
class Background {
 public:
  explicit Background(R& reactor) : reactor_(reactor) {}
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  ~Background() { stop(); }

  void start(coio::Task<void> task) {
    done_.emplace_back();
    reactor_.spawn([](coio::Task<void> t, std::promise<void>& signal) -> coio::Task<void> {
      co_await std::move(t);
      signal.set_value();
    }(std::move(task), done_.back()));
  }
  std::stop_token token() const noexcept { return source_.get_token(); }
  void stop() {
    if (done_.empty()) return;
    runOn(reactor_, [](std::stop_source& source) -> coio::Task<void> {
      source.request_stop();  // here: the stop callbacks touch the loop's operations
      co_return;
    }(source_));
    for (std::promise<void>& d : done_) d.get_future().get();
    done_.clear();
  }

 private:
  R& reactor_;
  std::stop_source source_;
  std::list<std::promise<void>> done_;  // a list: the coroutines hold references
};

// --etcd URL[,URL...]: the endpoints.
std::vector<std::string> splitEndpoints(const std::string& value) {
  std::vector<std::string> urls;
  for (std::size_t at = 0; at <= value.size();) {
    const std::size_t comma = std::min(value.find(',', at), value.size());
    if (comma > at) urls.push_back(value.substr(at, comma - at));
    at = comma + 1;
  }
  return urls;
}

void logEtcd(const std::string& line) { std::fprintf(stderr, "coio-storage-server: etcd: %s\n", line.c_str()); }

// An etcd client made on `reactor`'s loop thread (where it lives), or
// prints why not and returns null.
template <coio::Reactor R>
std::unique_ptr<storage::etcd::EtcdClient<R>> connectEtcd(R& reactor, const std::vector<std::string>& endpoints) {
  coio::Result<std::unique_ptr<storage::etcd::EtcdClient<R>>> client = coio::Errc::closed;
  runOn(reactor, [](R& home, std::vector<std::string> urls,
                    coio::Result<std::unique_ptr<storage::etcd::EtcdClient<R>>>& out) -> coio::Task<void> {
    storage::etcd::EtcdOptions options;
    options.endpoints = std::move(urls);
    options.log = logEtcd;
    out = storage::etcd::EtcdClient<R>::create(home, std::move(options));
    co_return;
  }(reactor, endpoints, client));
  if (!client) {
    std::fprintf(stderr, "coio-storage-server: --etcd: bad endpoint list (http://IP:PORT[,...]): %s\n",
                 client.error().message().c_str());
    return nullptr;
  }
  return std::move(*client);
}

// Destroys `client` on its loop thread.
template <coio::Reactor R>
void disconnectEtcd(R& reactor, std::unique_ptr<storage::etcd::EtcdClient<R>>& client) {
  runOn(reactor, [](std::unique_ptr<storage::etcd::EtcdClient<R>>& c) -> coio::Task<void> {
    c.reset();
    co_return;
  }(client));
}

// Why a target's index did not load (`why`: loadChunkStoreIndex's).
std::string describeIndexError(const std::string& dir, std::error_code error, const std::string& why) {
  if (error == std::errc::no_such_file_or_directory) {
    return dir + "/index not found: " + dir + " is not a dataset (create one with: coio-storage-server init --dir " +
           dir + " --chunks N --chunk-size S)";
  }
  if (!why.empty()) return why;
  return "cannot read " + dir + "/index: " + error.message();
}

// Checks every target's directory and index before any shard opens them
// (so that a problem names its target), and that a piece holds whole blocks
// of each; returns the data files in all, or prints the problem and returns
// nullopt.
std::optional<std::uint64_t> checkTargets(const ServeSettings& settings) {
  std::uint64_t files = 0;
  for (const storage::TargetSpec& target : settings.targets) {
    if (!std::filesystem::is_directory(target.dir)) {
      std::fprintf(stderr, "coio-storage-server: target %u: no such directory: %s (create a dataset with: "
                   "coio-storage-server init --dir %s --chunks N --chunk-size S)\n", target.id, target.dir.c_str(),
                   target.dir.c_str());
      return std::nullopt;
    }
    std::string why;
    coio::Result<storage::ChunkStoreIndex> index = storage::loadChunkStoreIndex(target.dir, &why);
    if (!index) {
      std::fprintf(stderr, "coio-storage-server: target %u: %s\n", target.id,
                   describeIndexError(target.dir, index.error(), why).c_str());
      return std::nullopt;
    }
    if (index->layout.chunkSize % 4096 != 0) {
      std::fprintf(stderr, "coio-storage-server: target %u: chunks of %u bytes, not a multiple of 4K (O_DIRECT): "
                   "recreate %s with init\n", target.id, index->layout.chunkSize, target.dir.c_str());
      return std::nullopt;
    }
    if (settings.server.pieceSize % index->layout.blockSize != 0) {
      std::fprintf(stderr, "coio-storage-server: target %u: its blocks of %u bytes do not fit whole in a piece of "
                   "--piece-size %zu: give a multiple of %u\n", target.id, index->layout.blockSize,
                   settings.server.pieceSize, index->layout.blockSize);
      return std::nullopt;
    }
    files += index->layout.files();
  }
  return files;
}

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

// Raises the fd limit and sets the connection limit: the default from it,
// a warning if the one given may not fit. Splits it between the reactors.
void limitConnections(ServeSettings& settings, std::uint64_t files) {
  settings.fdLimit = storage::cli::raiseFdLimit();
  // Each reactor opens every target's data files, and has its ring (or epoll) and wake-up fds.
  const std::uint64_t reserved = settings.reactors * (files + 8) + 64;
  const std::uint64_t perConnection = storage::cli::fdsPerConnection(settings.transport == "rdma");
  if (!settings.maxConnections) {
    settings.maxConnections = storage::cli::defaultMaxConnections(settings.fdLimit, reserved, perConnection);
  } else if (settings.fdLimit < reserved + *settings.maxConnections * perConnection) {
    std::fprintf(stderr,
                 "coio-storage-server: warning: --max-connections %llu may exceed the fd limit (%llu); accepts "
                 "then fail with EMFILE and are retried every 10 ms\n",
                 static_cast<unsigned long long>(*settings.maxConnections),
                 static_cast<unsigned long long>(settings.fdLimit));
  }
  settings.server.maxConnections = (*settings.maxConnections + settings.reactors - 1) / settings.reactors;
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
void printStats(const std::vector<storage::ShardSnapshot>& shards) {
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
void reportStall(std::size_t reactor, std::chrono::milliseconds threshold, const coio::LoopStall& stall) {
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
coio::Task<void> busyWait(std::chrono::milliseconds duration) {
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
  // The accepting shard first, so that no connection is handed to a stopped one.
  storage::ServerStats total;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    runOn(pool.reactor(i), shards[i]->shutdown());
    storage::addStats(total, shards[i]->stats());
  }
  pool.stop();
  shards.clear();  // no loop runs now: the Disks may go
  metrics.reset();
  listener.reset();
  if (status == 0) {
    std::printf("stopped after %llu requests (connections: %llu refused over the limit, %llu cut at the frame "
                "deadline, %llu closed idle)\n",
                static_cast<unsigned long long>(total.requests),
                static_cast<unsigned long long>(total.refusedConnections),
                static_cast<unsigned long long>(total.frameTimeouts),
                static_cast<unsigned long long>(total.idleTimeouts));
  }
  return status;
}

constexpr std::uint64_t kDayMs = 24 * 3600 * 1000;  // the longest deadline taken: no clock arithmetic overflows

// --target ID=DIR: the target, or nullopt.
std::optional<storage::TargetSpec> parseTarget(const std::string& value) {
  const std::size_t equals = value.find('=');
  if (equals == std::string::npos || equals + 1 == value.size()) return std::nullopt;
  const std::optional<std::uint64_t> id = storage::cli::parseCount(std::string_view(value).substr(0, equals));
  if (!id || *id > UINT32_MAX) return std::nullopt;
  return storage::TargetSpec{static_cast<std::uint32_t>(*id), value.substr(equals + 1)};
}

int serve(const Options& options) {
  ServeSettings settings;
  std::string listen = "127.0.0.1:9000", transport = "tcp";
  for (const auto& [name, value] : options) {
    std::optional<std::uint64_t> number;
    std::optional<storage::TargetSpec> target;
    if (name == "--dir") {
      settings.targets.push_back({0, value});
    } else if (name == "--target" && (target = parseTarget(value))) {
      settings.targets.push_back(*target);
    } else if (name == "--chains") {
      std::string why;
      coio::Result<storage::ChainTable> table = storage::ChainTable::load(value, &why);
      if (!table) {
        std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
        return 1;
      }
      settings.routing = std::move(*table);
    } else if (name == "--listen") {
      listen = value;
    } else if (name == "--transport") {
      transport = value;
    } else if (name == "--reactors" && (number = storage::cli::parseCount(value)) && *number > 0 && *number <= 256) {
      settings.reactors = *number;
    } else if (name == "--reactor" && coio::parseReactorKind(value)) {
      settings.kind = *coio::parseReactorKind(value);
    } else if (name == "--max-batch" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= storage::proto::kMaxIosPerFrame) {
      settings.server.maxBatch = static_cast<std::uint32_t>(*number);
    } else if (name == "--max-batch-bytes" && (number = storage::cli::parseSize(value)) && *number > 0) {
      settings.server.maxBatchBytes = *number;
    } else if (name == "--transmit-timeout-ms" && (number = storage::cli::parseCount(value)) && *number > 0) {
      settings.server.transmitTimeout = std::chrono::milliseconds(*number);
    } else if (name == "--pool" && (number = storage::cli::parseSize(value)) && *number > 0) {
      settings.server.poolBytes = *number;
    } else if (name == "--piece-size" && (number = storage::cli::parseSize(value)) && *number > 0 &&
               *number % 4096 == 0 && *number <= (16u << 20)) {
      settings.server.pieceSize = *number;
    } else if (name == "--max-requests" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= 65536) {
      settings.server.maxRequestsPerConnection = static_cast<std::uint32_t>(*number);
    } else if (name == "--frame-timeout-ms" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= kDayMs) {
      settings.server.frameTimeout = std::chrono::milliseconds(*number);
    } else if (name == "--send-timeout-ms" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= kDayMs) {
      settings.server.sendTimeout = std::chrono::milliseconds(*number);
    } else if (name == "--idle-timeout-ms" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= kDayMs) {
      settings.server.idleTimeout = std::chrono::milliseconds(*number);
    } else if (name == "--max-connections" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= (1u << 24)) {
      settings.maxConnections = *number;
    } else if (name == "--tcp-congestion" && !value.empty()) {
      settings.server.tcpCongestion = value;
    } else if (name == "--buffered") {
      settings.server.directIo = false;
    } else if (name == "--zero-copy-send") {
      settings.server.zeroCopySend = true;
    } else if (name == "--poison-buffers") {
      settings.server.poisonBuffers = true;
    } else if (name == "--metrics") {
      const coio::Result<coio::SocketAddress> at = coio::SocketAddress::parse(value);
      if (!at) return usage("--metrics takes host:port, e.g. 127.0.0.1:9100 (port 0: any)");
      settings.metrics = *at;
    } else if (name == "--stall-threshold-ms" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= kDayMs) {
      settings.stallThreshold = std::chrono::milliseconds(*number);
    } else if (name == "--inject-stall-ms" && (number = storage::cli::parseCount(value)) && *number > 0 &&
               *number <= 60000) {
      settings.injectStall = std::chrono::milliseconds(*number);
    } else if (name == "--etcd" && !splitEndpoints(value).empty()) {
      settings.etcd = splitEndpoints(value);
    } else if (name == "--name" && !value.empty()) {
      settings.name = value;
    } else if (name == "--ttl" && (number = storage::cli::parseCount(value)) && *number > 0 && *number <= 3600) {
      settings.ttl = static_cast<std::int64_t>(*number);
#if COIO_STORAGE_RDMA
    } else if (name == "--rdma-device") {
      settings.rdmaDevice = value;
    } else if (name == "--rdma-writes" && (number = storage::cli::parseCount(value)) && *number > 0) {
      settings.rdmaWrites = *number;
#endif
    } else {
      return usage(("bad option for serve: " + name + (value == "1" ? "" : " " + value)).c_str());
    }
  }
  if (settings.targets.empty()) return usage("serve needs --dir D or --target ID=DIR");
  if (settings.etcd.empty() && !settings.name.empty()) return usage("--name is the server's name in etcd: it needs --etcd");
  for (std::size_t i = 0; i < settings.targets.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (settings.targets[i].id == settings.targets[j].id) {
        return usage(("target " + std::to_string(settings.targets[i].id) + " given twice (--dir D is target 0)").c_str());
      }
    }
  }
  if (settings.server.poolBytes < settings.server.pieceSize) return usage("--pool must hold one --piece-size buffer");
  if (transport != "tcp" && transport != "rdma") return usage("--transport is tcp or rdma");
  settings.transport = transport;
  coio::Result<coio::SocketAddress> address = coio::SocketAddress::parse(listen);
  if (!address) return usage("--listen takes host:port, e.g. 127.0.0.1:9000 or [::1]:9000");
  settings.listen = *address;
  const std::optional<std::uint64_t> files = checkTargets(settings);
  if (!files) return 1;
  if (transport == "rdma" && !storage::cli::openRdmaDevice("coio-storage-server", settings.rdmaDevice, settings)) {
    return 1;
  }
  if (!settings.server.tcpCongestion.empty()) {
    const std::string& cc = settings.server.tcpCongestion;
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool taken = probe >= 0 && ::setsockopt(probe, IPPROTO_TCP, TCP_CONGESTION, cc.data(), cc.size()) == 0;
    const int error = errno;
    if (probe >= 0) ::close(probe);
    if (!taken) {
      std::fprintf(stderr, "coio-storage-server: --tcp-congestion %s: %s (available: see "
                   "/proc/sys/net/ipv4/tcp_available_congestion_control)\n", cc.c_str(), std::strerror(error));
      return 1;
    }
  }
  limitConnections(settings, *files);
  std::string why;
  if (const coio::ReactorKind usable = coio::usableReactorKind(settings.kind, &why); usable != settings.kind) {
    std::fprintf(stderr, "coio-storage-server: %s; using epoll\n", why.c_str());
    settings.kind = usable;
  }
  // Blocked in every thread (the reactor threads inherit the mask); the main thread sigwaits.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  if (settings.injectStall.count() > 0) sigaddset(&signals, SIGUSR2);  // else its default: it ends the process
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (settings.kind == coio::ReactorKind::uring) return serveWith<coio::UringReactor>(settings, signals);
  return serveWith<coio::EpollReactor>(settings, signals);
}

}  // namespace

// routing --chains FILE [--keys]: the table as people or a cluster manager read it.
int routing(const Options& options) {
  std::string chains;
  bool keys = false;
  for (const auto& [name, value] : options) {
    if (name == "--chains") {
      chains = value;
    } else if (name == "--keys") {
      keys = true;
    } else {
      return usage(("unknown option " + name + " for routing").c_str());
    }
  }
  if (chains.empty()) return usage("routing needs --chains FILE");
  std::string why;
  const coio::Result<storage::ChainTable> table = storage::ChainTable::load(chains, &why);
  if (!table) {
    std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
    return 1;
  }
  if (!keys) {
    std::fputs(storage::clusterStatus(*table).c_str(), stdout);
    return 0;
  }
  const storage::RoutingRecords records = table->records();
  std::printf("%s %s\n", storage::datasetKey().c_str(), storage::toJson(records.dataset).c_str());
  for (const storage::ServerRecord& server : records.servers) {
    std::printf("%s %s\n", storage::serverKey(server.name).c_str(), storage::toJson(server).c_str());
  }
  for (const storage::ChainRecord& chain : records.chains) {
    std::printf("%s %s\n", storage::chainKey(chain.id).c_str(), storage::toJson(chain).c_str());
  }
  return 0;
}

// mgmtd --etcd URL --id ID [--ttl S]: a cluster manager until SIGINT/SIGTERM.
int mgmtd(const Options& options) {
  std::vector<std::string> endpoints;
  std::string id;
  std::int64_t ttl = 3;
  for (const auto& [name, value] : options) {
    std::optional<std::uint64_t> number;
    if (name == "--etcd" && !splitEndpoints(value).empty()) {
      endpoints = splitEndpoints(value);
    } else if (name == "--id" && !value.empty()) {
      id = value;
    } else if (name == "--ttl" && (number = storage::cli::parseCount(value)) && *number > 0 && *number <= 3600) {
      ttl = static_cast<std::int64_t>(*number);
    } else {
      return usage(("bad option for mgmtd: " + name + " " + value).c_str());
    }
  }
  if (endpoints.empty() || id.empty()) return usage("mgmtd needs --etcd URL and --id ID");
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  coio::ReactorPool<coio::EpollReactor> pool(1);
  std::unique_ptr<storage::etcd::EtcdClient<coio::EpollReactor>> client = connectEtcd(pool.reactor(0), endpoints);
  if (!client) return 1;
  storage::ClusterManager<coio::EpollReactor> manager(*client, id, ttl, [](const std::string& line) {
    std::printf("mgmtd %s\n", line.c_str());
    std::fflush(stdout);
  });
  {
    Background<coio::EpollReactor> background(pool.reactor(0));
    background.start(manager.run(background.token()));
    std::printf("mgmtd %s: managing the cluster in etcd (lease of %llds)\n", id.c_str(), static_cast<long long>(ttl));
    std::fflush(stdout);
    int signal = 0;
    sigwait(&signals, &signal);
  }  // the manager stops: it revokes its lease, so that another leads at once
  disconnectEtcd(pool.reactor(0), client);
  pool.stop();
  std::printf("mgmtd %s: stopped\n", id.c_str());
  return 0;
}

// cluster load FILE | cluster status, against --etcd: one call on an epoll reactor.
int cluster(int argc, char** argv) {
  const std::string_view sub = argc > 2 ? argv[2] : "";
  const bool load = sub == "load";
  if (!load && sub != "status") return usage("cluster takes load FILE or status");
  if (load && (argc < 4 || std::string_view(argv[3]).rfind("--", 0) == 0)) return usage("cluster load needs FILE");
  const auto options = parseOptions(argc, argv, load ? 4 : 3, {"--force"});
  if (!options) return usage("options are --name value pairs");
  std::vector<std::string> endpoints;
  bool force = false;
  for (const auto& [name, value] : *options) {
    if (name == "--etcd" && !splitEndpoints(value).empty()) {
      endpoints = splitEndpoints(value);
    } else if (name == "--force" && load) {
      force = true;
    } else {
      return usage(("bad option for cluster " + std::string(sub) + ": " + name).c_str());
    }
  }
  if (endpoints.empty()) return usage("cluster needs --etcd URL");
  std::optional<storage::ChainTable> table;
  if (load) {
    std::string why;
    coio::Result<storage::ChainTable> loaded = storage::ChainTable::load(argv[3], &why);
    if (!loaded) {
      std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
      return 1;
    }
    table = std::move(*loaded);
  }
  coio::ReactorPool<coio::EpollReactor> pool(1);
  std::unique_ptr<storage::etcd::EtcdClient<coio::EpollReactor>> client = connectEtcd(pool.reactor(0), endpoints);
  if (!client) return 1;
  int status = 0;
  runOn(pool.reactor(0), [](storage::etcd::EtcdClient<coio::EpollReactor>& etcd, const std::optional<storage::ChainTable>& routing,
                            bool overwrite, int& result) -> coio::Task<void> {
    if (routing) {
      coio::Result<std::int64_t> done = co_await storage::loadRouting(etcd, *routing, overwrite);
      if (done) {
        std::printf("loaded %zu chains and %zu servers at revision %lld\n", routing->chains().size(),
                    routing->servers().size(), static_cast<long long>(*done));
      } else if (done.error() == std::errc::file_exists) {
        std::fprintf(stderr, "coio-storage-server: etcd holds chains already (cluster status shows them); "
                     "--force replaces them\n");
        result = 1;
      } else {
        std::fprintf(stderr, "coio-storage-server: cannot write to etcd: %s\n", etcd.lastError().c_str());
        result = 1;
      }
      co_return;
    }
    std::string why;
    coio::Result<storage::StoredRouting> stored = co_await storage::readRouting(etcd, &why);
    coio::Result<storage::ChainTable> assembled =
        stored ? storage::ChainTable::assemble(stored->records, &why) : coio::Result<storage::ChainTable>(stored.error());
    if (!assembled) {
      std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
      result = 1;
      co_return;
    }
    std::fputs(storage::clusterStatus(*assembled).c_str(), stdout);
    std::string live;
    for (const std::string& name : stored->live) live += " " + name;
    std::printf("\nregistered:%s\nleader lease: %s\n", live.empty() ? " none" : live.c_str(),
                stored->leaderLease == 0 ? "none (no mgmtd leads)" : std::to_string(stored->leaderLease).c_str());
  }(*client, table, force, status));
  disconnectEtcd(pool.reactor(0), client);
  pool.stop();
  return status;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage("missing command: init, serve, mgmtd, cluster or routing");
  const std::string_view command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") return usage();
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--help") return usage();
  }
  if (command == "cluster") return cluster(argc, argv);
  const auto options = parseOptions(argc, argv, 2, {"--buffered", "--zero-copy-send", "--poison-buffers", "--keys"});
  if (!options) return usage("options are --name value pairs");
  if (command == "init") return init(*options);
  if (command == "serve") return serve(*options);
  if (command == "routing") return routing(*options);
  if (command == "mgmtd") return mgmtd(*options);
  return usage(("unknown command " + std::string(command)).c_str());
}
