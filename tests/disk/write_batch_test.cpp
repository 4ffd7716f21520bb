// WriteBatch: many writes, one submission, one resumption; per-write
// results; streaming; cancellation. What it shares with ReadBatch
// (DiskBatch: a ring refusing SQEs, shutdown mid-batch) is tested there.
#include "disk_test_helpers.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/write_batch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <set>
#include <stop_token>

using namespace std::chrono_literals;
using coio::BufferPool;
using coio::File;
using coio::Task;
using coio::WriteBatch;
using coio::testing::DiskReactors;
using coio::testing::makeFifo;
using coio::testing::matchesPattern;
using coio::testing::openOrFail;
using coio::testing::patternByte;
using coio::testing::TempDir;

namespace {

std::vector<std::byte> contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// A FIFO's pipe filled to the brim: writes to it wait until it is drained.
class FullPipe {
 public:
  explicit FullPipe(const std::string& fifo) : fd_(::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC)) {
    REQUIRE(fd_ >= 0);
    const std::vector<char> chunk(4096, 'f');
    for (std::size_t step : {chunk.size(), std::size_t{1}}) {  // pages, then the last bytes
      for (ssize_t n; (n = ::write(fd_, chunk.data(), step)) > 0;) filled_ += static_cast<std::size_t>(n);
      REQUIRE(errno == EAGAIN);
    }
  }
  FullPipe(const FullPipe&) = delete;
  FullPipe& operator=(const FullPipe&) = delete;
  ~FullPipe() { ::close(fd_); }

  /// Reads the filling back (all of it, nothing past it).
  void drain() const {
    std::vector<char> sink(filled_);
    std::size_t got = 0;
    while (got < filled_) {
      const ssize_t n = ::read(fd_, sink.data() + got, filled_ - got);
      REQUIRE(n > 0);
      got += static_cast<std::size_t>(n);
    }
    CHECK(std::all_of(sink.begin(), sink.end(), [](char c) { return c == 'f'; }));
  }
  /// What the pipe holds beyond the filling (after drain()).
  std::string rest() const {
    char buffer[256];
    const ssize_t n = ::read(fd_, buffer, sizeof buffer);
    return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
  }

 private:
  int fd_;
  std::size_t filled_ = 0;
};

// A full pipe and a regular file, open for writing on a Disk of `Reactor`.
template <typename Reactor>
struct FullPipeAndFile {
  TempDir dir;
  std::string fifo = makeFifo(dir);
  FullPipe full{fifo};
  std::string path = (dir.path() / "file").string();
  Reactor reactor;
  coio::Disk disk{reactor};
  File pipe = openOrFail(disk, fifo, {.write = true});
  File file = openOrFail(disk, path, {.write = true, .create = true});
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("a WriteBatch of 512 O_DIRECT writes across 8 files lands every byte", "[disk][write]",
                        DiskReactors) {
  constexpr std::size_t kFiles = 8, kBlocks = 64, kBlock = 4096;
  TempDir dir;
  std::vector<std::string> paths;
  for (std::size_t f = 0; f < kFiles; ++f) paths.push_back((dir.path() / ("w" + std::to_string(f))).string());
  BufferPool pool({.bufferSize = kBlock, .count = kFiles * kBlocks});
  const bool registered = GENERATE(false, true);
  TestType reactor;
  coio::Disk disk(reactor);
  if (registered) REQUIRE(disk.registerBuffers(pool).hasValue());
  INFO(pool.registrationNote());
  CHECK(pool.registered() == registered);
  auto test = [&]() -> Task<void> {
    std::vector<File> files;
    for (std::size_t f = 0; f < kFiles; ++f) {
      files.push_back(openOrFail(disk, paths[f], {.write = true, .create = true, .direct = true}));
      REQUIRE(files.back().alignment() <= kBlock);
      if (f % 2 == 0) REQUIRE(files.back().registerWithRing().hasValue());
    }
    // Every block of every file once, in random order; block b of file f
    // gets pattern f's bytes at its offset.
    std::vector<std::size_t> order(kFiles * kBlocks);
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
    std::vector<coio::Buffer> buffers;
    WriteBatch batch(disk);
    batch.reserve(order.size());
    for (const std::size_t block : order) {
      const std::size_t f = block / kBlocks;
      const std::uint64_t offset = block % kBlocks * kBlock;
      buffers.push_back(*pool.tryAcquire());
      std::byte* data = buffers.back().data();
      for (std::size_t i = 0; i < kBlock; ++i) data[i] = patternByte(f, offset + i);
      CHECK(batch.add(files[f], offset, buffers.back().slice()) == buffers.size() - 1);
    }
    co_await batch;
    std::size_t written = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) written += batch.result(i).valueOr(0) == kBlock;
    CHECK(written == order.size());
    for (File& file : files) {
      coio::Result<std::uint64_t> size = co_await file.sizeAsync();  // statx through the ring
      CHECK(size.value() == kBlocks * kBlock);
      file.close();
    }
  };
  reactor.runUntil(test());
  for (std::size_t f = 0; f < kFiles; ++f) {
    const std::vector<std::byte> bytes = contents(paths[f]);
    REQUIRE(bytes.size() == kBlocks * kBlock);
    CHECK(matchesPattern(f, 0, bytes));
  }
  CHECK(pool.available() == pool.count());
}

