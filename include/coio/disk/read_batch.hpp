#pragma once
// Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/result.hpp>
#include <coio/detail/syscall.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/disk/detail/disk_ring.hpp>
#include <coio/disk/detail/io_priority.hpp>
#include <coio/disk/disk.hpp>
#include <coio/disk/file.hpp>

#include <cerrno>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <span>
#include <stop_token>
#include <system_error>
#include <utility>
#include <vector>

namespace coio {

/// N reads submitted together, awaited as one: the storage server's
/// batchRead (3FS's AioReadWorker, as a coroutine).
///
/// Guarantees:
/// - `co_await batch.submit(stop)` (or `co_await batch`) hands every read
///   added since the last clear() to the kernel in one io_uring_enter and
///   resumes the coroutine once, on the Disk's loop thread, when every one
///   has completed. Reads into a registered BufferPool slice use
///   IORING_OP_READ_FIXED, reads of a registered File IOSQE_FIXED_FILE.
/// - Results are per read (`result(i)`, i as returned by add()): bytes read
///   (short at end of file, 0 past it or for an empty read), or that read's
///   error (EIO, EBADF, DiskErrc::misalignedDirectIo checked before
///   submission, ...). One failing read does not fail the others.
/// - Submitting never throws out of the `co_await`: if the ring refuses an
///   SQE (a full SQ that cannot be flushed), that read and every later one
///   yield the error (errno of the std::system_error, ENOMEM for bad_alloc)
///   and the batch still resumes once, after the reads already submitted.
/// - Each SQE is tagged with its own read's record, and the batch resumes
///   only after the CQE of every read it submitted: no completion is lost,
///   none is attributed to a later submission, and the batch never resumes
///   twice.
/// - A stop requested on the loop thread cancels the reads still in flight
///   (they yield std::errc::operation_canceled unless they won the race);
///   the coroutine resumes once the kernel has let go of every buffer.
/// - Destroying the batch while reads are in flight (its coroutine frame
///   destroyed with its stopped reactor) waits for the kernel to let go of
///   the buffers first (see Disk for who waits).
/// - Streaming: `batch.start()` hands the reads to the kernel the same way
///   but returns at once; each `co_await batch.next(stop)` then yields the
///   index of one completed read, in completion order (reads that never
///   went to the kernel first: invalid, empty, refused), and std::nullopt
///   once every read was yielded. It resumes on the Disk's loop thread.
///   A stop requested while reads are in flight cancels them; next() goes
///   on yielding them as their completions arrive.
/// - keepApart(): each read reaches the device as a request of its own, so
///   each completes on its own. By default the block layer merges reads of
///   adjacent ranges that reach it together into one request, which a
///   streaming reader then sees complete all at once (16 reads of 256 KiB
///   become one 4 MiB request). With keepApart, consecutive reads of the
///   batch alternate between two I/O priorities of the submitting thread's
///   class that differ in level only (its own level and the next), and the
///   block layer never merges requests of different priorities. Schedulers
///   that order by priority order by class (mq-deadline); BFQ also weighs
///   the level, so every other read gets one level's worth less weight.
/// - Given no stop token, submit() and next() use the awaiting Task's (see
///   currentStopToken).
/// - The destinations must stay valid until the `co_await` returns (when
///   streaming: until next() yielded nullopt). The batch can be reused
///   after clear(). Loop thread only; not movable.
class ReadBatch {
  struct Read;

 public:
  /// An empty batch submitting to `disk`'s ring.
  explicit ReadBatch(Disk& disk) noexcept : ring_(disk.queue()) {}
  ReadBatch(const ReadBatch&) = delete;
  ReadBatch& operator=(const ReadBatch&) = delete;
  // A record still in flight waits for its CQE (DiskOp's destructor).
  ~ReadBatch() = default;

  /// Adds a read of destination.size() bytes at `offset`; returns its index.
  std::size_t add(const File& file, std::uint64_t offset, std::span<std::byte> destination) {
    return add(file, offset, destination.data(), destination.size(), -1);
  }
  /// Adds a read into a BufferPool slice (READ_FIXED if the pool is registered).
  std::size_t add(const File& file, std::uint64_t offset, BufferSlice destination) {
    return add(file, offset, destination.data, destination.size, destination.fixedIndex);
  }

