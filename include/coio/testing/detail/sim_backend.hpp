#pragma once
// SimWorld: what the reactors of one simulation share. It keeps virtual
// time, orders each ready phase by a seeded generator, and is the
// simulated network: sockets with addresses, listeners, connections whose
// segments (bytes, FIN, SYN, RST) arrive one link latency after they were
// sent, each an event in its queue; when nothing is ready anywhere the
// clock jumps to the next event or timer.
// SimBackend: each SimReactor's ReactorBackend, its window on the world:
// the world's first reactor runs the loop, and gives the others (its
// nodes) their turns from its poll.
// One file (over 700 lines): the world's event queue is one state machine
// (segments, SYN retries, partitions, disk completions, scheduled faults
// all go through deliverEvents), and SimBackend is its thin per-reactor
// face; the sockets themselves are in sim_socket.hpp.
#include <coio/core/detail/assert.hpp>
#include <coio/core/result.hpp>
#include <coio/reactor/detail/loop_core.hpp>
#include <coio/testing/detail/sim_files.hpp>
#include <coio/testing/detail/sim_socket.hpp>
#include <coio/testing/sim_types.hpp>

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>
#include <array>
#include <cerrno>
#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <vector>

namespace coio::detail {

/// A reactor of the world as the world sees it (SimBackend is one): its
/// loop's core, its address, and how it takes a turn.
struct SimLoop {
  LoopCore& loopCore;
  /// A node's address (port 0): its sockets are there unless bound
  /// elsewhere. AF_UNSPEC for the world's runner, whose are at loopback.
  SimEndpoint host{};
  /// A paused node takes no turn; its timers wait (SIGSTOP).
  bool paused = false;
  /// A node's: whether it has coroutines to resume; its turn (ready
  /// phase, timers); the reactor both are given.
  bool (*hasReady)(void* reactor) noexcept = nullptr;
  void (*turn)(void* reactor) = nullptr;
  void* reactor = nullptr;

  /// Where its sockets are when they connect or listen unbound.
  SimEndpoint home(sa_family_t family) const noexcept {
    return host.family == family ? host : SimEndpoint::loopback(family);
  }
};

/// The clock, the generator, the network and the disks' completions of a
/// simulation, and its reactors (SimBackends: the first runs the loop, the
/// others are nodes, which take their turns from it). Loop thread only.
class SimWorld {
 public:
  using Clock = LoopCore::Clock;

  /// The first fd number of simulated sockets: far above any real fd, so
  /// that a real fd handed to an operation by mistake is refused.
  static constexpr int kFirstFd = 1 << 24;
  /// A SYN that finds its listener's backlog full is dropped and sent
  /// again after 1, 2, 4... s, this many times, then connect fails with
  /// ETIMEDOUT (Linux's tcp_syn_retries).
  static constexpr int kSynRetries = 6;

  explicit SimWorld(std::uint64_t seed) : random_(seed) { trace(seed); }

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

  // --- The loop (SimBackend's ReactorBackend calls).

  /// Joins `loop` to the world: the first is the one that runs the loop.
  void attach(SimLoop& loop) { loops_.push_back(&loop); }
  /// `loop` is going away (a node killed): its sockets are gone, as a
  /// process's at exit (what they send was dealt with by kill()).
  void detach(SimLoop& loop) noexcept {
    std::erase(loops_, &loop);
    for (SimSocket& s : sockets_) {
      if (s.owner != &loop) continue;
      s.owner = nullptr;
      if (!s.open) continue;
      s.reader = s.writer = nullptr;  // their operations' frames are gone
      if (s.bound) bound_.erase(s.local);
      s.accepted.clear();
      s.open = false;
    }
  }
  /// The node whose turn is under way, or null.
  const SimLoop* turning() const noexcept { return turning_; }

  /// The poll of the loop that runs the world: the other reactors (nodes)
  /// take a turn each if they have work; when nothing anywhere is ready,
  /// the clock jumps to what happens next; then what is due arrives.
  void poll(SimLoop& runner, std::optional<Clock::duration> timeout) {
    LoopCore& core = runner.loopCore;
    core.woke(timeout);
    // Tasks spawned before the loop ran were handed over as from another
    // thread (the simulation has no other): they start here, in spawn
    // order, and the loop looks at what they made ready before time moves.
    if (core.resumeRemote()) return;
    const bool nodesRan = turnNodes(runner);
    if (!nodesRan && (!timeout || *timeout != Clock::duration::zero())) {
      // Nothing ready anywhere: the clock jumps to what happens next.
      bool any = false;
      Clock::time_point next{};
      const auto consider = [&](Clock::time_point t) {
        if (!any || t < next) next = t;
        any = true;
      };
      for (const SimLoop* l : loops_) {
        const TimerQueue& timers = l->loopCore.timers();
        if (!l->paused && timers.size() != 0) consider(timers.firstDeadline());
      }
      if (!events_.empty()) consider(events_.top().at);
      if (!any) {
        throw sim::Deadlock("coio::sim: deadlock at " + std::to_string(seconds(now_)) +
                            " s of virtual time: no coroutine is ready, no timer is set and no segment is on its way");
      }
      now_ = std::max(now_, next);
      trace(static_cast<std::uint64_t>(now_.time_since_epoch().count()));
    }
    deliverDue();
  }

