#pragma once
// SimReactor: a reactor in virtual time, on one thread, whose interleavings
// are drawn from a seed (deterministic simulation, as FoundationDB's).
#include <coio/core/cancellation.hpp>
#include <coio/core/result.hpp>
#include <coio/reactor/detail/cancellable_operation.hpp>
#include <coio/reactor/detail/syscall.hpp>
#include <coio/reactor/loop_stats.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/reactor_loop.hpp>
#include <coio/testing/detail/sim_backend.hpp>
#include <coio/testing/sim_types.hpp>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <stop_token>
#include <utility>
#include <vector>

namespace coio::sim {
class SimReactor;
class Node;
}  // namespace coio::sim

namespace coio::detail {

class SimDiskRing;

template <>
struct BackendOf<sim::SimReactor> {
  using type = SimBackend;
};

// What a simulated socket operation tries: `run` returns the result (>= 0),
// -errno, or kWouldBlock; `read` says which side of the socket it waits on.
inline constexpr long kWouldBlock = -(1L << 40);

struct SimRecvAttempt {
  static constexpr bool read = true;
  static constexpr OpKind kind = OpKind::recv;
  std::span<std::byte> buffer;
  long run(SimWorld& b, SimSocket& s) const {
    if (s.state != SimSocket::State::connected) return -ENOTCONN;
    if (buffer.empty() || s.readShut) return 0;
    if (!s.inbox.empty()) return static_cast<long>(b.receive(s, buffer.data(), buffer.size()));
    return s.finReceived ? 0 : kWouldBlock;
  }
};

struct SimSendAttempt {
  static constexpr bool read = false;
  static constexpr OpKind kind = OpKind::send;
  std::span<const std::byte> bytes;
  std::span<const iovec> parts;  // sendv's (then `bytes` is empty): valid until the send completes
  long run(SimWorld& b, SimSocket& s) const {
    if (s.state != SimSocket::State::connected) return -ENOTCONN;
    if (s.finSent || !b.peerOpen(s)) return -EPIPE;
    if (bytes.empty() && std::all_of(parts.begin(), parts.end(), [](const iovec& p) { return p.iov_len == 0; })) {
      return 0;
    }
    const std::size_t room = b.room(s);
    if (room == 0) return kWouldBlock;
    if (parts.empty()) return static_cast<long>(b.send(s, bytes.data(), bytes.size()));
    // The parts' bytes that fit, gathered into one segment (the rest is the
    // caller's to send again, as after a partial sendmsg).
    std::vector<std::byte> gathered = b.spareBytes();
    for (const iovec& part : parts) {
      const std::size_t n = std::min(part.iov_len, room - gathered.size());
      const auto* p = static_cast<const std::byte*>(part.iov_base);
      gathered.insert(gathered.end(), p, p + n);
      if (gathered.size() == room) break;
    }
    return static_cast<long>(b.send(s, std::move(gathered)));
  }
};

// readable / writable, as poll(2) sees a socket: a listener is readable
// with a connection to accept, a connecting socket writable once the
// connect ended.
struct SimReadinessAttempt {
  bool read;
  static constexpr OpKind kind = OpKind::poll;
  long run(SimWorld& b, SimSocket& s) const {
    switch (s.state) {
      case SimSocket::State::listening: return read && !s.accepted.empty() ? 0 : kWouldBlock;
      case SimSocket::State::connecting: return kWouldBlock;
      case SimSocket::State::connected:
        if (read) return !s.inbox.empty() || s.finReceived || s.readShut ? 0 : kWouldBlock;
        return b.room(s) > 0 || s.finSent || !b.peerOpen(s) ? 0 : kWouldBlock;
      default: return 0;  // fresh or failed: nothing to wait for (the next call fails)
    }
  }
};

struct SimAcceptAttempt {
  static constexpr bool read = true;
  static constexpr OpKind kind = OpKind::accept;
  long run(SimWorld& b, SimSocket& s) const {
    if (s.state != SimSocket::State::listening) return -EINVAL;
    const long fd = b.acceptOne(s);
    return fd == -EAGAIN ? kWouldBlock : fd;
  }
};

// The first run sends the SYN; later runs see how it went.
struct SimConnectAttempt {
  static constexpr bool read = false;
  static constexpr OpKind kind = OpKind::connect;
  std::optional<SimEndpoint> to;
  bool sent = false;
  long run(SimWorld& b, SimSocket& s) {
    if (!sent) {
      if (!to) return -EINVAL;
      if (const long r = b.connect(s, *to); r < 0) return r;
      sent = true;
    }
    switch (s.state) {
      case SimSocket::State::connected: return 0;
      case SimSocket::State::failed: return -s.error;
      default: return kWouldBlock;
    }
  }
};

/// One operation on a simulated socket (see SimReactor): completes at once
/// when it can, else waits on the socket until its state lets it (bytes
/// arrived, room freed, a FIN, a reset) and then resumes in the loop's next
/// ready phase, whose order the seed draws.
template <typename Attempt, typename T>
class [[nodiscard]] SimOperation : SimWaiter, public CancellableOperation<SimOperation<Attempt, T>> {
  using Base = CancellableOperation<SimOperation>;
  friend Base;

