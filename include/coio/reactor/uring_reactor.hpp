#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/result.hpp>
#include <coio/detail/iovec.hpp>
#include <coio/detail/provided_buffer_ring.hpp>
#include <coio/detail/reactor_base.hpp>
#include <coio/detail/reset_connection.hpp>
#include <coio/detail/syscall.hpp>

#include <liburing.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace coio {

/// The base of anything whose completion an io_uring CQE delivers: the
/// SQE's user_data points at it, and `complete` is called with the CQE's
/// result and flags, on the loop thread. It must stay alive until its last
/// completion (flags without IORING_CQE_F_MORE) has arrived, cancelled or not.
struct UringOperation {
  /// Called on the loop thread with each CQE's result and flags.
  void (*complete)(UringOperation* self, int result, unsigned flags) noexcept = nullptr;
  /// The reactor's: the LoopStats counter its completion counts in, set
  /// when it is submitted (from the SQE's opcode).
  std::uint8_t counter = detail::kUncounted;
};

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
// The kind an SQE counts as in LoopStats, by its opcode. (OpKind::timer is
// the loop's timers: an SQE of the kernel's timeouts is another kind.)
constexpr OpKind opKindOf(std::uint8_t opcode) noexcept {
  switch (opcode) {
    case IORING_OP_RECV: case IORING_OP_RECVMSG: return OpKind::recv;
    case IORING_OP_SEND: case IORING_OP_SENDMSG: case IORING_OP_SEND_ZC: case IORING_OP_SENDMSG_ZC: return OpKind::send;
    case IORING_OP_ACCEPT: return OpKind::accept;
    case IORING_OP_CONNECT: return OpKind::connect;
    case IORING_OP_POLL_ADD: return OpKind::poll;
    case IORING_OP_READ: case IORING_OP_READV: case IORING_OP_READ_FIXED: return OpKind::diskRead;
    case IORING_OP_WRITE: case IORING_OP_WRITEV: case IORING_OP_WRITE_FIXED: return OpKind::diskWrite;
    case IORING_OP_FSYNC: case IORING_OP_SYNC_FILE_RANGE: return OpKind::diskSync;
    default: return OpKind::other;
  }
}
// The counter `sqe` counts in.
inline std::uint8_t counterOf(const io_uring_sqe& sqe) noexcept { return counterOf(opKindOf(sqe.opcode)); }

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

class UringReactor;

namespace detail {

struct RecvPrep {
  int fd;
  std::span<std::byte> buffer;
  int flags = 0;  // MSG_WAITALL for recvAll
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_recv(sqe, fd, buffer.data(), buffer.size(), flags);
  }
};
// A socket with room in its send buffer takes the data at once: one
// send(2) then costs less than an io_uring round trip (an enter to submit
// and one to reap). So the send operations try a non-blocking call first;
// this is its outcome as tryNow() reports it: the byte count (at most
// MAX_RW_COUNT, as an io_uring result), -errno, or nothing if the socket
// is full. What the socket did not take goes in an SQE with MSG_WAITALL:
// the kernel sends the rest as room frees (one completion, not one loop
// iteration per socket-buffer's worth) and completes with all of it, or
// with what it sent before an error or a cancellation.
inline constexpr int kSendSqeFlags = MSG_NOSIGNAL | MSG_WAITALL;
inline std::optional<int> sentNow(ssize_t n) noexcept {
  if (n >= 0) return static_cast<int>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return std::nullopt;
  return -errno;
}
struct SendPrep {
  int fd;
  std::span<const std::byte> buffer;
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_send(sqe, fd, buffer.data(), buffer.size(), kSendSqeFlags);
  }
  std::optional<int> tryNow() const noexcept {
    return sentNow(::send(fd, buffer.data(), buffer.size(), MSG_NOSIGNAL | MSG_DONTWAIT));
  }
};
struct SendvPrep {
  int fd;
  msghdr message;  // lives in the operation until the kernel has read it
  void operator()(io_uring_sqe* sqe) const noexcept { io_uring_prep_sendmsg(sqe, fd, &message, kSendSqeFlags); }
  std::optional<int> tryNow() const noexcept {
    return sentNow(::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT));
  }
};
struct AcceptPrep {
  int fd;
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_accept(sqe, fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  }
};
struct ConnectPrep {
  int fd;
  sockaddr_storage address;  // lives in the operation until the kernel has read it
  socklen_t length;
  void operator()(io_uring_sqe* sqe) const noexcept {
    io_uring_prep_connect(sqe, fd, reinterpret_cast<const sockaddr*>(&address), length);
  }
};
struct PollPrep {
  int fd;
  unsigned events;
  void operator()(io_uring_sqe* sqe) const noexcept { io_uring_prep_poll_add(sqe, fd, events); }
};

template <typename Prep, typename T>
class UringIoOperation;
class UringReceiver;
class MultishotRead;
class UringRecv;
class UringZeroCopySend;

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

}  // namespace detail

/// An event loop over io_uring (liburing), driven by one thread.
///
/// Guarantees:
/// - Every awaitable resumes its coroutine on the loop thread (the thread
///   inside run() / runUntil()) and must be awaited there.
/// - Operations are native io_uring operations (accept, connect, recv, send,
///   poll_add; disk and RDMA layers add their own through `submit`), found on
///   completion through user_data. One exception: `send` first tries a
///   non-blocking send(2) and completes without suspending when the socket
///   takes the data (the usual case); only a full socket costs an SQE.
///   `sendv` (sendmsg) likewise.
///   `recv` may read from one multishot recv kept armed per socket instead
///   (RecvMode: by default, on sockets whose traffic is request/response).
///   `sendZeroCopy` sends from the caller's memory without copying it
///   (IORING_OP_SEND_ZC / SENDMSG_ZC, where zeroCopySend()) and resumes
///   only after the kernel's notification that it let go of that memory.
///   SQEs are submitted per SubmitPolicy, decided in one place (`commit`):
///   batched per loop iteration by default.
/// - Cancellation: a stop requested (on the loop thread) while an operation
///   is in flight submits an async cancel; the coroutine resumes only when
///   the operation's own completion arrives (std::errc::operation_canceled,
///   or its real result if it won the race), so its buffers stay owned by
///   the kernel until then. Given no token (a default one), an operation
///   awaited from a coio Task uses the token the Task runs under (see
///   currentStopToken).
/// - A full CQ does not lose completions (IORING_FEAT_NODROP, required); a
///   full SQ is flushed to the kernel; a wait interrupted by a signal
///   (-EINTR) just loops again.
/// - stop() (any thread) makes run() return after the current iteration,
///   once every in-flight operation has been cancelled and has completed;
///   spawned tasks that never started are destroyed then, the others with
///   the reactor.
/// - Fairness: at most kInlineTurnsPerIteration operations per loop
///   iteration complete without suspending (a send the socket took, a read
///   served from data a multishot recv kept, a stop already requested);
///   later ones still complete at once but resume their coroutine in the
///   next iteration (detail::InlineCompletion). And one poll dispatches at
///   most kReapRoundsPerPoll batches of completions before timers and ready
///   coroutines run again. So a coroutine whose operations are always
///   ready, or a flood of completions, cannot starve the rest of the loop.
/// - A stop callback or the wake-up path never throws: what it cannot
///   submit (SQ full and refused by the kernel) goes out before the loop's
///   next wait.
/// - Timers wake the loop through one IORING_OP_TIMEOUT for the earliest
///   deadline, moved only when that deadline changes (a wait with a timeout
///   of its own costs the kernel an hrtimer per wait).
/// - Options::taskRun picks when the kernel posts completions (TaskRun):
///   `deferred` by default, which binds the ring to the thread that first
///   runs the loop (see TaskRun::deferred for what that forbids; pick
///   `cooperative` to lift it).
/// - Construction fails with std::system_error naming the cause if io_uring
///   is unusable here (disabled by sysctl or seccomp, old kernel, missing
///   operation). `probe()` tells without throwing; see reactor_kind.hpp for
///   falling back to EpollReactor.
class UringReactor : public detail::ReactorBase<UringReactor> {
 public:
  /// The awaitable type of this reactor's io_uring operations.
  template <typename Prep, typename T>
  using Operation = detail::UringIoOperation<Prep, T>;

