#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/detail/inherited_stop.hpp>
#include <coio/core/result.hpp>
#include <coio/detail/fd.hpp>
#include <coio/detail/iovec.hpp>
#include <coio/detail/reactor_base.hpp>
#include <coio/detail/syscall.hpp>

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <stop_token>
#include <vector>

namespace coio {

class EpollReactor;

namespace detail {

enum class Direction : std::uint8_t { read = 0, write = 1 };

struct EpollWaiter {
  void (*onReady)(EpollWaiter*) noexcept = nullptr;
};

// What the reactor knows of one fd: its registration (made on first wait,
// edge-triggered, both directions) and, per direction, whether the fd may be
// ready (cleared only when an attempt would block) and who waits.
struct EpollFdState {
  std::uint32_t generation = 0;  // bumped by forget(): stale events are dropped
  bool registered = false;
  bool hungUp = false;  // the peer closed or the fd failed: ready for good, no more edges
  bool ready[2] = {true, true};
  EpollWaiter* waiter[2] = {nullptr, nullptr};

  // After an attempt that did not block.
  void attempted(Direction dir, bool exhausted) noexcept {
    if (exhausted && !hungUp) ready[static_cast<std::size_t>(dir)] = false;
  }
};

// The non-blocking system call behind each operation: the raw result, or
// -EAGAIN when it would block. `exhausted(result)`: the result proves the
// fd is no longer ready (a short read drained the socket, a short write
// filled it), so the next attempt would only find EAGAIN; the next edge
// reports new readiness. (Not 0 from recv: end of stream stays readable.)
// Each attempt's `kind` is the LoopStats counter of its waits.
struct RecvAttempt {
  static constexpr OpKind kind = OpKind::recv;
  int fd;
  std::span<std::byte> buffer;
  long operator()() noexcept { return retryOnEintr([&] { return ::recv(fd, buffer.data(), buffer.size(), 0); }); }
  bool exhausted(long result) const noexcept { return result > 0 && static_cast<std::size_t>(result) < buffer.size(); }
};
struct SendAttempt {
  static constexpr OpKind kind = OpKind::send;
  int fd;
  std::span<const std::byte> buffer;
  long operator()() noexcept {
    return retryOnEintr([&] { return ::send(fd, buffer.data(), buffer.size(), MSG_NOSIGNAL); });
  }
  bool exhausted(long result) const noexcept { return result > 0 && static_cast<std::size_t>(result) < buffer.size(); }
};
struct SendvAttempt {
  static constexpr OpKind kind = OpKind::send;
  int fd;
  std::span<const iovec> parts;
  long operator()() noexcept {
    msghdr message = messageOf(parts);
    return retryOnEintr([&] { return ::sendmsg(fd, &message, MSG_NOSIGNAL); });
  }
  bool exhausted(long result) const noexcept { return result > 0 && static_cast<std::size_t>(result) < totalBytes(parts); }
};
struct NeverExhausted {
  bool exhausted(long) const noexcept { return false; }
};
struct AcceptAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::accept;
  int fd;
  long operator()() noexcept {
    for (;;) {
      const long r = retryOnEintr([&] { return ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC); });
      if (r != -ECONNABORTED) return r;  // a connection reset while queued: take the next one
    }
  }
};
struct ConnectAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::connect;
  int fd;
  sockaddr_storage address;
  socklen_t length;
  bool started = false;
  long operator()() noexcept {
    if (!started) {
      started = true;
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) return 0;
      // EINTR: the connection attempt goes on asynchronously, like EINPROGRESS.
      return errno == EINPROGRESS || errno == EINTR ? -EAGAIN : -errno;
    }
    int error = 0;
    socklen_t size = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return -errno;
    return -error;
  }
};
struct ReadinessAttempt : NeverExhausted {
  static constexpr OpKind kind = OpKind::poll;
  long operator()() const noexcept { return 0; }
};

template <typename Attempt, typename T, bool Rearm>
class EpollOperation;

}  // namespace detail

