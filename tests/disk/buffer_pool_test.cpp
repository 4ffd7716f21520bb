// BufferPool: layout, hand-out without allocation, registration with the
// ring and every way it can fall back to plain reads.
#include "disk_test_helpers.hpp"

#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/read_batch.hpp>

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <set>

using coio::BufferPool;
using coio::File;
using coio::Task;
using coio::testing::DiskReactors;
using coio::testing::matchesPattern;
using coio::testing::TempDir;

namespace {

// Reads the first 64 KiB of pattern file 7 into a slice at a non-zero
// offset of one buffer, singly and in a batch; true if both match.
template <typename Reactor>
bool readsIntoPool(BufferPool& pool, coio::Disk& disk, Reactor& reactor, const std::string& path) {
  auto test = [&]() -> Task<bool> {
    coio::Result<File> file = File::open(disk, path.c_str(), {.direct = true});
    if (!file) co_return false;
    coio::Buffer buffer = *pool.tryAcquire();
    const coio::BufferSlice slice = buffer.slice(4096, 64 * 1024);
    coio::Result<std::size_t> single = co_await file->readFixed(8192, slice);
    const bool singleOk = single.valueOr(0) == slice.size && matchesPattern(7, 8192, slice.span());
    coio::ReadBatch batch(disk);
    batch.add(*file, 4096, slice);
    co_await batch;
    co_return singleOk && batch.result(0).valueOr(0) == slice.size && matchesPattern(7, 4096, slice.span());
  };
  return reactor.runUntil(test());
}

// Drops CAP_IPC_LOCK from this thread's effective set, so that
// RLIMIT_MEMLOCK applies to rings it creates (root is exempt otherwise).
bool dropIpcLock() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  return ::syscall(SYS_capset, &header, data) == 0;
}

}  // namespace

TEST_CASE("a BufferPool is one contiguous, aligned mapping handed out without allocation", "[disk][pool]") {
  BufferPool pool({.bufferSize = 3 * 4096, .count = 10});
  CHECK(pool.size() == 10 * 3 * 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(pool.data()) % (2 << 20) == 0);
  CHECK_FALSE(pool.registered());
  std::vector<coio::Buffer> out;
  std::set<std::uint32_t> indexes;
  while (auto buffer = pool.tryAcquire()) {
    CHECK(buffer->data() == pool.data() + buffer->index() * pool.bufferSize());
    CHECK(buffer->size() == pool.bufferSize());
    CHECK(buffer->slice().fixedIndex == -1);
    indexes.insert(buffer->index());
    out.push_back(std::move(*buffer));
  }
  CHECK(indexes.size() == 10);
  CHECK(pool.available() == 0);
  out.pop_back();
  CHECK(pool.available() == 1);
  out.clear();
  CHECK(pool.available() == 10);
  CHECK_THROWS_AS(BufferPool({.bufferSize = 1000, .count = 1}), std::system_error);
}

TEMPLATE_LIST_TEST_CASE("a registered pool reads with READ_FIXED at offsets inside a buffer; a second pool falls back",
                        "[disk][pool]", DiskReactors) {
  TempDir dir;
  const std::string path = dir.patternFile(7, 1 << 20);
  BufferPool pool({.bufferSize = 128 * 1024, .count = 8});
  BufferPool second({.bufferSize = 128 * 1024, .count = 2});
  TestType reactor;
  coio::Disk disk(reactor);
  REQUIRE(disk.registerBuffers(pool).hasValue());
  CHECK(pool.registered());
  CHECK(pool.tryAcquire()->slice().fixedIndex == 0);
  CHECK(disk.registerBuffers(second).error() == std::errc::device_or_resource_busy);
  INFO(second.registrationNote());
  CHECK(second.registrationNote().find("taken") != std::string::npos);
  CHECK(readsIntoPool(pool, disk, reactor, path));
  CHECK(readsIntoPool(second, disk, reactor, path));
  disk.unregisterBuffers(pool);
  CHECK(disk.registerBuffers(second).hasValue());
  CHECK(readsIntoPool(second, disk, reactor, path));
}

