#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/disk/detail/disk_ring.hpp>
#include <coio/disk/detail/io_priority.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/syscall.hpp>

#include <cerrno>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <stop_token>
#include <system_error>
#include <utility>
#include <vector>

namespace coio {

/// What ReadBatch and WriteBatch share: N transfers submitted together,
/// awaited as one or streamed. Only those two derive from it; code that
/// awaits or streams either kind can take a DiskBatch&.
///
/// Guarantees:
/// - `co_await batch.submit(stop)` (or `co_await batch`) hands every
///   transfer added since the last clear() to the kernel in one
///   io_uring_enter and resumes the coroutine once, on the Disk's loop
///   thread, when every one has completed. Transfers with a registered
///   BufferPool slice use the fixed-buffer opcodes (READ_FIXED /
///   WRITE_FIXED), those of a registered File IOSQE_FIXED_FILE.
/// - Results are per transfer (`result(i)`, i as returned by add()): the
///   bytes transferred (0 for an empty one), or that transfer's error (EIO,
///   EBADF, DiskErrc::misalignedDirectIo checked before submission, ...).
///   One failing transfer does not fail the others.
/// - Submitting never throws out of the `co_await`: if the ring refuses an
///   SQE (a full SQ that cannot be flushed), that transfer and every later
///   one yield the error (errno of the std::system_error, ENOMEM for
///   bad_alloc) and the batch still resumes once, after the transfers
///   already submitted.
/// - Each SQE is tagged with its own transfer's record, and the batch
///   resumes only after the CQE of every transfer it submitted: no
///   completion is lost, none is attributed to a later submission, and the
///   batch never resumes twice.
/// - A stop requested on the loop thread cancels the transfers still in
///   flight (they yield std::errc::operation_canceled unless they won the
///   race); the coroutine resumes once the kernel has let go of every buffer.
/// - Destroying the batch while transfers are in flight (its coroutine
///   frame destroyed with its stopped reactor) waits for the kernel to let
///   go of the buffers first (see Disk for who waits).
/// - Streaming: `batch.start()` hands the transfers to the kernel the same
///   way but returns at once; each `co_await batch.next(stop)` then yields
///   the index of one completed transfer, in completion order (those that
///   never went to the kernel first: invalid, empty, refused), and
///   std::nullopt once every one was yielded. It resumes on the Disk's loop
///   thread. A stop requested while transfers are in flight cancels them;
///   next() goes on yielding them as their completions arrive.
/// - Given no stop token, submit() and next() use the awaiting Task's (see
///   currentStopToken).
/// - The buffers must stay valid until the `co_await` returns (when
///   streaming: until next() yielded nullopt). The batch can be reused
///   after clear(). Loop thread only; not movable.
class DiskBatch {
  struct Operation;

 public:
  DiskBatch(const DiskBatch&) = delete;
  DiskBatch& operator=(const DiskBatch&) = delete;

  /// Reserves room for `n` transfers.
  void reserve(std::size_t n) { ops_.reserve(n); }
  /// Number of transfers added.
  std::size_t size() const noexcept { return ops_.size(); }

  /// Transfer i's outcome: the bytes transferred or its error; meaningful
  /// once the batch has been awaited (when streaming: once next() yielded i).
  Result<std::size_t> result(std::size_t i) const {
    const Operation& op = ops_.at(i);
    if (op.invalid) return op.invalid;
    return detail::toResult<std::size_t>(op.result);
  }

  /// Forgets every transfer, to start a new batch.
  void clear() noexcept {
    COIO_ASSERT(remaining_ == 0, "disk batch cleared while its transfers are in flight");
    ops_.clear();
    completed_.clear();
    yielded_ = 0;
    streaming_ = false;
  }

  /// Awaits the whole batch (see submit()).
  class [[nodiscard]] Awaiter : public detail::CancellableOperation<Awaiter> {
    using Base = detail::CancellableOperation<Awaiter>;
    friend Base;

