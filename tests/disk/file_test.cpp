// File: single reads, writes and fsync on both reactors; cancellation and
// shutdown with reads in flight.
#include "../reactor/loop_probe.hpp"
#include "disk_test_helpers.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/read_batch.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <stop_token>
#include <utility>

using namespace std::chrono_literals;
using coio::File;
using coio::Task;
using coio::testing::checkFifoUnclaimed;
using coio::testing::DiskReactors;
using coio::testing::makeFifo;
using coio::testing::openOrFail;
using coio::testing::matchesPattern;
using coio::testing::TempDir;

TEMPLATE_LIST_TEST_CASE("File reads the file's bytes, short at end of file, 0 past it and for an empty buffer",
                        "[disk][file]", DiskReactors) {
  TempDir dir;
  const std::size_t size = 3 * 4096 + 100;
  const std::string path = dir.patternFile(1, size);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path);
    CHECK(file.size().value() == size);
    CHECK(file.alignment() == 1);
    std::vector<std::byte> buffer(5000);
    coio::Result<std::size_t> middle = co_await file.read(123, buffer);
    CHECK(middle.value() == buffer.size());
    CHECK(matchesPattern(1, 123, buffer));
    coio::Result<std::size_t> tail = co_await file.read(size - 10, buffer);
    CHECK(tail.value() == 10);
    CHECK(matchesPattern(1, size - 10, std::span(buffer).first(10)));
    coio::Result<std::size_t> past = co_await file.read(size + 4096, buffer);
    CHECK(past.value() == 0);
    coio::Result<std::size_t> empty = co_await file.read(0, std::span<std::byte>{});
    CHECK(empty.value() == 0);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("File writes, fsyncs and reads back, registered or not", "[disk][file]", DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "written").string();
  TestType reactor;
  coio::Disk disk(reactor);
  const bool registered = GENERATE(false, true);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path, {.write = true, .create = true});
    if (registered) {
      coio::Result<void> r = file.registerWithRing();
      REQUIRE(r.hasValue());
      CHECK(file.registered());
    }
    const char text[] = "hello, disk";
    const auto bytes = std::as_bytes(std::span(text));
    coio::Result<std::size_t> written = co_await file.write(4096, bytes);
    CHECK(written.value() == bytes.size());
    coio::Result<void> synced = co_await file.fsync();
    CHECK(synced.hasValue());
    CHECK(file.size().value() == 4096 + bytes.size());
    std::vector<std::byte> back(bytes.size() + 10);
    coio::Result<std::size_t> read = co_await file.read(4096, back);
    REQUIRE(read.value() == bytes.size());
    CHECK(std::memcmp(back.data(), text, sizeof text) == 0);
    File moved = std::move(file);  // a registered file keeps its slot across a move
    CHECK(moved.registered() == registered);
    read = co_await moved.read(4096, back);
    CHECK(read.value() == bytes.size());
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("the reactor's stats() count a File's operations by kind, on either reactor's ring",
                        "[disk][file][stats]", DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "counted").string();
  TestType reactor;
  coio::Disk disk(reactor);
  using coio::OpKind;
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path, {.write = true, .create = true});
    const coio::LoopStats before = reactor.stats();
    const char text[] = "counted";
    coio::Result<std::size_t> written = co_await file.write(0, std::as_bytes(std::span(text)));
    CHECK(written.value() == sizeof text);
    coio::Result<void> synced = co_await file.fsync();
    CHECK(synced.hasValue());
    synced = co_await file.fdatasync();
    CHECK(synced.hasValue());
    std::vector<std::byte> back(sizeof text);
    coio::Result<std::size_t> read = co_await file.read(0, back);
    CHECK(read.value() == sizeof text);
    coio::Result<std::size_t> nothing = co_await file.read(0, std::span<std::byte>{});  // no SQE: inline
    CHECK(nothing.value() == 0);
    coio::Result<std::uint64_t> size = co_await file.sizeAsync();  // statx
    CHECK(size.value() == sizeof text);
    const coio::LoopStats after = reactor.stats();
    const auto moved = [&](OpKind kind) {
      return std::pair{after[kind].submitted - before[kind].submitted, after[kind].completed - before[kind].completed};
    };
    CHECK(moved(OpKind::diskWrite) == std::pair<std::uint64_t, std::uint64_t>{1, 1});
    CHECK(moved(OpKind::diskSync) == std::pair<std::uint64_t, std::uint64_t>{2, 2});
    CHECK(moved(OpKind::diskRead) == std::pair<std::uint64_t, std::uint64_t>{1, 1});
    CHECK(moved(OpKind::other) == std::pair<std::uint64_t, std::uint64_t>{1, 1});
    CHECK(after.completedInline - before.completedInline == 1);
    CHECK(after.inFlight == before.inFlight);  // (under epoll, the Disk's pump waits on its eventfd: a poll)
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("File reports the kernel's error for a file that cannot be read", "[disk][file]",
                        DiskReactors) {
  TempDir dir;
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File directory = openOrFail(disk, dir.path().string());
    std::vector<std::byte> buffer(64);
    coio::Result<std::size_t> r = co_await directory.read(0, buffer);
    CHECK(r.error() == std::errc::is_a_directory);
    coio::Result<File> missing = File::open(disk, (dir.path() / "missing").c_str());
    CHECK(missing.error() == std::errc::no_such_file_or_directory);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("a stop cancels a read in flight, which resumes once the kernel let go; given no token, "
                        "the awaiting Task's", "[disk][file]", DiskReactors) {
  TempDir dir;
  const std::string fifo = makeFifo(dir);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, fifo, {.write = true});
    std::stop_source stop;
    std::vector<std::byte> buffer(16);
    auto stopLater = [&]() -> Task<void> {
      co_await reactor.sleepFor(20ms);
      stop.request_stop();
    };
    reactor.spawn(stopLater());
    coio::Result<std::size_t> r = co_await file.read(0, buffer, stop.get_token());
    CHECK(r.error() == std::errc::operation_canceled);
    coio::Result<std::size_t> again = co_await file.read(0, buffer, stop.get_token());
    CHECK(again.error() == std::errc::operation_canceled);  // stopped before it started

    // Given no token, a read (or a batch) follows the awaiting Task's: here a deadline's.
    auto readOnce = [&]() -> Task<coio::Result<std::size_t>> { co_return co_await file.read(0, buffer); };
    coio::Result<std::size_t> late = co_await coio::withTimeout(reactor, readOnce(), 20ms);
    CHECK(late.error() == std::errc::timed_out);
    coio::ReadBatch batch(disk);
    batch.add(file, 0, buffer);
    auto submit = [&]() -> Task<void> { co_await batch; };
    coio::Result<void> submitted = co_await coio::withTimeout(reactor, submit(), 20ms);
    CHECK(submitted.error() == std::errc::timed_out);
    CHECK(batch.result(0).error() == std::errc::operation_canceled);
  };
  reactor.runUntil(test());
  checkFifoUnclaimed(fifo);
}

