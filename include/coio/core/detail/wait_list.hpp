#pragma once
// What coio's waiting primitives share (Semaphore, BatchSemaphore,
// SharedMutex, Event, Latch, BoundedQueue; Mutex only WaitNode and
// resumeInline, around a lock-free queue of its own, mutex_core.hpp):
// - WaitNode / WaitList: an intrusive FIFO of suspended coroutines. Nodes
//   live in the awaiting frames (no allocation); a list and the nodes'
//   states are guarded by the mutex of the primitive that owns them.
// - resumeInline(): resumes the waiters a call made ready, on the calling
//   thread, once the primitive's lock is dropped. A waiter that makes the
//   next one ready resumes it inside its own call, so a hand-over chain
//   nests one stack level per waiter: past kMaxInlineDepth nested
//   resumptions on a thread, waiters are queued instead and resumed by the
//   outermost resumption on that thread once the inner ones have returned
//   (a trampoline). The trampoline is per thread and shared by every
//   primitive, so stack use stays bounded whatever the chain's length, even
//   through several primitives.
// - WaitOperation: the awaitable, optionally cancellable with a
//   std::stop_token (given a default one: the awaiting Task's), that drives
//   an owner's waiting protocol.
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>

#include <coroutine>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>
#include <type_traits>

namespace coio::detail {

// idle: not queued yet; queued: in its owner's list; granted: got what it
// waited for; cancelled: stop was requested first; closed: the owner was
// closed (BoundedQueue).
enum class WaitState : std::uint8_t { idle, queued, granted, cancelled, closed };

struct WaitNode {
  std::coroutine_handle<> awaiting;
  WaitNode* prev = nullptr;
  WaitNode* next = nullptr;  // also links a list of nodes to resume, once out of the queue
  WaitState state = WaitState::idle;
};

class WaitList {
 public:
  bool empty() const noexcept { return head_ == nullptr; }
  WaitNode* front() const noexcept { return head_; }

  void pushBack(WaitNode& w) noexcept {
    w.state = WaitState::queued;
    w.prev = tail_;
    w.next = nullptr;
    (tail_ ? tail_->next : head_) = &w;
    tail_ = &w;
  }

  WaitNode& popFront() noexcept {
    WaitNode& w = *head_;
    unlink(w);
    return w;
  }

  void unlink(WaitNode& w) noexcept {
    (w.prev ? w.prev->next : head_) = w.next;
    (w.next ? w.next->prev : tail_) = w.prev;
    w.prev = w.next = nullptr;
  }

  // Empties the list, giving every node `state`; returns them oldest first,
  // still linked through `next`, ready for resumeInline().
  WaitNode* takeAll(WaitState state) noexcept {
    for (WaitNode* w = head_; w; w = w->next) w->state = state;
    WaitNode* all = head_;
    head_ = tail_ = nullptr;
    return all;
  }