  /// Delivers every event due now; whether there was any.
  bool deliverDue() { return deliverEvents(); }

  /// A node's turns, alone, at this instant (its kill: until `done()`):
  /// false if it can go no further without time passing.
  template <typename Done>
  bool drain(SimLoop& node, Done done) {
    while (!done()) {
      const bool ran = hasWork(node);
      if (ran) turn(node);
      if (!deliverDue() && !ran) return false;
    }
    return true;
  }

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

  // --- The socket calls ReactorLoop makes here instead of the kernel.

  Result<int> openSocket(SimLoop& owner, int family) {
    if (family != AF_INET && family != AF_INET6) return systemError(EAFNOSUPPORT);
    SimSocket& s = make(&owner);
    s.local.family = static_cast<sa_family_t>(family);
    return s.fd;
  }

  Result<void> bindSocket(int fd, const sockaddr* address, socklen_t length) {
    SimSocket* s = socket(fd);
    if (s == nullptr) return systemError(EBADF);
    const std::optional<SimEndpoint> e = SimEndpoint::from(address, length);
    if (!e || e->family != s->local.family) return systemError(e ? EAFNOSUPPORT : EINVAL);
    if (s->bound || s->state != SimSocket::State::fresh) return systemError(EINVAL);
    return bind(*s, onHost(*s, *e));
  }

  Result<void> listenSocket(int fd, int backlog) {
    SimSocket* s = socket(fd);
    if (s == nullptr) return systemError(EBADF);
    if (s->state != SimSocket::State::fresh && s->state != SimSocket::State::listening) return systemError(EINVAL);
    if (!s->bound) {  // as Linux: an ephemeral port on every address
      if (Result<void> r = bind(*s, onHost(*s, SimEndpoint{s->local.family, {}, 0})); !r) return r;
    }
    s->state = SimSocket::State::listening;
    s->backlog = static_cast<std::size_t>(std::clamp(backlog, 1, 4096));
    return {};
  }

  /// Every option is taken, none has an effect: the simulation has no
  /// Nagle, no congestion control, no socket buffers but the link's window.
  Result<void> setSocketOption(int fd, int, int, const void*, socklen_t) noexcept {
    if (socket(fd) == nullptr) return systemError(EBADF);
    return {};
  }

  Result<socklen_t> socketName(int fd, bool peer, sockaddr_storage& out) noexcept {
    const SimSocket* s = socket(fd);
    if (s == nullptr) return systemError(EBADF);
    if (!peer) return s->local.store(out);
    if (s->state != SimSocket::State::connected) return systemError(ENOTCONN);
    return s->remote.store(out);
  }

  Result<void> shutdownSocket(int fd, int how) {
    SimSocket* s = socket(fd);
    if (s == nullptr) return systemError(EBADF);
    if (s->state != SimSocket::State::connected) return systemError(ENOTCONN);
    if (how == SHUT_RD || how == SHUT_RDWR) {
      s->readShut = true;
      notify(*s, true);
    }
    if (how == SHUT_WR || how == SHUT_RDWR) shutdown(*s);
    return {};
  }

  /// ABORT: an RST to the peer; this end fails its operations from now on.
  Result<void> resetSocket(int fd) {
    SimSocket* s = socket(fd);
    if (s == nullptr) return systemError(EBADF);
    if (s->state == SimSocket::State::connected && !s->reset) {
      sendReset(*s);
      abortEnd(*s);
    }
    return {};
  }

  /// The owner's close: a listener resets the connections it had not
  /// accepted; a connection sends its FIN, or an RST if bytes it never
  /// read were left (as Linux). Nothing may wait on it.
  void closeSocket(int fd) {
    SimSocket* s = socket(fd);
    if (s == nullptr) return;  // as close(2) of a bad fd: EBADF, nothing else
    COIO_ASSERT(s->reader == nullptr && s->writer == nullptr, "closing a simulated socket an operation waits on");
    if (s->state == SimSocket::State::listening) {
      for (const int pending : s->accepted) {
        SimSocket& c = at(pending);
        sendReset(c);
        c.open = false;
      }
      s->accepted.clear();
    } else if (s->state == SimSocket::State::connected && !s->reset) {
      if (!s->inbox.empty()) {
        sendReset(*s);
      } else {
        shutdown(*s);
      }
    }
    if (s->bound) bound_.erase(s->local);
    s->open = false;
  }

  // --- Links and their faults (hosts are SimEndpoints with port 0).