/// An event loop over epoll, driven by one thread.
///
/// Guarantees:
/// - Every awaitable below resumes its coroutine on the loop thread (the
///   thread inside run() / runUntil()), and must be awaited there.
/// - I/O operations try their system call first and wait only if it would
///   block; an fd is registered once (edge-triggered, both directions) on its
///   first wait and stays registered until `forget(fd)`.
/// - Fairness: at most kInlineTurnsPerIteration operations per loop
///   iteration complete without suspending (a ready fd, an fd < 0, a stop
///   already requested); later ones still make their system call at once
///   but resume their coroutine in the next iteration, after timers and
///   other fds (detail::InlineCompletion). A socket that is always readable
///   or writable cannot starve the rest of the loop.
/// - One operation per fd and direction may wait at a time (asserted).
/// - Cancellation: each operation takes a std::stop_token; a stop requested
///   (on the loop thread) while it waits deregisters the waiter and the
///   operation yields std::errc::operation_canceled in a later iteration.
///   Nothing of the caller's buffer is touched after that. Given no token
///   (a default one), an operation awaited from a coio Task uses the token
///   the Task runs under (see currentStopToken).
/// - stop() (any thread) makes run() return after the current iteration;
///   spawned tasks that never started are destroyed then, the others with
///   the reactor, deregistering their waits.
/// - Timers wake the loop through one timerfd, set only when the earliest
///   deadline changes (a wait with a timeout of its own costs the kernel an
///   hrtimer per wait).
/// See ReactorBase (include/coio/detail/reactor_base.hpp) for run, runUntil,
/// spawn, schedule, the timers, stats() and the stall detector, which both
/// reactors share.
class EpollReactor : public detail::ReactorBase<EpollReactor> {
 public:
  /// The awaitable type of this reactor's I/O operations.
  template <typename Attempt, typename T, bool Rearm = false>
  using Operation = detail::EpollOperation<Attempt, T, Rearm>;

  /// Throws std::system_error if epoll, the wake-up eventfd or the timerfd
  /// cannot be created.
  EpollReactor();
  ~EpollReactor() { closeLoop(); }

  /// Completes once `fd` is readable (resp. writable) at or after the call:
  /// the fd's state is checked when the wait starts, so an edge that came
  /// before the call is not lost and a drained fd is not reported again.
  /// Yields an error if the fd cannot be polled (e.g. a regular file: EPERM).
  Operation<detail::ReadinessAttempt, void, true> readable(int fd, std::stop_token stop = {}) noexcept;
  /// As readable(), for writability.
  Operation<detail::ReadinessAttempt, void, true> writable(int fd, std::stop_token stop = {}) noexcept;

  /// accept4 (non-blocking, close-on-exec): the new fd.
  Operation<detail::AcceptAttempt, int> accept(int fd, std::stop_token stop = {}) noexcept;
  /// Connects a non-blocking socket.
  Operation<detail::ConnectAttempt, void> connect(int fd, const sockaddr* address, socklen_t length,
                                                  std::stop_token stop = {}) noexcept;
  /// recv: bytes read, 0 at end of stream.
  Operation<detail::RecvAttempt, std::size_t> recv(int fd, std::span<std::byte> buffer,
                                                    std::stop_token stop = {}) noexcept;
  /// send (MSG_NOSIGNAL): bytes written, possibly fewer than asked.
  Operation<detail::SendAttempt, std::size_t> send(int fd, std::span<const std::byte> buffer,
                                                    std::stop_token stop = {}) noexcept;
  /// sendmsg of `parts` (MSG_NOSIGNAL, at most IOV_MAX of them): bytes
  /// written, possibly fewer than asked. `parts` must stay valid until the
  /// co_await returns.
  Operation<detail::SendvAttempt, std::size_t> sendv(int fd, std::span<const iovec> parts,
                                                      std::stop_token stop = {}) noexcept;

  /// Forgets `fd`; call it before closing an fd this reactor has waited on.
  /// No operation may be pending on it, unless the reactor has stopped.
  void forget(int fd) noexcept;

