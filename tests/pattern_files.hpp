#pragma once
// Files with known contents in a temporary directory, for the tests that
// read files (the disk tests, the reactors' splice tests).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace coio::testing {

/// The byte at `offset` of pattern file number `file`.
inline std::byte patternByte(std::size_t file, std::uint64_t offset) noexcept {
  const std::uint64_t x = (offset ^ (offset >> 9) ^ (offset >> 17)) * 0x9E3779B1u + file * 131;
  return static_cast<std::byte>(x >> 13);
}

/// Whether `bytes` is pattern file `file` from `offset` on.
inline bool matchesPattern(std::size_t file, std::uint64_t offset, std::span<const std::byte> bytes) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != patternByte(file, offset + i)) return false;
  }
  return true;
}

/// A temporary directory (on the build machine's disk, where O_DIRECT
/// works), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "coio-disk-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Writes pattern file `file` of `size` bytes; returns its path.
  std::string patternFile(std::size_t file, std::size_t size) const {
    const std::string name = (path_ / ("pattern-" + std::to_string(file))).string();
    std::vector<std::byte> bytes(size);
    for (std::size_t i = 0; i < size; ++i) bytes[i] = patternByte(file, i);
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, bytes.data(), size) == static_cast<ssize_t>(size));
    ::close(fd);
    return name;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace coio::testing