TEMPLATE_LIST_TEST_CASE("registration refused under RLIMIT_MEMLOCK degrades to plain reads with a note",
                        "[disk][pool]", DiskReactors) {
  TempDir dir;
  const std::string path = dir.patternFile(7, 1 << 20);
  // In a child: the limit and the capability are process state.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Enough for the rings, not for 4 MiB of buffers.
    rlimit limit{1 << 20, 1 << 20};
    if (!dropIpcLock() || ::setrlimit(RLIMIT_MEMLOCK, &limit) != 0) ::_exit(10);
    int status = 0;
    try {
      BufferPool pool({.bufferSize = 1 << 20, .count = 4});
      TestType reactor;
      coio::Disk disk(reactor);
      const coio::Result<void> registered = disk.registerBuffers(pool);
      if (registered.error() != std::errc::not_enough_memory) status = 11;
      else if (pool.registrationNote().find("RLIMIT_MEMLOCK") == std::string::npos) status = 12;
      else if (pool.registered() || pool.tryAcquire()->slice().fixedIndex != -1) status = 13;
      else if (!readsIntoPool(pool, disk, reactor, path)) status = 14;
    } catch (...) {
      status = 15;
    }
    ::_exit(status);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEMPLATE_LIST_TEST_CASE("an unregistered pool, and one whose Disk went away, read with plain reads",
                        "[disk][pool]", DiskReactors) {
  TempDir dir;
  const std::string path = dir.patternFile(7, 1 << 20);
  BufferPool pool({.bufferSize = 128 * 1024, .count = 2});
  TestType reactor;
  {
    coio::Disk disk(reactor);
    CHECK(readsIntoPool(pool, disk, reactor, path));
    REQUIRE(disk.registerBuffers(pool).hasValue());
  }
  CHECK_FALSE(pool.registered());  // the Disk unregistered it
  coio::Disk disk(reactor);
  CHECK(readsIntoPool(pool, disk, reactor, path));
}

TEMPLATE_LIST_TEST_CASE("poisonOnRelease: a buffer out of the pool holds the pattern and, under ASan, is off-limits",
                        "[disk][pool]", DiskReactors) {
  const bool poison = GENERATE(false, true);
  INFO((poison ? "poisoning" : "plain") << " pool");
  const std::byte* mapping = nullptr;
  std::size_t mappingSize = 0;
  {
    BufferPool pool({.bufferSize = 2 * 4096, .count = 3, .poisonOnRelease = poison});
    mapping = pool.data();
    mappingSize = pool.size();
    auto holds = [](const coio::Buffer& b, std::byte value) {
      return std::all_of(b.span().begin(), b.span().end(), [value](std::byte x) { return x == value; });
    };
    coio::Buffer first = *pool.tryAcquire();
    CHECK(holds(first, poison ? BufferPool::kPoisonByte : std::byte{0}));  // a fresh mapping is zeroed
    std::fill(first.span().begin(), first.span().end(), std::byte{0x11});
    const std::byte* const data = first.data();
    const std::uint32_t index = first.index();
    first.reset();
#if defined(COIO_DETAIL_ASAN)
    CHECK(__asan_region_is_poisoned(const_cast<std::byte*>(data), pool.bufferSize()) == (poison ? data : nullptr));
    CHECK(__asan_address_is_poisoned(pool.data() + pool.size() - 1) == poison);  // never handed out
#else
    (void)data;
#endif
    coio::Buffer again = *pool.tryAcquire();  // the free list is LIFO: the same buffer
    REQUIRE(again.index() == index);
    CHECK(holds(again, poison ? BufferPool::kPoisonByte : std::byte{0x11}));
    again.reset();

    // Registered, it reads like any other pool: the kernel writes the unpoisoned buffer.
    TempDir dir;
    const std::string path = dir.patternFile(7, 1 << 20);
    BufferPool large({.bufferSize = 128 * 1024, .count = 2, .poisonOnRelease = poison});
    TestType reactor;
    coio::Disk disk(reactor);
    REQUIRE(disk.registerBuffers(large).hasValue());
    CHECK(readsIntoPool(large, disk, reactor, path));
    if (poison) CHECK(holds(*large.tryAcquire(), BufferPool::kPoisonByte));  // released after the read
  }
#if defined(COIO_DETAIL_ASAN)
  // Unmapped, the memory carries no marks for whatever is mapped there next.
  CHECK(__asan_region_is_poisoned(const_cast<std::byte*>(mapping), mappingSize) == nullptr);
#else
  (void)mapping;
  (void)mappingSize;
#endif
}
