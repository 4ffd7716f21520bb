// ReadBatch: many reads, one submission, one resumption; per-read results;
// cancellation and shutdown mid-batch.
#include "disk_test_helpers.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/read_batch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <stop_token>
#include <thread>

using namespace std::chrono_literals;
using coio::BufferPool;
using coio::File;
using coio::ReadBatch;
using coio::Task;
using coio::testing::checkFifoUnclaimed;
using coio::testing::DiskReactors;
using coio::testing::makeFifo;
using coio::testing::openOrFail;
using coio::testing::matchesPattern;
using coio::testing::TempDir;

TEMPLATE_LIST_TEST_CASE("a batch of 1,000 reads across 16 files returns every byte, resuming once",
                        "[disk][batch]", DiskReactors) {
  constexpr std::size_t kFiles = 16, kFileSize = 256 * 1024, kReads = 1000;
  TempDir dir;
  std::vector<std::string> paths;
  for (std::size_t f = 0; f < kFiles; ++f) paths.push_back(dir.patternFile(f, kFileSize));
  BufferPool pool({.bufferSize = 8192, .count = kReads});
  const bool registered = GENERATE(false, true);
  TestType reactor;
  coio::Disk disk(reactor);
  if (registered) REQUIRE(disk.registerBuffers(pool).hasValue());
  INFO(pool.registrationNote());
  CHECK(pool.registered() == registered);
  auto test = [&]() -> Task<void> {
    std::vector<File> files;
    for (std::size_t f = 0; f < kFiles; ++f) {
      // Half O_DIRECT, half buffered; half registered.
      files.push_back(openOrFail(disk, paths[f], {.direct = f % 2 == 1}));
      if (f % 4 < 2) REQUIRE(files.back().registerWithRing().hasValue());
    }
    std::mt19937_64 random(42);
    struct Expected {
      std::size_t file;
      std::uint64_t offset;
      std::size_t length;
      std::size_t at;  // where in the slice the requested bytes start
      coio::Buffer buffer;
    };
    std::vector<Expected> expected;
    ReadBatch batch(disk);
    batch.reserve(kReads);
    for (std::size_t i = 0; i < kReads; ++i) {
      const std::size_t f = random() % kFiles;
      coio::Buffer buffer = *pool.tryAcquire();
      Expected e{f, 0, 0, 0, std::move(buffer)};
      if (files[f].direct()) {
        e.offset = random() % (kFileSize / 4096) * 4096;
        e.length = 4096;
      } else {
        e.offset = random() % kFileSize;
        e.length = 1 + random() % 4096;
        e.at = random() % 4096;  // not at the start of the fixed buffer (liburing #994)
      }
      const std::size_t index = batch.add(files[f], e.offset, e.buffer.slice(e.at, e.length));
      CHECK(index == i);
      expected.push_back(std::move(e));
    }
    co_await batch;
    std::size_t good = 0;
    for (std::size_t i = 0; i < kReads; ++i) {
      const Expected& e = expected[i];
      const std::size_t want = std::min<std::size_t>(e.length, kFileSize - e.offset);
      coio::Result<std::size_t> r = batch.result(i);
      INFO("read " << i << ": " << r.error().message());
      REQUIRE(r.value() == want);
      good += matchesPattern(e.file, e.offset, e.buffer.span().subspan(e.at, want));
    }
    CHECK(good == kReads);
    for (File& file : files) file.close();
  };
  reactor.runUntil(test());
  CHECK(pool.available() == kReads);
  disk.unregisterBuffers(pool);
  CHECK_FALSE(pool.registered());
}

