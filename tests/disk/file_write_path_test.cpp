// File's write path through the ring: vectored I/O, fdatasync, fallocate,
// and the io_uring forms of open, statx and close, on both reactors.
#include "disk_test_helpers.hpp"
#include "../reactor/test_reactors.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <stop_token>
#include <thread>

using coio::BufferPool;
using coio::File;
using coio::Task;
using coio::testing::DiskReactors;
using coio::testing::matchesPattern;
using coio::testing::openOrFail;
using coio::testing::patternByte;
using coio::testing::TempDir;

namespace {

iovec part(std::span<std::byte> bytes) { return {bytes.data(), bytes.size()}; }

void fillPattern(std::size_t file, std::uint64_t offset, std::span<std::byte> bytes) {
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = patternByte(file, offset + i);
}

bool allZero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{}; });
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("vectored O_DIRECT writes and reads round-trip; a misaligned iovec is refused",
                        "[disk][file][vectored]", DiskReactors) {
  constexpr std::size_t kBlock = 4096;
  TempDir dir;
  const std::string path = (dir.path() / "vectored").string();
  BufferPool pool({.bufferSize = 4 * kBlock, .count = 4});
  const bool registered = GENERATE(false, true);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path, {.write = true, .create = true, .direct = true});
    REQUIRE(file.alignment() <= kBlock);
    if (registered) REQUIRE(file.registerWithRing().hasValue());
    coio::Buffer out = *pool.tryAcquire(), in = *pool.tryAcquire(), other = *pool.tryAcquire();
    // [8 KiB, 24 KiB) from three parts of unequal size.
    fillPattern(9, 2 * kBlock, out.span());
    const iovec parts[] = {part(out.span().subspan(0, kBlock)), part(out.span().subspan(kBlock, 2 * kBlock)),
                           part(out.span().subspan(3 * kBlock, kBlock))};
    coio::Result<std::size_t> written = co_await file.write(2 * kBlock, parts);
    CHECK(written.value() == 4 * kBlock);
    // Back in two other parts, in two buffers.
    const iovec back[] = {part(in.span().subspan(0, 3 * kBlock)), part(other.span().subspan(0, kBlock))};
    coio::Result<std::size_t> read = co_await file.read(2 * kBlock, back);
    CHECK(read.value() == 4 * kBlock);
    CHECK(matchesPattern(9, 2 * kBlock, in.span().first(3 * kBlock)));
    CHECK(matchesPattern(9, 5 * kBlock, other.span().first(kBlock)));
    // Short at end of file.
    const iovec tail[] = {part(in.span().subspan(0, kBlock)), part(in.span().subspan(kBlock, 2 * kBlock))};
    coio::Result<std::size_t> shortRead = co_await file.read(5 * kBlock, tail);
    CHECK(shortRead.value() == kBlock);

    // Refused before submission: nothing written past 24 KiB.
    const iovec shortPart[] = {part(out.span().subspan(0, kBlock)), part(out.span().subspan(kBlock, 100))};
    const iovec oddAddress[] = {part(out.span().subspan(0, kBlock)), part(out.span().subspan(kBlock + 1, kBlock))};
    coio::Result<std::size_t> refused = co_await file.write(6 * kBlock, shortPart);
    CHECK(refused.error() == coio::DiskErrc::misalignedDirectIo);
    refused = co_await file.write(6 * kBlock, oddAddress);
    CHECK(refused.error() == coio::DiskErrc::misalignedDirectIo);
    refused = co_await file.write(6 * kBlock + 256, parts);
    CHECK(refused.error() == coio::DiskErrc::misalignedDirectIo);
    refused = co_await file.read(0, oddAddress);
    CHECK(refused.error() == coio::DiskErrc::misalignedDirectIo);
    std::vector<iovec> tooMany(IOV_MAX + 1, part(out.span().subspan(0, kBlock)));
    refused = co_await file.write(6 * kBlock, tooMany);
    CHECK(refused.error() == std::errc::invalid_argument);
    coio::Result<std::uint64_t> size = co_await file.sizeAsync();
    CHECK(size.value() == 6 * kBlock);
    coio::Result<std::size_t> none = co_await file.write(0, std::span<const iovec>{});
    CHECK(none.value() == 0);

    // Without O_DIRECT any iovec goes.
    File buffered = openOrFail(disk, path, {.write = true});
    char hello[] = "hello", comma[] = ", ", word[] = "disk";
    const iovec words[] = {{hello, 5}, {comma, 2}, {word, 4}};
    written = co_await buffered.write(3, words);
    CHECK(written.value() == 11);
    std::vector<std::byte> text(11);
    read = co_await buffered.read(3, text);
    CHECK(read.value() == 11);
    CHECK(std::memcmp(text.data(), "hello, disk", 11) == 0);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("writeFixed writes a BufferPool slice, registered (WRITE_FIXED) or not", "[disk][file]",
                        DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "fixed").string();
  BufferPool pool({.bufferSize = 8192, .count = 2});
  const bool registered = GENERATE(false, true);
  TestType reactor;
  coio::Disk disk(reactor);
  if (registered) REQUIRE(disk.registerBuffers(pool).hasValue());
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path, {.write = true, .create = true, .direct = true});
    coio::Buffer out = *pool.tryAcquire(), in = *pool.tryAcquire();
    fillPattern(5, 4096, out.span());
    // The second half of the buffer: the fixed buffer's address, not its start.
    coio::Result<std::size_t> written = co_await file.writeFixed(4096, out.slice(4096, 4096));
    CHECK(written.value() == 4096);
    coio::Result<std::size_t> read = co_await file.readFixed(4096, in.slice(0, 4096));
    CHECK(read.value() == 4096);
    CHECK(std::memcmp(in.data(), out.data() + 4096, 4096) == 0);
    coio::Result<std::size_t> misaligned = co_await file.writeFixed(100, out.slice(0, 4096));
    CHECK(misaligned.error() == coio::DiskErrc::misalignedDirectIo);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("fdatasync and fallocate: KEEP_SIZE allocates without growing, a punched hole reads zeros",
                        "[disk][file]", DiskReactors) {
  constexpr std::size_t kSize = 64 * 1024;
  TempDir dir;
  const std::string path = dir.patternFile(4, kSize);
  const bool registered = GENERATE(false, true);
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    File file = openOrFail(disk, path, {.write = true});
    if (registered) REQUIRE(file.registerWithRing().hasValue());
    coio::Result<void> synced = co_await file.fdatasync();
    CHECK(synced.hasValue());

    coio::Result<struct statx> before = co_await file.stat(STATX_SIZE | STATX_BLOCKS);
    REQUIRE(before.hasValue());
    REQUIRE((before->stx_mask & STATX_BLOCKS) != 0);
    coio::Result<void> kept = co_await file.fallocate(FALLOC_FL_KEEP_SIZE, kSize, 1 << 20);
    REQUIRE(kept.hasValue());
    coio::Result<struct statx> after = co_await file.stat(STATX_SIZE | STATX_BLOCKS);
    CHECK(after->stx_size == kSize);
    CHECK((after->stx_blocks - before->stx_blocks) * 512 >= 1 << 20);

    coio::Result<void> grown = co_await file.fallocate(0, kSize, kSize);
    CHECK(grown.hasValue());
    coio::Result<std::uint64_t> size = co_await file.sizeAsync();
    CHECK(size.value() == 2 * kSize);

    coio::Result<void> punched = co_await file.fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 8192);
    REQUIRE(punched.hasValue());
    std::vector<std::byte> back(16384);
    coio::Result<std::size_t> read = co_await file.read(0, back);
    REQUIRE(read.value() == back.size());
    CHECK(matchesPattern(4, 0, std::span(back).first(4096)));
    CHECK(allZero(std::span(back).subspan(4096, 8192)));
    CHECK(matchesPattern(4, 12288, std::span(back).subspan(12288)));
    size = co_await file.sizeAsync();
    CHECK(size.value() == 2 * kSize);

    coio::Result<void> empty = co_await file.fallocate(0, 0, 0);  // goes to the kernel, which refuses it
    CHECK(empty.error() == std::errc::invalid_argument);
    File readOnly = openOrFail(disk, path);
    coio::Result<void> notWritable = co_await readOnly.fallocate(0, 0, 4096);
    CHECK(notWritable.error() == std::errc::bad_file_descriptor);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("openAsync opens through the ring, reporting openat's errors; closeAsync closes",
                        "[disk][file][open]", DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "opened").string();
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    coio::Result<File> missing = co_await File::openAsync(disk, (dir.path() / "missing").string());
    CHECK(missing.error() == std::errc::no_such_file_or_directory);
    coio::Result<File> directory = co_await File::openAsync(disk, dir.path().string(), {.write = true});
    CHECK(directory.error() == std::errc::is_a_directory);
    std::stop_source stopped;
    stopped.request_stop();
    coio::Result<File> cancelled = co_await File::openAsync(disk, path, {.write = true, .create = true},
                                                            stopped.get_token());
    CHECK(cancelled.error() == std::errc::operation_canceled);
    CHECK(::access(path.c_str(), F_OK) != 0);  // never created

    coio::Result<File> created = co_await File::openAsync(disk, path, {.write = true, .create = true, .direct = true});
    REQUIRE(created.hasValue());
    CHECK(created->isOpen());
    CHECK(created->direct());
    CHECK(created->alignment() == openOrFail(disk, path, {.direct = true}).alignment());  // statx'd as open() does
    std::vector<std::byte> bytes(8192, std::byte{7});
    BufferPool pool({.bufferSize = 8192, .count = 1});
    coio::Buffer block = *pool.tryAcquire();
    std::memcpy(block.data(), bytes.data(), bytes.size());
    coio::Result<std::size_t> written = co_await created->write(0, block.span());
    CHECK(written.value() == 8192);
    coio::Result<std::uint64_t> size = co_await created->sizeAsync();
    CHECK(size.value() == 8192);

    REQUIRE(created->registerWithRing().hasValue());
    const int fd = created->fd();
    coio::Result<void> closed = co_await created->closeAsync(stopped.get_token());
    CHECK(closed.error() == std::errc::operation_canceled);  // never ran: still open, still registered
    CHECK(created->fd() == fd);
    CHECK(created->registered());
    CHECK(::fcntl(fd, F_GETFD) != -1);
    closed = co_await created->closeAsync();
    CHECK(closed.hasValue());
    CHECK_FALSE(created->isOpen());
    CHECK_FALSE(created->registered());
    CHECK(::fcntl(fd, F_GETFD) == -1);  // the descriptor is gone
    CHECK(errno == EBADF);
    closed = co_await created->closeAsync();  // closing a closed File does nothing
    CHECK(closed.hasValue());

    coio::Result<File> reopened = co_await File::openAsync(disk, path);
    REQUIRE(reopened.hasValue());
    CHECK_FALSE(reopened->direct());
    std::vector<std::byte> back(10000);
    coio::Result<std::size_t> read = co_await reopened->read(0, back);
    CHECK(read.value() == 8192);
    CHECK(std::memcmp(back.data(), bytes.data(), 8192) == 0);
  };
  reactor.runUntil(test());
}

