#pragma once
// UringRing: one io_uring and what every user of one needs: SQEs when the
// SQ is full, submission when the kernel says its CQ is backed up, cancels
// that cannot fail, reaping into a backlog, dispatch to each operation's
// `complete`, and waiting until the kernel has let go of everything. The
// UringReactor's backend polls one; a Disk under EpollReactor pumps one of
// its own from an eventfd. Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/reactor/detail/loop_meter.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/loop_stats.hpp>
#include <coio/reactor/uring_operation.hpp>

#include <liburing.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace coio::detail {

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

/// One io_uring, owned. Operations (UringOperation) are submitted with an
/// SQE whose user_data points at them, count in the loop's meter, and stay
/// in flight until their last completion (no IORING_CQE_F_MORE) has been
/// dispatched. Loop thread only (or while no loop runs).
///
/// Submission: prepared SQEs reach the kernel when the owner flushes, or
/// at once while the ring is eager. Completions: reap() copies CQEs out
/// (into a backlog when they must wait) before dispatching any, since a
/// resumed coroutine may submit, and so reap, while the batch is walked.
class UringRing {
 public:
  /// Sets the ring up with `setUp(io_uring&)`, which throws if it cannot.
  /// `name` heads the messages of what this throws ("coio::UringReactor").
  /// `loopEvents`: the completions it dispatches are the loop's events
  /// (LoopStats, the completions phase), as when the loop waits on this
  /// ring; a ring pumped from a coroutine dispatches in the ready phase.
  template <typename SetUp>
  UringRing(LoopCore& loop, const char* name, bool loopEvents, SetUp&& setUp)
      : loop_(loop), name_(name), loopEvents_(loopEvents) {
    deferredCancels_.reserve(16);  // before the ring: nothing to release if it throws
    std::forward<SetUp>(setUp)(ring_);
    disabled_ = (ring_.flags & IORING_SETUP_R_DISABLED) != 0;
  }
  UringRing(const UringRing&) = delete;
  UringRing& operator=(const UringRing&) = delete;
  ~UringRing() { io_uring_queue_exit(&ring_); }

  io_uring& get() noexcept { return ring_; }
  LoopCore& loop() noexcept { return loop_; }

  /// Whether each prepared SQE goes to the kernel at once (else at the
  /// owner's flush or wait).
  void setEager(bool eager) noexcept { eager_ = eager; }

  /// Prepares one SQE with `prep(sqe)` whose completion calls `op.complete`
  /// (counted in the loop's stats by its opcode), submitted at once if the
  /// ring is eager. Throws std::system_error if no SQE can be had.
  template <typename Prep>
  void submit(UringOperation& op, Prep&& prep) {
    if (!trySubmit(op, std::forward<Prep>(prep))) throwSystemError(submitError_, std::string(name_) + ": io_uring_submit");
  }

  /// submit() for paths that must not throw: false (errno in submitError())
  /// if no SQE could be had. `counted` false leaves the operation out of
  /// stats() (the owner's own operations).
  template <typename Prep>
  bool trySubmit(UringOperation& op, Prep&& prep, bool counted = true) noexcept {
    io_uring_sqe* sqe = tryAcquireSqe();
    if (!sqe) return false;
    std::forward<Prep>(prep)(sqe);
    io_uring_sqe_set_data(sqe, &op);
    op.counter = counted ? counterOf(*sqe) : kUncounted;
    op.opcode = sqe->opcode;
    loop_.meter().submitted(op.counter);
    ++inFlight_;
    commit();
    return true;
  }

  /// An SQE acting on another operation (a cancel, a timeout update), whose
  /// own completion is ignored: false (errno in submitError()) if none
  /// could be had.
  template <typename Prep>
  bool trySubmitUntracked(Prep&& prep) noexcept {
    io_uring_sqe* sqe = tryAcquireSqe();
    if (!sqe) return false;
    std::forward<Prep>(prep)(sqe);
    io_uring_sqe_set_data64(sqe, 0);
    commit();
    return true;
  }

  /// Why the last trySubmit() failed.
  int submitError() const noexcept { return submitError_; }

  /// Asks the kernel to cancel `op`; its completion still arrives. Never
  /// throws (stop callbacks call it): if no SQE can be had right now, the
  /// cancel waits for submitDeferred().
  void cancel(UringOperation& op) noexcept {
    if (trySubmitCancel(op)) return;
    try {
      deferredCancels_.push_back(&op);
    } catch (...) {
      std::terminate();  // no SQE and no memory: the operation could never be cancelled
    }
  }

  /// Whether cancels wait for an SQE.
  bool cancelsDeferred() const noexcept { return !deferredCancels_.empty(); }

  /// Prepares the cancels cancel() could not: 0, or the errno of a ring
  /// that still refuses them.
  int submitDeferred() noexcept {
    while (!deferredCancels_.empty()) {
      if (!trySubmitCancel(*deferredCancels_.back())) return submitError_;
      deferredCancels_.pop_back();
    }
    return 0;
  }

