#pragma once
// The ring disk operations go to, behind one interface: the UringReactor's
// own ring, or (for EpollReactor) a dedicated ring whose completions an
// eventfd signals. Also the operation record both kinds of ring complete.
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/detail/reactor_base.hpp>
#include <coio/detail/syscall.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <liburing.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace coio::detail {

class DedicatedRing;

// One SQE's worth of disk operation. The kernel reads `address` for the
// whole operation: whoever owns the DiskOp keeps the memory alive.
struct DiskRequest {
  std::uint8_t opcode = IORING_OP_NOP;  // READ[_FIXED], WRITE[_FIXED], READV, WRITEV, FSYNC, FALLOCATE,
                                        // OPENAT, STATX or CLOSE
  bool fixedFile = false;               // `fd` is an index into the registered file table
  std::uint16_t bufferIndex = 0;        // for READ_FIXED / WRITE_FIXED
  int fd = -1;                          // OPENAT: the directory (AT_FDCWD)
  void* address = nullptr;              // the buffer; READV/WRITEV: the iovecs; OPENAT: the path; STATX: the struct statx
  std::uint64_t length = 0;             // bytes; READV/WRITEV: iovecs; FALLOCATE: the range; OPENAT: mode; STATX: mask
  std::uint64_t offset = 0;
  std::uint32_t opFlags = 0;            // FSYNC: fsync flags; FALLOCATE: mode; OPENAT: open flags; STATX: statx flags
  std::uint16_t ioprio = 0;             // 0: the submitting thread's (see ioprio(7))

  // A read or write of nothing: the kernel would answer 0.
  bool transfersNothing() const noexcept {
    switch (opcode) {
      case IORING_OP_READ: case IORING_OP_READ_FIXED: case IORING_OP_READV:
      case IORING_OP_WRITE: case IORING_OP_WRITE_FIXED: case IORING_OP_WRITEV: return length == 0;
      default: return false;
    }
  }

  void operator()(io_uring_sqe* sqe) const noexcept {
    const auto len = static_cast<unsigned>(length);  // a transfer's length was checked to fit
    switch (opcode) {
      case IORING_OP_READ_FIXED: io_uring_prep_read_fixed(sqe, fd, address, len, offset, bufferIndex); break;
      case IORING_OP_WRITE_FIXED: io_uring_prep_write_fixed(sqe, fd, address, len, offset, bufferIndex); break;
      case IORING_OP_FSYNC: io_uring_prep_fsync(sqe, fd, opFlags); break;
      case IORING_OP_FALLOCATE:
        io_uring_prep_fallocate(sqe, fd, static_cast<int>(opFlags), static_cast<off_t>(offset),
                                static_cast<off_t>(length));
        break;
      case IORING_OP_OPENAT:
        io_uring_prep_openat(sqe, fd, static_cast<const char*>(address), static_cast<int>(opFlags),
                             static_cast<mode_t>(length));
        break;
      case IORING_OP_STATX:  // of the descriptor itself
        io_uring_prep_statx(sqe, fd, "", static_cast<int>(opFlags), len, static_cast<struct statx*>(address));
        break;
      case IORING_OP_CLOSE: io_uring_prep_close(sqe, fd); break;
      default: io_uring_prep_rw(opcode, sqe, fd, address, len, offset); break;
    }
    if (fixedFile) sqe->flags |= IOSQE_FIXED_FILE;
    sqe->ioprio = ioprio;
  }
};

// A disk operation in a ring: the SQE's user_data points at it. `complete`
// (from UringOperation) runs on the loop thread with the CQE's result and
// sets the state to done.
//
// Lifetime rule: the kernel may write into an operation's buffer until its
// CQE has been taken from the ring. On the UringReactor's ring, operations
// are only destroyed in flight after the reactor has quiesced (stop() or
// its destructor drain every CQE); on a dedicated ring the destructor does
// that itself (`ring->release`), blocking until the kernel lets go.
struct DiskOp : UringOperation {
  enum class State : std::uint8_t {
    idle,      // not submitted (or moved around before submission)
    inFlight,  // SQE prepared; the kernel may own the buffer
    reaped,    // CQE taken from a dedicated ring, dispatch pending
    done,      // completed (or orphaned by a closed dedicated ring)
  };

