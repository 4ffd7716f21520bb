#pragma once
// UringReactor's options: when SQEs reach the kernel (SubmitPolicy), when
// the kernel posts completions (TaskRun), how sockets are read (RecvMode),
// and the ring's sizes (UringOptions), with their names for command lines.
#include <coio/core/result.hpp>

#include <cstddef>
#include <string_view>

namespace coio {

/// When prepared SQEs reach the kernel.
enum class SubmitPolicy {
  batched,  ///< once per loop iteration, with the wait for completions (one io_uring_enter)
  eager,    ///< as each operation is prepared (one io_uring_enter each; lower latency at low depth)
};

/// When the kernel runs the task work that turns finished operations (a
/// socket became readable, a disk read ended) into CQEs.
enum class TaskRun {
  /// At once: the kernel interrupts the loop thread, even in user space
  /// (no setup flag). Completions are never held back.
  immediate,
  /// When the loop thread next enters the kernel (IORING_SETUP_COOP_TASKRUN
  /// and TASKRUN_FLAG): fewer interruptions, but a completion may wait for
  /// the loop's next io_uring_enter. On loopback TCP and on 4 KiB O_DIRECT
  /// reads at depth 32, `immediate` measured the same within noise.
  cooperative,
  /// Only while the loop thread waits in io_uring_enter, batched
  /// (IORING_SETUP_SINGLE_ISSUER and DEFER_TASKRUN, Linux 6.1; older
  /// kernels fall back to `cooperative`). The default: +4-6 % request rate
  /// on loopback TCP over `cooperative`, disk reads the same or better
  /// (docs/benchmarks.md).
  /// Restriction: the ring is bound to the first thread that runs the loop
  /// (set up disabled, enabled there, or where the SQ first fills if that
  /// comes earlier). From then on only that thread may run the loop,
  /// destroy the reactor while operations other than its wake-up poll are
  /// in flight (else: a message, then std::terminate), or register
  /// resources (Disk).
  deferred,
};

/// The mode's name, for messages.
inline std::string_view toString(TaskRun mode) noexcept {
  switch (mode) {
    case TaskRun::immediate: return "immediate";
    case TaskRun::cooperative: return "cooperative";
    case TaskRun::deferred: return "deferred";
  }
  return "?";
}

/// How UringReactor::recv reads a socket.
enum class RecvMode {
  /// One recv SQE per read, straight into the read's buffer.
  plain,
  /// One multishot recv (Linux 6.0) kept armed per socket: data lands in a
  /// ring of provided buffers shared by the reactor's sockets and is copied
  /// into the buffer of the read that waits for it, or kept for the next
  /// reads (up to UringReactor::kRecvBacklogLimit per socket, then the recv
  /// is disarmed until the reader catches up). Saves the kernel a failed
  /// recv attempt and a poll arm/disarm per message (+3-4 % loopback request
  /// rate), but costs a copy and 4 KiB pieces: streams run at about half
  /// the speed.
  multishot,
  /// Per socket, by what it receives (the default): plain while reads come
  /// back large; multishot after kRecvModeSwitch reads in a row that each
  /// returned less than they asked for and less than one provided buffer
  /// (the socket ran dry: request/response traffic);
  /// plain again after kRecvModeSwitch multishot completions in a row that
  /// each filled a whole buffer, or when the backlog limit is reached (a
  /// stream). A switch costs one cancel.
  adaptive,
};

/// The mode's name, for messages.
inline std::string_view toString(RecvMode mode) noexcept {
  switch (mode) {
    case RecvMode::plain: return "plain";
    case RecvMode::multishot: return "multishot";
    case RecvMode::adaptive: return "adaptive";
  }
  return "?";
}

namespace detail {
// The value of `values` whose toString() is `text`; Errc::invalidArgument
// if none is.
template <typename E, std::size_t N>
Result<E> parseNamed(std::string_view text, const E (&values)[N]) {
  for (const E value : values) {
    if (text == toString(value)) return value;
  }
  return Errc::invalidArgument;
}
}  // namespace detail

/// "immediate", "cooperative" or "deferred"; Errc::invalidArgument otherwise.
inline Result<TaskRun> parseTaskRun(std::string_view text) {
  return detail::parseNamed(text, {TaskRun::immediate, TaskRun::cooperative, TaskRun::deferred});
}

/// "plain", "multishot" or "adaptive"; Errc::invalidArgument otherwise.
inline Result<RecvMode> parseRecvMode(std::string_view text) {
  return detail::parseNamed(text, {RecvMode::plain, RecvMode::multishot, RecvMode::adaptive});
}

/// How an UringReactor sets up and uses its ring (UringReactor::Options).
struct UringOptions {
  unsigned entries = 256;      ///< SQ size
  unsigned cqEntries = 4096;   ///< CQ size (at least 2 x entries)
  /// When prepared SQEs reach the kernel.
  SubmitPolicy submitPolicy = SubmitPolicy::batched;
  TaskRun taskRun = TaskRun::deferred;  ///< see TaskRun; falls back to cooperative before Linux 6.1
  /// How `recv` reads sockets (see RecvMode); plain on kernels before 6.0
  /// (see UringReactor::recvMode()). Unless plain, the reactor keeps a
  /// receiver per socket read through `recv`, found by fd, so such a socket
  /// must be forgotten before it is closed (as under EpollReactor; TcpStream
  /// does it), and read through `recv` only (not readable() + read(2)).
  /// Data a multishot recv took from a socket lives in the reactor until a
  /// read takes it: UringReactor::forget(fd) drops it, and
  /// TcpStream::release refuses to give such a socket up (see
  /// UringReactor::readsAhead()).
  RecvMode recvMode = RecvMode::adaptive;
  unsigned recvBuffers = 256;      ///< provided buffers, a power of two (multishot recvs)
  unsigned recvBufferSize = 4096;  ///< bytes each (multishot recvs)
  /// Whether sendZeroCopy may use the kernel's zero-copy sends (where it
  /// has them, Linux 6.1: see UringReactor::zeroCopySend()); false makes
  /// it copy.
  bool zeroCopySend = true;
};

}  // namespace coio
