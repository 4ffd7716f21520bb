#pragma once
// UringReactor's splice, tee and sendfile: one awaitable (UringSplice) that
// submits a transfer's IORING_OP_SPLICE / IORING_OP_TEE, waits with a poll
// where an end was not ready (-EAGAIN), and goes on to the next transfer
// its Steps ask for (sendfile: into the pipe, then out of it).
// Needs liburing: link coio::uring.
#include <coio/core/result.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/splice_call.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/detail/uring_ring.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/uring_operation.hpp>

#include <liburing.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <utility>

namespace coio::detail {

// The Steps of one splice or tee: the transfer, and its result is the
// operation's; or, if `refused` (-errno), that error without a transfer.
struct OneTransfer {
  SpliceCall transfer;
  long refused = 0;
  const SpliceCall& call() const noexcept { return transfer; }
  std::optional<long> atOnce() const noexcept { return refused != 0 ? std::optional<long>(refused) : std::nullopt; }
  std::optional<long> advance(long result) const noexcept { return result; }
};

// The Steps of a sendfile: fill the pipe from the file (as much as it
// holds), then splice from the pipe into `out` until the pipe is empty.
// An error (a cancellation included) on the way out ends it with the
// bytes already out, if any, and what the pipe still holds discarded.
class SendfileSteps {
 public:
  SendfileSteps(int out, int in, std::int64_t offset, std::size_t length, Pipe& pipe) noexcept
      : pipe_(pipe), out_(out),
        call_{false, in, offset, pipe.writeFd(), kNoOffset, std::min(length, pipe.capacity())} {}

  const SpliceCall& call() const noexcept { return call_; }
  // A result known without the kernel: a negative offset (kNoOffset would
  // splice from the file's position), an empty request, and a pipe that
  // holds bytes already, which would go out ahead of the file's (EBUSY).
  std::optional<long> atOnce() const noexcept {
    if (call_.inOffset < 0) return -EINVAL;
    if (call_.length == 0) return 0;
    if (pipe_.buffered() != 0) return -EBUSY;
    return std::nullopt;
  }
  // The operation's result once `result` (of call()) ends it; else call()
  // is the next transfer.
  std::optional<long> advance(long result) noexcept {
    if (!draining_) {
      if (result <= 0) return result;  // the file's end, or the error
      draining_ = true;
      filled_ = static_cast<std::size_t>(result);
      call_ = {false, pipe_.readFd(), kNoOffset, out_, kNoOffset, filled_};
      return std::nullopt;
    }
    if (result <= 0) {  // (0: the pipe's write end is gone; nothing more can come out)
      pipe_.discard();
      return sent_ > 0 ? static_cast<long>(sent_) : result;
    }
    sent_ += static_cast<std::size_t>(result);
    if (sent_ == filled_) return static_cast<long>(sent_);
    call_.length = filled_ - sent_;
    return std::nullopt;
  }

 private:
  Pipe& pipe_;
  int out_;
  SpliceCall call_;
  bool draining_ = false;  // the pipe is filled; call_ empties it
  std::size_t filled_ = 0;
  std::size_t sent_ = 0;
};

/// What UringReactor::splice, tee and sendfile return: `co_await` yields
/// the bytes moved (see SpliceReactor), on the loop thread, after the last
/// completion of its last SQE. Exactly one SQE of it is in flight while it
/// waits (a transfer, or a poll for the end a transfer found not ready),
/// so a cancel reaches whichever it is; none is submitted after it.
template <typename Steps>
class [[nodiscard]] UringSplice : UringOperation, public CancellableOperation<UringSplice<Steps>> {
  using Base = CancellableOperation<UringSplice>;
  friend Base;

 public:
  UringSplice(UringRing& ring, Steps steps, std::stop_token stop) noexcept
      : UringOperation{&UringSplice::onComplete}, Base(ring.loop(), std::move(stop)), ring_(ring),
        steps_(std::move(steps)) {}

 private:
  bool tryNow() noexcept {
    const std::optional<long> done = steps_.atOnce();
    if (done) this->result_ = *done;
    return done.has_value();
  }
  bool start() {
    ring_.submit(*this, [this](io_uring_sqe* sqe) { prepareTransfer(sqe); });
    return true;
  }
  void cancel() noexcept {
    stopped_ = true;
    ring_.cancel(*this);
  }
  Result<std::size_t> result() const { return toResult<std::size_t>(this->result_); }

  void prepareTransfer(io_uring_sqe* sqe) const noexcept {
    const SpliceCall& c = steps_.call();
    if (c.tee) {
      io_uring_prep_tee(sqe, c.in, c.out, c.chunk(), SPLICE_F_NONBLOCK);
    } else {
      io_uring_prep_splice(sqe, c.in, c.inOffset, c.out, c.outOffset, c.chunk(), SPLICE_F_NONBLOCK);
    }
  }

  static void onComplete(UringOperation* op, int result, unsigned) noexcept {
    static_cast<UringSplice*>(op)->completed(result);
  }

  void completed(long r) noexcept {
    if (std::exchange(polling_, false)) {
      if (r >= 0 && !stopped_) return submitNext(false);  // the end is ready: try again
      if (r >= 0) r = -ECANCELED;                         // ready, but stopped meanwhile
    } else if (r == -EAGAIN) {
      if (!stopped_) return submitNext(true);
      r = -ECANCELED;
    }
    // (Steps end at an error: no transfer follows one, nor a stop.)
    std::optional<long> done = steps_.advance(r);
    if (!done && stopped_) done = steps_.advance(-ECANCELED);
    if (!done) return submitNext(false);
    this->result_ = *done;
    this->resume();
  }

  // The next SQE: the transfer, or (`poll`) a poll for the end it found
  // not ready. No SQE to be had ends the operation with that error.
  void submitNext(bool poll) noexcept {
    polling_ = poll;
    bool submitted;
    if (poll) {
      const SpliceWait wait = spliceWait(steps_.call().in, steps_.call().out);
      submitted = ring_.trySubmit(
          *this, [&](io_uring_sqe* sqe) { io_uring_prep_poll_add(sqe, wait.fd, wait.write ? POLLOUT : POLLIN); });
    } else {
      submitted = ring_.trySubmit(*this, [this](io_uring_sqe* sqe) { prepareTransfer(sqe); });
    }
    if (submitted) return;
    polling_ = false;
    completed(-ring_.submitError());  // an error (never EAGAIN): the Steps end there
  }

  UringRing& ring_;
  Steps steps_;
  bool polling_ = false;  // the SQE in flight is a poll
  bool stopped_ = false;  // cancel() was called: no more SQEs
};

}  // namespace coio::detail
