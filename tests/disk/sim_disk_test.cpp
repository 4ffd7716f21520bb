// The simulated disk (coio/testing/sim_disk.hpp): coio::Disk, File and
// ReadBatch on a SimReactor, in virtual time, with faults from the seed.
#include "disk_test_helpers.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/read_batch.hpp>
#include <coio/reactor/with_timeout.hpp>
#include <coio/testing/sim_disk.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using coio::sim::SimReactor;
using coio::testing::matchesPattern;
using coio::testing::TempDir;

namespace {

// Code written for any reactor constructs its Disk this way.
template <coio::Reactor R>
struct Service {
  explicit Service(R& reactor) : disk(reactor) {}
  coio::Disk disk;
};

// 16 reads of 4 KiB from a pattern file, as one batch; the virtual time
// they took and the run's trace.
std::pair<std::chrono::steady_clock::duration, std::uint64_t> batchRun(std::uint64_t seed, const std::string& path) {
  SimReactor reactor(seed);
  Service<SimReactor> service(reactor);
  coio::Result<coio::File> file = coio::File::open(service.disk, path.c_str());
  REQUIRE(file);
  const auto took = reactor.runUntil([](SimReactor& r, coio::Disk& disk, coio::File& f)
                                         -> coio::Task<std::chrono::steady_clock::duration> {
    std::vector<std::byte> buffer(16 * 4096);
    coio::ReadBatch batch(disk);
    for (std::size_t i = 0; i < 16; ++i) batch.add(f, i * 8192, std::span(buffer).subspan(i * 4096, 4096));
    const auto start = r.now();
    co_await batch;
    for (std::size_t i = 0; i < 16; ++i) {
      const coio::Result<std::size_t> n = batch.result(i);
      REQUIRE((n && *n == 4096));
      CHECK(matchesPattern(0, i * 8192, std::span(buffer).subspan(i * 4096, 4096)));
    }
    CHECK(r.stats().inFlight == 0);
    co_return r.now() - start;
  }(reactor, service.disk, *file));
  return {took, reactor.traceHash()};
}

}  // namespace

TEST_CASE("Simulated disk: reads and writes of real files, completed in virtual time, replayed by seed", "[sim]") {
  TempDir dir;
  const std::string path = dir.patternFile(0, 1 << 20);
  const auto [took, hash] = batchRun(1, path);
  // Each read takes 20-200 us (the default latency); all 16 at once.
  CHECK(took >= 20us);
  CHECK(took <= 200us);
  CHECK(batchRun(1, path) == std::pair{took, hash});

  // Written bytes are read back; fsync, stat and an asynchronous open and close work.
  SimReactor reactor(2);
  coio::Disk disk(reactor);
  reactor.runUntil([](coio::Disk& d, std::string name) -> coio::Task<void> {
    coio::Result<coio::File> f = co_await coio::File::openAsync(d, name, {.write = true, .create = true});
    REQUIRE(f);
    const std::string text = "simulated, but real bytes";
    const coio::Result<std::size_t> w = co_await f->write(0, std::as_bytes(std::span(text)));
    REQUIRE((w && *w == text.size()));
    const coio::Result<void> synced = co_await f->fsync();
    REQUIRE(synced);
    const coio::Result<std::uint64_t> size = co_await f->sizeAsync();
    REQUIRE((size && *size == text.size()));
    std::string back(text.size(), '\0');
    const coio::Result<std::size_t> rd = co_await f->read(0, std::as_writable_bytes(std::span(back)));
    REQUIRE(rd);
    CHECK(back == text);
    const coio::Result<void> closed = co_await f->closeAsync();
    CHECK(closed);
  }(disk, (dir.path() / "written").string()));
}