  /// Keeps every read a request of its own (see the class comment), from
  /// the next submission on.
  void keepApart(bool apart = true) noexcept { keepApart_ = apart; }

  /// Reserves room for `n` reads.
  void reserve(std::size_t n) { reads_.reserve(n); }
  /// Number of reads added.
  std::size_t size() const noexcept { return reads_.size(); }

  /// Read i's outcome; meaningful once the batch has been awaited.
  Result<std::size_t> result(std::size_t i) const {
    const Read& read = reads_.at(i);
    if (read.invalid) return read.invalid;
    return detail::toResult<std::size_t>(read.result);
  }

  /// Forgets every read, to start a new batch.
  void clear() noexcept {
    COIO_ASSERT(remaining_ == 0, "ReadBatch cleared while its reads are in flight");
    reads_.clear();
    completed_.clear();
    yielded_ = 0;
    streaming_ = false;
  }

  class [[nodiscard]] Awaiter {
   public:
    Awaiter(ReadBatch& batch, std::stop_token stop) noexcept : batch_(batch), stop_(std::move(stop)) {}
    Awaiter(const Awaiter&) = delete;
    Awaiter& operator=(const Awaiter&) = delete;

    bool await_ready() const noexcept { return false; }
    template <typename Promise>
    bool await_suspend(std::coroutine_handle<Promise> h) {
      detail::inheritStopToken(stop_, h);
      batch_.handle_ = h;
      batch_.streaming_ = false;
      // Nothing to wait for (empty, invalid or cancelled reads).
      if (!batch_.submitAll(stop_.stop_requested())) return inline_.yieldDone(batch_.ring_.loop(), h);
      if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{&batch_});
      return true;
    }
    void await_resume() noexcept { onStop_.reset(); }

   private:
    struct OnStop {
      ReadBatch* batch;
      void operator()() const noexcept { batch->cancel(); }
    };
    ReadBatch& batch_;
    std::stop_token stop_;
    detail::InlineCompletion inline_;
    std::optional<std::stop_callback<OnStop>> onStop_;
  };

  /// Submits the reads; the awaiter resumes when all have completed.
  Awaiter submit(std::stop_token stop = {}) noexcept { return {*this, std::move(stop)}; }
  /// Same as `submit()` without a stop token.
  Awaiter operator co_await() noexcept { return submit(); }

  /// Streaming: submits the reads (as submit() does) without waiting for
  /// them; next() yields them as they complete. Throws only std::bad_alloc,
  /// before anything is submitted.
  void start() {
    COIO_ASSERT(remaining_ == 0, "ReadBatch started while its reads are in flight");
    completed_.clear();
    completed_.reserve(reads_.size());  // completions push without allocating
    yielded_ = 0;
    streaming_ = true;
    submitAll(false);
    for (std::size_t i = 0; i < reads_.size(); ++i) {
      if (!reads_[i].pending()) completed_.push_back(i);
    }
  }

  class [[nodiscard]] NextAwaiter {
   public:
    NextAwaiter(ReadBatch& batch, std::stop_token stop) noexcept : batch_(batch), stop_(std::move(stop)) {}
    NextAwaiter(const NextAwaiter&) = delete;
    NextAwaiter& operator=(const NextAwaiter&) = delete;
    ~NextAwaiter() {
      if (handle_ && batch_.handle_ == handle_) batch_.handle_ = nullptr;  // destroyed while waiting here
    }

    bool await_ready() noexcept {
      COIO_ASSERT(batch_.streaming_, "ReadBatch::next() without start()");
      if (stop_.stop_requested()) batch_.cancel();
      const bool ready = batch_.yielded_ < batch_.completed_.size() || batch_.remaining_ == 0;
      return inline_.admit(batch_.ring_.loop(), ready);
    }
    template <typename Promise>
    bool await_suspend(std::coroutine_handle<Promise> h) {
      if (inline_.deferred(batch_.ring_.loop(), h)) return true;
      // Checked when it must wait: a next() that finds a read done yields it, stop or not.
      if (detail::inheritStopToken(stop_, h) && stop_.stop_requested()) batch_.cancel();
      handle_ = batch_.handle_ = h;
      if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{&batch_});
      return true;
    }
    std::optional<std::size_t> await_resume() noexcept {
      onStop_.reset();
      handle_ = nullptr;
      if (batch_.yielded_ == batch_.completed_.size()) return std::nullopt;
      return batch_.completed_[batch_.yielded_++];
    }