  /// How the ring is set up and used.
  struct Options {
    unsigned entries = 256;      ///< SQ size
    unsigned cqEntries = 4096;   ///< CQ size (at least 2 x entries)
    /// When prepared SQEs reach the kernel.
    SubmitPolicy submitPolicy = SubmitPolicy::batched;
    TaskRun taskRun = TaskRun::deferred;  ///< see TaskRun; falls back to cooperative before Linux 6.1
    /// How `recv` reads sockets (see RecvMode); plain on kernels before 6.0
    /// (see recvMode()). Unless plain, the reactor keeps a receiver per
    /// socket read through `recv`, found by fd, so such a socket must be
    /// forgotten before it is closed (as under EpollReactor; TcpStream does
    /// it), and read through `recv` only (not readable() + read(2)). Data a
    /// multishot recv took from a socket lives in the reactor until a read
    /// takes it: forget(fd) drops it, and TcpStream::release refuses to give
    /// such a socket up (see readsAhead()).
    RecvMode recvMode = RecvMode::adaptive;
    unsigned recvBuffers = 256;      ///< provided buffers, a power of two (multishot recvs)
    unsigned recvBufferSize = 4096;  ///< bytes each (multishot recvs)
    /// Whether sendZeroCopy may use the kernel's zero-copy sends (where it
    /// has them, Linux 6.1: see zeroCopySend()); false makes it copy.
    bool zeroCopySend = true;
  };

  /// What one socket's multishot recv keeps for its reader before it stops
  /// taking data off the socket (TCP's flow control then holds the peer).
  static constexpr std::size_t kRecvBacklogLimit = 64 * 1024;
  /// Reads (or completions) in a row that switch a socket's recv mode
  /// under RecvMode::adaptive.
  static constexpr unsigned kRecvModeSwitch = 4;

  UringReactor() : UringReactor(Options{}) {}
  /// Sets up the ring; throws std::system_error naming the cause if io_uring is unusable (see probe()).
  explicit UringReactor(Options options);
  ~UringReactor() {
    closeLoop();
    // Sockets still open here (their owners outlive the reactor) or closed
    // while their recv was being cancelled: the kernel holds none of them now.
    while (receivers_) destroyReceiver(receivers_);
    io_uring_queue_exit(&ring_);
  }

  /// Whether an UringReactor can be constructed here; if not, the error and
  /// (in `why`) the same explanation the constructor would throw.
  static Result<void> probe(std::string* why = nullptr);

