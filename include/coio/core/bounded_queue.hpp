#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/wait_list.hpp>
#include <coio/core/result.hpp>

#include <cstddef>
#include <mutex>
#include <optional>
#include <stop_token>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace coio {

template <typename T>
class BoundedQueue;

namespace detail {

template <typename T>
struct QueueProducer : WaitNode {
  T* item = nullptr;  // the caller's; moved from only when it enters the queue
};

template <typename T>
struct QueueConsumer : WaitNode {
  std::optional<T> item;  // filled under the queue's lock when granted
};

// What a queue operation that ended in `s` reports: nothing (granted), the
// queue was closed, stop was requested, or (a try) the queue was full/empty.
inline std::error_code queueError(WaitState s) noexcept {
  switch (s) {
    case WaitState::granted: return {};
    case WaitState::closed: return make_error_code(Errc::closed);
    case WaitState::cancelled: return std::make_error_code(std::errc::operation_canceled);
    default: return std::make_error_code(std::errc::operation_would_block);
  }
}

// `co_await queue.push(item)`.
template <typename T, bool Cancellable>
class [[nodiscard]] QueuePushOperation : public WaitOperation<BoundedQueue<T>, QueueProducer<T>, Cancellable> {
 public:
  template <typename... Stop>
  QueuePushOperation(BoundedQueue<T>& queue, T& item, Stop... stop) noexcept
      : WaitOperation<BoundedQueue<T>, QueueProducer<T>, Cancellable>(queue, std::move(stop)...) {
    this->item = &item;
  }

  Result<void> await_resume() noexcept {
    this->endWait();
    return queueError(this->state);
  }
};

// `co_await queue.pop()`.
template <typename T, bool Cancellable>
class [[nodiscard]] QueuePopOperation : public WaitOperation<BoundedQueue<T>, QueueConsumer<T>, Cancellable> {
 public:
  template <typename... Stop>
  explicit QueuePopOperation(BoundedQueue<T>& queue, Stop... stop) noexcept
      : WaitOperation<BoundedQueue<T>, QueueConsumer<T>, Cancellable>(queue, std::move(stop)...) {}

  Result<T> await_resume() noexcept {
    this->endWait();
    if (this->state == WaitState::granted) return std::move(*this->item);
    return queueError(this->state);
  }
};

}  // namespace detail

/// A bounded multi-producer multi-consumer channel for coroutines: `push`
/// waits for room, `pop` waits for an item, `close()` ends it.
///
/// Results (coio::Result, errors as std::error_code):
/// - `co_await push(std::move(item))` -> `Result<void>`: success once the
///   item is in the queue or handed to a consumer; `Errc::closed` if the
///   queue was closed first; `std::errc::operation_canceled` if the
///   cancellable form's stop was requested first. The item is moved from
///   only on success: on failure it is still the caller's, untouched (pass
///   a named variable to keep it; a temporary dies with the expression).
/// - `co_await pop()` -> `Result<T>`: the oldest item; `Errc::closed` once
///   the queue is closed and every item pushed before has been popped;
///   `std::errc::operation_canceled` as for push.
/// - `tryPush` / `tryPop` never wait: as above, with
///   `std::errc::operation_would_block` where push / pop would have waited.
///
/// Guarantees:
/// - FIFO everywhere: items leave in the order they entered; producers
///   waiting for room get in, and consumers waiting for items are served,
///   in arrival order. Nobody barges: `tryPush` fails while producers wait
///   (the queue is full) and `tryPop` while consumers wait (it is empty).
/// - A pop whose stop is requested just as a push hands it an item either
///   gets the item (and yields it) or gives up before the hand-over, which
///   then goes to the next consumer or the queue: an item is never lost.
///   Both sides decide under the queue's lock.
/// - `close()` fails every waiting push (their items stay with their
///   callers) and every later one; waiting pops get `Errc::closed` (they
///   wait only on an empty queue); items already in the queue are still
///   delivered. Closing twice is harmless.
/// - A push happens-before the pop that receives its item.
/// - Which thread resumes a waiting coroutine: a consumer, the thread whose
///   push / tryPush hands it an item; a producer, the thread whose pop /
///   tryPop frees a slot for it (its item enters the queue within that
///   call); every waiter, the thread that calls close(); a cancelled one,
///   the thread that requests stop. Always inline, before that call
///   returns, with the 32-deep trampoline of Semaphore for hand-over
///   chains. An operation that need not wait continues on the awaiting
///   thread without suspending.
/// - Every operation is thread-safe and takes the queue's mutex once (no
///   lock-free path). Storage for `capacity` items is allocated up front.
///   T must be nothrow move-constructible (items move under the lock).
/// - A waiter whose frame is destroyed while waiting leaves the queue.
///   Destroying the queue while coroutines wait is a programming error
///   (asserted); items still in it are destroyed with it.
template <typename T>
class BoundedQueue {
  static_assert(std::is_nothrow_move_constructible_v<T>,
                "coio::BoundedQueue moves items under its lock: T must be nothrow move-constructible");
  using Producer = detail::QueueProducer<T>;
  using Consumer = detail::QueueConsumer<T>;