 public:
  SimOperation(SimBackend& backend, int fd, Attempt attempt, std::stop_token stop) noexcept
      : Base(backend.core(), std::move(stop)), backend_(backend), fd_(fd), attempt_(std::move(attempt)) {
    onEvent = &SimOperation::onSocketEvent;
  }
  ~SimOperation() { unregister(); }

 private:
  bool reads() const noexcept { return attempt_.read; }
  OpKind kind() const noexcept { return attempt_.kind; }

  long attempt() {
    SimSocket* s = backend_.world().socket(fd_);
    if (s == nullptr) return -EBADF;
    if (s->reset) return -ECONNRESET;
    return attempt_.run(backend_.world(), *s);
  }

  bool tryNow() noexcept {
    this->result_ = attempt();
    return this->result_ != kWouldBlock;
  }
  bool start() {
    SimSocket* s = backend_.world().socket(fd_);  // tryNow found it
    (reads() ? s->reader : s->writer) = this;
    waiting_ = true;
    backend_.core().meter().submitted(static_cast<std::uint8_t>(kind()));
    return true;
  }
  void cancel() noexcept {
    if (!waiting_) return;  // completed, its resumption already queued
    unregister();
    this->result_ = -ECANCELED;
    readyLater();
  }
  Result<T> result() const { return toResult<T>(this->result_); }

  void unregister() noexcept {
    if (!waiting_) return;
    waiting_ = false;
    backend_.core().meter().completed(static_cast<std::uint8_t>(kind()));
    if (SimSocket* s = backend_.world().socket(fd_)) {
      SimWaiter*& slot = reads() ? s->reader : s->writer;
      if (slot == this) slot = nullptr;
    }
  }

  // The socket changed: complete if it can now. Never resumes inline (the
  // change may come from inside another coroutine's operation): the
  // coroutine joins the next ready phase, whose order the seed draws.
  static bool onSocketEvent(SimWaiter* w) noexcept {
    auto* self = static_cast<SimOperation*>(w);
    const long r = self->attempt();
    if (r == kWouldBlock) return false;
    self->result_ = r;
    self->waiting_ = false;  // the backend took it out of the slot
    self->backend_.core().meter().completed(static_cast<std::uint8_t>(self->kind()));
    self->readyLater();
    return true;
  }

  // Onto the ready queue (not the loop's FIFO of posted resumptions): so
  // completions interleave with everything else ready at that instant.
  void readyLater() noexcept { backend_.core().enqueue(this->handle()); }

  SimBackend& backend_;
  int fd_;
  Attempt attempt_;
  bool waiting_ = false;
};

}  // namespace coio::detail

