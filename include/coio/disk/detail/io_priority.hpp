#pragma once
// I/O priority values (ioprio(7)) as the kernel encodes them: a class in
// the top bits, a level below. Spelled out here rather than taken from
// <linux/ioprio.h>, whose contents changed across kernel versions.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>

namespace coio::detail {

inline constexpr int kIoprioClassShift = 13;
inline constexpr int kIoprioClassNone = 0;
inline constexpr int kIoprioClassBestEffort = 2;
inline constexpr int kIoprioLevels = 8;

constexpr std::uint16_t ioprioValue(int ioClass, int level) noexcept {
  return static_cast<std::uint16_t>((ioClass << kIoprioClassShift) | level);
}

// The calling thread's effective I/O priority: its own, or (class none) the
// best-effort level the kernel derives from its nice value.
inline std::uint16_t currentIoprio() noexcept {
  const long prio = ::syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, 0 /* this thread */);
  if (prio > 0 && (prio >> kIoprioClassShift) != kIoprioClassNone) return static_cast<std::uint16_t>(prio);
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, 0);  // of this thread; -1 is also a valid nice value
  const int level = errno == 0 ? std::clamp((nice + 20) / 5, 0, kIoprioLevels - 1) : 4;
  return ioprioValue(kIoprioClassBestEffort, level);
}

// Two values of the thread's priority class that differ in level only:
// its own and the neighbouring level. The block layer never merges
// requests whose priorities differ (blk_rq_merge_ok, attempt_merge), and
// the schedulers that order by priority (mq-deadline) look at the class.
// Taken once per thread.
inline const std::array<std::uint16_t, 2>& apartIoprios() noexcept {
  thread_local const std::array<std::uint16_t, 2> values = [] {
    const std::uint16_t own = currentIoprio();
    const int level = own & (kIoprioLevels - 1);
    const int other = level + 1 < kIoprioLevels ? level + 1 : level - 1;
    return std::array<std::uint16_t, 2>{own, static_cast<std::uint16_t>((own & ~(kIoprioLevels - 1)) | other)};
  }();
  return values;
}

}  // namespace coio::detail
