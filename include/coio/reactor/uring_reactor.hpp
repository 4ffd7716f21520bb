#pragma once
// UringReactor: the event loop over io_uring. Its parts, each in a header
// of its own: the options (uring_options.hpp), the loop (reactor_loop.hpp),
// the backend that waits on the ring (detail/uring_backend.hpp), the ring
// (detail/uring_ring.hpp) and its set-up (detail/uring_setup.hpp), and the
// operations: single-shot ones (detail/uring_io_operation.hpp), the
// multishot receive (detail/uring_multishot_recv.hpp), the zero-copy send
// (detail/uring_zero_copy_send.hpp). Needs liburing: link coio::uring.
#include <coio/core/result.hpp>
#include <coio/reactor/detail/iovec.hpp>
#include <coio/reactor/detail/uring_backend.hpp>
#include <coio/reactor/detail/uring_io_operation.hpp>
#include <coio/reactor/detail/uring_multishot_recv.hpp>
#include <coio/reactor/detail/uring_setup.hpp>
#include <coio/reactor/detail/uring_splice.hpp>
#include <coio/reactor/detail/uring_zero_copy_send.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/reactor_loop.hpp>
#include <coio/reactor/splice.hpp>
#include <coio/reactor/uring_operation.hpp>
#include <coio/reactor/uring_options.hpp>

#include <liburing.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stop_token>
#include <string>
#include <utility>

namespace coio {

class UringReactor;
template <>
struct detail::BackendOf<UringReactor> {
  using type = UringBackend;
};

/// An event loop over io_uring (liburing), driven by one thread; it models
/// coio::Reactor, whose comment lists what every reactor guarantees.
///
/// Guarantees:
/// - Every awaitable resumes its coroutine on the loop thread (the thread
///   inside run() / runUntil()) and must be awaited there, once. Each
///   operation returns an awaitable named after it (RecvAwaitable...),
///   whose comment says what `co_await` yields.
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
///   `splice` and `tee` (it is a SpliceReactor) are IORING_OP_SPLICE /
///   IORING_OP_TEE, with a poll for an end that was not ready; `sendfile`
///   splices through the caller's pipe.
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
///   the reactor. An accept (or a Disk's open) that completed anyway is
///   not delivered: the reactor closes its new fd.
/// - Fairness: at most kInlineTurnsPerIteration operations per loop
///   iteration complete without suspending (a send the socket took, a read
///   served from data a multishot recv kept, a stop already requested);
///   later ones still complete at once but resume their coroutine in the
///   next iteration. And one poll dispatches at
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
///
/// run, runUntil, spawn, schedule, the timers, stats() and the stall
/// detector are the loop's (ReactorLoop), which both reactors share. Inside
/// (docs/reactors.md, "How the reactors are built"): UringBackend waits on
/// the ring (UringRing); the operations are UringIoOperation
/// (reactor/detail/uring_io_operation.hpp), the multishot receive
/// (uring_multishot_recv.hpp) and the zero-copy send
/// (uring_zero_copy_send.hpp).
///
/// Example:
/// \snippet api_examples_uring.cpp UringReactor
class UringReactor : public ReactorLoop<UringReactor> {
 public:
  /// The awaitable type of this reactor's io_uring operations.
  template <typename Prep, typename T>
  using Operation = detail::UringIoOperation<Prep, T>;

  /// What readable() and writable() return: `co_await` yields Result<void>.
  using ReadinessAwaitable = detail::UringIoOperation<detail::PollPrep, void>;
  /// What accept() returns: `co_await` yields Result<int>, the new socket.
  using AcceptAwaitable = detail::UringIoOperation<detail::AcceptPrep, int>;
  /// What connect() returns: `co_await` yields Result<void>.
  using ConnectAwaitable = detail::UringIoOperation<detail::ConnectPrep, void>;
  /// What recv() and recvAll() return: `co_await` yields
  /// Result<std::size_t>, the bytes read.
  using RecvAwaitable = detail::UringRecv;
  /// What send() returns: `co_await` yields Result<std::size_t>, the bytes sent.
  using SendAwaitable = detail::UringIoOperation<detail::SendPrep, std::size_t>;
  /// What sendv() returns: `co_await` yields Result<std::size_t>, the bytes sent.
  using SendvAwaitable = detail::UringIoOperation<detail::SendvPrep, std::size_t>;
  /// What sendZeroCopy() returns: `co_await` yields Result<std::size_t>,
  /// the bytes sent, once the kernel no longer references them.
  using SendZeroCopyAwaitable = detail::UringZeroCopySend;
  /// What splice() and tee() return: `co_await` yields Result<std::size_t>,
  /// the bytes moved (see SpliceReactor).
  using SpliceAwaitable = detail::UringSplice<detail::OneTransfer>;
  /// What sendfile() returns: `co_await` yields Result<std::size_t>, the
  /// bytes sent (see SpliceReactor).
  using SendfileAwaitable = detail::UringSplice<detail::SendfileSteps>;

