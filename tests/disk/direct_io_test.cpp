// O_DIRECT: alignment checks with a clear error, and the helper that widens
// an unaligned range.
#include "disk_test_helpers.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/direct_io.hpp>

using coio::BufferPool;
using coio::File;
using coio::Task;
using coio::testing::DiskReactors;
using coio::testing::matchesPattern;
using coio::testing::TempDir;

TEST_CASE("alignRange widens a range to aligned bounds and finds the requested part", "[disk][direct]") {
  const coio::AlignedRange inside = coio::alignRange(5000, 100);
  CHECK(inside.offset == 4096);
  CHECK(inside.length == 4096);
  CHECK(inside.head == 904);
  CHECK(inside.requestedLength(4096) == 100);
  CHECK(inside.requestedLength(950) == 46);  // end of file inside the range
  CHECK(inside.requestedLength(500) == 0);   // end of file before it

  const coio::AlignedRange across = coio::alignRange(4095, 2);
  CHECK(across.offset == 0);
  CHECK(across.length == 8192);
  CHECK(across.head == 4095);

  const coio::AlignedRange aligned = coio::alignRange(8192, 4096, 512);
  CHECK(aligned.offset == 8192);
  CHECK(aligned.length == 4096);
  CHECK(aligned.head == 0);

  const coio::AlignedRange empty = coio::alignRange(100, 0);
  CHECK(empty.length == 0);
  CHECK(empty.requestedLength(0) == 0);

  CHECK(coio::isAligned(4096, 8192, reinterpret_cast<const void*>(4096), 4096));
  CHECK_FALSE(coio::isAligned(4096, 100, reinterpret_cast<const void*>(4096), 4096));
  const std::error_code misaligned = coio::DiskErrc::misalignedDirectIo;
  CHECK(misaligned == std::errc::invalid_argument);
  CHECK(misaligned.message().find("alignRange") != std::string::npos);
}

TEMPLATE_LIST_TEST_CASE("O_DIRECT reads: aligned ones read, misaligned ones fail before the kernel",
                        "[disk][direct]", DiskReactors) {
  TempDir dir;
  const std::size_t size = 5 * 4096 + 1000;  // not a whole number of blocks
  const std::string path = dir.patternFile(8, size);
  BufferPool pool({.bufferSize = 4 * 4096, .count = 2});
  TestType reactor;
  coio::Disk disk(reactor);
  auto test = [&]() -> Task<void> {
    coio::Result<File> opened = File::open(disk, path.c_str(), {.direct = true});
    REQUIRE(opened.hasValue());
    File& file = *opened;
    CHECK(file.direct());
    const std::size_t align = file.alignment();
    CHECK(align >= 512);
    coio::Buffer buffer = *pool.tryAcquire();
    coio::Result<std::size_t> ok = co_await file.read(4096, buffer.span().first(8192));
    CHECK(ok.value() == 8192);
    CHECK(matchesPattern(8, 4096, buffer.span().first(8192)));

    coio::Result<std::size_t> offset = co_await file.read(align / 2, buffer.span().first(4096));
    CHECK(offset.error() == coio::DiskErrc::misalignedDirectIo);
    coio::Result<std::size_t> length = co_await file.read(0, buffer.span().first(align + 1));
    CHECK(length.error() == coio::DiskErrc::misalignedDirectIo);
    coio::Result<std::size_t> address = co_await file.read(0, buffer.span().subspan(1, 4096));
    CHECK(address.error() == coio::DiskErrc::misalignedDirectIo);

    // Past the last whole block: short, then nothing.
    coio::Result<std::size_t> tail = co_await file.read(5 * 4096, buffer.span().first(4096));
    CHECK(tail.value() == 1000);
    coio::Result<std::size_t> past = co_await file.read(8 * 4096, buffer.span().first(4096));
    CHECK(past.value() == 0);

    // An unaligned request, widened: the caller's bytes, clamped at end of file.
    for (auto [want, length] : {std::pair<std::uint64_t, std::size_t>{5000, 3000}, {size - 300, 1000}}) {
      const coio::AlignedRange range = coio::alignRange(want, length, align);
      REQUIRE(range.length <= buffer.size());
      coio::Result<std::size_t> r = co_await file.readFixed(range.offset, buffer.slice(0, range.length));
      const std::span<std::byte> part = range.requestedPart(buffer.span(), r.value());
      CHECK(part.size() == std::min<std::size_t>(length, size - want));
      CHECK(matchesPattern(8, want, part));
    }
  };
  reactor.runUntil(test());
}