  /// Completes once `fd` is readable (a one-shot poll).
  Operation<detail::PollPrep, void> readable(int fd, std::stop_token stop = {}) noexcept;
  /// Completes once `fd` is writable (a one-shot poll).
  Operation<detail::PollPrep, void> writable(int fd, std::stop_token stop = {}) noexcept;
  /// accept4 as an io_uring operation (non-blocking, close-on-exec): the new fd.
  Operation<detail::AcceptPrep, int> accept(int fd, std::stop_token stop = {}) noexcept;
  /// connect as an io_uring operation; `address` must stay valid until it completes.
  Operation<detail::ConnectPrep, void> connect(int fd, const sockaddr* address, socklen_t length,
                                               std::stop_token stop = {}) noexcept;
  /// A plain recv SQE, or a read served by the socket's multishot recv, as
  /// Options::recvMode and (adaptive) the socket's traffic say.
  detail::UringRecv recv(int fd, std::span<std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// recv for a reader that wants the whole buffer (TcpStream::readExact):
  /// a plain recv SQE asks for all of it (MSG_WAITALL), so the kernel
  /// fills it as data arrives and completes once, with fewer bytes only at
  /// the end of the stream, on an error, or when cancelled (what it read
  /// by then). A read served by the socket's multishot recv yields what is
  /// there, as recv does.
  detail::UringRecv recvAll(int fd, std::span<std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// Sends with a non-blocking send(2) first, and an SQE only when the
  /// socket is full; that SQE sends all that is left (MSG_WAITALL) unless
  /// an error or a stop comes first: bytes sent.
  Operation<detail::SendPrep, std::size_t> send(int fd, std::span<const std::byte> buffer,
                                                std::stop_token stop = {}) noexcept;
  /// sendmsg of `parts` (at most IOV_MAX), tried at once as send is: bytes
  /// written, possibly fewer than asked. `parts` must stay valid until the
  /// co_await returns.
  Operation<detail::SendvPrep, std::size_t> sendv(int fd, std::span<const iovec> parts,
                                                  std::stop_token stop = {}) noexcept;
  /// Sends `parts` (at most IOV_MAX) from their memory, without copying it
  /// into the socket, where zeroCopySend() (one IORING_OP_SEND_ZC, or
  /// SENDMSG_ZC for several parts); else with a copying sendmsg SQE. All of
  /// it unless an error or a stop comes first (MSG_WAITALL): bytes sent.
  ///
  /// Resumes once, on the loop thread, after the operation's last
  /// completion: with zero copy, the kernel's notification that it no longer
  /// references the memory (it comes when the peer has acknowledged the
  /// data, or the connection dropped it), so `parts` and the bytes they
  /// point to may be reused or freed as soon as the co_await returns, and
  /// must stay untouched until then. A stop cancels the send if the kernel
  /// has not taken all the data yet (then yielding what it took, or
  /// operation_canceled); the coroutine still resumes only after the
  /// notification, which a peer that stopped reading holds back: resetting
  /// the connection (TcpStream::abort) makes the kernel drop the data.
  /// stop() and destruction reset the connections of the zero-copy sends
  /// still in flight, for the same reason. TCP (and UDP) sockets only:
  /// others yield EOPNOTSUPP from the kernel.
  detail::UringZeroCopySend sendZeroCopy(int fd, std::span<const iovec> parts, std::stop_token stop = {}) noexcept;

  /// Whether sendZeroCopy avoids the copy: the kernel has IORING_OP_SEND_ZC
  /// and SENDMSG_ZC (Linux 6.1; probed once, at construction) and
  /// Options::zeroCopySend is set.
  bool zeroCopySend() const noexcept { return zeroCopySend_; }

  /// Drops the socket's receiver, if it has one, with what it holds (an
  /// armed recv is cancelled; the receiver is freed when its last completion
  /// arrives). Nothing else: io_uring keeps no per-fd registration.
  void forget(int fd) noexcept;

  /// The recv mode in effect: Options::recvMode, or plain on a kernel
  /// without multishot recvs.
  RecvMode recvMode() const noexcept { return recvBuffers_ ? recvMode_ : RecvMode::plain; }

  /// Whether the reactor reads `fd` ahead of its reader: a recv of its
  /// receiver is armed on it (the multishot recv, or the one-shot recv that
  /// ends a switch back to plain recvs), or the receiver holds data or the
  /// end of the stream no read took yet. Forgetting the socket then drops
  /// what its peer sent.
  bool readsAhead(int fd) const noexcept;

  // --- For layers that bring their own operations (disk, RDMA). Loop thread.

  /// The ring, e.g. to register buffers or files.
  io_uring& ring() noexcept { return ring_; }

  /// Prepares one SQE with `prep(sqe)` whose completion calls `op.complete`,
  /// then submits it according to the policy. It counts in stats() by its
  /// opcode (detail::opKindOf).
  template <typename Prep>
  void submit(UringOperation& op, Prep&& prep) {
    if (!trySubmit(op, std::forward<Prep>(prep))) {
      detail::throwSystemError(submitError_, "coio::UringReactor: io_uring_submit");
    }
  }

  /// submit() for paths that must not throw: false (errno in submitError())
  /// if no SQE could be had.
  template <typename Prep>
  bool trySubmit(UringOperation& op, Prep&& prep) noexcept {
    return trySubmitCounted(op, std::forward<Prep>(prep), true);
  }

  /// Why the last trySubmit() failed.
  int submitError() const noexcept { return submitError_; }

  /// Asks the kernel to cancel `op`; its completion still arrives. Never
  /// throws (stop callbacks call it): if the SQ is full and cannot be
  /// flushed right now, the cancel goes out before the loop's next wait
  /// (where a ring that still refuses it makes run() throw).
  void cancel(UringOperation& op) noexcept {
    if (trySubmitCancel(op)) return;
    try {
      deferredCancels_.push_back(&op);
    } catch (...) {
      std::terminate();  // no SQE and no memory: the operation could never be cancelled
    }
  }

  /// Submits whatever is prepared now, whatever the policy (a ring not
  /// enabled yet, TaskRun::deferred before the loop first ran, keeps it for
  /// the loop's first poll).
  void flush() { submitIfEnabled(); }

  /// The task-run mode the ring was set up with (after any fallback).
  TaskRun taskRun() const noexcept { return taskRun_; }

  /// When prepared SQEs reach the kernel.
  SubmitPolicy submitPolicy() const noexcept { return policy_; }
  /// Changes the submit policy from now on (loop thread).
  void setSubmitPolicy(SubmitPolicy policy) noexcept { policy_ = policy; }

  /// Operations whose last completion has not arrived yet (including the
  /// reactor's own wake-up poll, not its timer's timeout).
  std::size_t inFlight() const noexcept { return inFlight_ - (deadlineArmed_ ? 1 : 0); }

 private:
  friend class detail::ReactorBase<UringReactor>;

  struct Completion {
    std::uint64_t userData;
    int result;
    unsigned flags;
  };

  // The single place where the submission policy applies.
  void commit() noexcept {
    if (policy_ == SubmitPolicy::eager) submitIfEnabled();
  }

  // Submitting enables a disabled ring and binds it to the calling thread:
  // only the loop's poll, or a full SQ (tryAcquireSqe), may do that.
  void submitIfEnabled() noexcept {
    if (!disabled_) (void)io_uring_submit(&ring_);
  }

  // An SQE, or null if none can be had without throwing (the kernel refuses
  // to take the full SQ: errno in submitError_; or no memory to set
  // completions aside).
  io_uring_sqe* tryAcquireSqe() noexcept {
    COIO_ASSERT(ownedByCaller(), "io_uring operation submitted off the reactor's thread");
    for (;;) {
      if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) return sqe;
      // SQ full: hand the kernel what is queued. It refuses while completions
      // are backed up (-EBUSY): set some aside to make room.
      enableRing();
      const int r = io_uring_submit(&ring_);
      if (r == -EBUSY || r == -EAGAIN) {
        try {
          takeCompletions(backlog_);
        } catch (const std::bad_alloc&) {
          submitError_ = ENOMEM;
          return nullptr;
        }
      } else if (r < 0 && r != -EINTR) {
        submitError_ = -r;
        return nullptr;
      }
    }
  }

  // Receivers (unless RecvMode::plain), found by fd; each is also
  // in the reactor's list until freed, including after its socket was
  // forgotten while its recv was still armed.
  friend class detail::UringReceiver;
  friend class detail::MultishotRead;
  friend class detail::UringZeroCopySend;
  void submitZeroCopy(detail::UringZeroCopySend& op);  // and into zeroCopySends_
  void forgetZeroCopy(detail::UringZeroCopySend& op) noexcept;  // out of it, at its last completion
  detail::UringReceiver* receiverFor(int fd) noexcept;  // null: no memory
  detail::UringRecv recvWith(int fd, std::span<std::byte> buffer, std::stop_token stop, int flags) noexcept;
  void destroyReceiver(detail::UringReceiver* receiver) noexcept;

  // trySubmit; `counted` false for the reactor's own operations, which
  // stats() leaves out.
  template <typename Prep>
  bool trySubmitCounted(UringOperation& op, Prep&& prep, bool counted) noexcept {
    io_uring_sqe* sqe = tryAcquireSqe();
    if (!sqe) return false;
    std::forward<Prep>(prep)(sqe);
    io_uring_sqe_set_data(sqe, &op);
    op.counter = counted ? detail::counterOf(*sqe) : detail::kUncounted;
    meter_.submitted(op.counter);
    ++inFlight_;
    commit();
    return true;
  }

  bool trySubmitCancel(UringOperation& op) noexcept {
    return trySubmitUntracked([&](io_uring_sqe* sqe) { io_uring_prep_cancel(sqe, &op, 0); });
  }
  // An SQE acting on another operation (a cancel, a timeout update), whose
  // own completion is ignored: false (errno in submitError_) if none could
  // be had.
  template <typename Prep>
  bool trySubmitUntracked(Prep&& prep) noexcept {
    io_uring_sqe* sqe = tryAcquireSqe();
    if (!sqe) return false;
    std::forward<Prep>(prep)(sqe);
    io_uring_sqe_set_data64(sqe, 0);
    commit();
    return true;
  }

  // Copies the available CQEs out and frees their slots; returns how many.
  // All or nothing: if `out` cannot grow, no CQE is consumed.
  std::size_t takeCompletions(std::vector<Completion>& out) {
    io_uring_cqe* cqes[kBatch];
    const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kBatch);
    out.reserve(out.size() + n);
    for (unsigned i = 0; i < n; ++i) out.push_back({cqes[i]->user_data, cqes[i]->res, cqes[i]->flags});
    io_uring_cq_advance(&ring_, n);
    return n;
  }

  void poll(std::optional<Clock::duration> timeout);
  // Dispatches completions, at most `maxRounds` batches of kBatch.
  void reap(std::size_t maxRounds = SIZE_MAX);
  void quiesce() noexcept;
  void submitDeferred();

  void dispatch(const Completion& c) noexcept {
    if (c.userData == 0) return;
    auto* op = reinterpret_cast<UringOperation*>(c.userData);
    if (!(c.flags & IORING_CQE_F_MORE)) {
      --inFlight_;
      meter_.completed(op->counter);
      // Done: a cancel still waiting for an SQE would hit whatever reuses op's memory.
      if (!deferredCancels_.empty()) std::erase(deferredCancels_, op);
    }
    if (quiescing_) return;  // shutting down: nothing resumes
    op->complete(op, c.result, c.flags);
  }

  // The wake-up eventfd, watched by a poll. Its read end is non-blocking, so
  // an io_uring read would fail with -EAGAIN instead of waiting.
  struct WakeOperation : UringOperation {
    UringReactor* reactor;
  };
  // Watches the wake-up eventfd again; false if no SQE could be had (then
  // poll() re-arms it before it waits).
  bool tryArmWake() noexcept {
    wakeArmed_ = trySubmitCounted(wakeOperation_, detail::PollPrep{wake().fd(), POLLIN}, false);
    return wakeArmed_;
  }
  static void onWake(UringOperation* op, int, unsigned) noexcept;