 public:
  /// The item type.
  using value_type = T;
  /// What push(item) returns. `co_await` it once: it yields Result<void>,
  /// success once the item is in the queue or with a consumer, else
  /// Errc::closed; it continues at once if there is room (or the queue is
  /// closed), else it is resumed on the thread whose pop / tryPop makes room
  /// for it, or that calls close(). The item is read only then: keep it alive.
  using PushAwaitable = detail::QueuePushOperation<T, false>;
  /// What push(item, stop) returns: like PushAwaitable, but yields
  /// std::errc::operation_canceled, the item untouched, if `stop` is
  /// requested while it waits (resumed on the thread that requested stop).
  using CancellablePushAwaitable = detail::QueuePushOperation<T, true>;
  /// What pop() returns. `co_await` it once: it yields Result<T>, the oldest
  /// item or Errc::closed; it continues at once if an item is there (or the
  /// queue is closed and drained), else it is resumed on the thread whose
  /// push / tryPush hands it an item, or that calls close().
  using PopAwaitable = detail::QueuePopOperation<T, false>;
  /// What pop(stop) returns: like PopAwaitable, but yields
  /// std::errc::operation_canceled if `stop` is requested while it waits
  /// (resumed on the thread that requested stop).
  using CancellablePopAwaitable = detail::QueuePopOperation<T, true>;

  /// An open, empty queue holding at most `capacity` (at least 1) items.
  explicit BoundedQueue(std::size_t capacity) : ring_(capacity) {
    COIO_ASSERT(capacity >= 1, "coio::BoundedQueue needs a capacity of at least 1");
  }
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;
  ~BoundedQueue() {
    COIO_ASSERT(producers_.empty() && consumers_.empty(), "coio::BoundedQueue destroyed with waiters");
  }

  /// `co_await q.push(std::move(item))` appends `item`, waiting for room in
  /// FIFO order; yields Result<void> (see the class comment).
  PushAwaitable push(T&& item) noexcept { return {*this, item}; }

  /// Like push(), but gives up if `stop` is requested while waiting
  /// (std::errc::operation_canceled, `item` untouched).
  CancellablePushAwaitable push(T&& item, std::stop_token stop) noexcept {
    return {*this, item, std::move(stop)};
  }

  /// `co_await q.pop()` takes the oldest item, waiting for one in FIFO
  /// order; yields Result<T> (see the class comment).
  PopAwaitable pop() noexcept { return PopAwaitable(*this); }

  /// Like pop(), but gives up if `stop` is requested while waiting
  /// (std::errc::operation_canceled). An item available at once is taken
  /// even if stop was requested.
  CancellablePopAwaitable pop(std::stop_token stop) noexcept {
    return CancellablePopAwaitable(*this, std::move(stop));
  }

  /// Appends `item` if there is room: success, std::errc::operation_would_block
  /// (full) or Errc::closed; `item` is moved from only on success. A waiting
  /// consumer that gets it is resumed inline on this thread.
  Result<void> tryPush(T&& item) noexcept {
    Producer p;
    p.item = &item;
    return detail::queueError(settle(p, false));
  }

  /// Takes the oldest item if there is one: the item,
  /// std::errc::operation_would_block (empty) or Errc::closed (closed and
  /// empty). A waiting producer let into the freed slot is resumed inline on
  /// this thread.
  Result<T> tryPop() noexcept {
    Consumer c;
    const detail::WaitState s = settle(c, false);
    if (s == detail::WaitState::granted) return std::move(*c.item);
    return detail::queueError(s);
  }

