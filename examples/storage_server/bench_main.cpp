// coio-storage-bench: a load generator for coio-storage-server. Keeps
// --depth batchReads in flight over --connections connections for
// --duration seconds, then reports IOPS, throughput and batch latency.
#include "chunk_store.hpp"
#include "cli.hpp"
#include "storage_client.hpp"
#if COIO_STORAGE_RDMA
#include "rdma_channel.hpp"
#endif

#include <coio/core/collect_all.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = R"(usage: coio-storage-bench [options]
  --address 127.0.0.1:9000   the server
  --transport tcp|rdma       rdma: a queue pair per connection, brought up over TCP
  --rdma-device NAME         (default: the first device with an ACTIVE port)
  --dir D                    learn the dataset's shape from D/index, or give
  --chunks N --chunk-size S  it explicitly
  --target ID                the server's target to read (default 0: what serve --dir serves)
  --io-size 64K              bytes per IO (at most the chunk size); offsets are random, unaligned
  --batch 16                 IOs per batchRead
  --depth 8                  batchReads in flight
  --connections 4            spread over this many connections
  --max-transmissions 64     the client's transmission limit
  --duration 10              seconds
  --timeout-ms 30000         per batchRead; a stalled server shows as timed-out requests
                             (the run ends within --duration plus this)
  --reactor uring|epoll
  --verify                   ask for CRC32C and check it, and check every byte's content
  --json                     print the report as one JSON object
)";

struct Settings {
  coio::SocketAddress server;
  storage::ChunkStoreLayout layout;
  std::uint32_t ioSize = 64 * 1024;
  std::uint32_t target = 0;
  std::size_t batch = 16, depth = 8, connections = 4, maxTransmissions = 64;
  double duration = 10;
  std::chrono::milliseconds timeout{30000};
  coio::ReactorKind kind = coio::ReactorKind::uring;
  bool verify = false, json = false;
  std::string transport = "tcp";
#if COIO_STORAGE_RDMA
  std::unique_ptr<coio::rdma::Device> device;  // opened for --transport rdma
#endif
};

struct Tally {
  std::uint64_t ios = 0, bytes = 0;
  std::uint64_t badStatus = 0, checksumMismatches = 0, contentMismatches = 0, timedOutRequests = 0, failedRequests = 0;
  std::vector<double> latencies;  // seconds per batchRead
  std::uint64_t errors() const {
    return badStatus + checksumMismatches + contentMismatches + timedOutRequests + failedRequests;
  }
};

bool contentMatches(const storage::ReadOp& op, std::uint32_t bytes) {
  return storage::matchesChunkBytes(op.chunkId, op.offset, op.into.first(bytes));
}

template <coio::Reactor R>
coio::Task<void> worker(storage::StorageClient<R>& client, const Settings& settings, Clock::time_point end,
                        std::uint64_t seed, std::span<std::byte> memory, Tally& tally) {
  std::mt19937_64 random(seed);
  std::vector<storage::ReadOp> ios(settings.batch);
  while (Clock::now() < end) {
    for (std::size_t i = 0; i < ios.size(); ++i) {
      ios[i].chunkId = settings.layout.chunkAt(random() % settings.layout.chunks);
      ios[i].offset = static_cast<std::uint32_t>(random() % (settings.layout.chunkSize - settings.ioSize + 1));
      ios[i].length = settings.ioSize;
      ios[i].into = std::span(memory).subspan(i * settings.ioSize, settings.ioSize);
      ios[i].targetId = settings.target;
    }
    const Clock::time_point start = Clock::now();
    coio::Result<std::vector<storage::ReadOutcome>> outcomes = co_await client.batchRead(ios);
    if (!outcomes) {
      ++(outcomes.error() == std::errc::timed_out ? tally.timedOutRequests : tally.failedRequests);
      if (client.failure()) co_return;  // the connection is gone: this worker is done
      continue;
    }
    tally.latencies.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    for (std::size_t i = 0; i < ios.size(); ++i) {
      const storage::ReadOutcome& o = (*outcomes)[i];
      if (o.status != storage::proto::IoStatus::ok) {
        ++tally.badStatus;
        continue;
      }
      ++tally.ios;
      tally.bytes += o.bytes;
      if (o.checksumMismatch) ++tally.checksumMismatches;
      if (settings.verify && !contentMatches(ios[i], o.bytes)) ++tally.contentMismatches;
    }
  }
}

