#pragma once
// What both reactors' splice, tee and sendfile share: the transfer itself
// (a splice or a tee between two fds, never blocking on a pipe or socket),
// where one that found an end not ready waits, and keeping SIGPIPE off the
// loop thread.
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/splice.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace coio::detail {

// The most one transfer moves: the kernel's MAX_RW_COUNT, which also fits
// an SQE's 32-bit length.
inline constexpr std::size_t kMaxSpliceChunk = 0x7ffff000;

// One splice(2) or tee(2). SPLICE_F_NONBLOCK, on both reactors: a pipe or
// socket end that is not ready yields -EAGAIN, never a blocked thread.
struct SpliceCall {
  bool tee;  // tee(2): both ends pipes, no offsets
  int in;
  std::int64_t inOffset;
  int out;
  std::int64_t outOffset;
  std::size_t length;

  unsigned chunk() const noexcept { return static_cast<unsigned>(std::min(length, kMaxSpliceChunk)); }

  // The system call: bytes moved, or -errno.
  long operator()() const noexcept {
    return retryOnEintr([&]() -> long {
      if (tee) return ::tee(in, out, chunk(), SPLICE_F_NONBLOCK);
      loff_t inAt = inOffset;
      loff_t outAt = outOffset;
      return ::splice(in, inOffset == kNoOffset ? nullptr : &inAt, out, outOffset == kNoOffset ? nullptr : &outAt,
                      chunk(), SPLICE_F_NONBLOCK);
    });
  }
};

// Where a transfer that found an end not ready (-EAGAIN) waits: `fd`, to be
// writable (`write`) or readable.
struct SpliceWait {
  int fd;
  bool write;
};

// The end that is not ready now: `in` not readable, else `out` not
// writable (a regular file always is both, so this is a pipe or a socket).
// If both look ready (they changed since), the pipe end: its readiness is
// reported at once, and the transfer tried again.
inline SpliceWait spliceWait(int in, int out) noexcept {
  pollfd ends[2] = {{in, POLLIN, 0}, {out, POLLOUT, 0}};
  if (::poll(ends, 2, 0) >= 0) {
    if (!(ends[0].revents & (POLLIN | POLLHUP | POLLERR))) return {in, false};
    if (!(ends[1].revents & (POLLOUT | POLLHUP | POLLERR))) return {out, true};
  }
  struct stat st {};
  if (::fstat(in, &st) == 0 && S_ISFIFO(st.st_mode)) return {in, false};
  return {out, true};
}

// Calls `f` (a raw result: >= 0 or -errno) with SIGPIPE blocked on this
// thread, and takes back the SIGPIPE its -EPIPE raised: splice, tee and
// sendfile have no MSG_NOSIGNAL, and a peer that goes away must cost an
// error, not the process. (io_uring runs them on io-wq workers, which block
// every signal.) A caller that blocks SIGPIPE itself gets it as ever.
template <typename F>
long withoutSigpipe(F&& f) noexcept {
  sigset_t pipe;
  sigset_t old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  const long r = f();
  if (r == -EPIPE && !sigismember(&old, SIGPIPE)) {
    const timespec now{};
    while (sigtimedwait(&pipe, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return r;
}

}  // namespace coio::detail