TEMPLATE_LIST_TEST_CASE("a batch reports each read's own outcome; failures do not fail the others",
                        "[disk][batch]", DiskReactors) {
  TempDir dir;
  const std::size_t size = 10000;
  const std::string path = dir.patternFile(3, size);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path);
    File direct = openOrFail(disk, path, {.direct = true});
    File directory = openOrFail(disk, dir.path().string());
    std::vector<std::byte> a(100), b(100), c(100), d(100);
    ReadBatch batch(disk);
    batch.add(file, 50, a);                  // 0: whole
    batch.add(directory, 0, b);              // 1: EISDIR
    batch.add(file, size - 30, c);           // 2: short at end of file
    batch.add(file, size + 1, d);            // 3: past end of file
    batch.add(direct, 1, d);                 // 4: misaligned O_DIRECT, never submitted
    batch.add(file, 0, std::span<std::byte>{});  // 5: empty
    co_await batch.submit();
    CHECK(batch.result(0).value() == 100);
    CHECK(matchesPattern(3, 50, a));
    CHECK(batch.result(1).error() == std::errc::is_a_directory);
    CHECK(batch.result(2).value() == 30);
    CHECK(matchesPattern(3, size - 30, std::span(c).first(30)));
    CHECK(batch.result(3).value() == 0);
    CHECK(batch.result(4).error() == coio::DiskErrc::misalignedDirectIo);
    CHECK(batch.result(5).value() == 0);

    // Reused: the results are the new submission's.
    batch.clear();
    batch.add(file, 0, a);
    co_await batch;
    CHECK(batch.size() == 1);
    CHECK(batch.result(0).value() == 100);
    CHECK(matchesPattern(3, 0, a));

    // Nothing to submit: completes without suspending.
    batch.clear();
    batch.add(direct, 3, a);
    co_await batch;
    CHECK(batch.result(0).error() == std::errc::invalid_argument);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("a stop cancels what is still in flight; the batch resumes once, after every CQE",
                        "[disk][batch]", DiskReactors) {
  TempDir dir;
  const std::string fifo = makeFifo(dir);
  const std::string path = dir.patternFile(4, 1 << 20);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path);
    File pipe = openOrFail(disk, fifo, {.write = true});
    std::vector<std::vector<std::byte>> buffers(20, std::vector<std::byte>(4096));
    ReadBatch batch(disk);
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (i % 4 == 0) {
        batch.add(pipe, 0, buffers[i]);
      } else {
        batch.add(file, i * 4096, buffers[i]);
      }
    }
    std::stop_source stop;
    auto stopLater = [&]() -> Task<void> {
      co_await reactor.sleepFor(20ms);
      stop.request_stop();
    };
    reactor.spawn(stopLater());
    co_await batch.submit(stop.get_token());
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (i % 4 == 0) {
        CHECK(batch.result(i).error() == std::errc::operation_canceled);
      } else {
        CHECK(batch.result(i).value() == 4096);
        CHECK(matchesPattern(4, i * 4096, buffers[i]));
      }
    }
    co_await batch.submit(stop.get_token());  // already stopped: nothing submitted
    CHECK(batch.result(1).error() == std::errc::operation_canceled);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("reads racing with stop() from another thread: no completion touches freed memory",
                        "[disk][batch][threads]", DiskReactors) {
  TempDir dir;
  const std::string fifo = makeFifo(dir);
  const std::string path = dir.patternFile(5, 1 << 20);
  BufferPool pool({.bufferSize = 4096, .count = 256});
  for (int round = 0; round < 10; ++round) {
    std::atomic<std::size_t> batches{0};
    {
      TestType reactor;
      coio::Disk disk(reactor);
      (void)disk.registerBuffers(pool);
      auto reader = [&](bool withFifo) -> Task<void> {
        File file = openOrFail(disk, path, {.direct = true});
        File pipe = openOrFail(disk, fifo, {.write = true});
        std::vector<coio::Buffer> buffers;
        for (int i = 0; i < 32; ++i) buffers.push_back(*pool.tryAcquire());
        for (std::uint64_t n = 0;; ++n) {
          ReadBatch batch(disk);
          for (std::size_t i = 0; i < buffers.size(); ++i) {
            if (withFifo && i == 0) {
              batch.add(pipe, 0, buffers[i].slice());
            } else {
              batch.add(file, (n * 7 + i) % 256 * 4096, buffers[i].slice());
            }
          }
          co_await batch;
          batches.fetch_add(1, std::memory_order_relaxed);
        }
      };
      for (int i = 0; i < 4; ++i) reactor.spawn(reader(i == 0));
      std::thread loop([&] { reactor.run(); });
      std::this_thread::sleep_for(std::chrono::microseconds(500 * round));
      reactor.stop();
      loop.join();
    }
    CHECK(pool.available() == pool.count());  // every frame gone, every buffer back
  }
}

namespace {

// Makes io_uring_enter on `ring` fail (EBADF) until destroyed: the kernel
// refuses to take a full SQ, as it would for a ring gone bad.
class BreakRingFd {
 public:
  explicit BreakRingFd(io_uring& ring) noexcept : ring_(ring), fd_(ring.ring_fd), enterFd_(ring.enter_ring_fd) {
    ring.ring_fd = ring.enter_ring_fd = -1;
  }
  BreakRingFd(const BreakRingFd&) = delete;
  BreakRingFd& operator=(const BreakRingFd&) = delete;
  ~BreakRingFd() {
    ring_.ring_fd = fd_;
    ring_.enter_ring_fd = enterFd_;
  }

