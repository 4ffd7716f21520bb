// coio-storage-bench: a load generator for coio-storage-server. Keeps
// --depth batchReads in flight over --connections connections (or, with
// --cluster, over a whole cluster through ClusterClient) for --duration
// seconds, then reports IOPS, throughput, batch latency and the failed IOs
// by status; the first few failures are logged to stderr as they happen.
#include "cluster/chain_table.hpp"
#include "programs/bench/run.hpp"
#include "programs/bench/settings.hpp"
#include "programs/cli.hpp"
#include "protocol/crc32c.hpp"
#include "protocol/protocol.hpp"
#include "store/chunk_store.hpp"

#include <coio/net/socket_address.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

namespace {

constexpr const char* kProgram = "coio-storage-bench";

// What the command line gives beyond Settings.
struct CommandLine {
  storage::bench::Settings settings;
  std::string address = "127.0.0.1:9000", dir, rdmaDevice;
};

void declare(CLI::App& app, CommandLine& line) {
  using storage::cli::countIn;
  using storage::cli::kDayMs;
  using storage::cli::sizeIn;
  storage::bench::Settings& s = line.settings;
  const auto milliseconds = [&app](const std::string& name, std::chrono::milliseconds& into, std::uint64_t min,
                                   const std::string& help) {
    return app
        .add_option_function<std::uint64_t>(
            name, [&into](std::uint64_t ms) { into = std::chrono::milliseconds(ms); }, help)
        ->transform(countIn(min, kDayMs));
  };
  app.footer(
      "Failed IOs are counted by status name, in both reports; the first five failures are logged\n"
      "to stderr, with where they failed.\n"
      "--cluster FILE reads a whole cluster (a chain table, CHAINS.md) through ClusterClient: one\n"
      "connection per server, each IO from a replica of its chunk's chain, failing over between\n"
      "them; the table gives the dataset (--address, --dir, --chunks, --chunk-size, --target,\n"
      "--connections do not apply), and --max-transmissions is per server. --etcd is as --cluster,\n"
      "with the routing from etcd instead of a file (the records under /coio/, CHAINS.md): read\n"
      "once, then followed through a watch; reads never wait on etcd.");
  app.add_option("--address", line.address, "the server, host:port")->capture_default_str();
  app.add_option("--transport", s.transport, "tcp or rdma (a queue pair per connection, brought up over TCP)")
      ->check(CLI::IsMember({"tcp", "rdma"}))
      ->capture_default_str();
  app.add_option("--rdma-device", line.rdmaDevice, "the RDMA device (default: the first with an ACTIVE port)");
  app.add_option("--dir", line.dir, "learn the dataset's shape from D/index (or give --chunks and --chunk-size)");
  app.add_option("--chunks", s.layout.chunks, "chunks in the dataset")->transform(countIn(1, UINT64_MAX));
  app.add_option("--chunk-size", s.layout.chunkSize, "bytes per chunk")->transform(sizeIn(1, UINT32_MAX));
  app.add_option("--target", s.target, "the server's target to read (0: what serve --dir serves)")
      ->transform(countIn(0, UINT32_MAX))
      ->capture_default_str();
  app.add_option("--io-size", s.ioSize, "bytes per IO (at most the chunk size); offsets are random, unaligned")
      ->transform(sizeIn(1, UINT32_MAX))
      ->default_str("64K");
  app.add_option("--align", s.align,
                 "offsets are random multiples of N (e.g. 4K: IOs of whole blocks; default 1: any byte)")
      ->transform(sizeIn(1, UINT32_MAX))
      ->default_str("1");
  app.add_option("--batch", s.batch, "IOs per batchRead")
      ->transform(countIn(1, storage::proto::kMaxIosPerFrame))
      ->capture_default_str();
  app.add_option("--depth", s.depth, "batchReads in flight")->transform(countIn(1, 4096))->capture_default_str();
  app.add_option("--connections", s.connections, "spread over this many connections")
      ->transform(countIn(1, 1024))
      ->capture_default_str();
  app.add_option("--reactors", s.reactors,
                 "reactor threads the connections are spread over (connection c on thread c mod N; "
                 "--max-transmissions split between them; the live line is shown with one). Default one: the "
                 "bench usually shares the machine with the server it measures")
      ->transform(countIn(1, 256))
      ->capture_default_str();
  app.add_option("--max-transmissions", s.maxTransmissions, "the client's transmission limit")
      ->transform(countIn(1, UINT64_MAX))
      ->capture_default_str();
  app.add_option_function<std::uint64_t>(
         "--duration", [&s](std::uint64_t seconds) { s.duration = static_cast<double>(seconds); }, "seconds")
      ->transform(countIn(1, UINT64_MAX))
      ->default_str("10");
  milliseconds("--timeout-ms", s.timeout, 1,
               "per batchRead; a stalled server shows as timed-out requests (the run ends within --duration plus "
               "this)")
      ->default_str("30000");
  app.add_option_function<std::string>(
         "--reactor", [&s](const std::string& kind) { s.kind = *coio::parseReactorKind(kind); }, "uring or epoll")
      ->check(CLI::Validator(
          [](std::string& kind) { return coio::parseReactorKind(kind) ? std::string() : kind + " is not uring or epoll"; },
          "uring|epoll"))
      ->default_str("uring");
  app.add_flag("--verify", s.verify, "ask for CRC32C and check it, and check every byte's content");
  app.add_flag("--checksums", s.checksums,
               "ask for CRC32C and check it against the bytes received, as a cluster client always does (a server "
               "splices only such requests: serve --data-path); --verify does too");
  app.add_flag("--json", s.json, "print the report as one JSON object");
  app.add_option("--latency-log", s.latencyLog, "write one line per batch: \"UNIX-TIME-MS LATENCY-MS\" (its end)");
  app.add_option("--cluster", s.clusterFile, "read a whole cluster, the chain table FILE (below)");
  app.add_option_function<std::string>(
         "--etcd", [&s](const std::string& urls) { s.etcdEndpoints = storage::cli::splitList(urls); },
         "as --cluster, with the routing from etcd (URL[,URL...])")
      ->check(CLI::Validator(
          [](std::string& urls) {
            return storage::cli::splitList(urls).empty() ? urls + " is not URL[,URL...]" : std::string();
          },
          "URL[,URL...]"));
  milliseconds("--request-timeout-ms", s.requestTimeout, 1, "cluster: a request's deadline (finds a hung server)")
      ->default_str("2000");
  milliseconds("--retry-ms", s.retryFor, 0,
               "cluster: keep trying an IO every replica failed this long from its batch's start, pausing between "
               "tries (0: it fails at once)")
      ->default_str("0");
  milliseconds("--hedge-ms", s.hedge, 0, "cluster: also ask other replicas for a request unanswered this long (0: off)")
      ->default_str("0");
  app.add_option("--routing-log", s.routingLog,
                 "cluster: write one line per routing the client puts in use (the first, then each change), as it "
                 "does: \"UNIX-TIME-MS offline [TARGET...]\"");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A load generator for coio-storage-server: reports IOPS, throughput, batch latency and the failed "
               "IOs by status.",
               kProgram);
  storage::cli::lastOneCounts(app);
  CommandLine line;
  declare(app, line);
  if (const std::optional<int> exit = storage::cli::parse(app, argc, argv)) return *exit;
  storage::bench::Settings& settings = line.settings;
  const auto problem = [](const char* what) { return storage::cli::usageError(kProgram, what); };
  if (settings.transport == "rdma" && !storage::cli::openRdmaDevice(kProgram, line.rdmaDevice, settings)) return 1;
  if (!settings.routingLog.empty() && settings.etcdEndpoints.empty() && settings.clusterFile.empty()) {
    return problem("--routing-log is a cluster client's: it needs --cluster or --etcd");
  }
  if (settings.reactors > 1 && (!settings.etcdEndpoints.empty() || !settings.clusterFile.empty())) {
    return problem("--reactors is for one server's connections: a cluster client runs on one reactor");
  }
  if (settings.reactors > settings.connections) return problem("--reactors is more than --connections");
  if (!settings.etcdEndpoints.empty()) {
    if (!settings.clusterFile.empty()) return problem("--etcd replaces --cluster FILE: give one");
    settings.layout = {1, settings.ioSize, 1};  // a placeholder: etcd's routing gives the shape (runCluster)
  } else if (!settings.clusterFile.empty()) {
    std::string why;
    coio::Result<storage::ChainTable> table = storage::ChainTable::load(settings.clusterFile, &why);
    if (!table) {
      std::fprintf(stderr, "coio-storage-bench: %s\n", why.c_str());
      return 1;
    }
    settings.layout = {table->chunks(), table->chunkSize(), 1};
    settings.table = std::move(*table);
  } else if (!line.dir.empty()) {
    std::string why;
    coio::Result<storage::ChunkStoreIndex> index = storage::loadChunkStoreIndex(line.dir, &why);
    if (!index) {
      std::fprintf(stderr, "coio-storage-bench: cannot read %s/index: %s\n", line.dir.c_str(),
                   why.empty() ? index.error().message().c_str() : why.c_str());
      return 1;
    }
    settings.layout = index->layout;
  }
  if (settings.layout.chunks == 0 || settings.layout.chunkSize == 0) {
    return problem("give the dataset's shape: --dir D, or --chunks N and --chunk-size S");
  }
  if (settings.ioSize > settings.layout.chunkSize) return problem("--io-size is larger than a chunk");
  coio::Result<coio::SocketAddress> server = coio::SocketAddress::parse(line.address);
  if (!server) return problem("--address takes host:port");
  settings.server = *server;
  std::string why;
  if (const coio::ReactorKind usable = coio::usableReactorKind(settings.kind, &why); usable != settings.kind) {
    std::fprintf(stderr, "coio-storage-bench: %s; using epoll\n", why.c_str());
    settings.kind = usable;
  }
  storage::crc32cImplementation();  // the CRC32C path picked (timed) now, not inside the first timed batch
  return coio::withReactor(settings.kind, [&](auto& reactor) {
    const bool cluster = settings.table || !settings.etcdEndpoints.empty();
    return reactor.runUntil(cluster ? storage::bench::runCluster(reactor, settings)
                                    : storage::bench::run(reactor, settings));
  });
}
