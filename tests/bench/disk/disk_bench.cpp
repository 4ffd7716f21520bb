// disk_bench: random reads or writes through coio's disk layer (on either
// reactor), or reads through a raw liburing loop; prints one JSON line.
// run_disk_bench.sh runs it next to fio and prints the ratios.
//   disk_bench --engine=epoll|uring|raw --file=PATH [--rw=randread|randwrite] [--bs=4096] [--depth=32]
//              [--batch=1] [--direct=1] [--fixed=0] [--fdatasync=0] [--eager-below=64] [--latency=1]
//              [--thp=1] [--seconds=5] [--warm=0] [--create-mib=N] [--seed=N, default: drawn per run]
//              [--taskrun=immediate|cooperative|deferred]  (uring: UringReactor::Options::taskRun)
// randwrite overwrites the file's blocks in place (File::writeFixed, or a
// WriteBatch with --batch); --fdatasync=1 follows each write (each batch)
// with File::fdatasync and times the two together, as fio --fdatasync=1.
#include "disk_bench.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/disk/read_batch.hpp>
#include <coio/disk/write_batch.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <map>
#include <string>

using namespace disk_bench;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "disk_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename Reactor>
Outcome runCoio(Reactor& reactor, const Config& config) {
  coio::BufferPool pool(
      {.bufferSize = config.blockSize, .count = config.depth, .transparentHugePages = config.transparentHugePages});
  coio::Disk::Options diskOptions;
  diskOptions.eagerBelow = config.eagerBelow;
  coio::Disk disk(reactor, diskOptions);
  coio::Result<coio::File> opened =
      coio::File::open(disk, config.file.c_str(), {.write = config.write, .direct = config.direct});
  if (!opened) fail("open " + config.file + ": " + opened.error().message());
  coio::File& file = *opened;
  if (config.fixed) {
    if (!disk.registerBuffers(pool)) std::fprintf(stderr, "disk_bench: %s\n", pool.registrationNote().c_str());
    if (coio::Result<void> r = file.registerWithRing(); !r) fail("register file: " + r.error().message());
  }

  if (config.write) {  // what the writes write: random bytes, as fio's buffers hold
    Random random(99);
    for (std::size_t i = 0; i < pool.size(); i += sizeof(std::uint64_t)) {
      const std::uint64_t word = random.below(UINT64_MAX);
      std::memcpy(pool.data() + i, &word, sizeof word);
    }
  }

  const std::uint64_t blocks = config.fileSize / config.blockSize;
  Outcome outcome;
  if (config.latency) outcome.latencies.reserve(4'000'000);
  bool running = true;
  unsigned active = 0;
  // After a write (or a batch) with --fdatasync: whether it became durable.
  auto sync = [&]() -> coio::Task<bool> {
    coio::Result<void> synced = co_await file.fdatasync();
    co_return synced.hasValue();
  };
  auto count = [&](const coio::Result<std::size_t>& r, bool synced, Clock::time_point started) {
    if (!running) return;
    ++outcome.operations;
    if (r.valueOr(0) != config.blockSize || !synced) ++outcome.errors;
    if (config.latency) {
      outcome.latencies.push_back(static_cast<std::uint32_t>((Clock::now() - started).count()));
    }
  };
  // `depth` single reads or writes in flight: one coroutine each, a new
  // one as soon as one completes (what fio does).
  auto single = [&](unsigned id) -> coio::Task<void> {
    coio::Buffer buffer = *pool.tryAcquire();
    Random random(config.seed + id);
    while (running) {
      const Clock::time_point started = config.latency ? Clock::now() : Clock::time_point{};
      const std::uint64_t offset = random.below(blocks) * config.blockSize;
      coio::Result<std::size_t> r{std::size_t{0}};
      if (config.write) {
        r = co_await file.writeFixed(offset, buffer.slice());
      } else {
        r = co_await file.readFixed(offset, buffer.slice());
      }
      bool synced = true;
      if (config.datasync) synced = co_await sync();
      count(r, synced, started);
    }
    --active;
  };
  // Reads or writes in batches of `batch`, each awaited as a whole (3FS's
  // batchRead): both kinds of batch are a DiskBatch.
  auto batched = [&](unsigned id) -> coio::Task<void> {
    std::vector<coio::Buffer> buffers;
    for (unsigned i = 0; i < config.batch; ++i) buffers.push_back(*pool.tryAcquire());
    Random random(config.seed + id);
    coio::ReadBatch reads(disk);
    coio::WriteBatch writes(disk);
    coio::DiskBatch& batch = config.write ? static_cast<coio::DiskBatch&>(writes) : reads;
    while (running) {
      batch.clear();
      for (coio::Buffer& buffer : buffers) {
        const std::uint64_t offset = random.below(blocks) * config.blockSize;
        config.write ? writes.add(file, offset, buffer.slice()) : reads.add(file, offset, buffer.slice());
      }
      const Clock::time_point started = config.latency ? Clock::now() : Clock::time_point{};
      co_await batch;
      bool synced = true;
      if (config.datasync) synced = co_await sync();
      for (std::size_t i = 0; i < batch.size(); ++i) count(batch.result(i), synced, started);
    }
    --active;
  };
  auto main = [&]() -> coio::Task<void> {
    const unsigned workers = config.depth / config.batch;
    for (unsigned i = 0; i < workers; ++i) {
      ++active;
      reactor.spawn(config.batch == 1 ? single(i + 1) : batched(i + 1));
    }
    const Clock::time_point start = Clock::now();
    co_await reactor.sleepFor(config.duration);
    running = false;
    outcome.elapsed = Clock::now() - start;
    while (active > 0) co_await reactor.sleepFor(std::chrono::milliseconds(1));
  };
  reactor.runUntil(main());
  return outcome;
}

