#pragma once
// One disk operation as an awaitable. Needs liburing: link coio::uring.
#include <coio/core/result.hpp>
#include <coio/disk/detail/disk_ring.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/syscall.hpp>

#include <stop_token>
#include <system_error>
#include <utility>

namespace coio::detail {

/// One disk operation (read, write, fsync). `co_await` yields Result<T>;
/// the coroutine resumes on the loop thread once the CQE arrived. A
/// request that fails its checks before submission (`early`) completes at
/// once with that error, as does a zero-length transfer (with 0), within
/// the loop's inline budget (InlineCompletion). Given no stop token, it
/// uses the awaiting Task's (see currentStopToken).
template <typename T>
class [[nodiscard]] DiskOperation : DiskOp, public CancellableOperation<DiskOperation<T>> {
  using Base = CancellableOperation<DiskOperation>;
  friend Base;

 public:
  DiskOperation(DiskRing& ring, const DiskRequest& request, std::stop_token stop, std::error_code early = {}) noexcept
      : DiskOp(&DiskOperation::onComplete), Base(ring.loop(), std::move(stop)), ring_(ring), request_(request),
        early_(early) {}

 private:
  // True if the operation is over without an SQE.
  bool tryNow() const noexcept { return early_ || request_.transfersNothing(); }
  bool start() {
    ring_.submit(*this, request_);
    return true;
  }
  void cancel() noexcept {
    if (state == State::inFlight) ring_.cancel(*this);
  }
  Result<T> result() const {
    if (early_) return early_;  // before a stop: the request was wrong whatever happened
    return toResult<T>(this->result_);
  }

  static void onComplete(UringOperation* op, int result, unsigned) noexcept {
    auto* self = static_cast<DiskOperation*>(op);
    self->state = State::done;
    self->result_ = result;
    self->resume();
  }

  DiskRing& ring_;
  DiskRequest request_;
  std::error_code early_;
};

}  // namespace coio::detail
