#pragma once
#include <mutex>
#include <type_traits>
#include <utility>

namespace coio {

/// Which side of a lock a LockGuard holds.
enum class LockKind {
  exclusive,  ///< taken with lock(), released with unlock()
  shared,     ///< taken with lockShared(), released with unlockShared()
};

/// Owns a lock taken on a coio Mutex or SharedMutex and releases it when
/// destroyed: what `co_await m.scopedLock()` yields. Move-only.
///
/// Guarantees: each acquisition is released exactly once, by the guard that
/// owns it last (destruction, unlock() or being move-assigned over).
/// Releasing behaves as the mutex's unlock: the next waiter, if any, is
/// resumed inline on the releasing thread. An empty guard (default-made,
/// moved from, or from a cancelled `scopedLock(stop)`) releases nothing.
template <typename M, LockKind Kind = LockKind::exclusive>
class [[nodiscard]] LockGuard {
 public:
  /// The mutex type.
  using mutex_type = M;

  /// Owns nothing.
  LockGuard() noexcept = default;
  /// Adopts a lock (of kind `Kind`) the caller holds on `mutex`.
  LockGuard(M& mutex, std::adopt_lock_t) noexcept : mutex_(&mutex) {}
  /// Takes over `other`'s lock; `other` becomes empty.
  LockGuard(LockGuard&& other) noexcept : mutex_(std::exchange(other.mutex_, nullptr)) {}
  /// Releases the lock held, if any, and takes over `other`'s.
  LockGuard& operator=(LockGuard&& other) noexcept {
    if (this != &other) {
      unlock();
      mutex_ = std::exchange(other.mutex_, nullptr);
    }
    return *this;
  }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;
  ~LockGuard() { unlock(); }

  /// Whether the guard holds a lock.
  bool ownsLock() const noexcept { return mutex_ != nullptr; }
  /// Same as ownsLock().
  explicit operator bool() const noexcept { return ownsLock(); }
  /// The mutex whose lock the guard holds (nullptr if none).
  M* mutex() const noexcept { return mutex_; }

  /// Releases the lock now, if held; the guard becomes empty.
  void unlock() noexcept {
    if (M* m = std::exchange(mutex_, nullptr)) {
      if constexpr (Kind == LockKind::exclusive) {
        m->unlock();
      } else {
        m->unlockShared();
      }
    }
  }

 private:
  M* mutex_ = nullptr;
};

namespace detail {

// `co_await m.scopedLock()`: the acquisition `Acquire` (whose await_resume
// yields nothing, or for a cancellable one whether it got the lock), made to
// yield a LockGuard instead: an empty one if a cancellable acquisition gave
// up.
template <typename Guard, typename Acquire>
class [[nodiscard]] ScopedLockOperation : public Acquire {
  static constexpr bool kCancellable = std::is_same_v<decltype(std::declval<Acquire&>().await_resume()), bool>;

 public:
  template <typename... Args>
  ScopedLockOperation(typename Guard::mutex_type& mutex, Args&&... args) noexcept
      : Acquire(std::forward<Args>(args)...), mutex_(mutex) {}

  Guard await_resume() noexcept {
    if constexpr (kCancellable) {
      if (!Acquire::await_resume()) return Guard{};
    } else {
      Acquire::await_resume();
    }
    return Guard(mutex_, std::adopt_lock);
  }

 private:
  typename Guard::mutex_type& mutex_;
};

}  // namespace detail

}  // namespace coio