namespace coio::sim {

/// A reactor in virtual time: it models coio::Reactor on one thread, and a
/// run of it is a function of its seed. Put code written against the
/// Reactor concept (withTimeout, waitFor, TcpStream's users, a service's
/// own loops) under it to explore interleavings and faults in seconds of
/// wall time, and replay any run from its seed.
///
/// Guarantees (beside the Reactor concept's, which hold as stated there):
/// - Virtual time: now() starts at the clock's epoch and moves only when
///   nothing is ready: it jumps to the next timer, segment arrival or
///   disk completion. Code that sleeps a minute takes no wall time to do it.
/// - The coroutines ready at one instant run in an order drawn from the
///   seed (each ready phase is shuffled); timers due at one instant fire
///   in the order they were set, as on every reactor.
/// - Determinism: two runs with the same seed, of the same program, do the
///   same things in the same order; traceHash() sums them up (the times the
///   clock jumped to, the orders drawn, the bytes moved), so that two runs
///   can be compared. Draw a test's own random choices from random() and
///   they replay with the seed too. Same hash on g++ and clang (the
///   generator is splitmix64, no std distribution).
/// - A deadlock is an error, not a hang: when nothing is ready, no timer is
///   set, no segment is on its way and no disk operation will complete,
///   run() / runUntil() throws sim::Deadlock, saying at what virtual time.
/// - The network: sockets are made, bound, listened on, connected,
///   accepted and closed through the reactor (the Reactor concept's socket
///   calls), so TcpListener and TcpStream run on it unchanged. fd numbers
///   start at SimBackend::kFirstFd, never real fds (an operation on any
///   other fd yields EBADF). A connection's segments (bytes, FIN, SYN, RST)
///   arrive one link latency after they were sent, in order; its window
///   bounds the bytes unread or on their way to an end (a send takes what
///   fits and waits for room: backpressure); a receive of more than one
///   byte may return fewer than have arrived (drawn from the seed, as TCP's
///   partial receives). Addresses are IPv4 or IPv6 with ports; any address
///   may be bound; a socket that connects without binding is at the
///   loopback address with an ephemeral port (32768 up). connect() to an
///   address nobody listens on fails with ECONNREFUSED a round trip later;
///   a listener's full backlog drops the SYN, which is sent again after 1,
///   2, 4... s, and after six retries ETIMEDOUT. Results as TCP's: 0 at the
///   end of the stream after the peer's shutdown or close, EPIPE sending
///   after shutdown or to a closed peer, ECONNRESET after an RST (the
///   peer's abort, or its close with bytes it never read, or a fault:
///   reset()), ENOTCONN on a socket not connected. Socket options are taken
///   and ignored. socketPair() makes a connected pair directly.
/// - Links and faults: a link joins two hosts (IP addresses) both ways,
///   with a latency, a window and a bandwidth (setLink: one default, or per
///   pair of hosts; drawLinks: drawn from the seed per pair); segments on
///   a link go out in order at its bandwidth. partition(a, b) stops the
///   segments between two hosts without a reset until heal(a, b); reset(fd)
///   resets a connection at once, resetConnections(a, b) all between two
///   hosts, hostDown(h) all of a host's, refusing connects until hostUp(h)
///   (its processes crashed); a peer that stops reading fills the window
///   and holds its sender.
/// - Each socket operation resumes in the ready phase after its socket let
///   it complete (never inline from another coroutine's operation).
/// - Nodes: startNode(ip, main) runs a process of its own at `ip`, on a
///   reactor of its own in this simulation, that can be killed, paused and
///   restarted (see Node); at() schedules faults at virtual times.
/// - A disk: coio::Disk on it (<coio/testing/sim_disk.hpp>) does each
///   operation on the real file and completes it in virtual time, with
///   the faults of setDiskFaults().
/// - stats() counts as on every reactor; timing (setLoopTiming, the stall
///   handler) measures wall time, not virtual time.
/// - One thread: spawn() and schedule() from the loop thread (or before
///   the loop runs); the simulation has no other thread to hand over from.
class SimReactor : public ReactorLoop<SimReactor> {
 public:
  /// What a simulated socket operation returns: `co_await` it once, on the
  /// loop thread, where it resumes; it yields Result<std::size_t> (recv,
  /// send, sendv: bytes moved), Result<int> (accept: the new socket) or
  /// Result<void> (connect, readable, writable).
  using RecvAwaitable = detail::SimOperation<detail::SimRecvAttempt, std::size_t>;
  /// What send() and sendv() return.
  using SendAwaitable = detail::SimOperation<detail::SimSendAttempt, std::size_t>;
  /// What readable() and writable() return.
  using ReadinessAwaitable = detail::SimOperation<detail::SimReadinessAttempt, void>;
  /// What accept() returns.
  using AcceptAwaitable = detail::SimOperation<detail::SimAcceptAttempt, int>;
  /// What connect() returns.
  using ConnectAwaitable = detail::SimOperation<detail::SimConnectAttempt, void>;