TEMPLATE_LIST_TEST_CASE("a reactor stopped with reads in flight: the kernel lets go before frames are freed",
                        "[disk][file]", DiskReactors) {
  TempDir dir;
  const std::string fifo = makeFifo(dir);
  const std::string path = dir.patternFile(2, 1 << 20);
  int resumed = 0;
  {
    TestType reactor;
    coio::Disk disk(reactor);
    auto reader = [&]() -> Task<void> {
      File file = openOrFail(disk, fifo, {.write = true});
      std::vector<std::byte> buffer(4096);  // in this frame: freed only after the kernel let go
      (void)co_await file.read(0, buffer);
      ++resumed;
    };
    auto stopper = [&]() -> Task<void> {
      File file = openOrFail(disk, path);
      std::vector<std::byte> buffer(4096);
      for (int i = 0; i < 50; ++i) (void)co_await file.read(static_cast<std::uint64_t>(i) * 4096, buffer);
      reactor.stop();
    };
    reactor.spawn(reader());  // owned by the reactor: destroyed after the Disk
    reactor.spawn(stopper());
    // runUntil's own task is destroyed in runUntil, the Disk still alive.
    CHECK_THROWS_AS(reactor.runUntil(reader()), std::system_error);
  }
  CHECK(resumed == 0);
  checkFifoUnclaimed(fifo);
}

TEMPLATE_LIST_TEST_CASE("reads that complete while being submitted do not starve the loop's timers",
                        "[disk][file]", DiskReactors) {
  TempDir dir;
  const std::string path = dir.patternFile(6, 64 * 1024);  // just written: in the page cache
  TestType reactor;
  coio::Disk::Options options;
  options.eagerBelow = ~0u;  // each read in its own enter: every one completes inline
  coio::Disk disk(reactor, options);
  bool running = true;
  std::size_t reads = 0;
  auto worker = [&]() -> Task<void> {
    File file = openOrFail(disk, path);
    std::vector<std::byte> buffer(4096);
    while (running) {
      coio::Result<std::size_t> r = co_await file.read(reads % 16 * 4096, buffer);
      reads += r.valueOr(0) == buffer.size();
    }
  };
  auto test = [&]() -> Task<void> {
    for (int i = 0; i < 8; ++i) reactor.spawn(worker());
    co_await reactor.sleepFor(20ms);  // must fire although reads never stop completing
    running = false;
    co_await reactor.sleepFor(5ms);
  };
  reactor.runUntil(test());
  CHECK(reads > 0);
}

TEMPLATE_LIST_TEST_CASE("disk operations that complete at once share the loop's inline budget", "[disk][file]",
                        DiskReactors) {
  // A zero-length read and an empty batch complete without an SQE; before
  // the fix a coroutine doing either in a loop never yielded.
  TempDir dir;
  const std::string path = dir.patternFile(7, 4096);
  TestType reactor;
  coio::Disk disk(reactor);
  File file = openOrFail(disk, path);
  constexpr std::size_t budget = TestType::kInlineTurnsPerIteration;
  SECTION("zero-length reads") {
    auto step = [&]() -> Task<bool> {
      coio::Result<std::size_t> n = co_await file.read(0, std::span<std::byte>{});
      co_return n.valueOr(1) == 0;
    };
    coio::testing::checkServed(coio::testing::serviceWhileHammered(reactor, step), budget);
  }
  SECTION("empty read batches") {
    coio::ReadBatch batch(disk);
    auto step = [&]() -> Task<bool> {
      co_await batch.submit();
      co_return batch.size() == 0;
    };
    coio::testing::checkServed(coio::testing::serviceWhileHammered(reactor, step), budget);
  }
}