TEMPLATE_LIST_TEST_CASE("a WriteBatch reports each write's own outcome; failures do not fail the others",
                        "[disk][write]", DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "outcomes").string();
  BufferPool pool({.bufferSize = 4096, .count = 1});
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path, {.write = true, .create = true});
    File readOnly = openOrFail(disk, path);
    File direct = openOrFail(disk, path, {.write = true, .direct = true});
    const std::vector<std::byte> a(100, std::byte{'a'}), b(100, std::byte{'b'});
    coio::Buffer aligned = *pool.tryAcquire();
    WriteBatch batch(disk);
    batch.add(file, 0, a);                            // 0: written
    batch.add(readOnly, 100, b);                      // 1: EBADF
    batch.add(direct, 1, aligned.slice());            // 2: misaligned O_DIRECT, never submitted
    batch.add(file, std::uint64_t{1} << 63, b);       // 3: EINVAL (a negative offset to the kernel)
    batch.add(file, 0, std::span<const std::byte>{});  // 4: empty
    batch.add(file, 200, b);                          // 5: written
    co_await batch.submit();
    CHECK(batch.result(0).value() == 100);
    CHECK(batch.result(1).error() == std::errc::bad_file_descriptor);
    CHECK(batch.result(2).error() == coio::DiskErrc::misalignedDirectIo);
    CHECK(batch.result(3).error() == std::errc::invalid_argument);
    CHECK(batch.result(4).value() == 0);
    CHECK(batch.result(5).value() == 100);
    file.close();
  };
  reactor.runUntil(test());
  const std::vector<std::byte> bytes = contents(path);
  REQUIRE(bytes.size() == 300);
  CHECK(std::all_of(bytes.begin(), bytes.begin() + 100, [](std::byte c) { return c == std::byte{'a'}; }));
  CHECK(std::all_of(bytes.begin() + 100, bytes.begin() + 200, [](std::byte c) { return c == std::byte{}; }));
  CHECK(std::all_of(bytes.begin() + 200, bytes.end(), [](std::byte c) { return c == std::byte{'b'}; }));
}

TEMPLATE_LIST_TEST_CASE("a started WriteBatch yields each write as it completes: writes to a full pipe last",
                        "[disk][write]", DiskReactors) {
  FullPipeAndFile<TestType> s;
  auto test = [&]() -> Task<void> {
    File direct = openOrFail(s.disk, s.path, {.write = true, .direct = true});
    const std::string text = "abc";
    const auto word = std::as_bytes(std::span(text));
    std::vector<std::vector<std::byte>> blocks;
    blocks.reserve(8);
    WriteBatch batch(s.disk);
    batch.add(s.pipe, 0, word);  // 0 and 1: first added, last done
    batch.add(s.pipe, 0, word);
    for (std::size_t i = 2; i < 10; ++i) {
      blocks.emplace_back(4096, static_cast<std::byte>(i));
      batch.add(s.file, i * 4096, blocks.back());
    }
    const std::size_t invalid = batch.add(direct, 1, blocks.front());  // yielded at once
    batch.start();
    std::vector<std::size_t> order;
    for (std::size_t n = 0; n < 9; ++n) {  // the invalid write and the 8 file writes
      std::optional<std::size_t> i = co_await batch.next();
      REQUIRE(i.has_value());
      order.push_back(*i);
    }
    CHECK(order.front() == invalid);
    for (std::size_t k = 1; k < order.size(); ++k) {
      REQUIRE(order[k] >= 2);  // no pipe write yet: the pipe is full
      CHECK(batch.result(order[k]).value() == 4096);
    }
    s.full.drain();
    std::optional<std::size_t> a = co_await batch.next();
    std::optional<std::size_t> b = co_await batch.next();
    REQUIRE((a && b));
    CHECK(*a + *b == 1);  // 0 and 1, in either order
    CHECK(batch.result(0).value() == 3);
    CHECK(batch.result(1).value() == 3);
    CHECK(s.full.rest() == "abcabc");
    std::optional<std::size_t> end = co_await batch.next();
    CHECK_FALSE(end.has_value());
    std::set<std::size_t> seen(order.begin(), order.end());
    seen.insert({*a, *b});
    CHECK(seen.size() == batch.size());
  };
  s.reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("a stop cancels the writes still in flight, which write nothing; the others land",
                        "[disk][write]", DiskReactors) {
  FullPipeAndFile<TestType> s;
  auto test = [&]() -> Task<void> {
    const std::vector<std::byte> block(4096, std::byte{'x'});
    WriteBatch batch(s.disk);
    for (std::size_t i = 0; i < 12; ++i) {
      if (i % 4 == 0) {
        batch.add(s.pipe, 0, block);
      } else {
        batch.add(s.file, i * block.size(), block);
      }
    }
    std::stop_source stop;
    auto stopLater = [&]() -> Task<void> {
      co_await s.reactor.sleepFor(20ms);
      stop.request_stop();
    };
    s.reactor.spawn(stopLater());
    co_await batch.submit(stop.get_token());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (i % 4 == 0) {
        CHECK(batch.result(i).error() == std::errc::operation_canceled);
      } else {
        CHECK(batch.result(i).value() == block.size());
      }
    }
    s.full.drain();
    CHECK(s.full.rest().empty());  // the cancelled writes left nothing in the pipe
    coio::Result<std::uint64_t> size = co_await s.file.sizeAsync();
    CHECK(size.value() == 12 * block.size());
    co_await batch.submit(stop.get_token());  // already stopped: nothing submitted
    CHECK(batch.result(1).error() == std::errc::operation_canceled);
  };
  s.reactor.runUntil(test());
}
