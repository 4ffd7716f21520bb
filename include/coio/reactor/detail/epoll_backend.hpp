#pragma once
// EpollBackend: EpollReactor's ReactorBackend. One epoll instance watches
// the fds operations wait on (edge-triggered, registered on first wait),
// the loop's wake-up eventfd and a timerfd for the earliest timer.
#include <coio/core/detail/assert.hpp>
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/reactor/detail/syscall.hpp>

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace coio::detail {

enum class Direction : std::uint8_t { read = 0, write = 1 };

struct EpollWaiter {
  void (*onReady)(EpollWaiter*) noexcept = nullptr;
};

// What the backend knows of one fd: its registration (made on first wait,
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

/// EpollReactor's backend (see ReactorBackend). Loop thread only.
class EpollBackend {
 public:
  using Clock = LoopCore::Clock;

  /// Throws std::system_error if epoll or the timerfd cannot be created.
  explicit EpollBackend(LoopCore& core)
      : core_(core), epoll_(::epoll_create1(EPOLL_CLOEXEC)),
        timer_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
    if (!epoll_.valid()) throwSystemError(errno, "coio::EpollReactor: epoll_create1");
    if (!timer_.valid()) throwSystemError(errno, "coio::EpollReactor: timerfd_create");
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u64 = kWakeKey;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, core_.wake().fd(), &ev) != 0) {
      throwSystemError(errno, "coio::EpollReactor: registering the wake-up eventfd");
    }
    ev.events = EPOLLIN;
    ev.data.u64 = kTimerKey;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, timer_.get(), &ev) != 0) {
      throwSystemError(errno, "coio::EpollReactor: registering the timerfd");
    }
  }

  LoopCore& core() noexcept { return core_; }

  EpollFdState& state(int fd) {
    COIO_ASSERT(fd >= 0, "epoll state of a negative fd");
    if (static_cast<std::size_t>(fd) >= fds_.size()) fds_.resize(static_cast<std::size_t>(fd) + 1);
    return fds_[static_cast<std::size_t>(fd)];
  }

  // Registers `w` as the waiter; with `rearm`, re-arms an existing
  // registration so that the fd's current state is reported. 0 or an errno.
  // A wait is an operation of `kind` in LoopStats, until endWait.
  int startWait(int fd, Direction dir, EpollWaiter& w, bool rearm, OpKind kind) noexcept {
    COIO_ASSERT(core_.ownedByCaller(), "epoll operation awaited off the reactor's thread");
    EpollFdState& st = state(fd);
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
    core_.meter().submitted(counterOf(kind));
    return 0;
  }

  void endWait(int fd, Direction dir, OpKind kind) noexcept {
    fds_[static_cast<std::size_t>(fd)].waiter[static_cast<std::size_t>(dir)] = nullptr;
    core_.meter().completed(counterOf(kind));
  }

  /// EpollReactor::forget.
  void forget(int fd) noexcept {
    if (fd < 0 || static_cast<std::size_t>(fd) >= fds_.size()) return;
    EpollFdState& st = fds_[static_cast<std::size_t>(fd)];
    // After stop() waiters never resume, so owners may close fds in any order.
    COIO_ASSERT(core_.stopRequested() || (st.waiter[0] == nullptr && st.waiter[1] == nullptr),
                "forget() while an operation waits on the fd");
    if (st.registered) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    st = EpollFdState{st.generation + 1};
  }

  // --- ReactorBackend.

  void poll(std::optional<Clock::duration> timeout) {
    timespec ts{};
    if (timeout) ts = toTimespec<timespec>(*timeout);
    const int n = ::epoll_pwait2(epoll_.get(), events_.data(), static_cast<int>(events_.size()),
                                 timeout ? &ts : nullptr, nullptr);
    const int err = errno;
    core_.woke(timeout);
    if (n < 0) {
      if (err == EINTR) return;
      throwSystemError(err, "coio::EpollReactor: epoll_pwait2");
    }
    core_.meter().dispatched(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) dispatch(events_[static_cast<std::size_t>(i)]);
  }

  // Makes sure the loop wakes by `deadline`; false if the timerfd could not be set.
  bool armDeadline(Clock::time_point deadline) noexcept {
    if (armedDeadline_ == deadline) return true;
    itimerspec spec{};
    spec.it_value = toTimespec<timespec>(deadline.time_since_epoch());
    if (::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) return false;
    armedDeadline_ = deadline;
    return true;
  }

  void quiesce() noexcept {}  // epoll holds no reference to an operation
  void leaveLoop() noexcept {}  // nor is bound to the thread that ran it
  std::size_t unsubmitted() const noexcept { return 0; }  // nor queues them

 private:
  static constexpr std::uint64_t kWakeKey = ~std::uint64_t{0};
  static constexpr std::uint64_t kTimerKey = kWakeKey - 1;
  static std::uint64_t key(int fd, std::uint32_t generation) noexcept {
    return (std::uint64_t{generation} << 32) | static_cast<std::uint32_t>(fd);
  }

  void dispatch(const epoll_event& ev) noexcept {
    if (ev.data.u64 == kWakeKey) {
      core_.wake().drain();  // before taking the queue: see LoopCore::pushRemoteLocked
      core_.resumeRemote();
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
    EpollFdState& st = fds_[fd];  // deque: stays valid while callbacks add fds
    if (st.generation != generation) return;
    if (ev.events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) st.hungUp = true;
    if (ev.events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      st.ready[0] = true;
      if (EpollWaiter* w = st.waiter[0]) w->onReady(w);
    }
    // The reader's coroutine may have forgotten the fd meanwhile.
    if ((ev.events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) && st.generation == generation) {
      st.ready[1] = true;
      if (EpollWaiter* w = st.waiter[1]) w->onReady(w);
    }
  }

  LoopCore& core_;
  FileDescriptor epoll_;
  FileDescriptor timer_;                            // CLOCK_MONOTONIC = steady_clock
  std::optional<Clock::time_point> armedDeadline_;  // what timer_ is set for, until it fires
  std::deque<EpollFdState> fds_;
  std::vector<epoll_event> events_ = std::vector<epoll_event>(256);
};

}  // namespace coio::detail
