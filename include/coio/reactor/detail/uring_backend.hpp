#pragma once
// UringBackend: UringReactor's ReactorBackend. Its ring (UringRing) waits
// for completions in io_uring_enter; the loop's wake-up eventfd is watched
// by a poll on the ring, its earliest timer by one IORING_OP_TIMEOUT. It
// also holds what the reactor's features keep per ring: the multishot
// receivers and the zero-copy sends in flight. Needs liburing: link coio::uring.
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/detail/uring_io_operation.hpp>
#include <coio/reactor/detail/uring_multishot_recv.hpp>
#include <coio/reactor/detail/uring_ring.hpp>
#include <coio/reactor/detail/uring_setup.hpp>
#include <coio/reactor/detail/uring_zero_copy_send.hpp>
#include <coio/reactor/uring_operation.hpp>
#include <coio/reactor/uring_options.hpp>

#include <liburing.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace coio::detail {

/// UringReactor's backend (see ReactorBackend). Loop thread only.
class UringBackend {
 public:
  using Clock = LoopCore::Clock;

  /// Sets the ring up as `options` say; throws std::invalid_argument for
  /// bad receive buffers, std::system_error naming the cause if io_uring is
  /// unusable.
  UringBackend(LoopCore& core, const UringOptions& options)
      : core_(core), receivers_(options), policy_(options.submitPolicy), taskRun_(options.taskRun),
        ring_(core, "coio::UringReactor", true, [&](io_uring& ring) {
          std::string why;
          if (const int err = setUpRing(ring, options.entries, options.cqEntries, taskRun_, why)) {
            throwSystemError(err, why);
          }
        }) {
    ring_.setEager(policy_ == SubmitPolicy::eager);
    if (options.zeroCopySend) {
      const RingProbe probe = probeRing(ring_.get());
      zeroCopySends_.enable(probe && io_uring_opcode_supported(probe.get(), IORING_OP_SEND_ZC) &&
                            io_uring_opcode_supported(probe.get(), IORING_OP_SENDMSG_ZC));
    }
    if (const int err = receivers_.setUp(ring_)) {
      throwSystemError(err, "coio::UringReactor: registering the multishot recv buffers");
    }
    if (!tryArmWake()) throwSystemError(ring_.submitError(), "coio::UringReactor: arming the wake-up poll");
  }

  UringRing& ring() noexcept { return ring_; }
  const UringRing& ring() const noexcept { return ring_; }
  UringReceivers& receivers() noexcept { return receivers_; }
  const UringReceivers& receivers() const noexcept { return receivers_; }
  ZeroCopySends& zeroCopySends() noexcept { return zeroCopySends_; }
  const ZeroCopySends& zeroCopySends() const noexcept { return zeroCopySends_; }

  TaskRun taskRun() const noexcept { return taskRun_; }
  SubmitPolicy submitPolicy() const noexcept { return policy_; }
  void setSubmitPolicy(SubmitPolicy policy) noexcept {
    policy_ = policy;
    ring_.setEager(policy == SubmitPolicy::eager);
  }
  /// Operations in flight, the wake-up poll included, not the timer's timeout.
  std::size_t inFlight() const noexcept { return ring_.inFlight() - (deadlineArmed_ ? 1 : 0); }

  // --- ReactorBackend.