  /// The link between hosts without one of their own.
  void setLink(const sim::Link& link) noexcept { defaultLink_ = link; }
  /// The link between `a` and `b`, both ways, from the next segment on.
  void setLink(const SimEndpoint& a, const SimEndpoint& b, const sim::Link& link) { linkState(a, b).own = link; }
  /// Links without one of their own are drawn between `low` and `high`
  /// (each field uniformly, from the seed) when first used.
  void drawLinks(const sim::Link& low, const sim::Link& high) noexcept { range_ = {low, high}; }
  /// Segments between `a` and `b` stop (no RST): each waits, in order,
  /// until heal(), as TCP's retransmissions would deliver them then.
  void partition(const SimEndpoint& a, const SimEndpoint& b) {
    linkState(a, b).partitioned = true;
    trace(0x9A57);
  }
  /// Ends a partition: what waited goes, one latency on, in order.
  void heal(const SimEndpoint& a, const SimEndpoint& b) {
    LinkState& l = linkState(a, b);
    l.partitioned = false;
    std::vector<Held> held = std::move(l.held);
    l.held.clear();
    trace(0x4EA1 + held.size());
    for (Held& h : held) transmit(std::move(h.event), h.from, h.to, {});
  }

  // --- Connections.

  /// A connected pair whose bytes take `latency` each way, with windows of
  /// `capacity` bytes.
  std::pair<int, int> socketPair(Clock::duration latency, std::size_t capacity) {
    SimSocket& a = make(nullptr);
    SimSocket& b = make(nullptr);
    for (auto [s, peer] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
      s->state = SimSocket::State::connected;
      s->peer = peer->fd;
      s->capacity = capacity;
      s->latency = latency;
    }
    return {a.fd, b.fd};
  }

  /// Starts connecting `s` to `to`: a SYN on its way (connect's first
  /// attempt). 0 or -errno.
  long connect(SimSocket& s, const SimEndpoint& to) {
    if (s.state == SimSocket::State::connected) return -EISCONN;
    if (s.state != SimSocket::State::fresh) return s.state == SimSocket::State::connecting ? -EALREADY : -EINVAL;
    if (to.family != s.local.family) return -EAFNOSUPPORT;
    if (!s.bound) {
      const SimEndpoint here = s.owner ? s.owner->home(to.family) : SimEndpoint::loopback(to.family);
      if (Result<void> r = bind(s, here); !r) return -r.error().value();
    }
    s.state = SimSocket::State::connecting;
    s.remote = to;
    s.capacity = link(linkState(host(s.local), host(to))).window;
    transmit(Event{.kind = Segment::syn, .from = s.fd, .endpoint = to}, host(s.local), host(to), {});
    return 0;
  }

  /// The next connection `listener` made, or kWouldBlock-like -EAGAIN.
  long acceptOne(SimSocket& listener) {
    if (listener.accepted.empty()) return -EAGAIN;
    const int fd = listener.accepted.front();
    listener.accepted.pop_front();
    trace(static_cast<std::uint64_t>(fd));
    return fd;
  }

  /// Whether `s`'s peer is still open (not closed by its owner).
  bool peerOpen(const SimSocket& s) const noexcept { return at(s.peer).open; }

  /// The socket `fd` names, or null (not a simulated socket, or closed).
  SimSocket* socket(int fd) noexcept {
    if (fd < kFirstFd || static_cast<std::size_t>(fd - kFirstFd) >= sockets_.size()) return nullptr;
    SimSocket& s = at(fd);
    return s.open ? &s : nullptr;
  }

  /// Sends what fits of `data` from `from` (at least a byte: the caller
  /// checked there is room); it arrives one latency later. The bytes sent.
  std::size_t send(SimSocket& from, const std::byte* data, std::size_t n) {
    std::vector<std::byte> bytes = spareBytes();
    bytes.assign(data, data + std::min(n, room(from)));
    return send(from, std::move(bytes));
  }
  /// An empty buffer for a segment's bytes (with the capacity of one read
  /// to its end, if any).
  std::vector<std::byte> spareBytes() { return spare_.take(); }
  /// send() of bytes the caller gives up (a sendv's, gathered): no copy.
  std::size_t send(SimSocket& from, std::vector<std::byte>&& bytes) {
    bytes.resize(std::min(bytes.size(), room(from)));
    const std::size_t n = bytes.size();
    at(from.peer).inFlight += n;
    transmitFrom(from, Event{.to = from.peer, .kind = Segment::data, .bytes = std::move(bytes)});
    trace(n);
    return n;
  }

  /// Bytes `from` may send now: its peer's window less what is already
  /// there or on its way, as far as `from` knows (a read frees room once
  /// its window update arrived, a latency later, as TCP's ACK).
  std::size_t room(const SimSocket& from) const noexcept {
    const SimSocket& to = at(from.peer);
    const std::size_t used = to.inbox.size() + to.inFlight + to.acking;
    return used >= to.capacity ? 0 : to.capacity - used;
  }