 private:
  io_uring& ring_;
  int fd_, enterFd_;
};

// A reactor and a Disk whose ring has a 4-entry SQ.
template <typename R>
struct SmallRing;
template <>
struct SmallRing<coio::EpollReactor> {
  coio::EpollReactor reactor;
  coio::Disk disk{reactor, coio::Disk::Options{.entries = 4}};
};
template <>
struct SmallRing<coio::UringReactor> {
  coio::UringReactor reactor{coio::UringReactor::Options{.entries = 4}};
  coio::Disk disk{reactor};
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("a ring refusing SQEs mid-batch fails the reads left, not the co_await", "[disk][batch]",
                        DiskReactors) {
  // 12 reads, 4 SQ entries: flushing the full SQ fails. Before the fix the
  // exception left await_suspend with reads in flight (whose CQEs would
  // later resume the coroutine again) and, on a dedicated ring, the batch
  // left open for good.
  TempDir dir;
  constexpr std::size_t kReads = 12, kSize = 4096;
  const std::string path = dir.patternFile(6, kReads * kSize);
  SmallRing<TestType> s;
  auto test = [&]() -> Task<void> {
    File file = openOrFail(s.disk, path);
    std::vector<std::vector<std::byte>> buffers(kReads, std::vector<std::byte>(kSize));
    ReadBatch batch(s.disk);
    for (std::size_t i = 0; i < kReads; ++i) batch.add(file, i * kSize, buffers[i]);
    std::optional<BreakRingFd> broken(std::in_place, s.disk.ring());
    bool threw = false;
    auto submit = [&]() -> Task<void> {
      try {
        co_await batch;
      } catch (const std::exception&) {
        threw = true;
      }
    };
    // Runs as soon as the batch suspends, before the loop enters the kernel.
    auto repair = [&]() -> Task<void> {
      broken.reset();
      co_return;
    };
    co_await coio::collectAll(submit(), repair());
    REQUIRE_FALSE(threw);
    std::size_t ok = 0;
    while (ok < kReads && batch.result(ok).hasValue()) {
      CHECK(batch.result(ok).value() == kSize);
      CHECK(matchesPattern(6, ok * kSize, buffers[ok]));
      ++ok;
    }
    CHECK(ok > 0);
    CHECK(ok < kReads);
    for (std::size_t i = ok; i < kReads; ++i) CHECK(batch.result(i).error() == std::errc::bad_file_descriptor);

    // The ring works again.
    batch.clear();
    batch.add(file, 0, buffers[0]);
    co_await batch;
    CHECK(batch.result(0).value() == kSize);
  };
  s.reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("a started batch yields each read as it completes, out of order, then nullopt",
                        "[disk][batch]", DiskReactors) {
  // Reads of a FIFO complete only once it is written: the file reads (and
  // the invalid one, which never goes to the kernel) must come out first,
  // each exactly once, with its own bytes; the FIFO reads after the write.
  TempDir dir;
  const std::string fifo = makeFifo(dir);
  const std::string path = dir.patternFile(5, 1 << 20);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path);
    File pipe = openOrFail(disk, fifo, {.write = true});
    std::vector<std::vector<std::byte>> buffers(12, std::vector<std::byte>(4096));
    ReadBatch batch(disk);
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (i < 2) {
        batch.add(pipe, 0, std::span(buffers[i]).first(3));  // FIFO reads: first added, last done
      } else {
        batch.add(file, i * 4096, buffers[i]);
      }
    }
    File direct = openOrFail(disk, path, {.direct = true});
    const std::size_t invalid = batch.add(direct, 1, buffers[0]);  // misaligned: never submitted, yielded at once
    batch.start();
    std::vector<std::size_t> order;
    for (std::size_t n = 0; n < buffers.size() - 1; ++n) {  // the invalid read and the 10 file reads
      std::optional<std::size_t> i = co_await batch.next();
      REQUIRE(i.has_value());
      order.push_back(*i);
    }
    CHECK(order.front() == invalid);
    CHECK(batch.result(invalid).error() == coio::DiskErrc::misalignedDirectIo);
    for (std::size_t k = 1; k < order.size(); ++k) {
      const std::size_t i = order[k];
      REQUIRE(i >= 2);  // no FIFO read yet: nobody wrote to it
      CHECK(batch.result(i).value() == 4096);
      CHECK(matchesPattern(5, i * 4096, buffers[i]));
    }
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    REQUIRE(writer >= 0);
    REQUIRE(::write(writer, "abcdef", 6) == 6);
    std::optional<std::size_t> a = co_await batch.next();
    std::optional<std::size_t> b = co_await batch.next();
    ::close(writer);
    REQUIRE((a && b));
    CHECK(*a + *b == 1);  // 0 and 1, in either order
    CHECK(batch.result(0).value() == 3);
    CHECK(batch.result(1).value() == 3);
    std::optional<std::size_t> end = co_await batch.next();
    CHECK_FALSE(end.has_value());
    end = co_await batch.next();
    CHECK_FALSE(end.has_value());  // stays at the end
    std::set<std::size_t> seen(order.begin(), order.end());
    seen.insert({*a, *b});
    CHECK(seen.size() == batch.size());
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("a stop while a started batch waits cancels its reads, which next() still yields",
                        "[disk][batch]", DiskReactors) {
  TempDir dir;
  const std::string fifo = makeFifo(dir);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File pipe = openOrFail(disk, fifo, {.write = true});
    std::vector<std::vector<std::byte>> buffers(3, std::vector<std::byte>(16));
    ReadBatch batch(disk);
    for (auto& buffer : buffers) batch.add(pipe, 0, buffer);
    batch.start();
    std::stop_source stop;
    auto stopLater = [&]() -> Task<void> {
      co_await reactor.sleepFor(20ms);
      stop.request_stop();
    };
    reactor.spawn(stopLater());
    std::size_t yielded = 0;
    while (std::optional<std::size_t> i = co_await batch.next(stop.get_token())) {
      CHECK(batch.result(*i).error() == std::errc::operation_canceled);
      ++yielded;
    }
    CHECK(yielded == buffers.size());
  };
  reactor.runUntil(test());
  checkFifoUnclaimed(fifo);
}

namespace {

// Reads the block layer merged into others so far on the device holding
// `path` (the second field of /sys/dev/block/MAJ:MIN/stat).
std::uint64_t readMerges(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  const std::string stat =
      "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) + "/stat";
  std::ifstream in(stat);
  INFO(stat << ": the device's I/O counters are needed to see merges");
  std::uint64_t reads = 0, merges = 0;
  REQUIRE(static_cast<bool>(in >> reads >> merges));
  return merges;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("keepApart: adjacent O_DIRECT reads stay separate requests, each completing on its own",
                        "[disk][batch]", DiskReactors) {
  constexpr std::size_t kPiece = 64 * 1024, kPieces = 32;
  TempDir dir;
  const std::string path = dir.patternFile(3, kPiece * kPieces);
  {
    // On the device: an O_DIRECT read of dirty pages waits for their
    // writeback, which io_uring does off the submitting thread, read by read.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  BufferPool pool({.bufferSize = kPiece, .count = kPieces});
  TestType reactor;
  coio::Disk disk(reactor);
  REQUIRE(disk.registerBuffers(pool).hasValue());
  // One batch of kPieces reads covering the file end to end; the device's
  // merge count before and after.
  auto mergesOf = [&](bool apart) -> Task<std::uint64_t> {
    File file = openOrFail(disk, path, {.direct = true});
    std::vector<coio::Buffer> buffers;
    for (std::size_t i = 0; i < kPieces; ++i) buffers.push_back(*pool.tryAcquire());
    const std::uint64_t before = readMerges(path);
    ReadBatch batch(disk);
    batch.keepApart(apart);
    for (std::size_t i = 0; i < kPieces; ++i) batch.add(file, i * kPiece, buffers[i].slice());
    batch.start();
    std::size_t yielded = 0;
    while (std::optional<std::size_t> i = co_await batch.next()) {
      ++yielded;
      CHECK(batch.result(*i).value() == kPiece);
      CHECK(matchesPattern(3, *i * kPiece, buffers[*i].span()));
    }
    CHECK(yielded == kPieces);
    co_return readMerges(path) - before;
  };
  // Without it the block layer merges (else this test could not tell);
  // with it, nothing of ours is merged.
  const std::uint64_t merged = reactor.runUntil(mergesOf(false));
  INFO("merges without keepApart: " << merged);
  REQUIRE(merged > 0);
  CHECK(reactor.runUntil(mergesOf(true)) == 0);
}