  // The loop's next timer deadline (ReactorBase::waitTimeout), as one
  // IORING_OP_TIMEOUT (absolute, CLOCK_MONOTONIC = steady_clock): -2 %
  // loopback request rate with a timeout per wait while any timer is set.
  struct DeadlineOperation : UringOperation {
    UringReactor* reactor;
    __kernel_timespec when;  // read by the kernel when it takes the SQE
  };
  // Makes sure the loop wakes by `deadline`; false if no SQE could be had.
  bool armDeadline(Clock::time_point deadline) noexcept;
  static void onDeadline(UringOperation* op, int, unsigned) noexcept {
    static_cast<DeadlineOperation*>(op)->reactor->deadlineArmed_ = false;
  }

  static constexpr unsigned kBatch = 256;
  static constexpr unsigned short kRecvBufferGroup = 1;  // the multishot recvs' provided buffers
  // Completion batches one poll dispatches before the loop runs its timers
  // and ready coroutines again: operations that complete as soon as they are
  // submitted (an always-readable socket under SubmitPolicy::eager) cannot
  // keep reap() going for ever.
  static constexpr std::size_t kReapRoundsPerPoll = 4;

  // A ring set up disabled (TaskRun::deferred) is enabled by the first
  // thread that polls or quiesces it, or fills its SQ, which becomes its
  // only submitter.
  void enableRing() noexcept;

  // Waits through a registered ring fd skip the fd lookup, and in a
  // multi-threaded process the reference count on the ring's file, in
  // every io_uring_enter. A registration is a slot in the registering
  // thread's table: another thread entering by it fails, or enters a ring
  // of its own registered in that slot. So each run of the loop registers
  // in its first poll and leaveLoop() unregisters (two io_uring_register
  // calls per run()), and any other thread (a destructor's, a later
  // run()'s) enters by the plain fd. Best effort: a thread's table has 16
  // slots; without one the plain fd serves.
  void registerRingFd() noexcept {
    ringFdTried_ = true;
    ringFdRegistered_ = io_uring_register_ring_fd(&ring_) == 1;
  }
  std::size_t unsubmitted() const noexcept { return io_uring_sq_ready(&ring_); }
  void leaveLoop() noexcept {
    if (ringFdRegistered_) {
      // Cannot fail: same thread, a slot it registered.
      [[maybe_unused]] const int r = io_uring_unregister_ring_fd(&ring_);
      COIO_ASSERT(r == 1, "io_uring ring fd unregistration failed");
    }
    ringFdRegistered_ = ringFdTried_ = false;
  }

  io_uring ring_{};
  SubmitPolicy policy_;
  TaskRun taskRun_;
  bool disabled_ = false;  // set up with IORING_SETUP_R_DISABLED, not enabled yet
  bool ringFdTried_ = false;       // in this run of the loop
  bool ringFdRegistered_ = false;  // by the loop thread, until leaveLoop()
  std::size_t inFlight_ = 0;
  bool quiescing_ = false;
  bool wakeArmed_ = false;
  int submitError_ = 0;  // why tryAcquireSqe() last failed
  WakeOperation wakeOperation_{{&UringReactor::onWake}, this};
  DeadlineOperation deadlineOperation_{{&UringReactor::onDeadline}, this, {}};
  bool deadlineArmed_ = false;          // deadlineOperation_ in flight,
  Clock::time_point armedDeadline_{};  // for this deadline
  std::vector<UringOperation*> deferredCancels_;  // cancels no SQE could be had for yet
  std::vector<Completion> backlog_;
  std::vector<Completion> batch_;
  RecvMode recvMode_;
  std::optional<detail::ProvidedBufferRing> recvBuffers_;  // set up iff multishot recvs may be used
  std::vector<detail::UringReceiver*> receiverByFd_;
  detail::UringReceiver* receivers_ = nullptr;  // every receiver, a list through UringReceiver::next
  bool zeroCopySend_ = false;  // sendZeroCopy uses SEND_ZC / SENDMSG_ZC
  // Zero-copy sends between their SQE and their last completion, a list
  // through UringZeroCopySend::next_: quiesce() resets their connections.
  detail::UringZeroCopySend* zeroCopySends_ = nullptr;
};

namespace detail {

/// One io_uring operation (see UringReactor). `co_await` yields Result<T>;
/// the coroutine resumes on the loop thread when the completion arrives, or
/// goes on without suspending if the operation finished inline (`tryNow`).
template <typename Prep, typename T>
class [[nodiscard]] UringIoOperation : UringOperation {
 public:
  UringIoOperation(UringReactor& reactor, Prep prep, std::stop_token stop) noexcept
      : UringOperation{&UringIoOperation::onComplete}, reactor_(reactor), prep_(std::move(prep)),
        stop_(std::move(stop)) {}
  UringIoOperation(const UringIoOperation&) = delete;
  UringIoOperation& operator=(const UringIoOperation&) = delete;

  // Given no token, the attempt waits for await_suspend, which knows the awaiting Task's.
  bool await_ready() noexcept { return stop_.stop_possible() && inline_.admit(reactor_, tryComplete()); }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    if (inheritStopToken(stop_, h) && inline_.admit(reactor_, tryComplete())) return false;
    handle_ = h;
    if (inline_.deferred(reactor_, h)) return true;  // done, but the loop's other work goes first
    reactor_.submit(*this, prep_);
    if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
    return true;
  }
  Result<T> await_resume() {
    onStop_.reset();
    return toResult<T>(result_);
  }

 private:
  struct OnStop {
    UringIoOperation* self;
    void operator()() const noexcept {
      COIO_ASSERT(self->reactor_.isInLoopThread(), "stop requested off the reactor's thread");
      self->reactor_.cancel(*self);
    }
  };
  // True (result_ set) if the operation is over without an SQE: a stop
  // already requested, or one that can finish at once (send) and did.
  bool tryComplete() noexcept {
    if (stop_.stop_requested()) {
      result_ = -ECANCELED;
      return true;
    }
    if constexpr (requires(const Prep& p) { p.tryNow(); }) {
      if (const std::optional<int> done = prep_.tryNow()) {
        result_ = *done;
        return true;
      }
    }
    return false;
  }
  static void onComplete(UringOperation* op, int result, unsigned) noexcept {
    auto* self = static_cast<UringIoOperation*>(op);
    self->result_ = result;
    self->handle_.resume();
  }

  UringReactor& reactor_;
  Prep prep_;
  std::stop_token stop_;
  int result_ = 0;
  InlineCompletion inline_;
  std::coroutine_handle<> handle_;
  std::optional<std::stop_callback<OnStop>> onStop_;
};

/// What UringReactor::sendZeroCopy returns: `co_await` yields the bytes
/// sent (or the error), on the loop thread, once the kernel is done with the
/// memory (see sendZeroCopy).
///
/// A zero-copy send completes twice: its own CQE (the result, with
/// IORING_CQE_F_MORE when a notification follows: always once the kernel
/// took data) and the notification (IORING_CQE_F_NOTIF, no F_MORE). The
/// result is kept from the first, the coroutine resumes at the last, and
/// until then the operation is in its reactor's list of zero-copy sends.
/// Without zero copy (the fallback) there is one CQE.
class [[nodiscard]] UringZeroCopySend : UringOperation {
 public:
  UringZeroCopySend(UringReactor& reactor, int fd, std::span<const iovec> parts, std::stop_token stop) noexcept
      : UringOperation{&UringZeroCopySend::onComplete}, reactor_(reactor), fd_(fd), message_(messageOf(parts)),
        stop_(std::move(stop)) {}
  UringZeroCopySend(const UringZeroCopySend&) = delete;
  UringZeroCopySend& operator=(const UringZeroCopySend&) = delete;

