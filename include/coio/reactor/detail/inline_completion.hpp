#pragma once
// InlineCompletion: where the loop's inline budget is spent.
#include <coio/reactor/detail/loop_core.hpp>

#include <coroutine>

namespace coio::detail {

/// The one place where the loop's inline budget
/// (LoopCore::kInlineTurnsPerIteration) is spent. Every awaiter whose
/// operation may complete without suspending holds one and does:
///   await_ready():    attempt the operation; `return admit(loop, completed);`
///   await_suspend(h): `if (deferred(loop, h)) return true;` before waiting.
/// (An awaiter that learns only in await_suspend that it is done returns
/// `yieldDone(loop, h)` there instead.) A completed operation goes on
/// inline while the iteration's budget lasts; past it, its coroutine is
/// posted and resumes in the next iteration. The budget counts
/// completions, not attempts: an attempt that would block costs nothing.
/// CancellableOperation writes this out for the reactors' operations.
class InlineCompletion {
 public:
  bool admit(LoopCore& loop, bool completed) noexcept {
    deferred_ = completed && !loop.takeInlineTurn();
    return completed && !deferred_;
  }
  /// True if the operation completed but must yield: `h` is then posted.
  bool deferred(LoopCore& loop, std::coroutine_handle<> h) noexcept {
    if (!deferred_) return false;
    loop.post(posted_, h);
    return true;
  }
  /// await_suspend's value for an operation it found done: false (go on)
  /// within the budget, else true with `h` posted.
  bool yieldDone(LoopCore& loop, std::coroutine_handle<> h) noexcept {
    return !admit(loop, true) && deferred(loop, h);
  }
  /// Posts `h` to resume in a later iteration, for an operation that waited
  /// and ended without its own completion (its stop): the node is free
  /// then, as a deferred completion never waits.
  void resumeLater(LoopCore& loop, std::coroutine_handle<> h) noexcept { loop.post(posted_, h); }

 private:
  bool deferred_ = false;
  PostedResume posted_;
};

}  // namespace coio::detail