  explicit DiskOp(void (*onComplete)(UringOperation*, int, unsigned) noexcept) noexcept
      : UringOperation{onComplete} {}
  DiskOp(const DiskOp& other) noexcept : UringOperation{other.complete} {
    COIO_ASSERT(other.state == State::idle, "a submitted disk operation was copied or moved");
  }
  DiskOp& operator=(const DiskOp&) = delete;
  ~DiskOp();

  bool pending() const noexcept { return state == State::inFlight || state == State::reaped; }

  State state = State::idle;
  DedicatedRing* dedicated = nullptr;  // set while pending on a dedicated ring
};

// Decides whether a single operation goes to the kernel at once. At low
// depth on a real device that lowers latency and keeps it busier; but when
// reads complete while being submitted (page-cache hits: CPU-bound), one
// enter per read only costs, so after seeing that it batches for a while.
// "Seeing that" takes a streak: a fast device occasionally finishes an
// O_DIRECT read before the submitting enter returns (its task work runs on
// the way out), and one such read must not switch a disk-bound loop to
// batching (4 KiB O_DIRECT at depth 32: 0.83 of fio batched, 0.93 eager).
class EagerGate {
 public:
  explicit EagerGate(unsigned eagerBelow) noexcept : eagerBelow_(eagerBelow) {}
  bool open(std::size_t inFlight) noexcept {
    if (inFlight > eagerBelow_) return false;
    if (closedFor_ == 0) return true;
    --closedFor_;
    return false;
  }
  // After an operation went to the kernel at once: whether its completion
  // was already there when the enter returned.
  void submitted(bool completedInline) noexcept {
    inlineStreak_ = completedInline ? inlineStreak_ + 1 : 0;
    if (inlineStreak_ < kInlineStreak) return;
    inlineStreak_ = 0;
    closedFor_ = kBatchFor;
  }
  static bool completedInline(io_uring& ring, const UringOperation& op) noexcept {
    io_uring_cqe* cqe;
    unsigned head;
    io_uring_for_each_cqe(&ring, head, cqe) {
      if (cqe->user_data == reinterpret_cast<std::uintptr_t>(&op)) return true;
    }
    return false;
  }

  static constexpr unsigned kInlineStreak = 8;  // inline completions in a row that close the gate
  static constexpr unsigned kBatchFor = 4096;   // submissions it then stays closed for

 private:
  unsigned eagerBelow_;
  unsigned closedFor_ = 0;
  unsigned inlineStreak_ = 0;
};

/// Where disk operations are submitted. Loop thread only.
class DiskRing {
 public:
  virtual ~DiskRing() = default;
  virtual io_uring& ring() noexcept = 0;
  /// Prepares `request` for `op` and submits it per the policy (or defers
  /// it while a batch is open).
  virtual void submit(DiskOp& op, const DiskRequest& request) = 0;
  /// Asks the kernel to cancel `op`; its completion still arrives. Never
  /// throws (stop callbacks and destructors call it).
  virtual void cancel(DiskOp& op) noexcept = 0;
  /// Between the two calls, submissions go to the kernel together, in one
  /// io_uring_enter at the latest when the last batch closes.
  virtual void openBatch() = 0;
  virtual void closeBatch() = 0;
  /// The reactor's loop, whose thread owns the ring.
  virtual LoopCore& loop() noexcept = 0;
  bool ownedByCaller() noexcept { return loop().ownedByCaller(); }
  /// The Disk is going away: the kernel lets go of every pending operation.
  virtual void close() noexcept = 0;
};

// The UringReactor's own ring: its completions arrive through the
// reactor's dispatch, which calls each operation's `complete`.
class ReactorRing final : public DiskRing {
 public:
  ReactorRing(UringReactor& reactor, unsigned eagerBelow) noexcept : reactor_(reactor), gate_(eagerBelow) {}
  io_uring& ring() noexcept override { return reactor_.ring(); }
  // At once if the gate says so, else with the reactor's next enter.
  void submit(DiskOp& op, const DiskRequest& request) override {
    reactor_.submit(op, request);
    op.state = DiskOp::State::inFlight;  // only once prepared: submit may throw before
    if (batches_ == 0 && reactor_.submitPolicy() == SubmitPolicy::batched && gate_.open(reactor_.inFlight())) {
      reactor_.flush();
      gate_.submitted(EagerGate::completedInline(reactor_.ring(), op));
    }
  }
  void cancel(DiskOp& op) noexcept override { reactor_.cancel(op); }
  // A batch goes in with the reactor's next enter; under the eager policy,
  // once, when it closes.
  void openBatch() override {
    if (batches_++ == 0) {
      saved_ = reactor_.submitPolicy();
      reactor_.setSubmitPolicy(SubmitPolicy::batched);
    }
  }
  void closeBatch() override {
    if (--batches_ > 0) return;
    reactor_.setSubmitPolicy(saved_);
    if (saved_ == SubmitPolicy::eager) reactor_.flush();
  }
  LoopCore& loop() noexcept override { return reactor_; }
  void close() noexcept override {}  // the reactor's quiesce drains its ring