  // Never done without an SQE, but for a stop already requested. Given no
  // token, that check waits for await_suspend, which knows the awaiting Task's.
  bool await_ready() noexcept { return stop_.stop_possible() && inline_.admit(reactor_, stopped()); }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    if (inheritStopToken(stop_, h) && inline_.admit(reactor_, stopped())) return false;
    handle_ = h;
    if (inline_.deferred(reactor_, h)) return true;  // done, but the loop's other work goes first
    reactor_.submitZeroCopy(*this);
    if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
    return true;
  }
  Result<std::size_t> await_resume() {
    onStop_.reset();
    return toResult<std::size_t>(result_);
  }

 private:
  friend class coio::UringReactor;
  struct OnStop {
    UringZeroCopySend* self;
    void operator()() const noexcept {
      COIO_ASSERT(self->reactor_.isInLoopThread(), "stop requested off the reactor's thread");
      if (!self->sent_) self->reactor_.cancel(*self);  // after the send's CQE only its notification is due
    }
  };

  bool stopped() noexcept {
    if (!stop_.stop_requested()) return false;
    result_ = -ECANCELED;
    return true;
  }

  void prepare(io_uring_sqe* sqe, bool zeroCopy) const noexcept {
    if (!zeroCopy) {
      io_uring_prep_sendmsg(sqe, fd_, &message_, kSendSqeFlags);
    } else if (message_.msg_iovlen == 1) {  // no msghdr for the kernel to import
      const iovec& part = message_.msg_iov[0];
      // The SQE's length is 32 bits: clamped to what one send takes anyway (MAX_RW_COUNT).
      const auto length = static_cast<unsigned>(std::min<std::size_t>(part.iov_len, 0x7ffff000));
      io_uring_prep_send_zc(sqe, fd_, part.iov_base, length, kSendSqeFlags, 0);
    } else {
      io_uring_prep_sendmsg_zc(sqe, fd_, &message_, kSendSqeFlags);
    }
  }

  static void onComplete(UringOperation* op, int result, unsigned flags) noexcept {
    auto* self = static_cast<UringZeroCopySend*>(op);
    if (!(flags & IORING_CQE_F_NOTIF)) self->result_ = result;  // the send's own CQE
    if (flags & IORING_CQE_F_MORE) {
      self->sent_ = true;  // the kernel still references the memory: wait for its notification
      return;
    }
    self->reactor_.forgetZeroCopy(*self);
    self->handle_.resume();
  }

  UringReactor& reactor_;
  int fd_;
  msghdr message_;  // lives in the operation until the kernel has read it
  std::stop_token stop_;
  int result_ = 0;
  bool sent_ = false;  // the send's own CQE came
  InlineCompletion inline_;
  std::coroutine_handle<> handle_;
  std::optional<std::stop_callback<OnStop>> onStop_;
  UringZeroCopySend* prev_ = nullptr;  // the reactor's list of zero-copy sends in flight
  UringZeroCopySend* next_ = nullptr;
};

/// One socket's receiver (unless RecvMode::plain), owned by the reactor.
/// In multishot mode its recv, armed by the first read that finds nothing
/// buffered, stays armed across reads; each completion's data goes to the
/// waiting read, the rest to a backlog for the next reads. In direct mode
/// (RecvMode::adaptive only) reads are plain recv SQEs of their own, which
/// report their sizes here. Loop thread only.
///
/// State machine, in a few words: `armed_` from the SQE until a completion
/// without IORING_CQE_F_MORE (end of stream, an error, ENOBUFS when the
/// provided buffers ran out, or our cancel); `end_` once the stream ended
/// for good (sticky, after the data before it); `released_` once the socket
/// was forgotten: the receiver then only waits for its last completion to
/// free itself. `multishot_` is the mode; leaving multishot mode cancels the
/// recv, and reads are served here until it is disarmed and the backlog is
/// drained (a read waiting then gets a one-shot recv from the provided
/// buffers), so the bytes keep their order.
class UringReceiver : UringOperation {
 public:
  UringReceiver(UringReactor& reactor, int fd, bool adaptive) noexcept
      : UringOperation{&UringReceiver::onComplete}, reactor_(reactor), fd_(fd), adaptive_(adaptive),
        multishot_(!adaptive) {}
  UringReceiver(const UringReceiver&) = delete;
  UringReceiver& operator=(const UringReceiver&) = delete;

  /// Whether the next read is a plain recv of its own (direct mode, nothing
  /// armed or kept here).
  bool readsDirect() const noexcept { return !multishot_ && !readsAhead(); }
  /// Whether a recv is armed or data (or the end) is kept here.
  bool readsAhead() const noexcept { return armed_ || buffered() != 0 || end_; }
  /// A direct read's result, `requested` bytes asked: kRecvModeSwitch short
  /// ones in a row (less than asked and than one provided buffer: the
  /// socket was drained) switch to multishot mode; one of a whole provided
  /// buffer or more resets the count. A small read that got all it asked
  /// for says nothing (the socket may hold more).
  void noteDirect(const Result<std::size_t>& read, std::size_t requested) noexcept {
    if (!read || *read == 0) return;  // errors and the end say nothing about the traffic
    if (*read >= bufferSize()) {
      streak_ = 0;
    } else if (*read < requested && ++streak_ == UringReactor::kRecvModeSwitch) {
      multishot_ = true;
      streak_ = 0;
    }
  }

  /// Copies what is buffered into `into`, or yields the end of the stream:
  /// true (with `result` set) if the read is done without waiting.
  bool tryTake(std::span<std::byte> into, int& result) noexcept {
    if (buffered() != 0 || into.empty()) {
      result = static_cast<int>(take(into));
      return true;
    }
    if (end_) result = *end_;
    return end_.has_value();
  }

  /// Makes `read` the waiting read, arming the recv if needed; false (with
  /// the errno in the read's result) if it could not be armed.
  bool wait(MultishotRead& read) noexcept;
  /// Forgets `read` if it is the waiting one (its stop was requested, or
  /// its frame is destroyed).
  void abandon(MultishotRead* read) noexcept {
    if (waiter_ == read) waiter_ = nullptr;
  }
  /// The socket is being forgotten: true if the receiver can be freed now,
  /// false if it frees itself at its recv's last completion.
  bool release() noexcept;
  /// After the reactor quiesced: the kernel holds no recv any more.
  void disarm() noexcept { armed_ = cancelling_ = false; }

  UringReceiver* prev = nullptr;  // the reactor's list of receivers
  UringReceiver* next = nullptr;

 private:
  std::size_t buffered() const noexcept { return backlog_.size() - head_; }
  std::size_t take(std::span<std::byte> into) noexcept {
    const std::size_t n = std::min(into.size(), buffered());
    std::memcpy(into.data(), backlog_.data() + head_, n);
    head_ += n;
    if (head_ == backlog_.size()) {
      backlog_.clear();
      head_ = 0;
    }
    return n;
  }
  std::size_t bufferSize() const noexcept;
  bool arm() noexcept;
  void cancel() noexcept;
  // A multishot completion of `size` bytes: kRecvModeSwitch full buffers in
  // a row switch an adaptive receiver to direct mode.
  void noteMultishot(std::size_t size) noexcept {
    if (!adaptive_ || !multishot_) return;
    if (size < bufferSize()) {
      streak_ = 0;
    } else if (++streak_ == UringReactor::kRecvModeSwitch) {
      leaveMultishot();
    }
  }
  void leaveMultishot() noexcept {
    multishot_ = false;
    streak_ = 0;
    if (armed_) cancel();
  }
  // Hands `data` to the waiting read, the rest to the backlog; true if the
  // waiting read got some.
  bool deliver(std::span<const std::byte> data) noexcept;
  static void onComplete(UringOperation* op, int result, unsigned flags) noexcept;