 private:
  friend class detail::ReactorBase<EpollReactor>;
  template <typename, typename, bool>
  friend class detail::EpollOperation;

  static constexpr std::uint64_t kWakeKey = ~std::uint64_t{0};
  static constexpr std::uint64_t kTimerKey = kWakeKey - 1;
  static std::uint64_t key(int fd, std::uint32_t generation) noexcept {
    return (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
  }

  detail::EpollFdState& state(int fd) {
    COIO_ASSERT(fd >= 0, "epoll state of a negative fd");
    if (static_cast<std::size_t>(fd) >= fds_.size()) fds_.resize(static_cast<std::size_t>(fd) + 1);
    return fds_[static_cast<std::size_t>(fd)];
  }

  // Registers `w` as the waiter; with `rearm`, re-arms an existing
  // registration so that the fd's current state is reported. 0 or an errno.
  // A wait is an operation of `kind` in LoopStats, until endWait.
  int startWait(int fd, detail::Direction dir, detail::EpollWaiter& w, bool rearm, OpKind kind) noexcept {
    COIO_ASSERT(ownedByCaller(), "epoll operation awaited off the reactor's thread");
    detail::EpollFdState& st = state(fd);
    const auto d = static_cast<std::size_t>(dir);
    COIO_ASSERT(st.waiter[d] == nullptr, "two operations wait on the same fd in the same direction");
    st.ready[d] = false;
    if (!st.registered || rearm) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.u64 = key(fd, st.generation);
      if (::epoll_ctl(epoll_.get(), st.registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) return errno;
      st.registered = true;
    }
    st.waiter[d] = &w;
    meter_.submitted(detail::counterOf(kind));
    return 0;
  }

  void endWait(int fd, detail::Direction dir, OpKind kind) noexcept {
    fds_[static_cast<std::size_t>(fd)].waiter[static_cast<std::size_t>(dir)] = nullptr;
    meter_.completed(detail::counterOf(kind));
  }

  void poll(std::optional<Clock::duration> timeout);
  void quiesce() noexcept {}  // epoll holds no reference to an operation
  void leaveLoop() noexcept {}  // nor is bound to the thread that ran it
  std::size_t unsubmitted() const noexcept { return 0; }  // nor queues them

  // Makes sure the loop wakes by `deadline` (ReactorBase::waitTimeout);
  // false if the timerfd could not be set.
  bool armDeadline(Clock::time_point deadline) noexcept {
    if (armedDeadline_ == deadline) return true;
    itimerspec spec{};
    spec.it_value = detail::toTimespec<timespec>(deadline.time_since_epoch());
    if (::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) return false;
    armedDeadline_ = deadline;
    return true;
  }

  void dispatch(const epoll_event& ev) noexcept {
    if (ev.data.u64 == kWakeKey) {
      wake().drain();  // before taking the queue: see LoopCore::pushRemoteLocked
      resumeRemote();
      return;
    }
    if (ev.data.u64 == kTimerKey) {  // the loop fires its due timers next
      std::uint64_t expirations;
      (void)::read(timer_.get(), &expirations, sizeof expirations);  // level-triggered: drain it
      armedDeadline_.reset();
      return;
    }
    const auto fd = static_cast<std::size_t>(ev.data.u64 & 0xffffffffu);
    const auto generation = static_cast<std::uint32_t>(ev.data.u64 >> 32);
    detail::EpollFdState& st = fds_[fd];  // deque: stays valid while callbacks add fds
    if (st.generation != generation) return;
    if (ev.events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) st.hungUp = true;
    if (ev.events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      st.ready[0] = true;
      if (detail::EpollWaiter* w = st.waiter[0]) w->onReady(w);
    }
    // The reader's coroutine may have forgotten the fd meanwhile.
    if ((ev.events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) && st.generation == generation) {
      st.ready[1] = true;
      if (detail::EpollWaiter* w = st.waiter[1]) w->onReady(w);
    }
  }

  detail::FileDescriptor epoll_;
  detail::FileDescriptor timer_;                // CLOCK_MONOTONIC = steady_clock
  std::optional<Clock::time_point> armedDeadline_;  // what timer_ is set for, until it fires
  std::deque<detail::EpollFdState> fds_;
  std::vector<epoll_event> events_ = std::vector<epoll_event>(256);
};

namespace detail {

/// One epoll-driven operation (see EpollReactor). `co_await` yields
/// Result<T>; the coroutine resumes on the loop thread.
template <typename Attempt, typename T, bool Rearm>
class [[nodiscard]] EpollOperation : EpollWaiter {
 public:
  EpollOperation(EpollReactor& reactor, int fd, Direction dir, Attempt attempt, std::stop_token stop) noexcept
      : reactor_(reactor), fd_(fd), dir_(dir), attempt_(std::move(attempt)), stop_(std::move(stop)) {
    onReady = &EpollOperation::ready;
  }
  EpollOperation(const EpollOperation&) = delete;
  EpollOperation& operator=(const EpollOperation&) = delete;
  ~EpollOperation() {
    if (waiting_) reactor_.endWait(fd_, dir_, Attempt::kind);  // the frame is destroyed while suspended here
  }