  /// Reads up to `n` bytes of `s`'s inbox; a read of more than one byte
  /// may return fewer than there are (TCP's partial receives), drawn from
  /// the seed. The window it frees reaches the sender a latency later.
  std::size_t receive(SimSocket& s, std::byte* into, std::size_t n) {
    std::size_t take = std::min(n, s.inbox.size());
    if (take > 1 && random_.below(4) == 0) take = 1 + static_cast<std::size_t>(random_.below(take));
    s.inbox.take(into, take, spare_);
    trace(take);
    if (take != 0) {
      s.acking += take;
      transmitFrom(s, Event{.to = s.peer, .kind = Segment::window, .count = take});
    }
    return take;
  }

  /// No more sends from `s`: its peer reads to the end, then 0 (FIN),
  /// which arrives after what was sent before it.
  void shutdown(SimSocket& s) {
    if (s.finSent || s.reset) return;
    s.finSent = true;
    transmitFrom(s, Event{.to = s.peer, .kind = Segment::fin});
  }

  /// A connection reset (a fault): both ends fail every operation with
  /// ECONNRESET from now on, the bytes on their way are lost.
  void reset(int fd) {
    SimSocket* s = socket(fd);
    COIO_ASSERT(s != nullptr && s->state == SimSocket::State::connected, "resetting a simulated socket not connected");
    abortEnd(*s);
    abortEnd(at(s->peer));
    trace(0x5E5E7);
  }

  // --- Completions at a virtual time (the simulated disk's operations).

  sim::DiskFaults& diskFaults() noexcept { return diskFaults_; }
  /// The files simulated Disks keep in memory (SimDiskRing's).
  SimFiles& files() noexcept { return files_; }
  /// True with probability `p` (drawn from the seed; none drawn for 0 or 1).
  bool chance(double p) noexcept {
    if (p <= 0) return false;
    if (p >= 1) return true;
    return static_cast<double>(random_.below(1u << 30)) < p * static_cast<double>(1u << 30);
  }

  /// How a deferred operation completes: with its result (>= 0 or -errno).
  using Fire = void (*)(const void* owner, void* op, int result) noexcept;
  /// `fire(owner, op, result)` at `at`, or, without `at`, only when cancelled
  /// (an operation that hangs). Called on the loop thread, from poll().
  /// `owner` may drop its operations (dropDeferredOf).
  void defer(const void* owner, void* op, Fire fire, int result, std::optional<Clock::time_point> at) {
    const std::uint64_t id = nextDeferred_++;
    deferred_[op] = Deferred{id, fire, owner};
    if (at) push(Event{.at = *at, .kind = Segment::deferred, .attempt = result, .count = id, .op = op});
  }
  /// A pending deferred `op` completes now with ECANCELED (its own
  /// completion is dropped); false if it is not pending.
  bool cancelDeferred(void* op) {
    auto it = deferred_.find(op);
    if (it == deferred_.end()) return false;
    it->second.id = nextDeferred_++;
    push(Event{.at = now_, .kind = Segment::deferred, .attempt = -ECANCELED, .count = it->second.id, .op = op});
    return true;
  }
  /// The pending operations of `owner` will not complete (it is going away).
  void dropDeferredOf(const void* owner) noexcept {
    std::erase_if(deferred_, [owner](const auto& entry) { return entry.second.owner == owner; });
  }

  /// A fault: host `h`'s processes are gone (as after a crash, its
  /// machine still up): every connection to or from it is reset, and
  /// until hostUp(h) connects to it are refused and segments from its
  /// sockets are lost. Its listeners are kept (a restarted process's).
  void hostDown(const SimEndpoint& h) {
    down_.insert(h);
    for (SimSocket& s : sockets_) {
      if (!s.open || s.reset || s.state != SimSocket::State::connected || s.local.family == AF_UNSPEC) continue;
      if (host(s.local) == h || host(s.remote) == h) abortEnd(s);
    }
    trace(0xD0A1);
  }
  /// A fault: host `h` answers nothing, as a machine gone (no RST): what
  /// is sent to it is lost, connects to it time out; until unsilence(h).
  void silence(const SimEndpoint& h) {
    silent_.insert(h);
    trace(0x5113);
  }
  void unsilence(const SimEndpoint& h) { silent_.erase(h); }

  /// Calls `call` at virtual time `when` (not before now), from the poll
  /// of the loop that runs the world, after what arrives then.
  void at(Clock::time_point when, std::function<void()> call) {
    const std::uint64_t id = nextCall_++;
    calls_.emplace(id, std::move(call));
    push(Event{.at = when, .kind = Segment::call, .count = id});
  }