  /// A simulation whose every draw comes from `seed`.
  explicit SimReactor(std::uint64_t seed) : ReactorLoop(seed), seed_(seed) {}

  /// The seed it was made with (for the replay line of a failing run).
  std::uint64_t seed() const noexcept { return seed_; }
  /// What the run did so far, summed up (see the class comment).
  std::uint64_t traceHash() const noexcept { return backend_.world().traceHash(); }
  /// The seed's generator: a test's own draws, so that they replay too.
  Random& random() noexcept { return backend_.world().random(); }

  /// A connected pair of simulated sockets (see the class comment).
  std::pair<int, int> socketPair(Link link = {}) { return backend_.world().socketPair(link.latency, link.window); }
  /// The link between hosts that have none of their own (both ways;
  /// windows are fixed when a connection is made, the rest applies to the
  /// next segment on).
  void setLink(const Link& link) noexcept { backend_.world().setLink(link); }
  /// The link between hosts `a` and `b` (IP addresses, "10.0.0.1" or
  /// "::1"), both ways. std::invalid_argument for a malformed address.
  void setLink(std::string_view a, std::string_view b, const Link& link) {
    backend_.world().setLink(host(a), host(b), link);
  }
  /// A fault drawn from the seed: each pair of hosts without a link of its
  /// own gets one between `low` and `high` (each field uniformly) when its
  /// first segment goes.
  void drawLinks(const Link& low, const Link& high) noexcept { backend_.world().drawLinks(low, high); }
  /// A fault: a partition between hosts `a` and `b`. Bytes, FINs,
  /// connects and RSTs between them stop (nothing is reset: each side sees
  /// silence) until heal(a, b), then arrive in order, as TCP's
  /// retransmissions would deliver them.
  void partition(std::string_view a, std::string_view b) { backend_.world().partition(host(a), host(b)); }
  /// Ends partition(a, b).
  void heal(std::string_view a, std::string_view b) { backend_.world().heal(host(a), host(b)); }
  /// A fault of the network side of a crash: every connection to or from
  /// host `ip` is reset, connects to it are refused and what its sockets
  /// send is lost, until hostUp(ip). Its tasks keep running (they see
  /// their connections reset; its listeners accept again after hostUp):
  /// to kill a process and restart it afresh, make it a Node.
  void hostDown(std::string_view ip) { backend_.world().hostDown(host(ip)); }
  /// Ends hostDown(ip).
  void hostUp(std::string_view ip) { backend_.world().hostUp(host(ip)); }
  /// A fault: every connection between hosts `a` and `b` is reset at once,
  /// both ends (as reset(fd) for each); how many there were.
  std::size_t resetConnections(std::string_view a, std::string_view b) {
    return backend_.world().resetBetween(host(a), host(b));
  }

  /// What the simulated disks on this reactor (<coio/testing/sim_disk.hpp>)
  /// do to the operations submitted from now on: latency and faults.
  void setDiskFaults(const DiskFaults& faults) noexcept { backend_.world().diskFaults() = faults; }
  /// A fault: the connection of `fd` is reset at once; both ends fail
  /// every operation with ECONNRESET, bytes on their way are lost.
  void reset(int fd) { backend_.world().reset(fd); }