  // Given no token, the attempt waits for await_suspend, which knows the awaiting Task's.
  bool await_ready() noexcept { return stop_.stop_possible() && inline_.admit(reactor_, tryComplete()); }

  template <typename Promise>
  bool await_suspend(std::coroutine_handle<Promise> h) {
    if (inheritStopToken(stop_, h) && inline_.admit(reactor_, tryComplete())) return false;
    handle_ = h;
    if (inline_.deferred(reactor_, h)) return true;  // done, but the loop's other work goes first
    if (const int err = reactor_.startWait(fd_, dir_, *this, Rearm, Attempt::kind)) {
      result_ = -err;
      return false;
    }
    waiting_ = true;
    if (stop_.stop_possible()) onStop_.emplace(stop_, OnStop{this});
    return true;
  }

  Result<T> await_resume() {
    onStop_.reset();
    return toResult<T>(result_);
  }

 private:
  struct OnStop {
    EpollOperation* self;
    void operator()() const noexcept {
      COIO_ASSERT(self->reactor_.isInLoopThread(), "stop requested off the reactor's thread");
      if (!self->waiting_) return;
      self->finish(-ECANCELED);
      self->reactor_.post(self->posted_, self->handle_);
    }
  };

  // True (result_ set) if the operation is over without waiting.
  bool tryComplete() {
    if (fd_ < 0) {  // a closed or moved-from socket: no fd state to touch
      result_ = -EBADF;
      return true;
    }
    if (stop_.stop_requested()) {
      result_ = -ECANCELED;
      return true;
    }
    if constexpr (Rearm) {
      return false;
    } else {
      return tryNow();
    }
  }

  // The system call, if the fd may be ready; true if it did not block.
  bool tryNow() {
    EpollFdState& st = reactor_.state(fd_);
    if (!st.ready[static_cast<std::size_t>(dir_)]) return false;
    result_ = attempt_();
    if (result_ == -EAGAIN) return false;
    st.attempted(dir_, attempt_.exhausted(result_));
    return true;
  }

  void finish(long result) noexcept {
    reactor_.endWait(fd_, dir_, Attempt::kind);
    waiting_ = false;
    result_ = result;
  }

  static void ready(EpollWaiter* w) noexcept {
    auto* self = static_cast<EpollOperation*>(w);
    const long r = self->attempt_();
    EpollFdState& st = self->reactor_.state(self->fd_);
    if (r == -EAGAIN) {  // spurious: wait for the next edge
      st.ready[static_cast<std::size_t>(self->dir_)] = false;
      return;
    }
    st.attempted(self->dir_, self->attempt_.exhausted(r));
    self->finish(r);
    self->handle_.resume();
  }

