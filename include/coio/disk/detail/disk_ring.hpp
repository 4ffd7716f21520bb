#pragma once
// The ring disk operations go to, behind one interface: the UringReactor's
// own ring, or (for EpollReactor) a dedicated one, a UringRing of its own
// whose completions an eventfd signals. Also the operation record both
// kinds of ring complete. Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/reactor/detail/event_fd.hpp>
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/detail/uring_ring.hpp>
#include <coio/reactor/detail/uring_setup.hpp>
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
    inFlight,  // SQE prepared, completion not dispatched yet
    done,      // completed (or orphaned by a closed dedicated ring)
  };

  explicit DiskOp(void (*onComplete)(UringOperation*, int, unsigned) noexcept) noexcept
      : UringOperation{onComplete} {}
  DiskOp(const DiskOp& other) noexcept : UringOperation{other.complete} {
    COIO_ASSERT(other.state == State::idle, "a submitted disk operation was copied or moved");
  }
  DiskOp& operator=(const DiskOp&) = delete;
  ~DiskOp();

  bool pending() const noexcept { return state == State::inFlight; }

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

/// Where disk operations are submitted. Loop thread only. The two real
/// rings are io_uring's; coio::sim's is another kind (makeDiskRing, see
/// Disk), which is why registration goes through here.
class DiskRing {
 public:
  virtual ~DiskRing() = default;
  virtual io_uring& ring() noexcept = 0;
  /// The fixed-buffer table, and the registered-file table (made sparse,
  /// then one slot updated at a time): 0 or -errno, as liburing's calls.
  virtual int registerBuffers(const std::vector<iovec>& regions) noexcept {
    return io_uring_register_buffers(&ring(), regions.data(), static_cast<unsigned>(regions.size()));
  }
  virtual void unregisterBuffers() noexcept { (void)io_uring_unregister_buffers(&ring()); }
  virtual int registerFiles(unsigned slots) noexcept { return io_uring_register_files_sparse(&ring(), slots); }
  virtual int updateFile(unsigned slot, int fd) noexcept {
    return io_uring_register_files_update(&ring(), slot, &fd, 1);
  }
  virtual void unregisterFiles() noexcept { (void)io_uring_unregister_files(&ring()); }
  /// A File of this Disk has `fd` open from now on (`direct`: O_DIRECT), or
  /// is about to close it: for a ring that keeps state per file (the
  /// simulated disk keeps files' bytes in memory). Nothing for io_uring.
  /// (File::closeAsync's close is an operation: IORING_OP_CLOSE, submitted.)
  /// fileClosing may come after close(), from a File its Disk outlived.
  virtual void fileOpened(int /*fd*/, bool /*direct*/) noexcept {}
  virtual void fileClosing(int /*fd*/) noexcept {}
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
      : reactor_(reactor), gate_(eagerBelow), ring_(reactor, "coio::Disk", false, [&](io_uring& ring) {
          io_uring_params params{};
          params.flags = IORING_SETUP_CQSIZE;
          params.cq_entries = std::max(cqEntries, 2 * entries);
          if (const int r = io_uring_queue_init_params(entries, &ring, &params); r < 0) {
            throwSystemError(-r, describeUringSetupError(-r));
          }
          if (const int r = io_uring_register_eventfd(&ring, eventFd_.fd()); r < 0) {
            io_uring_queue_exit(&ring);
            throwSystemError(-r, "coio::Disk: io_uring_register_eventfd");
          }
        }) {}
  ~DedicatedRing() override { close(); }

  io_uring& ring() noexcept override { return ring_.get(); }
  int eventFd() const noexcept { return eventFd_.fd(); }
  bool closed() const noexcept { return closed_; }

  // Inside a batch (DiskBatch): at its end. Outside a dispatch round: at once (no
  // later point is certain to come). Inside one: at once if the gate says
  // so, else in one enter at the end of the round.
  void submit(DiskOp& op, const DiskRequest& request) override {
    COIO_ASSERT(!closed_, "disk operation submitted after its Disk was destroyed");
    ring_.submit(op, request);  // counted in the reactor's stats(), as on the UringReactor's ring
    op.state = DiskOp::State::inFlight;
    op.dedicated = this;
    if (batches_ > 0 || !dispatching_) {
      commit();
    } else if (gate_.open(ring_.inFlight())) {
      flush();
      gate_.submitted(EagerGate::completedInline(ring_.get(), op));
    }
  }

  // A disk operation ends on its own: a cancel only makes it end sooner.
  void cancel(DiskOp& op) noexcept override {
    ring_.cancel(op);  // without an SQE now: at the next pump
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
  /// are. One round: reads that complete while being submitted (page-cache
  /// hits) must not keep the loop from its timers and other fds; their CQEs
  /// signal the eventfd again, and what this round left waiting signals it
  /// here.
  void pump() {
    eventFd_.drain();  // first: a CQE posted from now on signals again
    if (const int err = ring_.submitDeferred()) throwSystemError(err, "coio::Disk: io_uring_submit");
    {
      dispatching_ = true;
      struct Dispatching {
        bool& flag;
        ~Dispatching() { flag = false; }
      } dispatching{dispatching_};
      ring_.reap(1);
    }
    commit();
    if (ring_.completionsWaiting()) eventFd_.signal();
  }

  /// For a pending operation being destroyed: makes the kernel let go of it
  /// (cancel, then wait for its CQE) and drops its undelivered completion.
  void release(DiskOp& op) noexcept {
    if (!ring_.reaped(op)) {
      cancel(op);
      while (!ring_.reaped(op)) ring_.waitForCompletions();
    }
    ring_.forget(op);
    op.state = DiskOp::State::done;
  }

  /// Cancels everything in flight and waits until the kernel has let go;
  /// those operations never resume.
  void close() noexcept override {
    if (closed_) return;
    closed_ = true;
    ring_.quiesce([](UringOperation* op) noexcept { static_cast<DiskOp*>(op)->state = DiskOp::State::done; });
    eventFd_.signal();  // wakes the pump, which deregisters the eventfd and ends
  }

 private:
  // Submits now, unless a batch is being submitted or completions are
  // being dispatched (then at the end of either).
  void commit() {
    if (batches_ == 0 && !dispatching_) flush();
  }
  void flush() {
    if (const int err = ring_.flush()) throwSystemError(err, "coio::Disk: io_uring_submit");
  }

  EpollReactor& reactor_;
  EagerGate gate_;
  EventFd eventFd_;  // non-blocking, signalled by the kernel for every CQE; before the ring, which registers it
  UringRing ring_;
  unsigned batches_ = 0;      // DiskBatches being submitted
  bool dispatching_ = false;  // inside pump()
  bool closed_ = false;
};

inline DiskOp::~DiskOp() {
  if (dedicated && pending()) dedicated->release(*this);
}

}  // namespace coio::detail