TEST_CASE("Simulated disk: faults from the seed: EIO, ENOSPC, short reads, an IO that hangs until cancelled", "[sim]") {
  TempDir dir;
  const std::string path = dir.patternFile(0, 1 << 16);
  SimReactor reactor(3);
  coio::Disk disk(reactor);
  coio::Result<coio::File> file = coio::File::open(disk, path.c_str(), {.write = true});
  REQUIRE(file);
  reactor.runUntil([](SimReactor& r, coio::File& f) -> coio::Task<void> {
    std::vector<std::byte> buffer(4096);
    r.setDiskFaults({.eio = 1});
    const coio::Result<std::size_t> failed = co_await f.read(0, buffer);
    CHECK(failed.error() == std::errc::io_error);
    const coio::Result<void> syncFailed = co_await f.fsync();
    CHECK(syncFailed.error() == std::errc::io_error);
    r.setDiskFaults({.enospc = 1});
    const coio::Result<std::size_t> full = co_await f.write(0, buffer);
    CHECK(full.error() == std::errc::no_space_on_device);
    r.setDiskFaults({.shortRead = 1});
    for (int i = 0; i < 20; ++i) {
      const coio::Result<std::size_t> part = co_await f.read(4096, buffer);
      REQUIRE(part);
      CHECK(*part >= 1);
      CHECK(*part < buffer.size());
      CHECK(matchesPattern(0, 4096, std::span(buffer).first(*part)));
    }
    r.setDiskFaults({.hang = 1});
    const auto start = r.now();
    coio::Result<std::size_t> hung =
        co_await coio::withTimeout(r, [&](std::stop_token stop) { return f.read(0, buffer, stop); }, 1s);
    CHECK(hung.error() == std::errc::timed_out);
    CHECK(r.now() - start == 1s);
    CHECK(r.stats().inFlight == 0);
    r.setDiskFaults({});
    const coio::Result<std::size_t> fine = co_await f.read(0, buffer);
    CHECK((fine && *fine == buffer.size()));
  }(reactor, *file));
}

TEST_CASE("Simulated disk: an IO that hangs with nothing else to do is a deadlock, not a hang of the test", "[sim]") {
  TempDir dir;
  const std::string path = dir.patternFile(0, 4096);
  SimReactor reactor(4);
  coio::Disk disk(reactor);
  coio::Result<coio::File> file = coio::File::open(disk, path.c_str());
  REQUIRE(file);
  reactor.setDiskFaults({.hang = 1});
  CHECK_THROWS_AS(reactor.runUntil([](coio::File& f) -> coio::Task<void> {
    std::vector<std::byte> buffer(4096);
    (void)co_await f.read(0, buffer);
  }(*file)),
                  coio::sim::Deadlock);
}

