// The example storage server and its client, unchanged, on the simulated
// reactor (coio::sim): one thread, virtual time, the simulated network and
// disk, faults drawn from the seed. Invariant of every run: each IO reads
// the dataset's bytes or fails with a named status; nothing hangs (a hang
// is a sim::Deadlock); the server shuts down; the same seed, the same run.
#include "e2e_support.hpp"
#include "client/storage_client.hpp"
#include "server/storage_server.hpp"

#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/testing/sim_disk.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using coio::Result;
using coio::Task;
using coio::sim::SimReactor;
using storage::proto::IoStatus;

namespace {

using R = SimReactor;
constexpr std::uint32_t kChunkSize = 64 * 1024;
constexpr std::uint64_t kChunks = 16;

// What a run did: IOs read right, IOs failed (by status name), bytes wrong
// (must be 0), the virtual time it took, its trace.
struct RunReport {
  std::uint64_t ok = 0;
  std::map<std::string, std::uint64_t> failed;
  std::uint64_t wrongBytes = 0;
  std::chrono::steady_clock::duration took{};
  std::uint64_t trace = 0;
  bool operator==(const RunReport&) const = default;
};

struct Faults {
  coio::sim::DiskFaults disk;
  bool partition = false;  // the client's host and the server's, for 300 ms of the run
};

// Reads `batches` batches of 8 random IOs (whole chunks and partial ranges)
// with a verifying client; the server on 10.0.0.1, both on `seed`'s run.
RunReport run(std::uint64_t seed, const std::filesystem::path& dataset, const Faults& faults, int batches = 12) {
  SimReactor reactor(seed);
  reactor.drawLinks({.latency = 20us, .window = 64 * 1024}, {.latency = 2ms, .window = 1 << 20});
  reactor.setDiskFaults(faults.disk);
  storage::ServerOptions options;
  options.pieceSize = 16 * 1024;
  options.poolBytes = 4u << 20;
  options.maxBatchBytes = 2u << 20;
  options.transmitTimeout = 2s;
  auto server = storage::StorageServer<R>::open(reactor, {{0, dataset.string()}}, options);
  INFO(server.error().message());
  REQUIRE(server);
  const coio::SocketAddress at = *coio::SocketAddress::parse("10.0.0.1:9000");
  auto bound = coio::TcpListener<R>::bind(reactor, at);
  REQUIRE(bound);
  std::optional<coio::TcpListener<R>> listener(std::move(*bound));
  (*server)->serve(*listener);
  storage::TransmissionLimiter limiter(16);
  RunReport report;
  const auto start = reactor.now();

  auto body = [](R& r, storage::TransmissionLimiter& lim, coio::SocketAddress to, int n, bool partition,
                 RunReport& out) -> Task<void> {
    auto connect = [&r, to](std::stop_token stop) -> Task<Result<std::unique_ptr<storage::Channel<R>>>> {
      Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, to, stop);
      if (!stream) co_return stream.error();
      co_return std::unique_ptr<storage::Channel<R>>(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)));
    };
    Result<std::unique_ptr<storage::StorageClient<R>>> client = co_await storage::StorageClient<R>::connect(
        connect, lim, {.timeout = 500ms, .verifyChecksums = true});
    INFO(client.error().message());
    REQUIRE(client);
    std::vector<std::byte> arena(8 * kChunkSize);
    for (int b = 0; b < n; ++b) {
      if (partition && b == n / 3) r.partition("127.0.0.1", "10.0.0.1");
      if (partition && b == n / 3 + 1) r.heal("127.0.0.1", "10.0.0.1");
      std::vector<storage::ReadOp> ios;
      for (std::size_t i = 0; i < 8; ++i) {
        storage::ReadOp op;
        op.chunkId = r.random().below(kChunks);
        const bool whole = r.random().below(2) == 0;
        op.offset = whole ? 0 : static_cast<std::uint32_t>(r.random().below(kChunkSize - 1));
        op.length = whole ? kChunkSize : 1 + static_cast<std::uint32_t>(r.random().below(kChunkSize - op.offset));
        op.into = std::span(arena).subspan(i * kChunkSize, op.length);
        ios.push_back(op);
      }
      Result<std::vector<storage::ReadOutcome>> outcomes = co_await (*client)->batchRead(ios);
      if (!outcomes) {  // the whole batch failed (the connection): every IO of it, named
        out.failed["batch: " + outcomes.error().message()] += ios.size();
        continue;
      }
      for (std::size_t i = 0; i < ios.size(); ++i) {
        const storage::ReadOutcome& o = (*outcomes)[i];
        if (o.status != IoStatus::ok) {
          ++out.failed[std::string(storage::proto::toString(o.status))];
          continue;
        }
        if (o.bytes != ios[i].length || o.checksumMismatch ||
            !storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, ios[i].into.first(o.bytes))) {
          out.wrongBytes += o.bytes;
          continue;
        }
        ++out.ok;
      }
    }
    co_await (*client)->close();
  };

  std::exception_ptr failure;
  reactor.runUntil([](R& r, Task<void> b, storage::StorageServer<R>& s, std::exception_ptr& f) -> Task<void> {
    try {
      co_await std::move(b);
    } catch (...) {
      f = std::current_exception();
    }
    co_await s.shutdown();
    (void)r;
  }(reactor, body(reactor, limiter, at, batches, faults.partition, report), **server, failure));
  if (failure) std::rethrow_exception(failure);
  report.took = reactor.now() - start;
  report.trace = reactor.traceHash();
  return report;
}

std::string describe(const RunReport& r) {
  std::string s = "ok " + std::to_string(r.ok) + ", wrong bytes " + std::to_string(r.wrongBytes) + ", failed:";
  for (const auto& [status, n] : r.failed) s += " " + status + " " + std::to_string(n);
  return s;
}

}  // namespace

TEST_CASE("Storage on the simulation: every IO of every seed reads the dataset's bytes; a seed replays", "[sim]") {
  storage::testing::TempDir dir({kChunks, kChunkSize, 3});
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const RunReport report = run(seed, dir.path, {});
    INFO("seed " << seed << ": " << describe(report));
    CHECK(report.ok == 12 * 8);
    CHECK(report.failed.empty());
    CHECK(report.wrongBytes == 0);
  }
  CHECK(run(7, dir.path, {}) == run(7, dir.path, {}));
}

TEST_CASE("Storage on the simulation: under disk faults and a partition, IOs read right or fail by name", "[sim]") {
  storage::testing::TempDir dir({kChunks, kChunkSize, 3});
  std::uint64_t ok = 0;
  std::map<std::string, std::uint64_t> failed;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const Faults faults{.disk = {.eio = 0.02, .shortRead = 0.02, .hang = 0.005}, .partition = seed % 2 == 0};
    const RunReport report = run(seed, dir.path, faults);
    INFO("seed " << seed << ": " << describe(report));
    CHECK(report.wrongBytes == 0);
    CHECK(report.ok + [&] {
      std::uint64_t n = 0;
      for (const auto& [status, count] : report.failed) n += count;
      return n;
    }() == 12 * 8);
    ok += report.ok;
    for (const auto& [status, n] : report.failed) failed[status] += n;
  }
  // The faults did something (the disk's EIO and short reads are ioError;
  // a hung read or the partition times its batch out), and most IOs still
  // got through.
  CHECK(failed.contains("ioError"));
  CHECK(failed.contains("batch: " + std::make_error_code(std::errc::timed_out).message()));
  CHECK(ok > 20 * 12 * 8 / 2);
}
