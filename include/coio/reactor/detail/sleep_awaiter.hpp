#pragma once
// SleepAwaiter: what ReactorLoop::sleepFor / sleepUntil return.
#include <coio/core/detail/assert.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/reactor/detail/timer_queue.hpp>

#include <stop_token>
#include <utility>

namespace coio::detail {

/// A timer of the loop: resumes on the loop thread at its deadline, or
/// early when its stop is requested (its own token, Cancellable; or the
/// awaiting Task's). The cancellable form yields whether the deadline passed.
template <bool Cancellable>
class [[nodiscard]] SleepAwaiter : TimerNode, public CancellableOperation<SleepAwaiter<Cancellable>> {
  using Base = CancellableOperation<SleepAwaiter>;
  friend Base;

 public:
  SleepAwaiter(LoopCore& core, LoopCore::Clock::time_point deadline, std::stop_token stop = {}) noexcept
      : Base(core, std::move(stop)) {
    this->deadline = deadline;
    this->fire = &SleepAwaiter::onFire;
  }
  ~SleepAwaiter() {
    if (queued()) this->loop().timers().remove(*this);
  }

 private:
  bool tryNow() const noexcept { return false; }  // in a later iteration, even if the deadline passed
  bool start() {
    COIO_ASSERT(this->loop().ownedByCaller(), "sleep awaited off the reactor's thread");
    this->loop().timers().push(*this);
    return true;
  }
  void cancel() noexcept {
    if (!queued()) return;
    this->loop().timers().remove(*this);
    this->resumeLater();
  }
  auto result() const noexcept {
    if constexpr (Cancellable) return this->result_ > 0;  // fired
  }

  static void onFire(TimerNode* n) noexcept {
    auto* self = static_cast<SleepAwaiter*>(n);
    self->result_ = 1;
    self->resume();
  }
};

}  // namespace coio::detail