 private:
  UringReactor& reactor_;
  EagerGate gate_;
  unsigned batches_ = 0;
  SubmitPolicy saved_ = SubmitPolicy::batched;
};

// A ring of its own for EpollReactor. The kernel signals an eventfd for
// every CQE; a pump task on the reactor waits for it (readable() is
// edge-safe), drains it, and dispatches the CQEs.
class DedicatedRing final : public DiskRing {
 public:
  DedicatedRing(EpollReactor& reactor, unsigned entries, unsigned cqEntries, unsigned eagerBelow)
      : reactor_(reactor), gate_(eagerBelow) {
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = std::max(cqEntries, 2 * entries);
    if (const int r = io_uring_queue_init_params(entries, &ring_, &params); r < 0) {
      throwSystemError(-r, describeUringSetupError(-r));
    }
    if (const int r = io_uring_register_eventfd(&ring_, eventFd_.fd()); r < 0) {
      io_uring_queue_exit(&ring_);
      throwSystemError(-r, "coio::Disk: io_uring_register_eventfd");
    }
  }
  ~DedicatedRing() override {
    close();
    io_uring_queue_exit(&ring_);
  }

  io_uring& ring() noexcept override { return ring_; }
  int eventFd() const noexcept { return eventFd_.fd(); }
  bool closed() const noexcept { return closed_; }

  // Inside a batch (DiskBatch): at its end. Outside a dispatch round: at once (no
  // later point is certain to come). Inside one: at once if the gate says
  // so, else in one enter at the end of the round.
  void submit(DiskOp& op, const DiskRequest& request) override {
    COIO_ASSERT(!closed_, "disk operation submitted after its Disk was destroyed");
    io_uring_sqe* sqe = acquireSqe();
    request(sqe);
    io_uring_sqe_set_data(sqe, static_cast<UringOperation*>(&op));
    op.state = DiskOp::State::inFlight;
    op.dedicated = this;
    op.counter = counterOf(*sqe);  // in the reactor's stats(), as on the UringReactor's ring
    reactor_.meter_.submitted(op.counter);
    ++inFlight_;
    if (batches_ > 0 || !dispatching_) {
      commit();
    } else if (gate_.open(inFlight_)) {
      submitNow();
      gate_.submitted(EagerGate::completedInline(ring_, op));
    }
  }

  // Best effort: a disk operation ends on its own, so a cancel the ring
  // refuses only means the operation completes with its real result.
  void cancel(DiskOp& op) noexcept override {
    io_uring_sqe* sqe = tryAcquireSqe();
    if (!sqe) return;
    io_uring_prep_cancel(sqe, static_cast<UringOperation*>(&op), 0);
    io_uring_sqe_set_data64(sqe, 0);  // the cancel's own completion is ignored
    try {
      commit();
    } catch (...) {
      eventFd_.signal();  // as in closeBatch: the pump retries, and fails the reactor if it fails
    }
  }

  void openBatch() override { ++batches_; }
  void closeBatch() override {
    --batches_;
    try {
      commit();
    } catch (...) {
      // The prepared SQEs stay queued, and no CQE may come to trigger the
      // next enter: have the pump retry (and fail the reactor if it fails).
      eventFd_.signal();
      throw;
    }
  }
  LoopCore& loop() noexcept override { return reactor_; }

  /// The pump, after the eventfd fired: dispatches the completions there
  /// are. One pass: reads that complete while being submitted (page-cache
  /// hits) must not keep the loop from its timers and other fds; their CQEs
  /// signal the eventfd again.
  void pump() {
    eventFd_.drain();  // first: a CQE posted from now on signals again
    std::swap(round_, backlog_);
    takeCompletions(round_);
    dispatching_ = true;
    // Indexed: a resumed coroutine may destroy an operation listed later,
    // which then clears its entry (forget()).
    for (std::size_t i = 0; i < round_.size(); ++i) {
      const Completion c = round_[i];
      if (c.op) c.op->complete(c.op, c.result, 0);
    }
    round_.clear();  // holds only undelivered completions: close() and forget() look there
    dispatching_ = false;
    commit();
    if (!backlog_.empty()) eventFd_.signal();  // set aside during the round: next round
  }