  UringReactor& reactor_;
  int fd_;
  const bool adaptive_;
  bool multishot_;
  unsigned streak_ = 0;  // reads or completions in a row that argue for the other mode
  bool armed_ = false;
  bool cancelling_ = false;
  bool released_ = false;
  std::optional<int> end_;        // 0 (end of stream) or -errno, once the recv ended for good
  std::vector<std::byte> backlog_;  // received, not read yet: [head_, size())
  std::size_t head_ = 0;
  MultishotRead* waiter_ = nullptr;
};

/// A read served by the socket's UringReceiver: completes at once from the
/// backlog, else resumes on the loop thread when data (or the end) arrives.
/// Cancelling it leaves the receiver's recv as it is (the kernel holds no
/// buffer of this read's): it resumes in a later loop iteration with
/// operation_canceled, and data arriving later waits for the next read.
class [[nodiscard]] MultishotRead {
 public:
  MultishotRead(UringReactor& reactor, UringReceiver& receiver, std::span<std::byte> buffer,
                std::stop_token stop) noexcept
      : reactor_(reactor), buffer_(buffer), stop_(std::move(stop)), receiver_(&receiver) {}
  MultishotRead(const MultishotRead&) = delete;
  MultishotRead& operator=(const MultishotRead&) = delete;
  ~MultishotRead() {
    if (receiver_) receiver_->abandon(this);  // the frame is destroyed while suspended here
  }

  // Given no token, the attempt waits for await_suspend, which knows the awaiting Task's.
  bool await_ready() noexcept { return stop_.stop_possible() && inline_.admit(reactor_, tryComplete()); }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) noexcept {
    if (inheritStopToken(stop_, h) && inline_.admit(reactor_, tryComplete())) return false;
    handle_ = h;
    if (inline_.deferred(reactor_, h)) {  // done, but the loop's other work goes first
      receiver_ = nullptr;  // done with the receiver: the socket may be forgotten meanwhile
      return true;
    }
    if (!receiver_->wait(*this)) return false;
    if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
    return true;
  }
  Result<std::size_t> await_resume() {
    onStop_.reset();
    receiver_ = nullptr;  // not waiting any more: the socket may be forgotten before this is destroyed
    return toResult<std::size_t>(result_);
  }

 private:
  friend class UringReceiver;
  // True (result_ set) if the read is over without waiting: a stop already
  // requested, or data (or the end) the receiver kept.
  bool tryComplete() noexcept {
    if (stop_.stop_requested()) {
      result_ = -ECANCELED;
      return true;
    }
    return receiver_->tryTake(buffer_, result_);
  }
  struct OnStop {
    MultishotRead* self;
    void operator()() const noexcept {
      COIO_ASSERT(self->reactor_.isInLoopThread(), "stop requested off the reactor's thread");
      if (self->receiver_) std::exchange(self->receiver_, nullptr)->abandon(self);
      self->result_ = -ECANCELED;
      self->reactor_.post(self->posted_, self->handle_);
    }
  };

  UringReactor& reactor_;
  std::span<std::byte> buffer_;
  std::stop_token stop_;
  UringReceiver* receiver_;  // null once the socket was forgotten
  int result_ = 0;
  InlineCompletion inline_;
  std::coroutine_handle<> handle_;
  PostedResume posted_;
  std::optional<std::stop_callback<OnStop>> onStop_;
};

inline bool UringReceiver::release() noexcept {
  released_ = true;
  // A read still pending (only after stop(): its frame is destroyed later,
  // maybe after this receiver) must not reach back into it.
  if (waiter_) std::exchange(waiter_, nullptr)->receiver_ = nullptr;
  if (!armed_) return true;
  cancel();
  return false;
}

inline bool UringReceiver::wait(MultishotRead& read) noexcept {
  COIO_ASSERT(waiter_ == nullptr, "two reads pending on one socket");
  if (!armed_ && !arm()) {
    read.result_ = -reactor_.submitError();
    return false;
  }
  waiter_ = &read;
  return true;
}

inline std::size_t UringReceiver::bufferSize() const noexcept { return reactor_.recvBuffers_->bufferSize(); }

inline bool UringReceiver::arm() noexcept {
  armed_ = reactor_.trySubmit(*this, [&](io_uring_sqe* sqe) {
    if (multishot_) {
      io_uring_prep_recv_multishot(sqe, fd_, nullptr, 0, 0);
    } else {
      io_uring_prep_recv(sqe, fd_, nullptr, 0, 0);  // leaving multishot mode: one buffer's worth
    }
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = reactor_.recvBuffers_->group();
  });
  return armed_;
}

inline void UringReceiver::cancel() noexcept {
  if (cancelling_) return;
  cancelling_ = true;
  reactor_.cancel(*this);
}

inline bool UringReceiver::deliver(std::span<const std::byte> data) noexcept {
  if (end_) return false;  // broken (see below): nothing after the gap may be read
  const bool served = waiter_ != nullptr;  // a read waits only on an empty backlog
  if (served) {  // the usual case: straight to the reader
    const std::size_t n = std::min(data.size(), waiter_->buffer_.size());
    std::memcpy(waiter_->buffer_.data(), data.data(), n);
    waiter_->result_ = static_cast<int>(n);
    data = data.subspan(n);
  }
  try {
    backlog_.insert(backlog_.end(), data.begin(), data.end());
  } catch (const std::bad_alloc&) {
    // Received but nowhere to keep it: the stream is broken from here on.
    end_ = -ENOMEM;
    backlog_.clear();
    head_ = 0;
  }
  return served;
}

inline void UringReceiver::onComplete(UringOperation* op, int result, unsigned flags) noexcept {
  auto* self = static_cast<UringReceiver*>(op);
  if (!(flags & IORING_CQE_F_MORE)) self->disarm();
  bool delivered = false;
  if (flags & IORING_CQE_F_BUFFER) {
    const auto id = static_cast<unsigned short>(flags >> IORING_CQE_BUFFER_SHIFT);
    detail::ProvidedBufferRing& buffers = *self->reactor_.recvBuffers_;
    if (result > 0 && !self->released_) {
      delivered = self->deliver(buffers.data(id, static_cast<std::size_t>(result)));
      self->noteMultishot(static_cast<std::size_t>(result));
    }
    buffers.recycle(id);  // also when the kernel picked a buffer for an end of stream
  }
  if (result == 0 || (result < 0 && result != -ENOBUFS && result != -ECANCELED)) {
    self->end_ = result;  // end of stream, or the socket's error
  }
  if (self->released_) {
    if (!self->armed_) self->reactor_.destroyReceiver(self);
    return;
  }
  // Past the limit, or broken (no memory for the backlog): stop taking data
  // (an adaptive receiver takes the limit for a stream).
  if (self->armed_ && self->end_) self->cancel();
  if (self->armed_ && self->buffered() >= UringReactor::kRecvBacklogLimit) {
    if (self->adaptive_) {
      self->leaveMultishot();
    } else {
      self->cancel();
    }
  }
  MultishotRead* read = self->waiter_;
  if (!read) return;
  if (!delivered) {
    if (self->end_) {
      read->result_ = *self->end_;
    } else if (self->armed_ || self->arm()) {
      return;  // still waiting (after ENOBUFS or our cancel, on a re-armed recv)
    } else {
      read->result_ = -self->reactor_.submitError();
    }
  }
  self->waiter_ = nullptr;
  read->handle_.resume();  // last: the reader may read again, or close the socket
}