 private:
  WaitNode* head_ = nullptr;
  WaitNode* tail_ = nullptr;
};

/// Nested resumptions (see the top of this file) a thread makes inline
/// before it defers to the outermost one.
inline constexpr unsigned kMaxInlineDepth = 32;

// Per thread: how deep in resumeInline() we are, and the nodes deferred to
// the outermost call (linked through `next`).
struct Trampoline {
  unsigned depth = 0;
  WaitNode* head = nullptr;
  WaitNode* tail = nullptr;
};
inline Trampoline& trampoline() noexcept {
  static thread_local Trampoline t;
  return t;
}
inline void resumeEach(WaitNode* w) noexcept {
  while (w) {
    WaitNode* next = w->next;  // read first: the resumed frame may be gone
    w->awaiting.resume();
    w = next;
  }
}

// Resumes `w` and the nodes linked behind it through `next`, in order, on
// this thread. Call it without holding any lock: the resumed coroutines run
// inside it.
inline void resumeInline(WaitNode* w) noexcept {
  if (!w) return;
  Trampoline& t = trampoline();
  if (t.depth >= kMaxInlineDepth) {  // deep in a hand-over chain: the outermost call resumes them
    (t.tail ? t.tail->next : t.head) = w;
    while (w->next) w = w->next;
    t.tail = w;
    return;
  }
  ++t.depth;
  resumeEach(w);
  if (t.depth == 1) {
    while (WaitNode* deferred = t.head) {
      t.head = t.tail = nullptr;
      resumeEach(deferred);  // may defer more: loop until none is left
    }
  }
  --t.depth;
}

// The usual cancel() of an owner whose waiters leave without side effects:
// under `mutex`, a node that has not queued yet is marked so it never does;
// a queued one leaves `list` and is resumed (as cancelled) on this thread.
// A node already granted or closed keeps its outcome.
inline void cancelWait(std::mutex& mutex, WaitList& list, WaitNode& w) noexcept {
  {
    std::lock_guard lock(mutex);
    if (w.state == WaitState::idle) {
      w.state = WaitState::cancelled;
      return;
    }
    if (w.state != WaitState::queued) return;
    list.unlink(w);
    w.state = WaitState::cancelled;
  }
  resumeInline(&w);  // unlink() cleared `next`: w alone
}

// The usual forget(): the frame of a queued node is being destroyed; it
// leaves `list` and nothing resumes it.
inline void forgetWait(std::mutex& mutex, WaitList& list, WaitNode& w) noexcept {
  std::lock_guard lock(mutex);
  if (w.state != WaitState::queued) return;
  list.unlink(w);
  w.state = WaitState::cancelled;
}

// The awaitable of a waiting operation on `Owner`, whose waiters are `Node`s
// (WaitNodes with the owner's extra fields). The owner provides, for Node:
//   bool tryNow(Node&)  await_ready: done without suspending (true, the
//                       node's state set) or must wait (false, untouched)
//   bool enqueue(Node&) under its lock: done now (false) or queued (true);
//                       false at once if the node was cancelled meanwhile.
//                       Nothing of the node is touched once it is queued
//                       and the lock dropped: it may already be resumed.
//   void cancel(Node&)  stop requested, from any thread (see cancelWait)
//   void forget(Node&)  the frame dies while queued (see forgetWait)
// The plain form's `co_await` yields nothing; the cancellable one yields
// true if the node was granted, false if stop was requested while waiting.
// Operations with a richer result derive and define their own
// await_resume(), calling endWait() first.
template <typename Owner, typename Node, bool Cancellable>
class [[nodiscard]] WaitOperation : protected Node {
  static_assert(std::is_base_of_v<WaitNode, Node>);

 public:
  explicit WaitOperation(Owner& owner) noexcept
    requires(!Cancellable)
      : owner_(owner) {}
  WaitOperation(Owner& owner, std::stop_token stop) noexcept
    requires Cancellable
      : owner_(owner), stop_(std::move(stop)) {}
  // Movable until awaited: g++ moves an awaiter co_awaited as an xvalue
  // (as blockingWait does) before it calls await_ready.
  WaitOperation(WaitOperation&& other) noexcept
      : Node(std::move(other.node())), owner_(other.owner_), stop_(std::move(other.stop_)) {
    COIO_ASSERT(other.state == WaitState::idle, "a wait operation moved after it was awaited");
  }
  WaitOperation& operator=(WaitOperation&&) = delete;

  // Only reached while queued if the awaiting frame is destroyed without
  // being resumed; leaving it linked would let the owner resume freed memory.
  ~WaitOperation() {
    if (this->state == WaitState::queued) owner_.forget(node());
  }

  bool await_ready() noexcept { return owner_.tryNow(node()); }

  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) noexcept {
    this->awaiting = h;
    if constexpr (Cancellable) {
      inheritStopToken(stop_, h);  // given none: the awaiting Task's
      // Registered before queueing: once enqueue() returns true we may
      // already have been resumed elsewhere and must touch nothing. If stop
      // was already requested this runs cancel() inline, and the node never
      // queues.
      onStop_.emplace(stop_, OnStop{this});
    }
    return owner_.enqueue(node());
  }

  auto await_resume() noexcept {
    endWait();
    if constexpr (Cancellable) return this->state == WaitState::granted;
  }

 protected:
  // Waits if a cancel() on another thread is still running: after this the
  // node's state is final.
  void endWait() noexcept {
    if constexpr (Cancellable) onStop_.reset();
  }
  Node& node() noexcept { return *this; }

 private:
  struct OnStop {
    WaitOperation* op;
    void operator()() const noexcept { op->owner_.cancel(op->node()); }
  };
  struct NoStop {};

  Owner& owner_;
  [[no_unique_address]] std::conditional_t<Cancellable, std::stop_token, NoStop> stop_;
  [[no_unique_address]] std::conditional_t<Cancellable, std::optional<std::stop_callback<OnStop>>, NoStop> onStop_;
};

}  // namespace coio::detail