  /// For a pending operation being destroyed: makes the kernel let go of it
  /// (cancel, then wait for its CQE) and drops its undelivered completion.
  void release(DiskOp& op) noexcept {
    if (op.state == DiskOp::State::inFlight) {
      cancel(op);
      while (op.state == DiskOp::State::inFlight) waitForCompletions();
    }
    forget(op);
  }

  /// Cancels everything in flight and waits until the kernel has let go;
  /// those operations never resume.
  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    if (inFlight_ > 0) {
      // Without an SQE the operations are waited for uncancelled.
      if (io_uring_sqe* sqe = tryAcquireSqe()) {
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
        io_uring_sqe_set_data64(sqe, 0);
      }
      while (inFlight_ > 0) waitForCompletions();
    }
    for (auto* list : {&backlog_, &round_}) {
      for (Completion& c : *list) {
        if (c.op) static_cast<DiskOp*>(c.op)->state = DiskOp::State::done;
      }
      list->clear();
    }
    eventFd_.signal();  // wakes the pump, which deregisters the eventfd and ends
  }

 private:
  struct Completion {
    UringOperation* op;  // null once the operation was destroyed
    int result;
  };

  // Submits now, unless a batch is being submitted or completions are
  // being dispatched (then at the end of either).
  void commit() {
    if (batches_ == 0 && !dispatching_) submitNow();
  }

  void submitNow() {
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0 || r == -EINTR) return;
      if (r != -EBUSY && r != -EAGAIN) throwSystemError(-r, "coio::Disk: io_uring_submit");
      takeCompletions(backlog_);  // completions backed up: make room, then retry
    }
  }

  io_uring_sqe* acquireSqe() {
    COIO_ASSERT(reactor_.ownedByCaller(), "disk operation submitted off the reactor's thread");
    for (;;) {
      if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) return sqe;
      submitNow();  // SQ full
    }
  }

  // As acquireSqe, but null where that would throw.
  io_uring_sqe* tryAcquireSqe() noexcept {
    try {
      return acquireSqe();
    } catch (...) {
      return nullptr;
    }
  }

  // Takes every available CQE; marks its operation reaped (the kernel is
  // done with it) and queues it in `out` for dispatch.
  void takeCompletions(std::vector<Completion>& out) noexcept {
    io_uring_cqe* cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++n;
      auto* op = static_cast<DiskOp*>(reinterpret_cast<UringOperation*>(cqe->user_data));
      if (!op) continue;
      --inFlight_;
      reactor_.meter_.completed(op->counter);
      op->state = DiskOp::State::reaped;
      out.push_back({op, cqe->res});
    }
    io_uring_cq_advance(&ring_, n);
  }

  void waitForCompletions() noexcept {
    io_uring_cqe* cqe = nullptr;
    [[maybe_unused]] const int r = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, nullptr, nullptr);
    COIO_ASSERT(r >= 0 || r == -EINTR || r == -EBUSY || r == -EAGAIN || r == -ETIME,
                "io_uring_enter failed while waiting for disk completions");
    takeCompletions(backlog_);
  }

  void forget(DiskOp& op) noexcept {
    for (auto* list : {&backlog_, &round_}) {
      for (Completion& c : *list) {
        if (c.op == &op) c.op = nullptr;
      }
    }
    op.state = DiskOp::State::done;
  }

  EpollReactor& reactor_;
  EagerGate gate_;
  EventFd eventFd_;  // non-blocking, signalled by the kernel for every CQE
  io_uring ring_{};
  std::size_t inFlight_ = 0;
  unsigned batches_ = 0;     // DiskBatches being submitted
  bool dispatching_ = false;  // inside pump()
  bool closed_ = false;
  std::vector<Completion> backlog_;  // taken from the ring, not dispatched yet
  std::vector<Completion> round_;    // the completions being dispatched
};

inline DiskOp::~DiskOp() {
  if (dedicated && pending()) dedicated->release(*this);
}

}  // namespace coio::detail
