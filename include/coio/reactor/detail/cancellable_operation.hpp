#pragma once
// CancellableOperation: the awaiter skeleton every reactor operation
// shares (cppcoro's io_operation_cancellable is the model).
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/reactor/detail/inline_completion.hpp>
#include <coio/reactor/detail/loop_core.hpp>

#include <cerrno>
#include <coroutine>
#include <optional>
#include <stop_token>
#include <utility>

namespace coio::detail {

/// The awaiter of one cancellable operation on a loop, written once:
/// adopt the awaiting Task's stop token if given none; complete without
/// suspending when the operation can (within the loop's inline budget,
/// InlineCompletion: past it the coroutine resumes in the next iteration);
/// else start it and, while it waits, cancel it when the stop is requested
/// (on the loop thread). A stop already requested completes it at once
/// with -ECANCELED, unless Derived says otherwise (stoppedAtOnce).
///
/// Derived, which makes this class a friend, supplies:
///   bool tryNow() noexcept  done without waiting? (then result_ is set)
///   bool start()            begin waiting; false if it ended instead (result_ set)
///   void cancel() noexcept  its stop was requested while it waits; it then
///                           ends on its own completion, or by resumeLater()
///   result()                what co_await yields (from result_)
/// and resumes the coroutine (resume()) when the operation completes. It
/// may also supply `bool stoppedAtOnce() noexcept`, for an operation that
/// does not simply end on a stop requested before it started (a batch
/// whose transfers each end cancelled, a stream that still yields what
/// completed): what to do instead, and whether it is then over.
template <typename Derived>
class CancellableOperation {
 public:
  CancellableOperation(LoopCore& loop, std::stop_token stop) noexcept : loop_(loop), stop_(std::move(stop)) {}
  CancellableOperation(const CancellableOperation&) = delete;
  CancellableOperation& operator=(const CancellableOperation&) = delete;

  // Given no token, the attempt waits for await_suspend, which knows the awaiting Task's.
  bool await_ready() noexcept { return stop_.stop_possible() && inline_.admit(loop_, tryComplete()); }
  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    if (inheritStopToken(stop_, h) && inline_.admit(loop_, tryComplete())) return false;
    handle_ = h;
    if (inline_.deferred(loop_, h)) return true;  // done, but the loop's other work goes first
    if (!derived().start()) return false;
    if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
    return true;
  }
  decltype(auto) await_resume() {
    onStop_.reset();
    return derived().result();
  }

 protected:
  ~CancellableOperation() = default;

  LoopCore& loop() const noexcept { return loop_; }
  /// The awaiting coroutine, from await_suspend on.
  std::coroutine_handle<> handle() const noexcept { return handle_; }
  /// Resumes the awaiting coroutine (at the operation's completion).
  void resume() const noexcept { handle_.resume(); }
  /// A stop was requested before the operation started: it ends at once,
  /// with -ECANCELED (Derived may say otherwise: see above).
  bool stoppedAtOnce() noexcept {
    result_ = -ECANCELED;
    return true;
  }
  /// Resumes it in a later iteration (an operation that ends on its stop).
  void resumeLater() noexcept { inline_.resumeLater(loop_, handle_); }

  long result_ = 0;  // raw: >= 0, or -errno

 private:
  struct OnStop {
    CancellableOperation* self;
    void operator()() const noexcept {
      COIO_ASSERT(self->loop_.isInLoopThread(), "stop requested off the reactor's thread");
      self->derived().cancel();
    }
  };

  Derived& derived() noexcept { return static_cast<Derived&>(*this); }

  // True (result_ set) if the operation is over without waiting.
  bool tryComplete() noexcept {
    if (stop_.stop_requested()) return derived().stoppedAtOnce();
    return derived().tryNow();
  }

  LoopCore& loop_;
  std::stop_token stop_;
  InlineCompletion inline_;
  std::coroutine_handle<> handle_;
  std::optional<std::stop_callback<OnStop>> onStop_;
};

}  // namespace coio::detail