  /// How the ring is set up and used (see UringOptions).
  using Options = UringOptions;

  /// What one socket's multishot recv keeps for its reader before it stops
  /// taking data off the socket (TCP's flow control then holds the peer).
  static constexpr std::size_t kRecvBacklogLimit = detail::kRecvBacklogLimit;
  /// Reads (or completions) in a row that switch a socket's recv mode
  /// under RecvMode::adaptive.
  static constexpr unsigned kRecvModeSwitch = detail::kRecvModeSwitch;

  /// Sets up the ring with default options (see the other constructor).
  UringReactor() : UringReactor(Options{}) {}
  /// Sets up the ring; throws std::system_error naming the cause if
  /// io_uring is unusable (see probe()), std::invalid_argument if
  /// recvBuffers is not a power of two up to 32768 or recvBufferSize is 0.
  explicit UringReactor(Options options) : ReactorLoop(options) {}

  /// Whether an UringReactor can be constructed here; if not, the error and
  /// (in `why`) the same explanation the constructor would throw.
  static Result<void> probe(std::string* why = nullptr);

  /// Completes once `fd` is readable (a one-shot poll).
  ReadinessAwaitable readable(int fd, std::stop_token stop = {}) noexcept;
  /// Completes once `fd` is writable (a one-shot poll).
  ReadinessAwaitable writable(int fd, std::stop_token stop = {}) noexcept;
  /// accept4 as an io_uring operation (non-blocking, close-on-exec): the new fd.
  AcceptAwaitable accept(int fd, std::stop_token stop = {}) noexcept;
  /// connect as an io_uring operation; `address` must stay valid until it completes.
  ConnectAwaitable connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop = {}) noexcept;
  /// A plain recv SQE, or a read served by the socket's multishot recv, as
  /// Options::recvMode and (adaptive) the socket's traffic say.
  RecvAwaitable recv(int fd, std::span<std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// recv for a reader that wants the whole buffer (TcpStream::readExact):
  /// a plain recv SQE asks for all of it (MSG_WAITALL), so the kernel
  /// fills it as data arrives and completes once, with fewer bytes only at
  /// the end of the stream, on an error, or when cancelled (what it read
  /// by then). A read served by the socket's multishot recv yields what is
  /// there, as recv does.
  RecvAwaitable recvAll(int fd, std::span<std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// Sends with a non-blocking send(2) first, and an SQE only when the
  /// socket is full; that SQE sends all that is left (MSG_WAITALL) unless
  /// an error or a stop comes first: bytes sent.
  SendAwaitable send(int fd, std::span<const std::byte> buffer, std::stop_token stop = {}) noexcept;
  /// sendmsg of `parts` (at most IOV_MAX), tried at once as send is: bytes
  /// written, possibly fewer than asked. `parts` must stay valid until the
  /// co_await returns.
  SendvAwaitable sendv(int fd, std::span<const iovec> parts, std::stop_token stop = {}) noexcept;
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
  SendZeroCopyAwaitable sendZeroCopy(int fd, std::span<const iovec> parts, std::stop_token stop = {}) noexcept;

  /// splice from `in` into `out`, one of them a pipe: an IORING_OP_SPLICE
  /// (run by the kernel's io-wq workers), and a poll for the end that was
  /// not ready, if one was, before trying again. What it guarantees
  /// (partial transfers, errors, O_DIRECT, cancellation): see SpliceReactor.
  /// From a socket the reactor reads ahead (readsAhead(in): a recv() under
  /// RecvMode::adaptive or multishot armed one), EBUSY: its multishot recv
  /// would take the bytes meant for the splice.
  SpliceAwaitable splice(int in, std::int64_t inOffset, int out, std::int64_t outOffset, std::size_t length,
                         std::stop_token stop = {}) noexcept;
  /// tee from pipe `in` into pipe `out`: an IORING_OP_TEE, as splice() is made.
  SpliceAwaitable tee(int in, int out, std::size_t length, std::stop_token stop = {}) noexcept;
  /// `in` from `offset` into `out` through `pipe` (empty): a splice that
  /// fills it (at most its capacity), then splices that empty it into
  /// `out`; the bytes that reached `out`. See SpliceReactor.
  SendfileAwaitable sendfile(int out, int in, std::int64_t offset, std::size_t length, Pipe& pipe,
                             std::stop_token stop = {}) noexcept;

  /// Whether sendZeroCopy avoids the copy: the kernel has IORING_OP_SEND_ZC
  /// and SENDMSG_ZC (Linux 6.1; probed once, at construction) and
  /// Options::zeroCopySend is set.
  bool zeroCopySend() const noexcept { return backend_.zeroCopySends().enabled(); }

  /// Drops the socket's receiver, if it has one, with what it holds (an
  /// armed recv is cancelled; the receiver is freed when its last completion
  /// arrives). Nothing else: io_uring keeps no per-fd registration.
  void forget(int fd) noexcept { backend_.receivers().forget(fd); }

  /// The recv mode in effect: Options::recvMode, or plain on a kernel
  /// without multishot recvs.
  RecvMode recvMode() const noexcept { return backend_.receivers().mode(); }

  /// Whether the reactor reads `fd` ahead of its reader: a recv of its
  /// receiver is armed on it (the multishot recv, or the one-shot recv that
  /// ends a switch back to plain recvs), or the receiver holds data or the
  /// end of the stream no read took yet. Forgetting the socket then drops
  /// what its peer sent.
  bool readsAhead(int fd) const noexcept { return backend_.receivers().readsAhead(fd); }

  // --- For layers that bring their own operations (disk, RDMA). Loop thread.

  /// The ring, e.g. to register buffers or files.
  io_uring& ring() noexcept { return backend_.ring().get(); }

  /// Prepares one SQE with `prep(sqe)` whose completion calls `op.complete`,
  /// then submits it according to the policy. It counts in stats() by its
  /// opcode (the LoopStats counter of that kind of operation).
  template <typename Prep>
  void submit(UringOperation& op, Prep&& prep) {
    backend_.ring().submit(op, std::forward<Prep>(prep));
  }

  /// submit() for paths that must not throw: false (errno in submitError())
  /// if no SQE could be had.
  template <typename Prep>
  bool trySubmit(UringOperation& op, Prep&& prep) noexcept {
    return backend_.ring().trySubmit(op, std::forward<Prep>(prep));
  }

  /// Why the last trySubmit() failed.
  int submitError() const noexcept { return backend_.ring().submitError(); }

  /// Asks the kernel to cancel `op`; its completion still arrives. Never
  /// throws (stop callbacks call it): if the SQ is full and cannot be
  /// flushed right now, the cancel goes out before the loop's next wait
  /// (where a ring that still refuses it makes run() throw).
  void cancel(UringOperation& op) noexcept { backend_.ring().cancel(op); }

  /// Submits whatever is prepared now, whatever the policy (a ring not
  /// enabled yet, TaskRun::deferred before the loop first ran, keeps it for
  /// the loop's first poll).
  void flush() { (void)backend_.ring().flush(); }

  /// The task-run mode the ring was set up with (after any fallback).
  TaskRun taskRun() const noexcept { return backend_.taskRun(); }

  /// When prepared SQEs reach the kernel.
  SubmitPolicy submitPolicy() const noexcept { return backend_.submitPolicy(); }
  /// Changes the submit policy from now on (loop thread).
  void setSubmitPolicy(SubmitPolicy policy) noexcept { backend_.setSubmitPolicy(policy); }

  /// Operations whose last completion has not arrived yet (including the
  /// reactor's own wake-up poll, not its timer's timeout).
  std::size_t inFlight() const noexcept { return backend_.inFlight(); }

 private:
  RecvAwaitable recvWith(int fd, std::span<std::byte> buffer, std::stop_token stop, int flags) noexcept;
};

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

inline auto UringReactor::readable(int fd, std::stop_token stop) noexcept -> ReadinessAwaitable {
  return {backend_.ring(), detail::PollPrep{fd, POLLIN}, std::move(stop)};
}
inline auto UringReactor::writable(int fd, std::stop_token stop) noexcept -> ReadinessAwaitable {
  return {backend_.ring(), detail::PollPrep{fd, POLLOUT}, std::move(stop)};
}
inline auto UringReactor::accept(int fd, std::stop_token stop) noexcept -> AcceptAwaitable {
  return {backend_.ring(), detail::AcceptPrep{fd}, std::move(stop)};
}
inline auto UringReactor::connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop) noexcept
    -> ConnectAwaitable {
  detail::ConnectPrep prep{fd, {}, length};
  std::memcpy(&prep.address, address, std::min<std::size_t>(length, sizeof prep.address));
  return {backend_.ring(), prep, std::move(stop)};
}
inline auto UringReactor::recv(int fd, std::span<std::byte> buffer, std::stop_token stop) noexcept -> RecvAwaitable {
  return recvWith(fd, buffer, std::move(stop), 0);
}
inline auto UringReactor::recvAll(int fd, std::span<std::byte> buffer, std::stop_token stop) noexcept
    -> RecvAwaitable {
  return recvWith(fd, buffer, std::move(stop), MSG_WAITALL);
}
inline auto UringReactor::recvWith(int fd, std::span<std::byte> buffer, std::stop_token stop, int flags) noexcept
    -> RecvAwaitable {
  // No receiver (no memory for a new socket's, or a negative fd): nothing
  // is read ahead on it, so a plain recv is safe.
  detail::UringReceiver* receiver = recvMode() != RecvMode::plain ? backend_.receivers().receiverFor(fd) : nullptr;
  if (receiver && !receiver->readsDirect()) return {*receiver, buffer, std::move(stop)};
  return {backend_.ring(), detail::RecvPrep{fd, buffer, flags}, std::move(stop), receiver};
}
inline auto UringReactor::send(int fd, std::span<const std::byte> buffer, std::stop_token stop) noexcept
    -> SendAwaitable {
  return {backend_.ring(), detail::SendPrep{fd, buffer}, std::move(stop)};
}
inline auto UringReactor::sendv(int fd, std::span<const iovec> parts, std::stop_token stop) noexcept
    -> SendvAwaitable {
  return {backend_.ring(), detail::SendvPrep{fd, detail::messageOf(parts)}, std::move(stop)};
}
inline auto UringReactor::sendZeroCopy(int fd, std::span<const iovec> parts, std::stop_token stop) noexcept
    -> SendZeroCopyAwaitable {
  return {backend_.ring(), backend_.zeroCopySends(), fd, parts, std::move(stop)};
}
inline auto UringReactor::splice(int in, std::int64_t inOffset, int out, std::int64_t outOffset, std::size_t length,
                                 std::stop_token stop) noexcept -> SpliceAwaitable {
  // A multishot recv armed on `in` would take its bytes, and bytes it kept
  // would be skipped: EBUSY, as TcpStream::release() says of such a socket.
  const long refused = readsAhead(in) ? -EBUSY : 0;
  return {backend_.ring(), detail::OneTransfer{{false, in, inOffset, out, outOffset, length}, refused},
          std::move(stop)};
}
inline auto UringReactor::tee(int in, int out, std::size_t length, std::stop_token stop) noexcept -> SpliceAwaitable {
  return {backend_.ring(), detail::OneTransfer{{true, in, kNoOffset, out, kNoOffset, length}}, std::move(stop)};
}
inline auto UringReactor::sendfile(int out, int in, std::int64_t offset, std::size_t length, Pipe& pipe,
                                   std::stop_token stop) noexcept -> SendfileAwaitable {
  return {backend_.ring(), detail::SendfileSteps{out, in, offset, length, pipe}, std::move(stop)};
}

}  // namespace coio