  /// A node's kill: its sockets fail their operations (ECONNRESET) from
  /// now on, its listeners are gone; its connections' peers get an RST (a
  /// crashed process's, from its kernel), or nothing with `silent` (its
  /// machine gone: see silence()).
  void crashSockets(SimLoop& node, bool silent) {
    for (SimSocket& s : sockets_) {
      if (s.owner != &node || !s.open) continue;
      switch (s.state) {
        case SimSocket::State::connected:
          if (s.reset) break;
          if (!silent) sendReset(s);
          abortEnd(s);
          break;
        case SimSocket::State::listening:  // its unaccepted connections are the node's too: above
          if (s.bound) bound_.erase(s.local);
          s.bound = false;
          s.state = SimSocket::State::failed;
          s.error = ECONNABORTED;
          notify(s, true);
          break;
        case SimSocket::State::connecting:
          s.state = SimSocket::State::failed;
          s.error = ECONNABORTED;
          notify(s, false);
          break;
        default: break;
      }
    }
    trace(silent ? 0xC2A51 : 0xC2A50);
  }

  /// Ends hostDown(h).
  void hostUp(const SimEndpoint& h) {
    down_.erase(h);
    trace(0xB0A1);
  }

  /// A fault: every connection between hosts `a` and `b` is reset at once
  /// (as by a middlebox, or a peer's restart): the number reset.
  std::size_t resetBetween(const SimEndpoint& a, const SimEndpoint& b) {
    std::size_t n = 0;
    for (SimSocket& s : sockets_) {
      if (!s.open || s.reset || s.state != SimSocket::State::connected || s.local.family == AF_UNSPEC) continue;
      const SimEndpoint here = host(s.local);
      const SimEndpoint there = host(s.remote);
      if (!((here == a && there == b) || (here == b && there == a))) continue;
      abortEnd(s);
      SimSocket& peer = at(s.peer);
      if (!peer.reset) abortEnd(peer);
      ++n;
    }
    trace(0x5E5E8 + n);
    return n;
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
  // What travels between sockets: bytes, a FIN, a window update (the room
  // a read freed), a connection's SYN (to an address), its answer
  // (established, or refused with an errno) and RST.
  // (And a deferred completion and a scheduled call, which travel nowhere.)
  enum class Segment : std::uint8_t { data, fin, window, syn, established, refused, rst, deferred, call };

  struct Event {
    Clock::time_point at{};  // when it arrives (transmit() sets it)
    std::uint64_t seq = 0;  // equal times: in the order sent
    int to = -1;            // the socket it arrives at (a SYN: the one at `endpoint`)
    Segment kind = Segment::data;
    std::vector<std::byte> bytes{};
    int from = -1;          // syn: the connecting socket; established: the accepted one
    SimEndpoint endpoint{};  // syn: the address it is sent to
    int attempt = 0;        // syn: sent before this many times; refused: the errno
    std::size_t count = 0;  // window: the bytes read; deferred: its id
    void* op = nullptr;     // deferred: the operation (attempt: its result)
  };

  // A segment waiting for a partition to heal, with the hosts it goes between.
  struct Held {
    Event event;
    SimEndpoint from;
    SimEndpoint to;
  };
  struct LinkState {
    std::optional<sim::Link> own;            // setLink(a, b, ...) or drawn
    bool partitioned = false;
    std::array<Clock::time_point, 2> busy{};  // when each direction's last byte goes out
    std::vector<Held> held;                  // partitioned: in the order sent
  };

  // The socket of a simulated fd number, open or not.
  SimSocket& at(int fd) noexcept { return sockets_[static_cast<std::size_t>(fd - kFirstFd)]; }
  const SimSocket& at(int fd) const noexcept { return sockets_[static_cast<std::size_t>(fd - kFirstFd)]; }

  // A node has one address: binding the wildcard binds that.
  static SimEndpoint onHost(const SimSocket& s, SimEndpoint e) noexcept {
    if (e.wildcard() && s.owner != nullptr && s.owner->host.family == e.family) e.ip = s.owner->host.ip;
    return e;
  }

  SimSocket& make(SimLoop* owner) {
    SimSocket& s = sockets_.emplace_back();
    s.fd = kFirstFd + static_cast<int>(sockets_.size() - 1);
    s.owner = owner;
    return s;
  }

  // Node `l`'s turn (turning() says whose is under way).
  void turn(SimLoop& l) {
    SimLoop* outer = std::exchange(turning_, &l);
    struct Restore {
      SimLoop*& slot;
      SimLoop* value;
      ~Restore() { slot = value; }
    } restore{turning_, outer};
    l.turn(l.reactor);
  }

  // Whether node `l` has something to do at this instant.
  bool hasWork(SimLoop& l) const noexcept {
    if (l.paused) return false;
    return l.hasReady(l.reactor) || l.loopCore.timers().anyDue(now_);
  }

  // A turn of each node (every reactor but the runner) with work, in an
  // order drawn from the seed; whether any ran.
  bool turnNodes(SimLoop& runner) {
    std::vector<SimLoop*>& due = due_;  // a member: no allocation per poll (never re-entered: only the runner polls)
    due.clear();
    for (SimLoop* l : loops_) {
      if (l != &runner && hasWork(*l)) due.push_back(l);
    }
    if (due.empty()) return false;
    for (std::size_t i = due.size(); i > 1; --i) std::swap(due[i - 1], due[random_.below(i)]);
    trace(0x70DE + due.size());
    // A turn may kill a node (and detach it): each is looked up again.
    for (SimLoop* l : due) {
      if (std::find(loops_.begin(), loops_.end(), l) != loops_.end() && hasWork(*l)) turn(*l);
    }
    return true;
  }

  void push(Event e) {
    e.seq = seq_++;
    std::size_t slot;
    if (freeSlots_.empty()) {
      slot = slots_.size();
      slots_.push_back(std::move(e));
    } else {
      slot = freeSlots_.back();
      freeSlots_.pop_back();
      slots_[slot] = std::move(e);
    }
    const Event& placed = slots_[slot];
    events_.push(Due{placed.at, placed.seq, slot});
  }

  static SimEndpoint host(const SimEndpoint& e) noexcept { return SimEndpoint{e.family, e.ip, 0}; }

  // A segment from socket `from` to socket `e.to`.
  void transmitFrom(const SimSocket& from, Event e) {
    const SimSocket& to = at(e.to);
    transmit(std::move(e), host(from.local), host(to.local), to.latency);
  }

  // Puts `e` on the link from host `from` to host `to`: it goes out once
  // the bytes before it on that link have (at the link's bandwidth) and
  // arrives a latency later, never before an earlier segment to the same
  // socket; across a partition it waits for heal(). Sockets without an
  // address (socketPair's) have no link: `pairLatency` is theirs.
  void transmit(Event e, const SimEndpoint& from, const SimEndpoint& to, Clock::duration pairLatency) {
    if (from.family == AF_UNSPEC) {
      e.at = now_ + pairLatency;
    } else if ((down_.contains(from) || silent_.contains(from)) && e.kind != Segment::refused) {
      return;  // its processes are gone: nothing they "send" leaves
    } else if (silent_.contains(to) && e.kind != Segment::syn) {
      return;  // a silent host answers nothing (a SYN is retried: arriveSyn)
    } else {
      LinkState& l = linkState(from, to);
      if (l.partitioned) {
        l.held.push_back(Held{std::move(e), from, to});
        return;
      }
      const sim::Link& link = this->link(l);
      Clock::time_point departs = now_;
      if (link.bandwidth != 0) {
        Clock::time_point& busy = l.busy[from < to ? 0 : 1];
        const auto serialise = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(static_cast<double>(e.bytes.size()) / static_cast<double>(link.bandwidth)));
        busy = std::max(busy, now_) + serialise;
        departs = busy;
      }
      e.at = departs + link.latency;
    }
    if (e.to >= 0) {
      SimSocket& r = at(e.to);
      e.at = std::max(e.at, r.lastArrival);
      r.lastArrival = e.at;
    }
    push(std::move(e));
  }

