#pragma once
// FileDescriptor: the sole owner of a file descriptor.
#include <unistd.h>

#include <utility>

namespace coio {

/// Owns one file descriptor (or none: -1) and closes it on destruction or
/// reset(). Move-only: at most one FileDescriptor closes a given fd.
/// What TcpStream::release() hands back, and what the reactors, sockets,
/// pipes and files hold. Not thread-safe: one owner, one thread at a time.
class FileDescriptor {
 public:
  FileDescriptor() noexcept = default;
  /// Takes ownership of `fd` (-1: none).
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  /// Takes over `other`'s descriptor; `other` owns none.
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  /// Closes its own descriptor, then takes over `other`'s.
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  /// Closes the descriptor it owns.
  ~FileDescriptor() { reset(); }

  /// The descriptor (-1 if none), still owned.
  int get() const noexcept { return fd_; }
  /// Whether it owns one.
  bool valid() const noexcept { return fd_ >= 0; }

  /// Gives up ownership: returns the descriptor without closing it.
  int release() noexcept { return std::exchange(fd_, -1); }

  /// Closes the owned descriptor (if any) and takes ownership of `fd`.
  void reset(int fd = -1) noexcept {
    // close() is not retried on EINTR: on Linux the descriptor is gone anyway.
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace coio