/// What UringReactor::recv returns: a plain recv SQE (UringIoOperation) or
/// a MultishotRead, as the reactor's recv mode and the socket's receiver
/// say (decided when recv() is called).
class [[nodiscard]] UringRecv {
 public:
  /// A plain recv; `receiver` (direct mode) hears its result.
  UringRecv(UringReactor& reactor, RecvPrep prep, std::stop_token stop, UringReceiver* receiver) noexcept
      : op_(std::in_place_index<0>, reactor, prep, std::move(stop)), receiver_(receiver),
        requested_(prep.buffer.size()) {}
  UringRecv(UringReactor& reactor, UringReceiver& receiver, std::span<std::byte> buffer,
            std::stop_token stop) noexcept
      : op_(std::in_place_index<1>, reactor, receiver, buffer, std::move(stop)) {}

  bool await_ready() noexcept {
    return std::visit([](auto& op) { return op.await_ready(); }, op_);
  }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    return std::visit(
        [h](auto& op) {
          if constexpr (std::is_void_v<decltype(op.await_suspend(h))>) {
            op.await_suspend(h);
            return true;
          } else {
            return op.await_suspend(h);
          }
        },
        op_);
  }
  Result<std::size_t> await_resume() {
    Result<std::size_t> read = std::visit([](auto& op) { return op.await_resume(); }, op_);
    if (receiver_) receiver_->noteDirect(read, requested_);
    return read;
  }

 private:
  std::variant<UringIoOperation<RecvPrep, std::size_t>, MultishotRead> op_;
  UringReceiver* receiver_ = nullptr;  // direct reads: hears the result
  std::size_t requested_ = 0;
};

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

}  // namespace detail

inline UringReactor::UringReactor(Options options)
    : policy_(options.submitPolicy), taskRun_(options.taskRun), recvMode_(options.recvMode) {
  const unsigned buffers = options.recvBuffers;
  if (recvMode_ != RecvMode::plain && (buffers == 0 || buffers > 32768 || (buffers & (buffers - 1)) != 0 ||
                                options.recvBufferSize == 0)) {
    throw std::invalid_argument(
        "coio::UringReactor: recvBuffers must be a power of two up to 32768 and recvBufferSize positive");
  }
  deferredCancels_.reserve(16);  // before the ring: nothing to release if it throws
  std::string why;
  if (const int err = detail::setUpRing(ring_, options.entries, options.cqEntries, taskRun_, why)) {
    detail::throwSystemError(err, why);
  }
  disabled_ = (ring_.flags & IORING_SETUP_R_DISABLED) != 0;
  if (options.zeroCopySend) {
    const detail::RingProbe probe = detail::probeRing(ring_);
    zeroCopySend_ = probe && io_uring_opcode_supported(probe.get(), IORING_OP_SEND_ZC) &&
                    io_uring_opcode_supported(probe.get(), IORING_OP_SENDMSG_ZC);
  }
  int err = 0;
  const char* what = nullptr;
  // Registered before the ring is enabled: a TaskRun::deferred ring takes
  // registrations from its submitter thread only, which it does not have yet.
  if (recvMode_ != RecvMode::plain && detail::kernelAtLeast(6, 0)) {
    err = recvBuffers_.emplace().setUp(ring_, kRecvBufferGroup, buffers, options.recvBufferSize);
    what = "coio::UringReactor: registering the multishot recv buffers";
    if (err && recvMode_ == RecvMode::adaptive) {
      recvBuffers_.reset();  // not registered: reads stay plain, as before Linux 6.0
      err = 0;
    }
  }
  if (!err && !tryArmWake()) {
    err = submitError_;
    what = "coio::UringReactor: arming the wake-up poll";
  }
  if (err) {
    io_uring_queue_exit(&ring_);
    detail::throwSystemError(err, what);
  }
}

inline Result<void> UringReactor::probe(std::string* why) {
  io_uring ring{};
  std::string reason;
  TaskRun mode = TaskRun::immediate;
  if (const int err = detail::setUpRing(ring, 4, 8, mode, reason)) {
    if (why) *why = reason;
    return systemError(err);
  }
  io_uring_queue_exit(&ring);
  return {};
}

inline auto UringReactor::readable(int fd, std::stop_token stop) noexcept -> Operation<detail::PollPrep, void> {
  return {*this, detail::PollPrep{fd, POLLIN}, std::move(stop)};
}
inline auto UringReactor::writable(int fd, std::stop_token stop) noexcept -> Operation<detail::PollPrep, void> {
  return {*this, detail::PollPrep{fd, POLLOUT}, std::move(stop)};
}
inline auto UringReactor::accept(int fd, std::stop_token stop) noexcept -> Operation<detail::AcceptPrep, int> {
  return {*this, detail::AcceptPrep{fd}, std::move(stop)};
}
inline auto UringReactor::connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop) noexcept
    -> Operation<detail::ConnectPrep, void> {
  detail::ConnectPrep prep{fd, {}, length};
  std::memcpy(&prep.address, address, std::min<std::size_t>(length, sizeof prep.address));
  return {*this, prep, std::move(stop)};
}
inline detail::UringRecv UringReactor::recv(int fd, std::span<std::byte> buffer, std::stop_token stop) noexcept {
  return recvWith(fd, buffer, std::move(stop), 0);
}
inline detail::UringRecv UringReactor::recvAll(int fd, std::span<std::byte> buffer, std::stop_token stop) noexcept {
  return recvWith(fd, buffer, std::move(stop), MSG_WAITALL);
}
inline detail::UringRecv UringReactor::recvWith(int fd, std::span<std::byte> buffer, std::stop_token stop,
                                                int flags) noexcept {
  // No receiver (no memory for a new socket's, or a negative fd): nothing
  // is read ahead on it, so a plain recv is safe.
  detail::UringReceiver* receiver = recvMode() != RecvMode::plain ? receiverFor(fd) : nullptr;
  if (receiver && !receiver->readsDirect()) return {*this, *receiver, buffer, std::move(stop)};
  return {*this, detail::RecvPrep{fd, buffer, flags}, std::move(stop), receiver};
}

inline bool UringReactor::readsAhead(int fd) const noexcept {
  const auto slot = static_cast<std::size_t>(fd);
  return fd >= 0 && slot < receiverByFd_.size() && receiverByFd_[slot] && receiverByFd_[slot]->readsAhead();
}

inline void UringReactor::forget(int fd) noexcept {
  if (fd < 0 || static_cast<std::size_t>(fd) >= receiverByFd_.size()) return;
  detail::UringReceiver* receiver = std::exchange(receiverByFd_[static_cast<std::size_t>(fd)], nullptr);
  if (receiver && receiver->release()) destroyReceiver(receiver);
}