  /// Completes once `fd` has bytes to read or its peer's FIN arrived.
  ReadinessAwaitable readable(int fd, std::stop_token stop = {}) noexcept {
    return {backend_, fd, {true}, std::move(stop)};
  }
  /// Completes once `fd`'s peer has room in its window (or sends would fail).
  ReadinessAwaitable writable(int fd, std::stop_token stop = {}) noexcept {
    return {backend_, fd, {false}, std::move(stop)};
  }
  /// The next connection made to the listening socket `fd`: its fd.
  AcceptAwaitable accept(int fd, std::stop_token stop = {}) noexcept { return {backend_, fd, {}, std::move(stop)}; }
  /// Connects `fd` to `address` (a round trip: SYN, then its answer).
  ConnectAwaitable connect(int fd, const sockaddr* address, socklen_t length, std::stop_token stop = {}) noexcept {
    return {backend_, fd, {detail::SimEndpoint::from(address, length)}, std::move(stop)};
  }
  /// Reads what has arrived, up to `buffer`'s size (maybe less: see the
  /// class comment); waits if nothing has; 0 at the end of the stream.
  RecvAwaitable recv(int fd, std::span<std::byte> buffer, std::stop_token stop = {}) noexcept {
    return {backend_, fd, {buffer}, std::move(stop)};
  }
  /// Sends what fits in the peer's window (at least a byte: waits for
  /// room), arriving one latency later; yields the bytes sent.
  SendAwaitable send(int fd, std::span<const std::byte> bytes, std::stop_token stop = {}) noexcept {
    return {backend_, fd, {bytes, {}}, std::move(stop)};
  }
  /// send() of the parts, gathered when sent (what fits of them: a copy).
  /// The parts and their bytes stay valid until the send completes, as
  /// for every reactor.
  SendAwaitable sendv(int fd, std::span<const iovec> parts, std::stop_token stop = {}) noexcept {
    return {backend_, fd, {{}, parts}, std::move(stop)};
  }
  /// Nothing to forget: a simulated fd number is never reused.
  void forget(int) noexcept {}

  /// What a node runs: its process's main, given the node's own reactor.
  using NodeMain = std::function<Task<void>(SimReactor&)>;
  /// Starts a node at `ip` (see Node): `main(reactor)` on a reactor of its
  /// own in this simulation, whose sockets are at `ip`. Only on the
  /// reactor that runs the simulation (not on a node's). The node lives as
  /// long as this reactor, whose destruction kills it if it still runs.
  /// std::invalid_argument for a malformed address or one a live node has.
  Node& startNode(std::string_view ip, NodeMain main);
  /// The node started at `ip`; std::invalid_argument if there is none.
  Node& node(std::string_view ip);

  /// Calls `fault` at virtual time `when`, from the loop, after the
  /// segments and completions due then (a fault schedule: kill a node,
  /// partition, restart...). std::invalid_argument if `when` is past.
  void at(Clock::time_point when, std::function<void()> fault);
  /// at(now() + delay, fault); std::invalid_argument for a negative delay.
  void after(Clock::duration delay, std::function<void()> fault) {
    if (delay < Clock::duration::zero()) throw std::invalid_argument("coio::sim: a fault after a negative delay");
    at(now() + delay, std::move(fault));
  }

  ~SimReactor();

 private:
  friend class detail::SimDiskRing;
  friend class Node;

  // A node's reactor, in `runner`'s world at `address`.
  SimReactor(SimReactor& runner, const detail::SimEndpoint& address)
      : ReactorLoop(runner.backend_, address), seed_(runner.seed_) {
    // The simulation has one thread: the node's loop is "entered" for good,
    // so that what wakes its coroutines queues them directly.
    loopThread_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    backend_.reactor = this;
    backend_.hasReady = [](void* r) noexcept { return static_cast<SimReactor*>(r)->readyCount() != 0; };
    backend_.turn = [](void* r) {
      auto& self = *static_cast<SimReactor*>(r);
      self.readyAndTimers();
      // A task of the node failed (it stopped its loop): the simulation fails.
      if (std::exception_ptr failure = self.takeFailure()) std::rethrow_exception(failure);
    };
  }