  /// Hands what is prepared to the kernel: 0 or an errno. While completions
  /// are backed up (EBUSY) it sets some aside and tries again. Nothing
  /// while the ring is disabled (see enable()).
  int flush() noexcept {
    if (disabled_) return 0;
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0) return 0;
      if (r == -EINTR) continue;
      if (r != -EBUSY && r != -EAGAIN) return -r;
      try {
        takeCompletions(backlog_);
      } catch (const std::bad_alloc&) {
        return ENOMEM;
      }
    }
  }

  /// A ring set up disabled (TaskRun::deferred) is enabled by the first
  /// thread that calls this (the owner's poll or quiesce, or a full SQ),
  /// which becomes its only submitter.
  void enable() noexcept {
    if (!disabled_) return;
    // liburing 2.3 declares io_uring_enable_rings but does not export it:
    // the raw register call. It can only fail if ring_fd is no longer our
    // ring; the ring then stays disabled and the submission that needed it
    // fails (-EBADFD) and is reported.
    disabled_ = ::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) != 0;
  }

  /// Operations whose last completion has not been dispatched yet.
  std::size_t inFlight() const noexcept { return inFlight_; }
  /// SQEs prepared but not handed to the kernel yet.
  std::size_t unsubmitted() const noexcept { return io_uring_sq_ready(&ring_); }
  /// Whether completions wait: set aside in the backlog, or in the CQ.
  bool completionsWaiting() const noexcept { return !backlog_.empty() || io_uring_cq_ready(&ring_) != 0; }
  /// Whether completions were set aside (a wait should not block then).
  bool backlogged() const noexcept { return !backlog_.empty(); }

  /// Dispatches completions, at most `maxRounds` batches of kBatch: the
  /// backlog first, then the CQ.
  void reap(std::size_t maxRounds = SIZE_MAX) {
    for (std::size_t round = 1;; ++round) {
      batch_.clear();
      std::swap(batch_, backlog_);
      const std::size_t n = takeCompletions(batch_);
      if (loopEvents_) loop_.meter().dispatched(batch_.size());
      // Indexed: a resumed coroutine may forget() an operation listed later
      // (its entry is then ignored), or quiesce() the ring (which empties
      // the batch).
      for (next_ = 0; next_ < batch_.size();) dispatch(batch_[next_++]);
      batch_.clear();
      next_ = 0;
      // A full batch may hide more; a backlog must not wait for a new event.
      if ((n < kBatch && backlog_.empty()) || round >= maxRounds) break;
    }
  }

  /// Waits until at least one completion is there, then sets what is there
  /// aside for reap(). Never throws: a failing wait (other than a signal or
  /// a backed-up CQ) ends the process, since the caller cannot free what the
  /// kernel may still write to.
  void waitForCompletions() noexcept {
    const int r = io_uring_submit_and_wait(&ring_, 1);
    // Unable to wait, we could only free operations the kernel may still
    // write to: better to stop here.
    if (r == -EEXIST) {
      std::fprintf(stderr, "%s: destroyed with operations in flight off the thread that ran its "
                           "TaskRun::deferred ring; only that thread can wait for them\n", name_);
    }
    if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) std::terminate();
    try {
      takeCompletions(backlog_);
    } catch (const std::bad_alloc&) {
      // Left in the CQ: the next round takes them.
    }
  }

  /// Cancels every operation in flight and waits until the kernel has let
  /// go of all of them; none of them resumes, nor does any completion
  /// reaped but not dispatched yet (each operation is passed to `dropped`,
  /// if given, at its last completion; a new fd it carries, an accept's or
  /// an open's, is closed). May be called from a dispatch.
  /// Never throws: a ring that takes no cancel ends the process, since the
  /// kernel may keep writing into operations that are about to be freed.
  void quiesce(void (*dropped)(UringOperation*) noexcept = nullptr) noexcept {
    drop(batch_, next_, dropped);  // the rest of a batch being dispatched, if any
    next_ = 0;
    drop(backlog_, 0, dropped);
    if (inFlight_ == 0) return;
    enable();  // never run: what was prepared was never submitted, but the wait below needs the ring
    deferredCancels_.clear();  // the cancel below covers them
    if (!trySubmitUntracked([](io_uring_sqe* sqe) { io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY); })) {
      std::terminate();
    }
    while (inFlight_ > 0) {
      waitForCompletions();
      drop(backlog_, 0, dropped);
    }
  }

  /// Whether `op`'s last completion was taken from the CQ but not
  /// dispatched yet (the kernel is done with it).
  bool reaped(const UringOperation& op) const noexcept {
    const auto last = [&](const Completion& c) {
      return c.userData == reinterpret_cast<std::uintptr_t>(&op) && !(c.flags & IORING_CQE_F_MORE);
    };
    return std::any_of(backlog_.begin(), backlog_.end(), last) ||
           std::any_of(batch_.begin() + static_cast<std::ptrdiff_t>(next_), batch_.end(), last);
  }

  /// For an operation destroyed with its completion reaped but not
  /// dispatched: drops that completion (it counts as completed; a new fd
  /// it carries is closed, as quiesce() does).
  void forget(UringOperation& op) noexcept {
    for (auto [list, from] : {std::pair{&backlog_, std::size_t{0}}, std::pair{&batch_, next_}}) {
      for (std::size_t i = from; i < list->size(); ++i) {
        Completion& c = (*list)[i];
        if (c.userData != reinterpret_cast<std::uintptr_t>(&op)) continue;
        if (!(c.flags & IORING_CQE_F_MORE)) {
          closeMadeFd(op, c);
          settle(op);
        }
        c.userData = 0;
      }
    }
  }

  // Waits through a registered ring fd skip the fd lookup, and in a
  // multi-threaded process the reference count on the ring's file, in
  // every io_uring_enter. A registration is a slot in the registering
  // thread's table: another thread entering by it fails, or enters a ring
  // of its own registered in that slot. So each run of the loop registers
  // in its first poll (registerFd) and leaveLoop() unregisters
  // (unregisterFd: two io_uring_register calls per run()), and any other
  // thread (a destructor's, a later run()'s) enters by the plain fd. Best
  // effort: a thread's table has 16 slots; without one the plain fd serves.
  void registerFd() noexcept {
    if (fdTried_) return;
    fdTried_ = true;
    fdRegistered_ = io_uring_register_ring_fd(&ring_) == 1;
  }
  void unregisterFd() noexcept {
    if (fdRegistered_) {
      // Cannot fail: same thread, a slot it registered.
      [[maybe_unused]] const int r = io_uring_unregister_ring_fd(&ring_);
      COIO_ASSERT(r == 1, "io_uring ring fd unregistration failed");
    }
    fdRegistered_ = fdTried_ = false;
  }

 private:
  struct Completion {
    std::uint64_t userData;  // 0: ignored (an untracked SQE's, or forgotten)
    int result;
    unsigned flags;
  };

  static constexpr unsigned kBatch = 256;

  void commit() noexcept {
    if (eager_) (void)flush();  // what fails stays prepared: the owner's next flush or wait reports it
  }

  bool trySubmitCancel(UringOperation& op) noexcept {
    return trySubmitUntracked([&](io_uring_sqe* sqe) { io_uring_prep_cancel(sqe, &op, 0); });
  }

  // An SQE, or null if none can be had without throwing (the kernel refuses
  // to take the full SQ: errno in submitError_; or no memory to set
  // completions aside).
  io_uring_sqe* tryAcquireSqe() noexcept {
    COIO_ASSERT(loop_.ownedByCaller(), "io_uring operation submitted off the reactor's thread");
    for (;;) {
      if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) return sqe;
      // SQ full: hand the kernel what is queued (binding a disabled ring to
      // this thread). It refuses while completions are backed up (-EBUSY):
      // set some aside to make room.
      enable();
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

  // `op`'s last completion: it is no longer in flight.
  void settle(UringOperation& op) noexcept {
    --inFlight_;
    loop_.meter().completed(op.counter);
    // A cancel still waiting for an SQE would hit whatever reuses op's memory.
    if (!deferredCancels_.empty()) std::erase(deferredCancels_, &op);
  }

  void dispatch(const Completion& c) noexcept {
    if (c.userData == 0) return;
    auto* op = reinterpret_cast<UringOperation*>(c.userData);
    if (!(c.flags & IORING_CQE_F_MORE)) settle(*op);
    op->complete(op, c.result, c.flags);
  }

  // A completion that will not be dispatched still carries what the kernel
  // made for it: the fd of an accept or an open, which no one else will
  // ever see (an accept submitted along with quiesce()'s cancel, or one
  // that won the race with it, yields a connection that was waiting).
  static void closeMadeFd(const UringOperation& op, const Completion& c) noexcept {
    const bool madeFd = op.opcode == IORING_OP_ACCEPT || op.opcode == IORING_OP_OPENAT;
    if (madeFd && c.result >= 0) ::close(c.result);
  }

  // Completions that will not be dispatched (quiesce): `list`'s from `from` on.
  void drop(std::vector<Completion>& list, std::size_t from, void (*dropped)(UringOperation*) noexcept) noexcept {
    for (std::size_t i = from; i < list.size(); ++i) {
      const Completion& c = list[i];
      if (c.userData == 0 || (c.flags & IORING_CQE_F_MORE)) continue;
      auto* op = reinterpret_cast<UringOperation*>(c.userData);
      closeMadeFd(*op, c);
      settle(*op);
      if (dropped) dropped(op);
    }
    list.clear();
  }

  io_uring ring_{};
  LoopCore& loop_;
  const char* name_;
  const bool loopEvents_;
  bool disabled_ = false;  // set up with IORING_SETUP_R_DISABLED, not enabled yet
  bool eager_ = false;
  bool fdTried_ = false;       // in this run of the loop
  bool fdRegistered_ = false;  // by the loop thread, until unregisterFd()
  int submitError_ = 0;        // why tryAcquireSqe() last failed
  std::size_t inFlight_ = 0;
  std::vector<UringOperation*> deferredCancels_;         // cancels no SQE could be had for yet
  std::vector<Completion> backlog_;                      // taken from the CQ, not dispatched yet
  std::vector<Completion> batch_;                        // being dispatched,
  std::size_t next_ = 0;                                 // from this entry on
};

}  // namespace coio::detail
