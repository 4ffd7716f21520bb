#pragma once
// Pipe: the kernel buffer that splice, tee and sendfile move pages through
// (see coio/reactor/splice.hpp).
#include <coio/core/result.hpp>
#include <coio/reactor/file_descriptor.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <utility>

namespace coio {

/// A pipe made for splicing: both ends non-blocking and close-on-exec,
/// owned (closed by the destructor), movable, not copyable.
///
/// Guarantees:
/// - make() yields the pipe or, as a value, the error that prevented it,
///   leaking no fd either way: EMFILE (this process is at its fd limit,
///   RLIMIT_NOFILE), ENFILE (the system is), EPERM (`capacity` is over
///   fs.pipe-max-size for a process without CAP_SYS_RESOURCE, or the user's
///   pipes already hold fs.pipe-user-pages-soft pages), EINVAL (`capacity`
///   over INT_MAX).
/// - capacity() is what the kernel gave: a power of two of pages, at least
///   the size asked (64 KiB by default). One splice into the pipe moves at
///   most that much.
/// - A reactor that waited on an end keeps state by its fd number (see
///   Reactor: `forget`): close(reactor) forgets both ends on it before
///   closing them; the destructor just closes them, which is right for a
///   pipe no reactor waited on (one only sendfile used, say).
/// - Used by one thread at a time; its ends are plain fds, for any system
///   call too.
class Pipe {
 public:
  /// A new pipe, sized to hold at least `capacity` bytes (0: the kernel's
  /// default) with F_SETPIPE_SZ; the errors are listed above.
  static Result<Pipe> make(std::size_t capacity = 0) {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return systemError(errno);
    Pipe pipe{FileDescriptor{fds[0]}, FileDescriptor{fds[1]}};
    Result<std::size_t> sized = capacity != 0 ? pipe.resize(capacity) : pipe.queryCapacity();
    if (!sized) return sized.error();
    return pipe;
  }

  /// Takes over both ends; `other` is left with none.
  Pipe(Pipe&& other) noexcept = default;
  /// Closes this pipe's ends, then takes over `other`'s.
  Pipe& operator=(Pipe&& other) noexcept = default;

  /// The end splices read from.
  int readFd() const noexcept { return read_.get(); }
  /// The end splices write into.
  int writeFd() const noexcept { return write_.get(); }
  /// Bytes the pipe holds at most (F_GETPIPE_SZ, as of make() or resize()).
  std::size_t capacity() const noexcept { return capacity_; }

  /// Resizes it to hold at least `capacity` bytes (F_SETPIPE_SZ): the new
  /// capacity. Errors as make()'s, and EBUSY if it holds more than that.
  Result<std::size_t> resize(std::size_t capacity) {
    if (capacity > INT_MAX) return systemError(EINVAL);
    const int given = ::fcntl(write_.get(), F_SETPIPE_SZ, static_cast<int>(capacity));
    if (given < 0) return systemError(errno);
    return capacity_ = static_cast<std::size_t>(given);
  }

  /// Bytes in the pipe now (FIONREAD).
  std::size_t buffered() const noexcept {
    int n = 0;
    return ::ioctl(read_.get(), FIONREAD, &n) == 0 ? static_cast<std::size_t>(n) : 0;
  }

  /// Reads out and drops whatever the pipe holds (without blocking): the
  /// bytes dropped. For a pipe left holding what a failed transfer could
  /// not deliver.
  std::size_t discard() noexcept {
    std::size_t dropped = 0;
    char sink[4096];
    for (;;) {
      const ssize_t n = ::read(read_.get(), sink, sizeof sink);
      if (n > 0) {
        dropped += static_cast<std::size_t>(n);
      } else if (n == 0 || errno != EINTR) {
        return dropped;  // empty (EAGAIN), or no end to read
      }
    }
  }

  /// Forgets both ends on `reactor` (EpollReactor keeps state by fd number:
  /// see Reactor), then closes them. Loop thread; no operation may be
  /// pending on either end.
  template <typename R>
  void close(R& reactor) noexcept {
    reactor.forget(read_.get());
    reactor.forget(write_.get());
    read_.reset();
    write_.reset();
  }

 private:
  Pipe(FileDescriptor read, FileDescriptor write) noexcept
      : read_(std::move(read)), write_(std::move(write)) {}

  Result<std::size_t> queryCapacity() {
    const int size = ::fcntl(write_.get(), F_GETPIPE_SZ);
    if (size < 0) return systemError(errno);
    return capacity_ = static_cast<std::size_t>(size);
  }

  FileDescriptor read_;
  FileDescriptor write_;
  std::size_t capacity_ = 0;
};

}  // namespace coio