   public:
    Awaiter(DiskBatch& batch, std::stop_token stop) noexcept : Base(batch.ring_.loop(), std::move(stop)), batch_(batch) {}

   private:
    // Submits the transfers: over if none went to the kernel (empty,
    // invalid or refused), each with its result.
    bool tryNow() noexcept {
      batch_.streaming_ = false;
      return !batch_.submitAll(false);
    }
    bool start() noexcept {
      batch_.handle_ = this->handle();  // the last transfer's completion resumes it
      return true;
    }
    // Stopped before: every transfer yields operation_canceled, none goes.
    bool stoppedAtOnce() noexcept {
      batch_.streaming_ = false;
      batch_.submitAll(true);
      return true;
    }
    void cancel() noexcept { batch_.cancel(); }
    void result() const noexcept {}

    DiskBatch& batch_;
  };

  /// Submits the transfers; the awaiter resumes when all have completed.
  Awaiter submit(std::stop_token stop = {}) noexcept { return {*this, std::move(stop)}; }
  /// Same as `submit()` without a stop token.
  Awaiter operator co_await() noexcept { return submit(); }

  /// Streaming: submits the transfers (as submit() does) without waiting
  /// for them; next() yields them as they complete. Throws only
  /// std::bad_alloc, before anything is submitted.
  void start() {
    COIO_ASSERT(remaining_ == 0, "disk batch started while its transfers are in flight");
    completed_.clear();
    completed_.reserve(ops_.size());  // completions push without allocating
    yielded_ = 0;
    streaming_ = true;
    submitAll(false);
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      if (!ops_[i].pending()) completed_.push_back(i);
    }
  }

  /// Awaits the next completed transfer (see next()).
  class [[nodiscard]] NextAwaiter : public detail::CancellableOperation<NextAwaiter> {
    using Base = detail::CancellableOperation<NextAwaiter>;
    friend Base;

   public:
    NextAwaiter(DiskBatch& batch, std::stop_token stop) noexcept : Base(batch.ring_.loop(), std::move(stop)), batch_(batch) {
      COIO_ASSERT(batch_.streaming_, "disk batch next() without start()");
    }
    ~NextAwaiter() {
      if (batch_.handle_ && batch_.handle_ == this->handle()) batch_.handle_ = nullptr;  // destroyed while waiting here
    }

   private:
    // A transfer to yield, or none left to wait for.
    bool tryNow() const noexcept { return batch_.yielded_ < batch_.completed_.size() || batch_.remaining_ == 0; }
    bool start() noexcept {
      batch_.handle_ = this->handle();  // the next transfer's completion resumes it
      return true;
    }
    // Stopped before: the transfers in flight are cancelled, and next()
    // goes on yielding them (a transfer already done is yielded at once).
    bool stoppedAtOnce() noexcept {
      batch_.cancel();
      return tryNow();
    }
    void cancel() noexcept { batch_.cancel(); }
    std::optional<std::size_t> result() noexcept {
      if (batch_.yielded_ == batch_.completed_.size()) return std::nullopt;
      return batch_.completed_[batch_.yielded_++];
    }

    DiskBatch& batch_;
  };

  /// Streaming: the index of the next completed transfer (see start()), or
  /// std::nullopt once every transfer was yielded.
  NextAwaiter next(std::stop_token stop = {}) noexcept { return {*this, std::move(stop)}; }

 protected:
  /// An empty batch submitting to `disk`'s ring.
  explicit DiskBatch(Disk& disk) noexcept : ring_(disk.queue()) {}
  // A record still in flight waits for its CQE (DiskOp's destructor).
  ~DiskBatch() = default;

  /// Adds a transfer (`opcode` READ or WRITE; `fixedBuffer` >= 0 makes it
  /// the _FIXED form); returns its index.
  std::size_t addTransfer(std::uint8_t opcode, const File& file, std::uint64_t offset, std::byte* data,
                          std::size_t length, int fixedBuffer) {
    COIO_ASSERT(remaining_ == 0, "transfer added to a disk batch in flight");
    COIO_ASSERT(&file.disk().queue() == &ring_, "disk batch and File on different Disks");
    ops_.emplace_back(this, file.request(opcode, offset, data, length, fixedBuffer), file.check(offset, data, length));
    return ops_.size() - 1;
  }