  EpollReactor& reactor_;
  int fd_;
  Direction dir_;
  bool waiting_ = false;
  InlineCompletion inline_;
  Attempt attempt_;
  std::stop_token stop_;
  long result_ = 0;
  std::coroutine_handle<> handle_;
  PostedResume posted_;
  std::optional<std::stop_callback<OnStop>> onStop_;
};

}  // namespace detail

inline EpollReactor::EpollReactor()
    : epoll_(::epoll_create1(EPOLL_CLOEXEC)), timer_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
  if (!epoll_.valid()) detail::throwSystemError(errno, "coio::EpollReactor: epoll_create1");
  if (!timer_.valid()) detail::throwSystemError(errno, "coio::EpollReactor: timerfd_create");
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.u64 = kWakeKey;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake().fd(), &ev) != 0) {
    detail::throwSystemError(errno, "coio::EpollReactor: registering the wake-up eventfd");
  }
  ev.events = EPOLLIN;
  ev.data.u64 = kTimerKey;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, timer_.get(), &ev) != 0) {
    detail::throwSystemError(errno, "coio::EpollReactor: registering the timerfd");
  }
}

inline auto EpollReactor::readable(int fd, std::stop_token stop) noexcept
    -> Operation<detail::ReadinessAttempt, void, true> {
  return {*this, fd, detail::Direction::read, {}, std::move(stop)};
}
inline auto EpollReactor::writable(int fd, std::stop_token stop) noexcept
    -> Operation<detail::ReadinessAttempt, void, true> {
  return {*this, fd, detail::Direction::write, {}, std::move(stop)};
}
inline auto EpollReactor::accept(int fd, std::stop_token stop) noexcept -> Operation<detail::AcceptAttempt, int> {
  return {*this, fd, detail::Direction::read, detail::AcceptAttempt{{}, fd}, std::move(stop)};
}
inline auto EpollReactor::connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop) noexcept
    -> Operation<detail::ConnectAttempt, void> {
  detail::ConnectAttempt attempt{{}, fd, {}, length};
  std::memcpy(&attempt.address, address, std::min<std::size_t>(length, sizeof attempt.address));
  return {*this, fd, detail::Direction::write, attempt, std::move(stop)};
}
inline auto EpollReactor::recv(int fd, std::span<std::byte> buffer, std::stop_token stop) noexcept
    -> Operation<detail::RecvAttempt, std::size_t> {
  return {*this, fd, detail::Direction::read, detail::RecvAttempt{fd, buffer}, std::move(stop)};
}
inline auto EpollReactor::send(int fd, std::span<const std::byte> buffer, std::stop_token stop) noexcept
    -> Operation<detail::SendAttempt, std::size_t> {
  return {*this, fd, detail::Direction::write, detail::SendAttempt{fd, buffer}, std::move(stop)};
}

inline auto EpollReactor::sendv(int fd, std::span<const iovec> parts, std::stop_token stop) noexcept
    -> Operation<detail::SendvAttempt, std::size_t> {
  return {*this, fd, detail::Direction::write, detail::SendvAttempt{fd, parts}, std::move(stop)};
}

inline void EpollReactor::forget(int fd) noexcept {
  if (fd < 0 || static_cast<std::size_t>(fd) >= fds_.size()) return;
  detail::EpollFdState& st = fds_[static_cast<std::size_t>(fd)];
  // After stop() waiters never resume, so owners may close fds in any order.
  COIO_ASSERT(stopRequested() || (st.waiter[0] == nullptr && st.waiter[1] == nullptr),
              "forget() while an operation waits on the fd");
  if (st.registered) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  st = detail::EpollFdState{st.generation + 1};
}

inline void EpollReactor::poll(std::optional<Clock::duration> timeout) {
  timespec ts{};
  if (timeout) ts = detail::toTimespec<timespec>(*timeout);
  const int n = ::epoll_pwait2(epoll_.get(), events_.data(), static_cast<int>(events_.size()),
                               timeout ? &ts : nullptr, nullptr);
  const int err = errno;
  woke(timeout);
  if (n < 0) {
    if (err == EINTR) return;
    detail::throwSystemError(err, "coio::EpollReactor: epoll_pwait2");
  }
  meter_.dispatched(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) dispatch(events_[static_cast<std::size_t>(i)]);
}

}  // namespace coio