   private:
    struct OnStop {
      ReadBatch* batch;
      void operator()() const noexcept { batch->cancel(); }
    };
    ReadBatch& batch_;
    std::stop_token stop_;
    std::coroutine_handle<> handle_;
    detail::InlineCompletion inline_;
    std::optional<std::stop_callback<OnStop>> onStop_;
  };

  /// Streaming: the index of the next completed read (see start()), or
  /// std::nullopt once every read was yielded.
  NextAwaiter next(std::stop_token stop = {}) noexcept { return {*this, std::move(stop)}; }

 private:
  struct Read : detail::DiskOp {
    Read(ReadBatch* batch, const detail::DiskRequest& request, std::error_code invalid) noexcept
        : DiskOp(&Read::onComplete), batch(batch), request(request), invalid(invalid) {}
    static void onComplete(UringOperation* op, int result, unsigned) noexcept {
      auto* self = static_cast<Read*>(op);
      COIO_ASSERT(self->pending(), "a completion for a read that is not in flight");
      self->state = State::done;
      self->result = result;
      ReadBatch& batch = *self->batch;
      --batch.remaining_;
      if (batch.streaming_) {
        batch.completed_.push_back(static_cast<std::size_t>(self - batch.reads_.data()));
        if (batch.handle_) std::exchange(batch.handle_, nullptr).resume();
      } else if (batch.remaining_ == 0) {
        batch.handle_.resume();
      }
    }
    ReadBatch* batch;
    detail::DiskRequest request;
    std::error_code invalid;  // why it never goes to the kernel
    int result = 0;           // the CQE's result
  };

  std::size_t add(const File& file, std::uint64_t offset, std::byte* data, std::size_t length, int fixedBuffer) {
    COIO_ASSERT(remaining_ == 0, "read added to a ReadBatch in flight");
    COIO_ASSERT(&file.disk().queue() == &ring_, "ReadBatch and File on different Disks");
    reads_.emplace_back(this, file.request(IORING_OP_READ, offset, data, length, fixedBuffer),
                        file.check(offset, data, length));
    return reads_.size() - 1;
  }

  // Submits every read that can go (one enter); false if none went.
  // Never throws: once one read is in flight its CQE will resume handle_,
  // so an exception must not unwind the awaiting coroutine. If the ring
  // refuses an SQE (submit throws), that read and the ones after it fail
  // with the error and the batch waits for those already submitted.
  bool submitAll(bool stopped) noexcept {
    COIO_ASSERT(remaining_ == 0, "ReadBatch awaited twice at once");
    for (Read& read : reads_) {
      read.state = detail::DiskOp::State::done;
      read.result = stopped ? -ECANCELED : 0;
    }
    if (stopped) return false;
    int failed = 0;  // errno that stopped the submission
    ring_.openBatch();
    for (Read& read : reads_) {
      if (read.invalid || read.request.length == 0) continue;
      read.request.ioprio = keepApart_ ? detail::apartIoprios()[(&read - reads_.data()) & 1] : 0;
      if (failed == 0) {
        try {
          ring_.submit(read, read.request);
        } catch (...) {
          failed = errnoOf(std::current_exception());
        }
      }
      if (read.pending()) {
        ++remaining_;  // prepared (even if the ring threw after): its CQE will come
      } else {
        read.result = -failed;
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
    for (Read& read : reads_) {
      if (read.state == detail::DiskOp::State::inFlight) ring_.cancel(read);
    }
  }

  detail::DiskRing& ring_;
  std::vector<Read> reads_;
  std::size_t remaining_ = 0;
  std::coroutine_handle<> handle_;  // the awaiting coroutine (streaming: only while next() waits)
  bool streaming_ = false;          // start()ed: completions are queued for next()
  bool keepApart_ = false;
  std::vector<std::size_t> completed_;  // streaming: indices in completion order; [0, yielded_) yielded
  std::size_t yielded_ = 0;
};

}  // namespace coio
