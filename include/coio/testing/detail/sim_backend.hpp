#pragma once
// SimBackend: coio::sim::SimReactor's ReactorBackend. It keeps virtual
// time, orders each ready phase by a seeded generator, and carries the
// simulated sockets' bytes: a byte sent arrives at the peer one link
// latency later, an event in its queue; when nothing is ready the clock
// jumps to the next event or timer.
#include <coio/core/detail/assert.hpp>
#include <coio/reactor/detail/loop_core.hpp>

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

namespace coio::sim {

/// A simulation that cannot go on: nothing is ready to run, no timer is set
/// and no byte is on its way, yet the loop was asked to wait (every task
/// waits for something that will never happen). Thrown out of run() /
/// runUntil() instead of waiting for ever.
class Deadlock : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// splitmix64: one 64-bit state, the same sequence on every compiler and
/// standard library (std::shuffle and the distributions are not).
class Random {
 public:
  explicit Random(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (n > 0; the bias of the modulo is below 2^-32 for
  /// the n a simulation draws).
  std::uint64_t below(std::uint64_t n) noexcept { return next() % n; }

 private:
  std::uint64_t state_;
};

}  // namespace coio::sim

namespace coio::detail {

/// A simulated socket's waiting operation (recv, send, readable, writable):
/// `onEvent` is called when the socket's state changed so that it may
/// complete; it returns whether it did (it then resumed its coroutine).
struct SimWaiter {
  bool (*onEvent)(SimWaiter*) noexcept = nullptr;
};

/// One end of a simulated connection.
struct SimSocket {
  int peer = -1;
  bool open = true;           // not closed by its owner
  bool finReceived = false;   // the peer's FIN arrived: reads end once `inbox` is drained
  bool finSent = false;       // shutdown or close: no more sends
  bool reset = false;         // RST: every operation fails with ECONNRESET
  std::deque<std::byte> inbox;  // arrived, not read yet
  std::size_t inFlight = 0;     // bytes sent to this socket, not arrived yet
  std::size_t capacity = 0;     // inbox + inFlight may not exceed it (the window)
  std::chrono::steady_clock::duration latency{};  // of bytes sent to this socket
  SimWaiter* reader = nullptr;
  SimWaiter* writer = nullptr;
};

/// SimReactor's backend (see ReactorBackend). Loop thread only.
class SimBackend {
 public:
  using Clock = LoopCore::Clock;
  /// ReactorLoop: the clock is this backend's, and it orders ready phases.
  static constexpr bool kVirtualTime = true;

  /// The first fd number of simulated sockets: far above any real fd, so
  /// that a real fd handed to an operation by mistake is refused.
  static constexpr int kFirstFd = 1 << 24;

  SimBackend(LoopCore& core, std::uint64_t seed) : core_(core), random_(seed) { trace(seed); }

  LoopCore& core() noexcept { return core_; }
  Clock::time_point now() const noexcept { return now_; }
  sim::Random& random() noexcept { return random_; }
  std::uint64_t traceHash() const noexcept { return trace_; }

  /// Mixes `value` into the trace hash (FNV-1a over its bytes): what the
  /// run did, in order, so that two runs of one seed can be compared.
  void trace(std::uint64_t value) noexcept {
    for (int i = 0; i < 8; ++i) {
      trace_ ^= (value >> (8 * i)) & 0xff;
      trace_ *= 0x100000001B3ull;
    }
  }

  // --- ReactorBackend.

  void poll(std::optional<Clock::duration> timeout) {
    core_.woke(timeout);
    // Tasks spawned before the loop ran were handed over as from another
    // thread (the simulation has no other): they start here, in spawn
    // order, and the loop looks at what they made ready before time moves.
    if (core_.resumeRemote()) return;
    if (!timeout || *timeout != Clock::duration::zero()) {
      // Nothing ready: the clock jumps to what happens next.
      std::optional<Clock::time_point> next = core_.timers().nextDeadline();
      if (!events_.empty() && (!next || events_.top().at < *next)) next = events_.top().at;
      if (!next) {
        throw sim::Deadlock("coio::sim: deadlock at " + std::to_string(seconds(now_)) +
                            " s of virtual time: no coroutine is ready, no timer is set and no byte is on its way");
      }
      now_ = std::max(now_, *next);
      trace(static_cast<std::uint64_t>(now_.time_since_epoch().count()));
    }
    deliverDue();
  }
  bool armDeadline(Clock::time_point) noexcept { return true; }  // poll reads the timers itself
  void quiesce() noexcept {}
  void leaveLoop() noexcept {}
  std::size_t unsubmitted() const noexcept { return 0; }

  /// ReactorLoop, before each ready phase: the coroutines ready at this
  /// instant run in an order drawn from the seed (Fisher-Yates).
  void order(std::vector<std::coroutine_handle<>>& ready) noexcept {
    trace(ready.size());
    for (std::size_t i = ready.size(); i > 1; --i) {
      const std::size_t j = static_cast<std::size_t>(random_.below(i));
      std::swap(ready[i - 1], ready[j]);
      trace(j);
    }
  }

  // --- Sockets.

  /// A connected pair whose bytes take `latency` each way, with windows of
  /// `capacity` bytes.
  std::pair<int, int> socketPair(Clock::duration latency, std::size_t capacity) {
    const int a = kFirstFd + static_cast<int>(sockets_.size());
    const int b = a + 1;
    sockets_.emplace_back();
    sockets_.emplace_back();
    for (int fd : {a, b}) {
      SimSocket& s = *socket(fd);
      s.peer = fd == a ? b : a;
      s.capacity = capacity;
      s.latency = latency;
    }
    return {a, b};
  }