  /// Closes the queue: every waiting push and pop, and every later push,
  /// fails with Errc::closed; items already queued can still be popped.
  /// Waiters are resumed inline on this thread, oldest first.
  void close() noexcept {
    detail::WaitNode* waiters;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      // At most one side waits: consumers only on an empty ring, producers
      // only on a full one.
      waiters = (consumers_.empty() ? producers_ : consumers_).takeAll(detail::WaitState::closed);
    }
    detail::resumeInline(waiters);
  }

  /// Whether close() has been called.
  bool isClosed() const noexcept {
    std::lock_guard lock(mutex_);
    return closed_;
  }

  /// Items in the queue right now (a snapshot).
  std::size_t size() const noexcept {
    std::lock_guard lock(mutex_);
    return count_;
  }

  /// The most items the queue holds.
  std::size_t capacity() const noexcept { return ring_.size(); }

 private:
  template <typename, typename, bool>
  friend class detail::WaitOperation;

  // The WaitOperation protocol (wait_list.hpp), for both sides.
  template <typename Node>
  bool tryNow(Node& n) noexcept {
    return settle(n, false) != detail::WaitState::idle;
  }
  template <typename Node>
  bool enqueue(Node& n) noexcept {
    return settle(n, true) == detail::WaitState::queued;
  }
  template <typename Node>
  void cancel(Node& n) noexcept {
    detail::cancelWait(mutex_, waitersOf(n), n);
  }
  template <typename Node>
  void forget(Node& n) noexcept {
    detail::forgetWait(mutex_, waitersOf(n), n);
  }

  detail::WaitList& waitersOf(Producer&) noexcept { return producers_; }
  detail::WaitList& waitersOf(Consumer&) noexcept { return consumers_; }

  // One attempt for `n`, under the lock. Returns its outcome: granted or
  // closed (also stored in `n`), cancelled if it was cancelled before it
  // could queue, idle if it must wait; if it must wait and `mayQueue`, it
  // is queued instead (returns queued; nothing of it is touched after the
  // lock is dropped). The waiter of the other side that the attempt
  // satisfied, if any, is resumed inline once the lock is dropped.
  template <typename Node>
  detail::WaitState settle(Node& n, bool mayQueue) noexcept {
    detail::WaitNode* satisfied = nullptr;
    detail::WaitState outcome;
    {
      std::lock_guard lock(mutex_);
      if (n.state == detail::WaitState::cancelled) return n.state;
      outcome = attempt(n, satisfied);
      if (outcome == detail::WaitState::idle) {
        if (!mayQueue) return outcome;
        waitersOf(n).pushBack(n);
        return detail::WaitState::queued;
      }
      n.state = outcome;
    }
    detail::resumeInline(satisfied);
    return outcome;
  }

  // A push: hands the item to the oldest waiting consumer (then the ring
  // is empty) or appends it to the ring; idle if the ring is full.
  detail::WaitState attempt(Producer& p, detail::WaitNode*& satisfied) noexcept {
    if (closed_) return detail::WaitState::closed;
    if (!consumers_.empty()) {
      auto& c = static_cast<Consumer&>(consumers_.popFront());
      c.item.emplace(std::move(*p.item));
      c.state = detail::WaitState::granted;
      satisfied = &c;
    } else if (count_ < ring_.size()) {
      append(*p.item);
    } else {
      return detail::WaitState::idle;
    }
    return detail::WaitState::granted;
  }

  // A pop: takes the oldest item, and lets the oldest waiting producer's
  // item (then the ring was full) into the freed slot; idle if the ring is
  // empty and the queue open.
  detail::WaitState attempt(Consumer& c, detail::WaitNode*& satisfied) noexcept {
    if (count_ == 0) return closed_ ? detail::WaitState::closed : detail::WaitState::idle;
    std::optional<T>& oldest = ring_[head_];
    c.item.emplace(std::move(*oldest));
    oldest.reset();
    head_ = (head_ + 1) % ring_.size();
    --count_;
    if (!producers_.empty()) {
      auto& p = static_cast<Producer&>(producers_.popFront());
      append(*p.item);
      p.state = detail::WaitState::granted;
      satisfied = &p;
    }
    return detail::WaitState::granted;
  }

  void append(T& item) noexcept {
    ring_[(head_ + count_) % ring_.size()].emplace(std::move(item));
    ++count_;
  }

  mutable std::mutex mutex_;
  std::vector<std::optional<T>> ring_;  // count_ items from head_ on, wrapping
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  bool closed_ = false;
  detail::WaitList producers_;  // waiting only while the ring is full and the queue open
  detail::WaitList consumers_;  // waiting only while the ring is empty and the queue open
};

}  // namespace coio