TEMPLATE_LIST_TEST_CASE("stop with an open done in the kernel but not delivered leaks no fd", "[disk][file][open]",
                        DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "opened").string();
  const std::size_t fdsBefore = coio::testing::openFdCount();
  {
    TestType reactor;
    coio::Disk disk(reactor);
    auto openOne = [&]() -> Task<void> {
      (void)co_await File::openAsync(disk, path, {.write = true, .create = true});
      FAIL("resumed after stop");
    };
    // Blocks the loop until the kernel's worker has created the file: the
    // open can no longer be cancelled, and its file is not delivered yet.
    auto stopper = [&]() -> Task<void> {
      for (int i = 0; i < 10000 && ::access(path.c_str(), F_OK) != 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      CHECK(::access(path.c_str(), F_OK) == 0);
      reactor.stop();
      co_return;
    };
    reactor.spawn(openOne());  // first: its open reaches the kernel before the stop
    reactor.spawn(stopper());
    reactor.run();
  }
  CHECK(coio::testing::openFdCount() == fdsBefore);
}

TEMPLATE_LIST_TEST_CASE("the write path's awaitables resume on the Disk's loop thread", "[disk][file][threads]",
                        DiskReactors) {
  TempDir dir;
  const std::string path = (dir.path() / "threads").string();
  TestType reactor;
  coio::Disk disk(reactor);
  std::vector<std::thread::id> resumedOn;  // where the coroutine started, then after each co_await
  std::vector<bool> succeeded;
  auto test = [&]() -> Task<void> {
    resumedOn.push_back(std::this_thread::get_id());
    coio::Result<File> file = co_await File::openAsync(disk, path, {.write = true, .create = true});
    resumedOn.push_back(std::this_thread::get_id());
    succeeded.push_back(file.hasValue());
    if (file) {
      char text[] = "on the loop";
      const iovec parts[] = {{text, sizeof text}};
      coio::Result<std::size_t> written = co_await file->write(0, parts);
      resumedOn.push_back(std::this_thread::get_id());
      succeeded.push_back(written.valueOr(0) == sizeof text);
      coio::Result<void> synced = co_await file->fdatasync();
      resumedOn.push_back(std::this_thread::get_id());
      succeeded.push_back(synced.hasValue());
      coio::Result<std::uint64_t> size = co_await file->sizeAsync();
      resumedOn.push_back(std::this_thread::get_id());
      succeeded.push_back(size.valueOr(0) == sizeof text);
      coio::Result<void> closed = co_await file->closeAsync();
      resumedOn.push_back(std::this_thread::get_id());
      succeeded.push_back(closed.hasValue());
    }
    reactor.stop();
  };
  reactor.spawn(test());
  std::thread loop([&] { reactor.run(); });
  const std::thread::id loopThread = loop.get_id();
  loop.join();
  CHECK(succeeded == std::vector<bool>(5, true));
  CHECK(resumedOn == std::vector<std::thread::id>(6, loopThread));
}