TEST_CASE("Simulated disk: files kept in memory read as the file would: others' writes through a Disk, ends, holes",
          "[sim]") {
  TempDir dir;
  const std::string path = dir.patternFile(0, 200 * 1024);  // four 64 KiB extents, the last in part
  SimReactor reactor(4);
  coio::Disk disk(reactor);
  coio::Result<coio::File> reader = coio::File::open(disk, path.c_str());
  coio::Result<coio::File> writer = coio::File::open(disk, path.c_str(), {.write = true});  // the same file, another fd
  REQUIRE(reader);
  REQUIRE(writer);
  reactor.runUntil([](coio::File& in, coio::File& out) -> coio::Task<void> {
    std::vector<std::byte> buffer(16 * 1024);
    // Across an extent's end: the file's bytes.
    coio::Result<std::size_t> n = co_await in.read(60 * 1024, buffer);
    REQUIRE((n && *n == buffer.size()));
    CHECK(matchesPattern(0, 60 * 1024, buffer));
    // A write through the other File, into the extents just read: seen.
    const std::string text = "written through another File";
    coio::Result<std::size_t> w = co_await out.write(65 * 1024, std::as_bytes(std::span(text)));
    REQUIRE((w && *w == text.size()));
    n = co_await in.read(65 * 1024, std::span(buffer).first(text.size()));
    REQUIRE((n && *n == text.size()));
    CHECK(std::memcmp(buffer.data(), text.data(), text.size()) == 0);
    // Vectored, over the write's edge.
    std::vector<std::byte> head(4), tail(8);
    const std::vector<iovec> parts{{head.data(), head.size()}, {tail.data(), tail.size()}};
    n = co_await in.read(65 * 1024 - 4, parts);
    REQUIRE((n && *n == 12));
    CHECK(matchesPattern(0, 65 * 1024 - 4, head));
    CHECK(std::memcmp(tail.data(), text.data(), tail.size()) == 0);
    // The end of the file: a short read, then nothing; a write past it grows it (the gap reads as zeros).
    n = co_await in.read(200 * 1024 - 100, buffer);
    REQUIRE((n && *n == 100));
    CHECK(matchesPattern(0, 200 * 1024 - 100, std::span(buffer).first(100)));
    n = co_await in.read(300 * 1024, buffer);
    REQUIRE((n && *n == 0));
    w = co_await out.write(210 * 1024, std::as_bytes(std::span(text)));
    REQUIRE((w && *w == text.size()));
    n = co_await in.read(200 * 1024, buffer);
    REQUIRE((n && *n == 10 * 1024 + text.size()));
    CHECK(std::all_of(buffer.begin(), buffer.begin() + 10 * 1024, [](std::byte b) { return b == std::byte{0}; }));
    CHECK(std::memcmp(buffer.data() + 10 * 1024, text.data(), text.size()) == 0);
    // A hole punched through the other File reads as zeros.
    const coio::Result<void> punched = co_await out.fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096);
    REQUIRE(punched);
    n = co_await in.read(0, std::span(buffer).first(8192));
    REQUIRE((n && *n == 8192));
    CHECK(std::all_of(buffer.begin(), buffer.begin() + 4096, [](std::byte b) { return b == std::byte{0}; }));
    CHECK(matchesPattern(0, 4096, std::span(buffer).subspan(4096, 4096)));
    n = co_await in.read(70 * 1024, std::span(buffer).first(64));  // (in memory when the Files close)
    REQUIRE((n && *n == 64));
    CHECK(matchesPattern(0, 70 * 1024, std::span(buffer).first(64)));
  }(*reader, *writer));

  // A file too large to copy (a sparse one of 5 GiB) reads as the file all the same.
  const std::string sparse = (dir.path() / "sparse").string();
  const int sparseFd = ::open(sparse.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(sparseFd >= 0);
  constexpr std::uint64_t kSparse = std::uint64_t{5} << 30;
  REQUIRE(::pwrite(sparseFd, "end", 3, static_cast<off_t>(kSparse - 3)) == 3);
  ::close(sparseFd);
  static_assert(kSparse > coio::detail::SimFiles::kMaxBytes);
  coio::Result<coio::File> large = coio::File::open(disk, sparse.c_str());
  REQUIRE(large);
  reactor.runUntil([](coio::File& in, std::uint64_t size) -> coio::Task<void> {
    std::vector<std::byte> buffer(8, std::byte{0x55});
    coio::Result<std::size_t> n = co_await in.read(size - 3, buffer);
    REQUIRE((n && *n == 3));
    CHECK(std::memcmp(buffer.data(), "end", 3) == 0);
    n = co_await in.read(size / 2, buffer);
    REQUIRE((n && *n == buffer.size()));
    CHECK(std::all_of(buffer.begin(), buffer.end(), [](std::byte b) { return b == std::byte{0}; }));
  }(*large, kSparse));
  large->close();

  // Once its Files are closed, the file is read afresh: a change made meanwhile by other means is seen.
  reader->close();
  writer->close();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const char changed[] = "changed while closed";
  REQUIRE(::pwrite(fd, changed, sizeof changed, 70 * 1024) == static_cast<ssize_t>(sizeof changed));
  ::close(fd);
  coio::Result<coio::File> again = coio::File::open(disk, path.c_str());
  REQUIRE(again);
  reactor.runUntil([](coio::File& in, const char* expected, std::size_t length) -> coio::Task<void> {
    std::vector<std::byte> buffer(length);
    const coio::Result<std::size_t> n = co_await in.read(70 * 1024, buffer);
    REQUIRE((n && *n == length));
    CHECK(std::memcmp(buffer.data(), expected, length) == 0);
  }(*again, changed, sizeof changed));
}