  static detail::SimEndpoint host(std::string_view ip) {
    const std::string text(ip);
    detail::SimEndpoint e;
    if (::inet_pton(AF_INET, text.c_str(), e.ip.data()) == 1) {
      e.family = AF_INET;
    } else if (::inet_pton(AF_INET6, text.c_str(), e.ip.data()) == 1) {
      e.family = AF_INET6;
    } else {
      throw std::invalid_argument("coio::sim: not an IP address: '" + text + "'");
    }
    return e;
  }

  std::uint64_t seed_;
  std::vector<std::unique_ptr<Node>> nodes_;  // the runner's
};

/// A node of a simulation (SimReactor::startNode): a process of its own,
/// at its own address, running its main on its own reactor in the
/// simulation's world, with the files it finds on disk (real files: kept
/// across restarts).
///
/// Guarantees:
/// - Its sockets are at its address (binding the wildcard binds it, a
///   connect without bind leaves from it): faults between hosts (partition,
///   setLink, resetConnections) apply to it by its address.
/// - Its coroutines take their turns in the simulation's loop, in an order
///   drawn from the seed among the nodes ready at one instant.
/// - kill(mode): at once, its connections are reset or go silent (see
///   KillMode) and its listeners are gone, then its main's stop token is
///   stopped and its tasks run alone, at that instant, until main returns:
///   its operations on its sockets fail, a stop cancels the rest, and the
///   node's frames are gone before kill() returns. A node whose tasks
///   still wait then (on what no stop cancels: a Baton never posted, an
///   operation given a token of its own) is an error: sim::Deadlock,
///   naming it. (A real crash runs no
///   destructors; a simulated one does, so that the service's own
///   invariants hold: lost writes are the disk faults' to model.)
/// - pause() / resume(): as SIGSTOP / SIGCONT: nothing of it runs and its
///   timers wait; the network still delivers to its sockets (until their
///   windows are full), so its peers see silence.
/// - restart(): kill() (reset) if it is alive, then main again on a fresh
///   reactor at the same address.
/// - Only from the loop of the reactor that runs the simulation, or a
///   fault it scheduled (SimReactor::at), or another node: a node's own
///   tasks cannot kill, pause or restart it (std::logic_error).
class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// Its address, as given to startNode.
  const std::string& address() const noexcept { return address_; }
  /// Running: started (or restarted), not killed, its main not returned.
  bool alive() const noexcept { return reactor_ != nullptr && running_; }
  /// Stopped by pause(), not resumed yet.
  bool paused() const noexcept { return reactor_ != nullptr && reactor_->backend_.paused; }
  /// Its process's reactor (its stats, its random()); std::logic_error once killed.
  SimReactor& reactor() {
    if (!reactor_) throw std::logic_error("coio::sim: node " + address_ + " is not running");
    return *reactor_;
  }

  /// Kills it (see the class comment); nothing if it is not running.
  void kill(KillMode mode = KillMode::reset) {
    if (!reactor_ || killing_) return;  // (a fault due while it dies: it is dying)
    checkNotOwnTurn("killed");
    struct Killing {
      bool& flag;
      explicit Killing(bool& f) : flag(f) { flag = true; }
      ~Killing() { flag = false; }
    } killing{killing_};
    detail::SimWorld& world = runner_.backend_.world();
    detail::SimBackend& backend = reactor_->backend_;
    backend.paused = false;
    world.crashSockets(backend, mode == KillMode::silent);
    if (mode == KillMode::silent) world.silence(backend.host);
    stop_.request_stop();
    if (!world.drain(backend, [this] { return !running_; })) {
      throw Deadlock("coio::sim: node " + address_ + " was killed at " + std::to_string(secondsNow()) +
                     " s of virtual time and its tasks did not end when stopped: they wait on what no stop "
                     "cancels (a Baton, an operation given a token of its own)");
    }
    reactor_.reset();  // what its tasks spawned and left: destroyed
  }

  /// Stops it (SIGSTOP); resume() goes on.
  void pause() {
    checkNotOwnTurn("paused");
    reactor().backend_.paused = true;
  }
  /// Goes on after pause() (SIGCONT): its overdue timers fire now.
  void resume() { reactor().backend_.paused = false; }

  /// kill() if it runs, then main again, on a fresh reactor at its address.
  void restart() {
    if (killing_) throw std::logic_error("coio::sim: node " + address_ + " restarted while it is being killed");
    kill();
    start();
  }