  /// Every transfer a request of its own to the device (ReadBatch::keepApart).
  bool keepApart_ = false;

 private:
  struct Operation : detail::DiskOp {
    Operation(DiskBatch* batch, const detail::DiskRequest& request, std::error_code invalid) noexcept
        : DiskOp(&Operation::onComplete), batch(batch), request(request), invalid(invalid) {}
    static void onComplete(UringOperation* op, int result, unsigned) noexcept {
      auto* self = static_cast<Operation*>(op);
      COIO_ASSERT(self->pending(), "a completion for a transfer that is not in flight");
      self->state = State::done;
      self->result = result;
      DiskBatch& batch = *self->batch;
      --batch.remaining_;
      if (batch.streaming_) {
        batch.completed_.push_back(static_cast<std::size_t>(self - batch.ops_.data()));
        if (batch.handle_) std::exchange(batch.handle_, nullptr).resume();
      } else if (batch.remaining_ == 0) {
        batch.handle_.resume();
      }
    }
    DiskBatch* batch;
    detail::DiskRequest request;
    std::error_code invalid;  // why it never goes to the kernel
    int result = 0;           // the CQE's result
  };

  // Submits every transfer that can go (one enter); false if none went.
  // Never throws: once one transfer is in flight its CQE will resume
  // handle_, so an exception must not unwind the awaiting coroutine. If the
  // ring refuses an SQE (submit throws), that transfer and the ones after it
  // fail with the error and the batch waits for those already submitted.
  bool submitAll(bool stopped) noexcept {
    COIO_ASSERT(remaining_ == 0, "disk batch awaited twice at once");
    for (Operation& op : ops_) {
      op.state = detail::DiskOp::State::done;
      op.result = stopped ? -ECANCELED : 0;
    }
    if (stopped) return false;
    int failed = 0;  // errno that stopped the submission
    ring_.openBatch();
    for (Operation& op : ops_) {
      if (op.invalid || op.request.length == 0) continue;
      op.request.ioprio = keepApart_ ? detail::apartIoprios()[(&op - ops_.data()) & 1] : 0;
      if (failed == 0) {
        try {
          ring_.submit(op, op.request);
        } catch (...) {
          failed = errnoOf(std::current_exception());
        }
      }
      if (op.pending()) {
        ++remaining_;  // prepared (even if the ring threw after): its CQE will come
      } else {
        op.result = -failed;
      }
    }
    try {
      ring_.closeBatch();
    } catch (...) {
      // The prepared SQEs stay queued and go in with the ring's next enter.
    }
    return remaining_ > 0;
  }

  static int errnoOf(std::exception_ptr e) noexcept {
    try {
      std::rethrow_exception(e);
    } catch (const std::system_error& error) {
      const int value = error.code().value();
      const bool isErrno = error.code().category() == std::system_category() ||
                           error.code().category() == std::generic_category();
      return isErrno && value > 0 ? value : EIO;
    } catch (const std::bad_alloc&) {
      return ENOMEM;
    } catch (...) {
      return EIO;
    }
  }

  void cancel() noexcept {
    COIO_ASSERT(ring_.ownedByCaller(), "stop requested off the reactor's thread");
    for (Operation& op : ops_) {
      if (op.state == detail::DiskOp::State::inFlight) ring_.cancel(op);
    }
  }

  detail::DiskRing& ring_;
  std::vector<Operation> ops_;
  std::size_t remaining_ = 0;
  std::coroutine_handle<> handle_;  // the awaiting coroutine (streaming: only while next() waits)
  bool streaming_ = false;          // start()ed: completions are queued for next()
  std::vector<std::size_t> completed_;  // streaming: indices in completion order; [0, yielded_) yielded
  std::size_t yielded_ = 0;
};

}  // namespace coio