inline detail::UringReceiver* UringReactor::receiverFor(int fd) noexcept {
  if (fd < 0) return nullptr;  // not a socket: the plain recv reports EBADF
  const auto slot = static_cast<std::size_t>(fd);
  try {
    if (slot >= receiverByFd_.size()) receiverByFd_.resize(slot + 1);
    if (!receiverByFd_[slot]) {
      auto* receiver = new detail::UringReceiver(*this, fd, recvMode_ == RecvMode::adaptive);
      receiver->next = receivers_;
      if (receivers_) receivers_->prev = receiver;
      receivers_ = receiver;
      receiverByFd_[slot] = receiver;
    }
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  return receiverByFd_[slot];
}

inline void UringReactor::destroyReceiver(detail::UringReceiver* receiver) noexcept {
  (receiver->prev ? receiver->prev->next : receivers_) = receiver->next;
  if (receiver->next) receiver->next->prev = receiver->prev;
  delete receiver;
}
inline auto UringReactor::send(int fd, std::span<const std::byte> buffer, std::stop_token stop) noexcept
    -> Operation<detail::SendPrep, std::size_t> {
  return {*this, detail::SendPrep{fd, buffer}, std::move(stop)};
}

inline auto UringReactor::sendv(int fd, std::span<const iovec> parts, std::stop_token stop) noexcept
    -> Operation<detail::SendvPrep, std::size_t> {
  return {*this, detail::SendvPrep{fd, detail::messageOf(parts)}, std::move(stop)};
}

inline detail::UringZeroCopySend UringReactor::sendZeroCopy(int fd, std::span<const iovec> parts,
                                                           std::stop_token stop) noexcept {
  return {*this, fd, parts, std::move(stop)};
}

inline void UringReactor::submitZeroCopy(detail::UringZeroCopySend& op) {
  submit(op, [&](io_uring_sqe* sqe) { op.prepare(sqe, zeroCopySend_); });
  if (!zeroCopySend_) return;  // a copying send: cancelled like any other
  op.next_ = zeroCopySends_;
  if (zeroCopySends_) zeroCopySends_->prev_ = &op;
  zeroCopySends_ = &op;
}

inline void UringReactor::forgetZeroCopy(detail::UringZeroCopySend& op) noexcept {
  if (!zeroCopySend_) return;
  (op.prev_ ? op.prev_->next_ : zeroCopySends_) = op.next_;
  if (op.next_) op.next_->prev_ = op.prev_;
  op.prev_ = op.next_ = nullptr;
}

inline void UringReactor::onWake(UringOperation* op, int, unsigned) noexcept {
  UringReactor* self = static_cast<WakeOperation*>(op)->reactor;
  self->wake().drain();  // before taking the queue: see LoopCore::pushRemoteLocked
  self->resumeRemote();
  (void)self->tryArmWake();  // noexcept path: a failure is retried by poll()
}

inline void UringReactor::submitDeferred() {
  while (!deferredCancels_.empty()) {
    if (!trySubmitCancel(*deferredCancels_.back())) {
      detail::throwSystemError(submitError_, "coio::UringReactor: io_uring_submit");
    }
    deferredCancels_.pop_back();
  }
  if (!wakeArmed_ && !tryArmWake()) {
    detail::throwSystemError(submitError_, "coio::UringReactor: arming the wake-up poll");
  }
}

inline bool UringReactor::armDeadline(Clock::time_point deadline) noexcept {
  if (deadlineArmed_ && armedDeadline_ == deadline) return true;
  deadlineOperation_.when = detail::toTimespec<__kernel_timespec>(deadline.time_since_epoch());
  if (!deadlineArmed_) {
    deadlineArmed_ = trySubmitCounted(
        deadlineOperation_,
        [this](io_uring_sqe* sqe) { io_uring_prep_timeout(sqe, &deadlineOperation_.when, 0, IORING_TIMEOUT_ABS); },
        false);
    if (!deadlineArmed_) return false;
  } else {
    // Moved in place. If it fired meanwhile, the update finds nothing, and
    // the completion already on its way wakes the loop, which re-arms.
    const bool updated = trySubmitUntracked([this](io_uring_sqe* sqe) {
      io_uring_prep_timeout_update(
          sqe, &deadlineOperation_.when,
          reinterpret_cast<std::uint64_t>(static_cast<UringOperation*>(&deadlineOperation_)), IORING_TIMEOUT_ABS);
    });
    if (!updated) return false;
  }
  armedDeadline_ = deadline;
  return true;
}

inline void UringReactor::enableRing() noexcept {
  if (!disabled_) return;
  // liburing 2.3 declares io_uring_enable_rings but does not export it:
  // the raw register call. It can only fail if ring_fd is no longer our
  // ring; the ring then stays disabled and the submission that needed it
  // fails (-EBADFD) and is reported.
  disabled_ = ::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) != 0;
}

inline void UringReactor::poll(std::optional<Clock::duration> timeout) {
  enableRing();
  if (!ringFdTried_) registerRingFd();
  // What a noexcept path (a stop callback, onWake) could not submit.
  if (!wakeArmed_ || !deferredCancels_.empty()) submitDeferred();
  if (!backlog_.empty()) timeout = Clock::duration::zero();  // completions already wait
  int r;
  if (timeout && *timeout == Clock::duration::zero()) {
    r = io_uring_submit_and_get_events(&ring_);
  } else {
    __kernel_timespec ts{};
    if (timeout) ts = detail::toTimespec<__kernel_timespec>(*timeout);
    io_uring_cqe* cqe = nullptr;
    r = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, timeout ? &ts : nullptr, nullptr);
  }
  woke(timeout);
  // -ETIME: the timeout passed; -EINTR: a signal; -EBUSY/-EAGAIN: completions
  // are backed up, which reaping fixes.
  if (r < 0 && r != -ETIME && r != -EINTR && r != -EBUSY && r != -EAGAIN) {
    detail::throwSystemError(-r, "coio::UringReactor: io_uring_enter");
  }
  // Bounded: what is left waits in the CQ (the next wait returns at once) or
  // in the backlog (the next poll does not wait).
  reap(kReapRoundsPerPoll);
}

inline void UringReactor::reap(std::size_t maxRounds) {
  // Completions are copied out before any is dispatched: a resumed coroutine
  // may submit, and even reap into the backlog, while we iterate.
  for (std::size_t round = 1;; ++round) {
    batch_.clear();
    std::swap(batch_, backlog_);
    const std::size_t n = takeCompletions(batch_);
    meter_.dispatched(batch_.size());
    for (const Completion& c : batch_) dispatch(c);
    // A full batch may hide more; a backlog must not wait for a new event.
    if ((n < kBatch && backlog_.empty()) || round >= maxRounds) break;
  }
}

inline void UringReactor::quiesce() noexcept {
  // The wake-up poll alone holds no memory of anyone's, and closing the ring
  // ends it: no wait, so that a thread other than the one that ran a
  // deferred ring (only that one may wait on it) can destroy the reactor.
  // Nor does the timer's timeout.
  if (inFlight_ <= (wakeArmed_ ? 1u : 0u) + (deadlineArmed_ ? 1u : 0u)) return;
  enableRing();  // never run: what was prepared was never submitted, but the wait below needs the ring
  quiescing_ = true;
  deferredCancels_.clear();  // the cancel below covers them
  // A zero-copy send's notification waits for the peer to acknowledge the
  // data, which a peer that stopped reading never does, so the wait below
  // could last for ever: with the connection reset, the kernel drops it.
  for (detail::UringZeroCopySend* op = zeroCopySends_; op; op = op->next_) (void)detail::resetConnection(op->fd_);
  // Without a cancel the kernel may keep writing into operations that are
  // about to be freed: as below, better to stop here.
  if (!trySubmitUntracked([](io_uring_sqe* sqe) { io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY); })) {
    std::terminate();
  }
  for (;;) {
    reap();  // first the backlog: its completions will not come again
    if (inFlight_ == 0) break;
    const int r = io_uring_submit_and_wait(&ring_, 1);
    // Unable to wait, we could only free operations the kernel may still
    // write to: better to stop here.
    if (r == -EEXIST) {
      std::fputs("coio::UringReactor: destroyed with operations in flight off the thread that ran its "
                 "TaskRun::deferred ring; only that thread can wait for them\n", stderr);
    }
    if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) std::terminate();
  }
  quiescing_ = false;
  zeroCopySends_ = nullptr;  // all completed (unseen by their operations)
  deadlineArmed_ = false;  // cancelled too: its completion came while quiescing
  for (detail::UringReceiver* r = receivers_; r; r = r->next) r->disarm();
}

}  // namespace coio