// Reads the file once, buffered, so that the page cache holds it.
void warm(const Config& config) {
  const int fd = ::open(config.file.c_str(), O_RDONLY);
  std::vector<char> chunk(1 << 20);
  while (::read(fd, chunk.data(), chunk.size()) > 0) {
  }
  ::close(fd);
}

void create(const std::string& path, std::uint64_t mib) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= mib << 20) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("create " + path + ": " + std::strerror(errno));
  std::vector<char> chunk(1 << 20);
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131 + 7);
  for (std::uint64_t i = 0; i < mib; ++i) {
    if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) fail("write " + path);
  }
  ::fsync(fd);
  ::close(fd);
}

double meanUs(const std::vector<std::uint32_t>& ns) {
  if (ns.empty()) return 0;
  double sum = 0;
  for (const std::uint32_t x : ns) sum += x;
  return sum / static_cast<double>(ns.size()) / 1000.0;
}

double percentileUs(std::vector<std::uint32_t>& ns, double p) {
  if (ns.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(ns.size() - 1));
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(k), ns.end());
  return ns[k] / 1000.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) fail("arguments are --key=value: " + arg);
    args[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  auto get = [&](const char* key, const char* fallback) {
    const auto it = args.find(key);
    return it == args.end() ? std::string(fallback) : it->second;
  };
  Config config;
  config.engine = get("engine", "uring");
  config.file = get("file", "");
  if (config.file.empty()) fail("--file=PATH is required");
  config.blockSize = std::stoul(get("bs", "4096"));
  config.depth = static_cast<unsigned>(std::stoul(get("depth", "32")));
  config.batch = static_cast<unsigned>(std::stoul(get("batch", "1")));
  config.direct = get("direct", "1") == "1";
  config.fixed = get("fixed", "0") == "1";
  const std::string rw = get("rw", "randread");
  if (rw != "randread" && rw != "randwrite") fail("--rw must be randread or randwrite");
  config.write = rw == "randwrite";
  config.datasync = get("fdatasync", "0") == "1";
  if (config.datasync && !config.write) fail("--fdatasync=1 needs --rw=randwrite");
  config.eagerBelow = static_cast<unsigned>(std::stoul(get("eager-below", "64")));
  config.latency = get("latency", "1") == "1";
  config.transparentHugePages = get("thp", "1") == "1";
  config.duration = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::stod(get("seconds", "5"))));
  const std::string seed = get("seed", "");
  config.seed = seed.empty() ? std::random_device{}() : std::stoull(seed);
  if (config.batch == 0 || config.depth % config.batch != 0) fail("--depth must be a multiple of --batch");
  if (const std::string mib = get("create-mib", ""); !mib.empty()) create(config.file, std::stoull(mib));
  struct stat st {};
  if (::stat(config.file.c_str(), &st) != 0) fail("stat " + config.file + ": " + std::strerror(errno));
  config.fileSize = static_cast<std::uint64_t>(st.st_size);
  if (config.fileSize < config.blockSize) fail("file smaller than one block");
  if (get("warm", "0") == "1") warm(config);

  Outcome outcome;
  if (config.engine == "raw") {
    if (config.write) fail("--engine=raw reads only");
    outcome = runRaw(config);
  } else if (config.engine == "uring") {
    coio::UringReactor::Options options;  // --taskrun not given: the reactor's default
    if (const std::string name = get("taskrun", ""); !name.empty()) {
      const coio::Result<coio::TaskRun> taskRun = coio::parseTaskRun(name);
      if (!taskRun) fail("--taskrun must be immediate, cooperative or deferred");
      options.taskRun = *taskRun;
    }
    coio::UringReactor reactor(options);
    outcome = runCoio(reactor, config);
  } else if (config.engine == "epoll") {
    coio::EpollReactor reactor;
    outcome = runCoio(reactor, config);
  } else {
    fail("unknown engine " + config.engine);
  }
  const double seconds = std::chrono::duration<double>(outcome.elapsed).count();
  const double iops = static_cast<double>(outcome.operations) / seconds;
  std::printf("{\"engine\":\"%s\",\"rw\":\"%s\",\"bs\":%zu,\"depth\":%u,\"batch\":%u,\"direct\":%d,\"fixed\":%d,"
              "\"fdatasync\":%d,\"eager_below\":%u,\"iops\":%.0f,\"mibs\":%.1f,\"mean_us\":%.1f,\"p50_us\":%.1f,"
              "\"p99_us\":%.1f,\"errors\":%llu,\"seed\":%llu}\n",
              config.engine.c_str(), rw.c_str(), config.blockSize, config.depth, config.batch, config.direct,
              config.fixed, config.datasync, config.eagerBelow, iops,
              iops * static_cast<double>(config.blockSize) / (1 << 20), meanUs(outcome.latencies),
              percentileUs(outcome.latencies, 0.50), percentileUs(outcome.latencies, 0.99),
              static_cast<unsigned long long>(outcome.errors), static_cast<unsigned long long>(config.seed));
  return outcome.errors == 0 ? 0 : 2;
}