 private:
  friend class SimReactor;

  Node(SimReactor& runner, std::string address, detail::SimEndpoint host, SimReactor::NodeMain main)
      : runner_(runner), address_(std::move(address)), host_(host), main_(std::move(main)) {}

  void start() {
    runner_.backend_.world().unsilence(host_);
    reactor_.reset(new SimReactor(runner_, host_));
    stop_ = std::stop_source();
    running_ = true;
    reactor_->spawn(run(*this, withStopToken(stop_.get_token(), main_(*reactor_))));
  }

  static Task<void> run(Node& self, Task<void> main) {
    co_await std::move(main);
    self.running_ = false;
  }

  void checkNotOwnTurn(const char* what) const {
    if (reactor_ && runner_.backend_.world().turning() == &reactor_->backend_) {
      throw std::logic_error("coio::sim: node " + address_ + " " + what + " by its own task");
    }
  }
  double secondsNow() const { return std::chrono::duration<double>(runner_.now().time_since_epoch()).count(); }

  SimReactor& runner_;
  std::string address_;
  detail::SimEndpoint host_;
  SimReactor::NodeMain main_;
  std::unique_ptr<SimReactor> reactor_;
  std::stop_source stop_;
  bool running_ = false;
  bool killing_ = false;  // kill() under way (its drain may run a fault that kills it again)
};

inline Node& SimReactor::startNode(std::string_view ip, NodeMain main) {
  if (backend_.host.family != AF_UNSPEC) throw std::logic_error("coio::sim: startNode on a node's reactor");
  const detail::SimEndpoint h = host(ip);
  for (const auto& n : nodes_) {
    if (n->host_ == h && n->reactor_) throw std::invalid_argument("coio::sim: a node runs at " + std::string(ip) + " already");
  }
  std::erase_if(nodes_, [&](const auto& n) { return n->host_ == h; });  // a dead one's place
  nodes_.push_back(std::unique_ptr<Node>(new Node(*this, std::string(ip), h, std::move(main))));
  backend_.world().trace(0x57A7);
  nodes_.back()->start();
  return *nodes_.back();
}

inline Node& SimReactor::node(std::string_view ip) {
  const detail::SimEndpoint h = host(ip);
  for (const auto& n : nodes_) {
    if (n->host_ == h) return *n;
  }
  throw std::invalid_argument("coio::sim: no node at " + std::string(ip));
}

inline void SimReactor::at(Clock::time_point when, std::function<void()> fault) {
  if (when < now()) {
    throw std::invalid_argument("coio::sim: a fault at " +
                                std::to_string(std::chrono::duration<double>(when.time_since_epoch()).count()) +
                                " s, before now (" +
                                std::to_string(std::chrono::duration<double>(now().time_since_epoch()).count()) + " s)");
  }
  backend_.world().at(when, std::move(fault));
}

}  // namespace coio::sim

namespace coio::detail {
inline std::uint64_t& lastTraceSlot() noexcept {
  thread_local std::uint64_t trace = 0;
  return trace;
}
}  // namespace coio::detail

namespace coio::sim {

/// The trace hash of the simulation that ended last on this thread (when
/// the SimReactor that ran it was destroyed): a run that threw has no
/// other, and runSeeds puts it in the failure's replay line.
inline std::uint64_t lastTraceHash() noexcept { return detail::lastTraceSlot(); }

// The nodes go first: their reactors leave the world before the runner's.
// Those still running are killed, so that a run that failed (an exception
// out of runUntil) unwinds as one that ended does: their tasks end as when
// stopped (a service that asserts it was shut down before it is destroyed
// is), and one that cannot end is destroyed as it is.
inline SimReactor::~SimReactor() {
  for (const auto& n : nodes_) {
    try {
      n->kill();
    } catch (...) {  // a node that could not end: destroyed below, frames and all
    }
  }
  nodes_.clear();
  if (backend_.host.family == AF_UNSPEC) detail::lastTraceSlot() = traceHash();
}

}  // namespace coio::sim
