#pragma once
// The simulated disk's copies of files in memory (SimWorld holds them, for
// every simulated Disk of one simulation): a read of a file kept here is a
// copy from memory, not a system call. docs/simulation.md, the table's
// "a disk" row.
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace coio::detail {

/// The bytes of files that coio::Files on simulated Disks have open, one
/// copy per file (by device and inode: two Files of one file share it),
/// read from the file 64 KiB extent by extent as reads first need them.
///
/// Guarantees:
/// - Reads through a File not opened O_DIRECT copy from memory, with
///   pread's results (fewer bytes at the end of the file, 0 past it); an
///   O_DIRECT File's reads stay preads, so that the file system's alignment
///   rules hold.
/// - Writes through a simulated Disk go to the file, whose extents they
///   touch are read again at the next read; a write past the end or an
///   fallocate drops the copy (made again at the next read).
/// - The copy goes when the file's last File closes. A file larger than
///   kMaxBytes (a large sparse one, say) is not copied: its reads stay preads.
/// - What changes a file by other means while a File has it open (another
///   process, a write(2) of the test's own) is seen only in extents not
///   read yet.
class SimFiles {
 public:
  static constexpr std::size_t kExtent = std::size_t{64} << 10;
  static constexpr std::uint64_t kMaxBytes = std::uint64_t{4} << 30;

  /// A File opened `fd`. An fd that cannot be told apart (fstat fails, no
  /// memory) is left out: its reads stay preads.
  void opened(int fd, bool direct) noexcept {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    try {
      closing(fd);  // (never open twice; but a File that leaked its fd must not pin a copy)
      const Key key{st.st_dev, st.st_ino};
      fds_[fd] = Open{key, direct};
      ++files_[key].opens;  // (the last step that may throw)
    } catch (...) {
      fds_.erase(fd);
    }
  }

  /// A File is closing `fd`.
  void closing(int fd) noexcept {
    const auto open = fds_.find(fd);
    if (open == fds_.end()) return;
    const auto file = files_.find(open->second.key);
    if (file != files_.end() && --file->second.opens == 0) files_.erase(file);
    fds_.erase(open);
  }

  /// preadv(fd, parts, count, offset) from the copy: the result, or
  /// nullopt when `fd` has none (the caller preads).
  std::optional<long> read(int fd, const iovec* parts, int count, std::uint64_t offset) {
    Copy* copy = copyFor(fd);
    if (copy == nullptr) return std::nullopt;
    std::size_t done = 0;
    for (int i = 0; i < count; ++i) {
      const std::uint64_t at = offset + done;
      const std::size_t n = at >= copy->size ? 0 : std::min<std::size_t>(parts[i].iov_len, copy->size - at);
      if (n != 0 && !fetch(fd, *copy, at, n)) return std::nullopt;  // changed under it: the caller preads
      if (n != 0) std::memcpy(parts[i].iov_base, copy->bytes.get() + at, n);
      done += n;
      if (n < parts[i].iov_len) break;
    }
    return static_cast<long>(done);
  }

  /// `written` bytes went to the file at `offset` through `fd`.
  void wrote(int fd, std::size_t written, std::uint64_t offset) noexcept {
    Copy* copy = existingCopy(fd);
    if (copy == nullptr || written == 0) return;
    if (offset + written > copy->size) {
      unmake(*copy);
      return;
    }
    for (std::size_t e = offset / kExtent; e * kExtent < offset + written; ++e) copy->fetched[e] = false;
  }

  /// The file behind `fd` changed in a way the copy does not follow
  /// (fallocate): made again at the next read.
  void changed(int fd) noexcept {
    if (Copy* copy = existingCopy(fd)) unmake(*copy);
  }

 private:
  using Key = std::pair<dev_t, ino_t>;
  struct Copy {
    int opens = 0;
    bool tooLarge = false;                  // above kMaxBytes when last looked at: preads
    std::uint64_t size = 0;                 // the file's, when made
    std::unique_ptr<std::byte[]> bytes;     // size bytes, those of fetched extents read; null: not made
    std::vector<bool> fetched;              // per kExtent bytes
  };
  struct Open {
    Key key;
    bool direct = false;
  };

  static void unmake(Copy& copy) noexcept {
    copy.tooLarge = false;
    copy.size = 0;
    copy.bytes.reset();
    copy.fetched = {};
  }

  Copy* existingCopy(int fd) noexcept {
    const auto open = fds_.find(fd);
    if (open == fds_.end()) return nullptr;
    const auto file = files_.find(open->second.key);
    return file != files_.end() && file->second.bytes ? &file->second : nullptr;
  }

  // The copy to read `fd` from, made now if it was not; null: pread.
  Copy* copyFor(int fd) {
    const auto open = fds_.find(fd);
    if (open == fds_.end() || open->second.direct) return nullptr;
    Copy& copy = files_[open->second.key];
    if (copy.tooLarge) return nullptr;
    if (!copy.bytes) {
      struct stat st {};
      if (::fstat(fd, &st) != 0) return nullptr;  // preads, which report the error
      if (static_cast<std::uint64_t>(st.st_size) > kMaxBytes) {
        copy.tooLarge = true;
        return nullptr;
      }
      copy.size = static_cast<std::uint64_t>(st.st_size);
      copy.fetched.assign((copy.size + kExtent - 1) / kExtent, false);
      copy.bytes.reset(new std::byte[copy.size]);  // not zeroed: untouched until fetched (never null)
    }
    return &copy;
  }

  // Reads the extents of [at, at + n) not read yet; false if the file
  // was shorter than the copy (changed by other means: the copy is dropped).
  static bool fetch(int fd, Copy& copy, std::uint64_t at, std::size_t n) {
    for (std::size_t e = at / kExtent; e * kExtent < at + n; ++e) {
      if (copy.fetched[e]) continue;
      const std::uint64_t start = e * kExtent;
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kExtent, copy.size - start));
      std::size_t got = 0;
      while (got < want) {
        const ssize_t r = ::pread(fd, copy.bytes.get() + start + got, want - got, static_cast<off_t>(start + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          unmake(copy);
          return false;
        }
        got += static_cast<std::size_t>(r);
      }
      copy.fetched[e] = true;
    }
    return true;
  }

  std::map<Key, Copy> files_;
  std::unordered_map<int, Open> fds_;
};

}  // namespace coio::detail
