#pragma once
// Conventions for system calls inside coio: a raw result is a `long`, >= 0
// on success and -errno on failure (the io_uring CQE convention), so that
// both reactors map results to `Result<T>` the same way.
#include <coio/core/result.hpp>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <string>
#include <system_error>

namespace coio::detail {

/// Calls `f` (a system call returning -1 and setting errno on failure)
/// until it is not interrupted by a signal; returns the result or -errno.
template <typename F>
long retryOnEintr(F&& f) noexcept {
  for (;;) {
    const long r = static_cast<long>(f());
    if (r >= 0) return r;
    if (errno != EINTR) return -errno;
  }
}

/// A raw result (>= 0, or -errno) as a Result<T>: void drops the value,
/// integral types keep it.
template <typename T>
Result<T> toResult(long raw) {
  if (raw < 0) return systemError(static_cast<int>(-raw));
  if constexpr (std::is_void_v<T>) {
    return {};
  } else {
    return static_cast<T>(raw);
  }
}

/// A duration (or a steady_clock time since its epoch: CLOCK_MONOTONIC) as
/// a timespec-shaped struct (timespec, __kernel_timespec).
template <typename Timespec>
Timespec toTimespec(std::chrono::nanoseconds ns) noexcept {
  Timespec ts{};
  ts.tv_sec = static_cast<decltype(ts.tv_sec)>(ns.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<decltype(ts.tv_nsec)>(ns.count() % 1'000'000'000);
  return ts;
}

/// For failures that leave an object unusable at construction (no epoll fd,
/// no ring): the caller cannot get a Result out of a constructor.
[[noreturn]] inline void throwSystemError(int err, const std::string& what) {
  throw std::system_error(systemError(err), what);
}

}  // namespace coio::detail