// The live line, on a terminal only.
template <coio::Reactor R>
coio::Task<void> progress(R& reactor, Clock::time_point begin, Clock::time_point end,
                          const std::vector<Tally>& tallies) {
  if (!::isatty(STDERR_FILENO)) co_return;
  while (Clock::now() < end) {
    co_await reactor.sleepFor(std::min<Clock::duration>(std::chrono::seconds(1), end - Clock::now()));
    const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
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

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto at = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(at, sorted.size() - 1)];
}

void report(const Settings& settings, Tally& tally, double elapsed) {
  std::sort(tally.latencies.begin(), tally.latencies.end());
  const double iops = static_cast<double>(tally.ios) / elapsed;
  const double gib = static_cast<double>(tally.bytes) / elapsed / (1u << 30);
  const double p50 = percentile(tally.latencies, 0.5) * 1e3, p99 = percentile(tally.latencies, 0.99) * 1e3,
               p999 = percentile(tally.latencies, 0.999) * 1e3;
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  if (settings.json) {
    std::printf("{\"transport\":\"%s\",\"reactor\":\"%s\",\"connections\":%zu,\"depth\":%zu,\"batch\":%zu,"
                "\"io_size\":%u,\"verify\":%s,\"seconds\":%.3f,\"ios\":%llu,\"bytes\":%llu,\"iops\":%.1f,"
                "\"gib_per_s\":%.4f,\"batch_latency_ms\":{\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f},"
                "\"errors\":{\"total\":%llu,\"io_status\":%llu,\"checksum\":%llu,\"content\":%llu,\"timed_out\":%llu,"
                "\"request\":%llu}}\n",
                settings.transport.c_str(), std::string(coio::toString(settings.kind)).c_str(), settings.connections,
                settings.depth, settings.batch, settings.ioSize, settings.verify ? "true" : "false", elapsed, u(tally.ios),
                u(tally.bytes), iops, gib, p50, p99, p999, u(tally.errors()), u(tally.badStatus),
                u(tally.checksumMismatches), u(tally.contentMismatches), u(tally.timedOutRequests),
                u(tally.failedRequests));
    return;
  }
  std::printf("coio-storage-bench: %s to %s, %s reactor, %zu connection(s), depth %zu, batch %zu x %u bytes, "
              "verify %s\n",
              settings.transport.c_str(), settings.server.toString().c_str(), std::string(coio::toString(settings.kind)).c_str(),
              settings.connections, settings.depth, settings.batch, settings.ioSize, settings.verify ? "on" : "off");
  std::printf("  duration        %.2f s\n", elapsed);
  std::printf("  IOPS            %.0f\n", iops);
  std::printf("  throughput      %.3f GiB/s\n", gib);
  std::printf("  batch latency   p50 %.3f ms   p99 %.3f ms   p999 %.3f ms   (%zu batches)\n", p50, p99, p999,
              tally.latencies.size());
  std::printf("  errors          %llu (IO status %llu, checksum %llu, content %llu, timed out %llu, "
              "failed requests %llu)\n",
              u(tally.errors()), u(tally.badStatus), u(tally.checksumMismatches), u(tally.contentMismatches),
              u(tally.timedOutRequests), u(tally.failedRequests));
}

