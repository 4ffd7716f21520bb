// coio-storage-server serve: its options, and the checks made before any
// shard opens the targets (serving.hpp serves).
#include "cluster/chain_table.hpp"
#include "programs/cli.hpp"
#include "programs/server/commands.hpp"
#include "programs/server/serving.hpp"
#include "protocol/protocol.hpp"
#include "store/chunk_store.hpp"

#include <coio/net/socket_address.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace storage::cli {
namespace {

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

// Raises the fd limit and sets the connection limit: the default from it,
// a warning if the one given may not fit. Splits it between the reactors.
void limitConnections(ServeSettings& settings, std::uint64_t files) {
  settings.fdLimit = storage::cli::raiseFdLimit();
  // Each reactor opens every target's data files, and has its ring (or epoll) and wake-up fds; one
  // that may splice, a pipe (2 fds) per pool buffer at most.
  const bool splices = settings.transport == "tcp" && settings.server.dataPath != storage::DataPath::copy;
  const std::uint64_t pipeFds = splices ? 2 * (settings.server.poolBytes / settings.server.pieceSize) : 0;
  const std::uint64_t reserved = settings.reactors * (files + 8 + pipeFds) + 64;
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
// --data-path's value, or nullopt.
std::optional<storage::DataPath> parseDataPath(std::string_view value) {
  if (value == "auto") return storage::DataPath::automatic;
  if (value == "splice") return storage::DataPath::splice;
  if (value == "copy") return storage::DataPath::copy;
  return std::nullopt;
}

// --target ID=DIR: the target, or nullopt.
std::optional<TargetSpec> parseTarget(const std::string& value) {
  const std::size_t equals = value.find('=');
  if (equals == std::string::npos || equals + 1 == value.size()) return std::nullopt;
  const std::optional<std::uint64_t> id = parseCount(std::string_view(value).substr(0, equals));
  if (!id || *id > UINT32_MAX) return std::nullopt;
  return TargetSpec{static_cast<std::uint32_t>(*id), value.substr(equals + 1)};
}

// What the options give, before the checks that need them all.
struct ServeCommandLine {
  ServeSettings settings;
  std::string listen = "127.0.0.1:9000";
  std::string chains;
};

int serve(ServeCommandLine& line) {
  ServeSettings& settings = line.settings;
  const auto problem = [](const std::string& what) { return usageError(kServerProgram, what); };
  if (settings.targets.empty()) return problem("serve needs --dir D or --target ID=DIR");
  if (settings.etcd.empty() && !settings.name.empty()) return problem("--name is the server's name in etcd: it needs --etcd");
  for (std::size_t i = 0; i < settings.targets.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (settings.targets[i].id == settings.targets[j].id) {
        return problem("target " + std::to_string(settings.targets[i].id) + " given twice (--dir D is target 0)");
      }
    }
  }
  if (settings.server.poolBytes < settings.server.pieceSize) return problem("--pool must hold one --piece-size buffer");
  if (settings.server.splicePieceSize % settings.server.pieceSize != 0) {
    return problem("--splice-piece-size must be a multiple of --piece-size");
  }
  coio::Result<coio::SocketAddress> address = coio::SocketAddress::parse(line.listen);
  if (!address) return problem("--listen takes host:port, e.g. 127.0.0.1:9000 or [::1]:9000");
  settings.listen = *address;
  if (!line.chains.empty()) {
    std::string why;
    coio::Result<ChainTable> table = ChainTable::load(line.chains, &why);
    if (!table) {
      std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
      return 1;
    }
    settings.routing = std::move(*table);
  }
  const std::optional<std::uint64_t> files = checkTargets(settings);
  if (!files) return 1;
  if (settings.transport == "rdma" && !openRdmaDevice(kServerProgram, settings.rdmaDevice, settings)) return 1;
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

// A duration option in milliseconds, from 1 to `max`.
CLI::Option* addMilliseconds(CLI::App& command, const std::string& name, std::chrono::steady_clock::duration& into,
                             std::uint64_t max, const std::string& help) {
  return command
      .add_option_function<std::uint64_t>(
          name, [&into](std::uint64_t ms) { into = std::chrono::milliseconds(ms); }, help)
      ->transform(countIn(1, max));
}

}  // namespace

Command addServe(CLI::App& program) {
  auto line = std::make_shared<ServeCommandLine>();
  ServeSettings& s = line->settings;
  ServerOptions& server = s.server;
  CLI::App* sub = program.add_subcommand("serve", "Serves batched reads of its targets until SIGINT/SIGTERM.");
  sub->footer(
      "Serves D (as target 0), or each --target ID=DIR (repeat it: one dataset per target, typically\n"
      "one per disk, several per disk allowed; a request names the target of each IO; all targets\n"
      "share each reactor's ring and pool), until SIGINT/SIGTERM (requests in flight get up to 5 s to\n"
      "finish). SIGUSR1 prints a line of figures, summed over the reactors: \"stats: requests=N\n"
      "connections=N buffers_in_use=N buffers=N send_timeouts=N corrupt_ios=N\": BatchReadRequests\n"
      "received, connections serving now (past the transport's handshake, not yet closed; those over\n"
      "--max-connections never are), read buffers in use and in the pools, connections dropped because\n"
      "the client stopped reading, IOs answered corrupt.\n"
      "--metrics serves GET /metrics on ADDR:PORT (HTTP/1.0; port 0: any, as printed): the counters,\n"
      "latency histograms and each reactor's loop figures in Prometheus' text format; it also times\n"
      "the loops. A frame must arrive whole within --frame-timeout-ms of its first byte (an RDMA\n"
      "handshake within it of the accept), a connection with nothing in flight is closed after\n"
      "--idle-timeout-ms, and one whose sends make no progress (the client stopped reading) is\n"
      "dropped within 1.25 x --send-timeout-ms. --max-connections is split between the reactors;\n"
      "more are accepted and closed at once; the default is 10000, or half of what the fd limit\n"
      "(raised to the hard limit at start) leaves, if less. RDMA: clients connect over TCP to\n"
      "--listen and bring up a queue pair on it. With --etcd, SIGTERM revokes the lease first (its\n"
      "targets go offline at once), then drains; while etcd cannot be reached it serves with the\n"
      "versions it has and retries.");
  sub->add_option_function<std::string>(
         "--dir", [&s](const std::string& dir) { s.targets.push_back({0, dir}); }, "serve D as target 0")
      ->check(nonEmpty())
      ->trigger_on_parse();
  sub->add_option_function<std::string>(
         "--target", [&s](const std::string& value) { s.targets.push_back(*parseTarget(value)); },
         "serve DIR as target ID (ID=DIR; repeat it)")
      ->check(CLI::Validator(
          [](std::string& value) { return parseTarget(value) ? std::string() : value + " is not ID=DIR"; },
          "ID=DIR"))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->trigger_on_parse();
  sub->add_option("--chains", line->chains,
                  "the chain table FILE (CHAINS.md) its targets belong to; a file gives every chain version 1, so "
                  "no IO is stale until a cluster manager changes a version (--etcd: an IO routed with an older "
                  "one is then answered staleRouting)");
  sub->add_option("--listen", line->listen, "host:port")->capture_default_str();
  sub->add_option("--transport", s.transport, "tcp or rdma")
      ->check(CLI::IsMember({"tcp", "rdma"}))
      ->capture_default_str();
  s.reactors = std::min<std::size_t>(usableCpus(), 256);
  sub->add_option("--reactors", s.reactors,
                  "reactor threads, one shard each, each with its own --pool (default: the CPUs this process may "
                  "run on)")
      ->transform(countIn(1, 256))
      ->capture_default_str();
  sub->add_option_function<std::string>(
         "--reactor", [&s](const std::string& kind) { s.kind = *coio::parseReactorKind(kind); }, "uring or epoll")
      ->check(CLI::Validator(
          [](std::string& kind) { return coio::parseReactorKind(kind) ? std::string() : kind + " is not uring or epoll"; },
          "uring|epoll"))
      ->default_str("uring");
  sub->add_option("--max-batch", server.maxBatch, "IOs per batch")
      ->transform(countIn(1, proto::kMaxIosPerFrame))
      ->capture_default_str();
  sub->add_option("--max-batch-bytes", server.maxBatchBytes, "requested bytes per batch")
      ->transform(sizeIn(1, UINT64_MAX))
      ->default_str("64M");
  addMilliseconds(*sub, "--transmit-timeout-ms", server.transmitTimeout, UINT64_MAX,
                  "how long a request waits for its TransmitGrant")
      ->default_str("10000");
  sub->add_option("--max-requests", server.maxRequestsPerConnection, "requests in flight per connection")
      ->transform(countIn(1, 65536))
      ->capture_default_str();
  sub->add_option("--pool", server.poolBytes, "the read-buffer pool per reactor, in buffers of --piece-size")
      ->transform(sizeIn(1, UINT64_MAX))
      ->default_str("128M");
  sub->add_option("--piece-size", server.pieceSize,
                  "one pool buffer: a larger read is read and sent in pieces of that size, each as soon as it is read")
      ->transform(sizeIn(4096, 16u << 20, 4096))
      ->default_str("128K");
  sub->add_flag_callback("--buffered", [&server] { server.directIo = false; },
                         "read through the page cache instead of O_DIRECT");
  addMilliseconds(*sub, "--frame-timeout-ms", server.frameTimeout, kDayMs, "how long a frame may take to arrive")
      ->default_str("10000");
  addMilliseconds(*sub, "--idle-timeout-ms", server.idleTimeout, kDayMs,
                  "how long a connection may have nothing in flight")
      ->default_str("60000");
  addMilliseconds(*sub, "--send-timeout-ms", server.sendTimeout, kDayMs,
                  "how long a connection's sends may make no progress")
      ->default_str("10000");
  sub->add_option_function<std::uint64_t>(
         "--max-connections", [&s](std::uint64_t n) { s.maxConnections = n; }, "connections served at once")
      ->transform(countIn(1, 1u << 24));
  sub->add_option("--tcp-congestion", server.tcpCongestion,
                  "the congestion control of the served connections (default: the system's; e.g. cubic)")
      ->check(nonEmpty());
  sub->add_option_function<std::string>(
         "--data-path", [&server](const std::string& path) { server.dataPath = *parseDataPath(path); },
         "how TCP data of a target read through the page cache (--buffered, or a file system without O_DIRECT) "
         "leaves: splice (file -> pipe -> socket, no copy in the server; for requests that ask for CRCs, which the "
         "client then checks for the blocks the server does not see), copy (read into the pool, checked, sent), "
         "auto (splice requests whose IOs are all 64K or more, copy the rest). On hot data (in the page cache) splice "
         "spends a third to a half of copy's server CPU; cold data reads best with O_DIRECT, the default "
         "(docs/benchmarks.md, hot data)")
      ->check(CLI::Validator(
          [](std::string& path) { return parseDataPath(path) ? std::string() : path + " is not auto, splice or copy"; },
          "auto|splice|copy"))
      ->default_str("auto");
  sub->add_option("--splice-piece-size", server.splicePieceSize,
                  "a spliced request's pieces, a pipe each (a multiple of --piece-size; over 1M, fs.pipe-max-size, "
                  "needs CAP_SYS_RESOURCE)")
      ->transform(sizeIn(4096, 1u << 30, 4096))
      ->default_str("1M");
  sub->add_flag("--zero-copy-send", server.zeroCopySend,
                "send the data over TCP straight from the read buffers (io_uring zero-copy sends, Linux 6.1+; "
                "else it copies, as the banner says)");
  sub->add_flag("--poison-buffers", server.poisonBuffers,
                "debugging: fill and, under ASan, poison every buffer given back to the pool");
  sub->add_option_function<std::string>(
         "--metrics", [&s](const std::string& at) { s.metrics = *coio::SocketAddress::parse(at); },
         "serve GET /metrics on ADDR:PORT")
      ->check(CLI::Validator(
          [](std::string& at) {
            return coio::SocketAddress::parse(at) ? std::string()
                                                  : std::string("takes host:port, e.g. 127.0.0.1:9100 (port 0: any)");
          },
          "ADDR:PORT"));
  sub->add_option_function<std::uint64_t>(
         "--stall-threshold-ms", [&s](std::uint64_t ms) { s.stallThreshold = std::chrono::milliseconds(ms); },
         "log a line to stderr for each turn of a loop longer than N ms (and count it)")
      ->transform(countIn(1, kDayMs));
  sub->add_option_function<std::uint64_t>(
         "--inject-stall-ms", [&s](std::uint64_t ms) { s.injectStall = std::chrono::milliseconds(ms); },
         "debugging only: each reactor's loop busy-waits N ms once per SIGUSR2")
      ->transform(countIn(1, 60000));
  addEtcdOption(*sub, s.etcd,
                "register in etcd (docs/etcd.md) with the address and targets, under a lease kept alive, and "
                "follow the chains' versions there");
  sub->add_option("--name", s.name, "the name in etcd (default: the listen address)")->check(nonEmpty());
  sub->add_option("--ttl", s.ttl, "the registration's lease, in seconds")
      ->transform(countIn(1, 3600))
      ->capture_default_str();
#if COIO_STORAGE_RDMA
  sub->add_option("--rdma-device", s.rdmaDevice, "the RDMA device (default: the first with an ACTIVE port)");
  sub->add_option("--rdma-writes", s.rdmaWrites, "RDMA WRITEs in flight (split between the reactors)")
      ->transform(countIn(1, UINT64_MAX))
      ->capture_default_str();
#endif
  return {sub, [line] { return serve(*line); }};
}

}  // namespace storage::cli
