#pragma once
// Setting up an io_uring with what coio needs, and telling why it cannot
// be (UringReactor::probe, the constructor's message). Needs liburing.
#include <coio/reactor/uring_options.hpp>

#include <liburing.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace coio::detail {

// The ring's table of supported operations (null if the kernel will not tell).
using RingProbe = std::unique_ptr<io_uring_probe, void (*)(io_uring_probe*)>;
inline RingProbe probeRing(io_uring& ring) noexcept { return {io_uring_get_probe_ring(&ring), &io_uring_free_probe}; }

// Why io_uring cannot be used, in words, for an errno from the set-up.
inline std::string describeUringSetupError(int err) {
  std::string why = "coio::UringReactor: io_uring unavailable: ";
  switch (err) {
    case ENOSYS: return why + "the kernel was built without io_uring (ENOSYS)";
    case EPERM:
      return why + "io_uring is disabled for this process: kernel.io_uring_disabled sysctl, "
                   "or a seccomp/container policy (EPERM)";
    case EINVAL: return why + "the kernel is too old: coio needs Linux 5.19 or later (EINVAL from io_uring_setup)";
    case ENOMEM: return why + "no memory for the rings: RLIMIT_MEMLOCK too low on older kernels? (ENOMEM)";
    default: return why + "io_uring_setup failed: " + std::strerror(err);
  }
}

// Linux version of the running kernel at least major.minor.
inline bool kernelAtLeast(int major, int minor) noexcept {
  utsname u{};
  int haveMajor = 0, haveMinor = 0;
  if (::uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &haveMajor, &haveMinor) != 2) return false;
  return haveMajor > major || (haveMajor == major && haveMinor >= minor);
}

inline unsigned taskRunFlags(TaskRun mode) noexcept {
  switch (mode) {
    case TaskRun::immediate: return 0;
    case TaskRun::cooperative: return IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
    case TaskRun::deferred:
      return IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED;
  }
  return 0;
}

// Sets up a ring with what coio needs; 0 or an errno, and `why` on failure.
// `mode` may fall back (deferred -> cooperative on kernels before 6.1).
inline int setUpRing(io_uring& ring, unsigned entries, unsigned cqEntries, TaskRun& mode, std::string& why) {
  io_uring_params params{};
  int r;
  for (;;) {
    params = {};
    params.cq_entries = std::max(cqEntries, 2 * entries);
    params.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | taskRunFlags(mode);
    r = io_uring_queue_init_params(entries, &ring, &params);
    if (r == -EINVAL && mode == TaskRun::deferred) {
      mode = TaskRun::cooperative;  // SINGLE_ISSUER / DEFER_TASKRUN unknown: before 6.1
      continue;
    }
    break;
  }
  if (r < 0) {
    why = describeUringSetupError(-r);
    return -r;
  }
  const char* missing = nullptr;
  if (!(params.features & IORING_FEAT_NODROP)) missing = "IORING_FEAT_NODROP";
  if (!(params.features & IORING_FEAT_EXT_ARG)) missing = "IORING_FEAT_EXT_ARG";
  if (!missing) {
    const RingProbe probe = probeRing(ring);
    if (!probe) {
      missing = "IORING_REGISTER_PROBE";
    } else {
      for (const auto& [op, name] : {std::pair{IORING_OP_ACCEPT, "ACCEPT"}, std::pair{IORING_OP_CONNECT, "CONNECT"},
                                     std::pair{IORING_OP_RECV, "RECV"}, std::pair{IORING_OP_SEND, "SEND"},
                                     std::pair{IORING_OP_READ, "READ"}, std::pair{IORING_OP_POLL_ADD, "POLL_ADD"},
                                     std::pair{IORING_OP_ASYNC_CANCEL, "ASYNC_CANCEL"},
                                     // The version check (5.19): ASYNC_CANCEL_ANY, which
                                     // shutdown relies on, came with the same release.
                                     std::pair{IORING_OP_SOCKET, "SOCKET"}}) {
        if (!io_uring_opcode_supported(probe.get(), op)) missing = name;
      }
    }
  }
  if (missing) {
    io_uring_queue_exit(&ring);
    why = std::string("coio::UringReactor: io_uring lacks ") + missing + " (kernel too old)";
    return ENOTSUP;
  }
  return 0;
}

}  // namespace coio::detail
