#pragma once
// Shared by the disk tests: both reactors, opening files, FIFOs (files
// with known contents: ../pattern_files.hpp).
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include "../pattern_files.hpp"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace coio::testing {

using DiskReactors = std::tuple<EpollReactor, UringReactor>;

inline File openOrFail(Disk& disk, const std::string& path, File::OpenOptions options = {}) {
  Result<File> file = File::open(disk, path.c_str(), options);
  INFO(path << ": " << file.error().message());
  REQUIRE(file.hasValue());
  return std::move(*file);
}

/// A FIFO in `dir`; opened read-write, reads from it wait for data, so
/// they stay in flight until cancelled.
inline std::string makeFifo(const TempDir& dir) {
  const std::string path = (dir.path() / "fifo").string();
  REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
  return path;
}

/// Proves no read is still pending on the FIFO: bytes written now can be
/// read back directly.
inline void checkFifoUnclaimed(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "abc", 3) == 3);
  char back[8] = {};
  CHECK(::read(fd, back, sizeof back) == 3);
  ::close(fd);
}

}  // namespace coio::testing