  // The state of the link between hosts `a` and `b` (either order), made
  // on first use.
  LinkState& linkState(const SimEndpoint& a, const SimEndpoint& b) {
    return links_[a < b ? std::pair{a, b} : std::pair{b, a}];
  }

  // The link between hosts `a` and `b`: their own, else drawn (once), else
  // the default.
  const sim::Link& link(LinkState& l) {
    if (l.own) return *l.own;
    if (!range_) return defaultLink_;
    const auto& [low, high] = *range_;
    const auto draw = [this](auto lo, auto hi) {
      return hi <= lo ? lo : lo + static_cast<decltype(lo)>(random_.below(static_cast<std::uint64_t>(hi - lo) + 1));
    };
    sim::Link drawn;
    drawn.latency = Clock::duration(draw(low.latency.count(), high.latency.count()));
    drawn.window = draw(low.window, high.window);
    drawn.bandwidth = draw(low.bandwidth, high.bandwidth);
    trace(static_cast<std::uint64_t>(drawn.latency.count()));
    return *(l.own = drawn);
  }

  // Takes `e` for `s` (port 0: the next free ephemeral port).
  Result<void> bind(SimSocket& s, SimEndpoint e) {
    if (e.port == 0) {
      for (int tries = 0; tries <= kLastEphemeral - kFirstEphemeral; ++tries) {
        e.port = nextPort_;
        nextPort_ = nextPort_ == kLastEphemeral ? kFirstEphemeral : static_cast<std::uint16_t>(nextPort_ + 1);
        if (!bound_.contains(e)) break;
      }
    }
    if (!bound_.emplace(e, s.fd).second) return systemError(EADDRINUSE);
    s.local = e;
    s.bound = true;
    return {};
  }

  // The listener a SYN to `e` reaches: bound to it, or to its port on
  // every address.
  SimSocket* listenerAt(const SimEndpoint& e) noexcept {
    for (const SimEndpoint& key : {e, SimEndpoint{e.family, {}, e.port}}) {
      if (auto it = bound_.find(key); it != bound_.end()) {
        SimSocket& s = at(it->second);
        if (s.open && s.state == SimSocket::State::listening) return &s;
      }
    }
    return nullptr;
  }

  // An RST from `s` to its peer.
  void sendReset(SimSocket& s) { transmitFrom(s, Event{.to = s.peer, .kind = Segment::rst}); }