  /// Whether `s`'s peer is still open (not closed by its owner).
  bool peerOpen(const SimSocket& s) const noexcept {
    return at(s.peer).open;
  }

  /// The socket `fd` names, or null (not a simulated socket, or closed).
  SimSocket* socket(int fd) noexcept {
    if (fd < kFirstFd || static_cast<std::size_t>(fd - kFirstFd) >= sockets_.size()) return nullptr;
    SimSocket& s = at(fd);
    return s.open ? &s : nullptr;
  }

  /// Sends what fits of `data` from `fd` (at least a byte: the caller
  /// checked there is room); it arrives one latency later. The bytes sent.
  std::size_t send(SimSocket& from, const std::byte* data, std::size_t n) {
    SimSocket& to = at(from.peer);
    n = std::min(n, room(from));
    to.inFlight += n;
    events_.push(Event{now_ + to.latency, seq_++, from.peer, std::vector<std::byte>(data, data + n), false});
    trace(n);
    return n;
  }

  /// Bytes `from` may send now: its peer's window less what is already
  /// there or on its way.
  std::size_t room(const SimSocket& from) const noexcept {
    const SimSocket& to = at(from.peer);
    const std::size_t used = to.inbox.size() + to.inFlight;
    return used >= to.capacity ? 0 : to.capacity - used;
  }

  /// Reads up to `n` bytes of `s`'s inbox; a read of more than one byte
  /// may return fewer than there are (TCP's partial receives), drawn from
  /// the seed. The window it frees may let the peer's sender go on.
  std::size_t receive(SimSocket& s, std::byte* into, std::size_t n) {
    std::size_t take = std::min(n, s.inbox.size());
    if (take > 1 && random_.below(4) == 0) take = 1 + static_cast<std::size_t>(random_.below(take));
    std::copy_n(s.inbox.begin(), take, into);
    s.inbox.erase(s.inbox.begin(), s.inbox.begin() + static_cast<std::ptrdiff_t>(take));
    trace(take);
    if (take != 0) notify(at(s.peer), false);
    return take;
  }

  /// No more sends from `fd`: its peer reads to the end, then 0 (FIN),
  /// which arrives after what was sent before it.
  void shutdown(SimSocket& s) {
    if (s.finSent || s.reset) return;
    s.finSent = true;
    events_.push(Event{now_ + at(s.peer).latency, seq_++, s.peer, {}, true});
  }

  /// Closes `fd` (its owner's close): a FIN to the peer unless it was
  /// reset; an operation still waiting on it is a misuse.
  void close(int fd) {
    SimSocket* s = socket(fd);
    COIO_ASSERT(s != nullptr, "closing a simulated socket that is not open");
    COIO_ASSERT(s->reader == nullptr && s->writer == nullptr, "closing a simulated socket an operation waits on");
    shutdown(*s);
    s->open = false;
  }

  /// A connection reset (a fault): both ends fail every operation with
  /// ECONNRESET from now on, the bytes on their way are lost.
  void reset(int fd) {
    SimSocket* s = socket(fd);
    COIO_ASSERT(s != nullptr, "resetting a simulated socket that is not open");
    for (SimSocket* end : {s, &at(s->peer)}) {
      end->reset = true;
      end->inbox.clear();
      notify(*end, true);
      notify(*end, false);
    }
    trace(0x5E5E7);
  }

  /// Wakes the operation waiting to read (or write) on `s`, if any; it
  /// stays registered if it could not complete.
  void notify(SimSocket& s, bool read) noexcept {
    SimWaiter*& slot = read ? s.reader : s.writer;
    if (SimWaiter* w = slot) {
      slot = nullptr;
      if (!w->onEvent(w)) slot = w;
    }
  }

 private:
  // A piece of bytes (or a FIN) arriving at socket `to` at `at`.
  struct Event {
    Clock::time_point at;
    std::uint64_t seq;  // equal times: in the order sent
    int to;
    std::vector<std::byte> bytes;
    bool fin;
    bool operator>(const Event& o) const noexcept { return at != o.at ? at > o.at : seq > o.seq; }
  };

  // The socket of a simulated fd number (made by socketPair), open or not.
  SimSocket& at(int fd) noexcept { return sockets_[static_cast<std::size_t>(fd - kFirstFd)]; }
  const SimSocket& at(int fd) const noexcept { return sockets_[static_cast<std::size_t>(fd - kFirstFd)]; }

  static double seconds(Clock::time_point t) noexcept {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  }

  // Delivers every event due at now_.
  void deliverDue() {
    while (!events_.empty() && events_.top().at <= now_) {
      Event e = events_.top();
      events_.pop();
      SimSocket& s = at(e.to);
      s.inFlight -= e.bytes.size();
      if (s.reset) continue;  // lost with the connection
      s.inbox.insert(s.inbox.end(), e.bytes.begin(), e.bytes.end());
      s.finReceived = s.finReceived || e.fin;
      trace(e.bytes.size() * 2 + (e.fin ? 1 : 0));
      core_.meter().dispatched(1);
      notify(s, true);
    }
  }

  LoopCore& core_;
  sim::Random random_;
  Clock::time_point now_{};
  std::uint64_t trace_ = 0xCBF29CE484222325ull;
  std::uint64_t seq_ = 0;
  std::deque<SimSocket> sockets_;  // a deque: references stay valid as sockets are added
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
};

}  // namespace coio::detail