  void poll(std::optional<Clock::duration> timeout) {
    ring_.enable();
    ring_.registerFd();
    // What a noexcept path (a stop callback, onWake) could not submit.
    if (!wakeArmed_ || ring_.cancelsDeferred()) submitDeferred();
    if (ring_.backlogged()) timeout = Clock::duration::zero();  // completions already wait
    io_uring& ring = ring_.get();
    int r;
    if (timeout && *timeout == Clock::duration::zero()) {
      r = io_uring_submit_and_get_events(&ring);
    } else {
      __kernel_timespec ts{};
      if (timeout) ts = toTimespec<__kernel_timespec>(*timeout);
      io_uring_cqe* cqe = nullptr;
      r = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, timeout ? &ts : nullptr, nullptr);
    }
    core_.woke(timeout);
    // -ETIME: the timeout passed; -EINTR: a signal; -EBUSY/-EAGAIN: completions
    // are backed up, which reaping fixes.
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EBUSY && r != -EAGAIN) {
      throwSystemError(-r, "coio::UringReactor: io_uring_enter");
    }
    // Bounded: what is left waits in the CQ (the next wait returns at once) or
    // in the backlog (the next poll does not wait).
    ring_.reap(kReapRoundsPerPoll);
  }

  // The loop's next timer deadline, as one IORING_OP_TIMEOUT (absolute,
  // CLOCK_MONOTONIC = steady_clock): -2 % loopback request rate with a
  // timeout per wait while any timer is set. False if no SQE could be had.
  bool armDeadline(Clock::time_point deadline) noexcept {
    if (deadlineArmed_ && armedDeadline_ == deadline) return true;
    deadline_.when = toTimespec<__kernel_timespec>(deadline.time_since_epoch());
    if (!deadlineArmed_) {
      deadlineArmed_ = ring_.trySubmit(
          deadline_, [this](io_uring_sqe* sqe) { io_uring_prep_timeout(sqe, &deadline_.when, 0, IORING_TIMEOUT_ABS); },
          false);
      if (!deadlineArmed_) return false;
    } else {
      // Moved in place. If it fired meanwhile, the update finds nothing, and
      // the completion already on its way wakes the loop, which re-arms.
      const bool updated = ring_.trySubmitUntracked([this](io_uring_sqe* sqe) {
        io_uring_prep_timeout_update(sqe, &deadline_.when,
                                     reinterpret_cast<std::uint64_t>(static_cast<UringOperation*>(&deadline_)),
                                     IORING_TIMEOUT_ABS);
      });
      if (!updated) return false;
    }
    armedDeadline_ = deadline;
    return true;
  }

  void quiesce() noexcept {
    // The wake-up poll alone holds no memory of anyone's, and closing the
    // ring ends it: no wait, so that a thread other than the one that ran a
    // deferred ring (only that one may wait on it) can destroy the reactor.
    // Nor does the timer's timeout.
    const std::size_t own = (wakeArmed_ ? 1u : 0u) + (deadlineArmed_ ? 1u : 0u);
    if (ring_.inFlight() <= own) return;
    zeroCopySends_.resetConnections();
    ring_.quiesce();
    zeroCopySends_.clear();
    deadlineArmed_ = false;  // cancelled too: its completion came while quiescing
    receivers_.disarmAll();
  }

  void leaveLoop() noexcept { ring_.unregisterFd(); }
  std::size_t unsubmitted() const noexcept { return ring_.unsubmitted(); }

 private:
  // The wake-up eventfd, watched by a poll. Its read end is non-blocking, so
  // an io_uring read would fail with -EAGAIN instead of waiting.
  struct WakeOperation : UringOperation {
    UringBackend* backend;
  };
  struct DeadlineOperation : UringOperation {
    UringBackend* backend;
    __kernel_timespec when;  // read by the kernel when it takes the SQE
  };

  // Completion batches one poll dispatches before the loop runs its timers
  // and ready coroutines again: operations that complete as soon as they are
  // submitted (an always-readable socket under SubmitPolicy::eager) cannot
  // keep the reaping going for ever.
  static constexpr std::size_t kReapRoundsPerPoll = 4;

  // Watches the wake-up eventfd again; false if no SQE could be had (then
  // poll() re-arms it before it waits).
  bool tryArmWake() noexcept {
    wakeArmed_ = ring_.trySubmit(wake_, PollPrep{core_.wake().fd(), POLLIN}, false);
    return wakeArmed_;
  }
  static void onWake(UringOperation* op, int, unsigned) noexcept {
    UringBackend* self = static_cast<WakeOperation*>(op)->backend;
    self->core_.wake().drain();  // before taking the queue: see LoopCore::pushRemoteLocked
    self->core_.resumeRemote();
    (void)self->tryArmWake();  // noexcept path: a failure is retried by poll()
  }
  static void onDeadline(UringOperation* op, int, unsigned) noexcept {
    static_cast<DeadlineOperation*>(op)->backend->deadlineArmed_ = false;
  }

  void submitDeferred() {
    if (const int err = ring_.submitDeferred()) throwSystemError(err, "coio::UringReactor: io_uring_submit");
    if (!wakeArmed_ && !tryArmWake()) {
      throwSystemError(ring_.submitError(), "coio::UringReactor: arming the wake-up poll");
    }
  }

  LoopCore& core_;
  UringReceivers receivers_;  // before the ring: the kernel may write into its buffers until the ring is gone
  SubmitPolicy policy_;
  TaskRun taskRun_;  // after any fallback
  UringRing ring_;
  ZeroCopySends zeroCopySends_;
  WakeOperation wake_{{&UringBackend::onWake}, this};
  bool wakeArmed_ = false;
  DeadlineOperation deadline_{{&UringBackend::onDeadline}, this, {}};
  bool deadlineArmed_ = false;         // deadline_ in flight,
  Clock::time_point armedDeadline_{};  // for this deadline
};

}  // namespace coio::detail