#if COIO_STORAGE_RDMA
// A queue pair brought up over a new TCP connection: how an RDMA client
// connects, and reconnects after an idle close.
template <coio::Reactor R>
coio::Task<coio::Result<std::unique_ptr<storage::Channel<R>>>> connectRdma(R& reactor, const Settings& settings,
                                                                           std::stop_token stop) {
  coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, settings.server, stop);
  if (!stream) co_return stream.error();
  co_return co_await storage::RdmaChannel<R>::connect(reactor, *settings.device, std::move(*stream), std::move(stop),
                                                      std::chrono::seconds(10));
}
#endif

// One client over the chosen transport; `memory` is where its IOs land.
template <coio::Reactor R>
coio::Task<coio::Result<std::unique_ptr<storage::StorageClient<R>>>> connect(R& reactor, const Settings& settings,
                                                                             storage::TransmissionLimiter& limiter,
                                                                             std::span<std::byte> memory) {
  const storage::ClientOptions options{.timeout = settings.timeout, .verifyChecksums = settings.verify};
#if COIO_STORAGE_RDMA
  if (settings.device) {
    coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await storage::StorageClient<R>::connect(
        [&reactor, &settings](std::stop_token stop) { return connectRdma(reactor, settings, std::move(stop)); },
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

template <coio::Reactor R>
coio::Task<int> run(R& reactor, const Settings& settings) {
  storage::TransmissionLimiter limiter(settings.maxTransmissions);
  // Every worker's destinations, in one allocation that each client registers once (RDMA).
  std::vector<std::byte> memory(settings.depth * settings.batch * settings.ioSize);
  std::vector<std::unique_ptr<storage::StorageClient<R>>> clients;
  for (std::size_t c = 0; c < settings.connections; ++c) {
    coio::Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await connect(reactor, settings, limiter, memory);
    if (!client) {
      std::fprintf(stderr, "coio-storage-bench: cannot connect to %s over %s: %s (is coio-storage-server running%s?)\n",
                   settings.server.toString().c_str(), settings.transport.c_str(), client.error().message().c_str(),
                   settings.transport == "rdma" ? " with --transport rdma" : "");
      for (auto& open : clients) co_await open->close();
      co_return 1;
    }
    clients.push_back(std::move(*client));
  }
  const Clock::time_point begin = Clock::now();
  const Clock::time_point end =
      begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(settings.duration));
  std::vector<Tally> tallies(settings.depth);
  std::vector<coio::Task<void>> tasks;
  for (std::size_t w = 0; w < settings.depth; ++w) {
    const std::size_t slice = settings.batch * settings.ioSize;
    tasks.push_back(worker(*clients[w % clients.size()], settings, end, 1000 + w,
                           std::span(memory).subspan(w * slice, slice), tallies[w]));
  }
  tasks.push_back(progress(reactor, begin, end, tallies));
  co_await coio::collectAllRange(std::move(tasks));
  const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
  for (auto& client : clients) co_await client->close();

  Tally all;
  for (Tally& t : tallies) {
    all.ios += t.ios;
    all.bytes += t.bytes;
    all.badStatus += t.badStatus;
    all.checksumMismatches += t.checksumMismatches;
    all.contentMismatches += t.contentMismatches;
    all.timedOutRequests += t.timedOutRequests;
    all.failedRequests += t.failedRequests;
    all.latencies.insert(all.latencies.end(), t.latencies.begin(), t.latencies.end());
  }
  report(settings, all, elapsed);
  co_return all.errors() == 0 && all.ios > 0 ? 0 : 1;
}

int usage(const char* problem = nullptr) {
  if (problem) std::fprintf(stderr, "coio-storage-bench: %s\n", problem);
  std::fputs(kUsage, problem ? stderr : stdout);
  return problem ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  std::string address = "127.0.0.1:9000", transport = "tcp", dir, rdmaDevice;
  for (int i = 1; i < argc; ++i) {
    const std::string_view name = argv[i];
    if (name == "--help" || name == "-h") return usage();
    if (name == "--verify") {
      settings.verify = true;
      continue;
    }
    if (name == "--json") {
      settings.json = true;
      continue;
    }
    if (i + 1 >= argc) return usage(("missing value for " + std::string(name)).c_str());
    const std::string_view value = argv[++i];
    const std::optional<std::uint64_t> count = storage::cli::parseCount(value);
    const std::optional<std::uint64_t> size = storage::cli::parseSize(value);
    bool ok = true;
    if (name == "--address") {
      address = value;
    } else if (name == "--transport") {
      transport = value;
    } else if (name == "--rdma-device") {
      rdmaDevice = value;
    } else if (name == "--dir") {
      dir = value;
    } else if (name == "--target") {
      ok = count && *count <= UINT32_MAX;
      settings.target = static_cast<std::uint32_t>(count.value_or(0));
    } else if (name == "--chunks") {
      ok = count && *count > 0;
      settings.layout.chunks = count.value_or(0);
    } else if (name == "--chunk-size") {
      ok = size && *size > 0 && *size <= UINT32_MAX;
      settings.layout.chunkSize = static_cast<std::uint32_t>(size.value_or(0));
    } else if (name == "--io-size") {
      ok = size && *size > 0 && *size <= UINT32_MAX;
      settings.ioSize = static_cast<std::uint32_t>(size.value_or(0));
    } else if (name == "--batch") {
      ok = count && *count > 0 && *count <= storage::proto::kMaxIosPerFrame;
      settings.batch = count.value_or(0);
    } else if (name == "--depth") {
      ok = count && *count > 0 && *count <= 4096;
      settings.depth = count.value_or(0);
    } else if (name == "--connections") {
      ok = count && *count > 0 && *count <= 1024;
      settings.connections = count.value_or(0);
    } else if (name == "--max-transmissions") {
      ok = count && *count > 0;
      settings.maxTransmissions = count.value_or(0);
    } else if (name == "--duration") {
      ok = count && *count > 0;
      settings.duration = static_cast<double>(count.value_or(0));
    } else if (name == "--timeout-ms") {
      ok = count && *count > 0 && *count <= 24 * 3600 * 1000;
      settings.timeout = std::chrono::milliseconds(count.value_or(0));
    } else if (name == "--reactor") {
      ok = coio::parseReactorKind(value).hasValue();
      if (ok) settings.kind = *coio::parseReactorKind(value);
    } else {
      return usage(("unknown option " + std::string(name)).c_str());
    }
    if (!ok) return usage(("bad value for " + std::string(name) + ": " + std::string(value)).c_str());
  }
  if (transport != "tcp" && transport != "rdma") return usage("--transport is tcp or rdma");
  settings.transport = transport;
  if (transport == "rdma" && !storage::cli::openRdmaDevice("coio-storage-bench", rdmaDevice, settings)) return 1;
  if (!dir.empty()) {
    coio::Result<storage::ChunkStoreIndex> index = storage::loadChunkStoreIndex(dir);
    if (!index) {
      std::fprintf(stderr, "coio-storage-bench: cannot read %s/index: %s\n", dir.c_str(), index.error().message().c_str());
      return 1;
    }
    settings.layout = index->layout;
  }
  if (settings.layout.chunks == 0 || settings.layout.chunkSize == 0) {
    return usage("give the dataset's shape: --dir D, or --chunks N and --chunk-size S");
  }
  if (settings.ioSize > settings.layout.chunkSize) return usage("--io-size is larger than a chunk");
  coio::Result<coio::SocketAddress> server = coio::SocketAddress::parse(address);
  if (!server) return usage("--address takes host:port");
  settings.server = *server;
  std::string why;
  if (const coio::ReactorKind usable = coio::usableReactorKind(settings.kind, &why); usable != settings.kind) {
    std::fprintf(stderr, "coio-storage-bench: %s; using epoll\n", why.c_str());
    settings.kind = usable;
  }
  return coio::withReactor(settings.kind, [&](auto& reactor) { return reactor.runUntil(run(reactor, settings)); });
}