  // This end is reset: operations fail, what arrived unread is lost.
  void abortEnd(SimSocket& s) noexcept {
    s.reset = true;
    s.inbox.clear();
    notify(s, true);
    notify(s, false);
  }

  static double seconds(Clock::time_point t) noexcept {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  }

  // Delivers every event due at now_; whether there was any.
  bool deliverEvents() {
    bool any = false;
    while (!events_.empty() && events_.top().at <= now_) {
      const std::size_t slot = events_.top().slot;
      events_.pop();
      Event e = std::move(slots_[slot]);
      freeSlots_.push_back(slot);
      any = true;
      if (e.to >= 0 && at(e.to).owner) at(e.to).owner->loopCore.meter().dispatched(1);
      if (e.kind == Segment::syn) {
        arriveSyn(e);
        continue;
      }
      if (e.kind == Segment::call) {
        auto it = calls_.find(e.count);
        std::function<void()> call = std::move(it->second);
        calls_.erase(it);
        trace(0xCA11);
        call();
        continue;
      }
      if (e.kind == Segment::deferred) {
        auto it = deferred_.find(e.op);
        if (it == deferred_.end() || it->second.id != e.count) continue;  // cancelled or dropped since
        const Deferred d = it->second;
        deferred_.erase(it);
        trace(0xD15C0000 + static_cast<std::uint64_t>(static_cast<std::uint32_t>(e.attempt)));
        d.fire(d.owner, e.op, e.attempt);
        continue;
      }
      if (e.kind == Segment::window) {  // to the sender, of its peer's room
        SimSocket& sender = at(e.to);
        at(sender.peer).acking -= e.count;
        trace(e.count * 2);
        if (sender.open) notify(sender, false);
        continue;
      }
      SimSocket& s = at(e.to);
      s.inFlight -= e.bytes.size();
      if (e.kind != Segment::data && e.kind != Segment::fin) trace(0x5E6000 + static_cast<std::uint64_t>(e.kind));
      if (!s.open) {
        // A closed socket answers bytes and a connection's answer with RST.
        if ((e.kind == Segment::data && !s.reset) || e.kind == Segment::established) {
          transmitFrom(s, Event{.to = e.kind == Segment::data ? s.peer : e.from, .kind = Segment::rst});
          s.reset = true;
        }
        continue;
      }
      switch (e.kind) {
        case Segment::data:
        case Segment::fin:
          if (s.reset) continue;  // lost with the connection
          trace(e.bytes.size() * 2 + (e.kind == Segment::fin ? 1 : 0));
          s.inbox.push(std::move(e.bytes));
          s.finReceived = s.finReceived || e.kind == Segment::fin;
          notify(s, true);
          break;
        case Segment::established:
          if (s.state != SimSocket::State::connecting) continue;
          s.state = SimSocket::State::connected;
          s.peer = e.from;
          notify(s, false);
          break;
        case Segment::refused:
          if (s.state != SimSocket::State::connecting) continue;
          s.state = SimSocket::State::failed;
          s.error = e.attempt;
          notify(s, false);
          break;
        case Segment::rst:
          if (s.state == SimSocket::State::connected && !s.reset) abortEnd(s);
          break;
        case Segment::syn:
        case Segment::window:
        case Segment::deferred:
        case Segment::call:
          break;
      }
    }
    return any;
  }

  // A SYN reached its address: a listener with room makes the connection
  // (the accepted socket waits in its queue; the answer goes back); none:
  // refused; a full backlog drops it, and the client sends it again later.
  void arriveSyn(Event& e) {
    SimSocket& client = at(e.from);
    if (!client.open || client.state != SimSocket::State::connecting) return;
    const bool silent = silent_.contains(host(e.endpoint));
    SimSocket* listener = silent || down_.contains(host(e.endpoint)) ? nullptr : listenerAt(e.endpoint);
    trace(listener == nullptr ? 0 : listener->accepted.size() + 1);
    // Unanswered (a silent host, a full backlog): sent again later, until ETIMEDOUT.
    const bool unanswered = silent || (listener != nullptr && listener->accepted.size() >= listener->backlog);
    if (unanswered && e.attempt <= kSynRetries) {
      e.at = now_ + std::chrono::seconds(1 << e.attempt);
      ++e.attempt;
      push(std::move(e));
      return;
    }
    if (listener == nullptr || unanswered) {
      transmit(Event{.to = client.fd, .kind = Segment::refused, .attempt = unanswered ? ETIMEDOUT : ECONNREFUSED},
               host(e.endpoint), host(client.local), {});
      return;
    }
    SimSocket& server = make(listener->owner);  // a deque: `client` and `listener` stay where they are
    server.state = SimSocket::State::connected;
    server.peer = client.fd;
    server.local = e.endpoint;
    server.remote = client.local;
    server.capacity = client.capacity;
    listener->accepted.push_back(server.fd);
    notify(*listener, true);
    transmitFrom(server, Event{.to = client.fd, .kind = Segment::established, .from = server.fd});
  }

