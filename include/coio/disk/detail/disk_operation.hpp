#pragma once
// One disk operation as an awaitable. Needs liburing: link coio::uring.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/result.hpp>
#include <coio/detail/syscall.hpp>
#include <coio/disk/detail/disk_ring.hpp>

#include <coroutine>
#include <optional>
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
class [[nodiscard]] DiskOperation : DiskOp {
 public:
  DiskOperation(DiskRing& ring, const DiskRequest& request, std::stop_token stop, std::error_code early = {}) noexcept
      : DiskOp(&DiskOperation::onComplete), ring_(ring), request_(request), stop_(std::move(stop)), early_(early) {}
  DiskOperation(const DiskOperation&) = delete;
  DiskOperation& operator=(const DiskOperation&) = delete;

  // Given no token, the attempt waits for await_suspend, which knows the awaiting Task's.
  bool await_ready() noexcept { return stop_.stop_possible() && inline_.admit(ring_.loop(), tryComplete()); }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    if (inheritStopToken(stop_, h) && inline_.admit(ring_.loop(), tryComplete())) return false;
    handle_ = h;
    if (inline_.deferred(ring_.loop(), h)) return true;  // done, but the loop's other work goes first
    ring_.submit(*this, request_);
    if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
    return true;
  }
  Result<T> await_resume() {
    onStop_.reset();
    if (early_) return early_;
    return toResult<T>(result_);
  }

 private:
  struct OnStop {
    DiskOperation* self;
    void operator()() const noexcept {
      COIO_ASSERT(self->ring_.ownedByCaller(), "stop requested off the reactor's thread");
      if (self->state == State::inFlight) self->ring_.cancel(*self);
    }
  };
  // True if the operation is over without an SQE.
  bool tryComplete() noexcept {
    if (early_) return true;
    if (stop_.stop_requested()) {
      early_ = std::make_error_code(std::errc::operation_canceled);
      return true;
    }
    return request_.transfersNothing();
  }
  static void onComplete(UringOperation* op, int result, unsigned) noexcept {
    auto* self = static_cast<DiskOperation*>(op);
    self->state = State::done;
    self->result_ = result;
    self->handle_.resume();
  }

  DiskRing& ring_;
  DiskRequest request_;
  std::stop_token stop_;
  std::error_code early_;
  int result_ = 0;
  InlineCompletion inline_;
  std::coroutine_handle<> handle_;
  std::optional<std::stop_callback<OnStop>> onStop_;
};

}  // namespace coio::detail