  static constexpr std::uint16_t kFirstEphemeral = 32768;  // Linux's ip_local_port_range
  static constexpr std::uint16_t kLastEphemeral = 60999;

  std::vector<SimLoop*> loops_;  // the runner first, then the nodes
  SimLoop* turning_ = nullptr;
  std::vector<SimLoop*> due_;  // turnNodes' scratch
  SimSpareBytes spare_;
  sim::Random random_;
  Clock::time_point now_{};
  std::uint64_t trace_ = 0xCBF29CE484222325ull;
  std::uint64_t seq_ = 0;
  sim::Link defaultLink_;
  std::optional<std::pair<sim::Link, sim::Link>> range_;
  std::map<std::pair<SimEndpoint, SimEndpoint>, LinkState> links_;
  std::set<SimEndpoint> down_;    // hostDown
  std::set<SimEndpoint> silent_;  // silence
  std::map<std::uint64_t, std::function<void()>> calls_;  // at(): by event id
  std::uint64_t nextCall_ = 0;
  struct Deferred {
    std::uint64_t id;  // of its current completion event
    Fire fire;
    const void* owner;
  };
  std::map<void*, Deferred> deferred_;
  sim::DiskFaults diskFaults_;
  SimFiles files_;
  std::uint64_t nextDeferred_ = 0;
  std::uint16_t nextPort_ = kFirstEphemeral;
  std::deque<SimSocket> sockets_;  // a deque: references stay valid as sockets are added
  std::map<SimEndpoint, int> bound_;
  // What is on its way, as (when, order, slot) keys in a heap: a key is
  // small to move, the events (with their bytes) stay put in `slots_`.
  struct Due {
    Clock::time_point at;
    std::uint64_t seq;
    std::size_t slot;
    bool operator>(const Due& o) const noexcept { return at != o.at ? at > o.at : seq > o.seq; }
  };
  std::priority_queue<Due, std::vector<Due>, std::greater<>> events_;
  std::vector<Event> slots_;
  std::vector<std::size_t> freeSlots_;
};

/// SimReactor's backend (see ReactorBackend): its window on the world. The
/// first reactor of a world (SimReactor(seed)) makes the world and runs
/// its loop; a node's shares its runner's world and takes turns in it.
class SimBackend : public SimLoop {
 public:
  using Clock = LoopCore::Clock;
  /// ReactorLoop: the clock is the world's, and it orders ready phases.
  static constexpr bool kVirtualTime = true;
  static constexpr int kFirstFd = SimWorld::kFirstFd;

  /// A world of its own, whose loop this reactor runs.
  SimBackend(LoopCore& core, std::uint64_t seed)
      : SimLoop{core}, own_(std::make_unique<SimWorld>(seed)), world_(own_.get()) {
    world_->attach(*this);
  }
  /// A node at `host` in the world `runner` runs.
  SimBackend(LoopCore& core, SimBackend& runner, const SimEndpoint& host) : SimLoop{core, host}, world_(runner.world_) {
    world_->attach(*this);
  }
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;
  ~SimBackend() { world_->detach(*this); }

  LoopCore& core() noexcept { return loopCore; }
  SimWorld& world() noexcept { return *world_; }
  const SimWorld& world() const noexcept { return *world_; }
  Clock::time_point now() const noexcept { return world_->now(); }

  // --- ReactorBackend.

  void poll(std::optional<Clock::duration> timeout) { world_->poll(*this, timeout); }
  bool armDeadline(Clock::time_point) noexcept { return true; }  // poll reads the timers itself
  void quiesce() noexcept {}
  void leaveLoop() noexcept {}
  std::size_t unsubmitted() const noexcept { return 0; }
  void order(std::vector<std::coroutine_handle<>>& ready) noexcept { world_->order(ready); }

  // --- The socket calls ReactorLoop makes here instead of the kernel.

  Result<int> openSocket(int family) { return world_->openSocket(*this, family); }
  Result<void> bindSocket(int fd, const sockaddr* address, socklen_t length) {
    return world_->bindSocket(fd, address, length);
  }
  Result<void> listenSocket(int fd, int backlog) { return world_->listenSocket(fd, backlog); }
  Result<void> setSocketOption(int fd, int level, int name, const void* value, socklen_t length) noexcept {
    return world_->setSocketOption(fd, level, name, value, length);
  }
  Result<socklen_t> socketName(int fd, bool peer, sockaddr_storage& out) noexcept {
    return world_->socketName(fd, peer, out);
  }
  Result<void> shutdownSocket(int fd, int how) { return world_->shutdownSocket(fd, how); }
  Result<void> resetSocket(int fd) { return world_->resetSocket(fd); }
  void closeSocket(int fd) { world_->closeSocket(fd); }

 private:
  std::unique_ptr<SimWorld> own_;  // the runner's
  SimWorld* world_;
};

}  // namespace coio::detail
