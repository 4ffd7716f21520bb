#pragma once
// The simulated network's sockets (SimWorld holds them): a socket's
// state, its address, the bytes it has not read, and the operation waiting
// on it.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <bit>
#include <compare>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <vector>

namespace coio::detail {

struct SimLoop;

/// A simulated socket's waiting operation (recv, send, accept, connect,
/// readable, writable): `onEvent` is called when the socket's state changed
/// so that it may complete; it returns whether it did (it then queued its
/// coroutine to resume).
struct SimWaiter {
  bool (*onEvent)(SimWaiter*) noexcept = nullptr;
};

/// An address in the simulated network: family, IP and port (IPv4's four
/// bytes first in `ip`). The key listeners are found by.
struct SimEndpoint {
  sa_family_t family = AF_UNSPEC;
  std::array<std::uint8_t, 16> ip{};
  std::uint16_t port = 0;  // host order

  bool operator==(const SimEndpoint&) const = default;
  /// Family, then the address byte by byte, then the port (compared eight
  /// bytes at a time: the links' and hosts' maps compare endpoints per segment).
  friend std::strong_ordering operator<=>(const SimEndpoint& a, const SimEndpoint& b) noexcept {
    if (a.family != b.family) return a.family <=> b.family;
    for (std::size_t at = 0; at < a.ip.size(); at += 8) {
      std::uint64_t x, y;
      std::memcpy(&x, a.ip.data() + at, 8);
      std::memcpy(&y, b.ip.data() + at, 8);
      if (x == y) continue;
      if constexpr (std::endian::native == std::endian::little) x = __builtin_bswap64(x), y = __builtin_bswap64(y);
      return x <=> y;  // as big-endian numbers: the first differing byte decides
    }
    return a.port <=> b.port;
  }
  bool wildcard() const noexcept { return ip == std::array<std::uint8_t, 16>{}; }

  /// `address` as an endpoint, or nullopt (not AF_INET / AF_INET6, short).
  static std::optional<SimEndpoint> from(const sockaddr* address, socklen_t length) noexcept {
    SimEndpoint e;
    if (address == nullptr) return std::nullopt;
    if (address->sa_family == AF_INET && length >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(address);
      e.family = AF_INET;
      std::memcpy(e.ip.data(), &in->sin_addr, 4);
      e.port = ntohs(in->sin_port);
      return e;
    }
    if (address->sa_family == AF_INET6 && length >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
      e.family = AF_INET6;
      std::memcpy(e.ip.data(), &in6->sin6_addr, 16);
      e.port = ntohs(in6->sin6_port);
      return e;
    }
    return std::nullopt;
  }

  /// The loopback address of `family` (where a socket of the reactor that
  /// runs the simulation is when it connects without binding).
  static SimEndpoint loopback(sa_family_t family) noexcept {
    SimEndpoint e;
    e.family = family;
    if (family == AF_INET) e.ip[0] = 127, e.ip[3] = 1;
    else e.ip[15] = 1;
    return e;
  }

  /// As a sockaddr in `out`: its length.
  socklen_t store(sockaddr_storage& out) const noexcept {
    out = {};
    if (family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&out);
      in6->sin6_family = AF_INET6;
      std::memcpy(&in6->sin6_addr, ip.data(), 16);
      in6->sin6_port = htons(port);
      return sizeof(sockaddr_in6);
    }
    auto* in = reinterpret_cast<sockaddr_in*>(&out);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, ip.data(), 4);
    in->sin_port = htons(port);
    return sizeof(sockaddr_in);
  }
};

/// Segments' byte buffers read to the end, kept for the next segments
/// sent: a segment is often tens of KiB, and allocating it afresh (and
/// touching new pages) cost more than copying its bytes.
class SimSpareBytes {
 public:
  /// An empty buffer, with the capacity of one given back if there is one.
  std::vector<std::byte> take() {
    if (spare_.empty()) return {};
    std::vector<std::byte> bytes = std::move(spare_.back());
    spare_.pop_back();
    return bytes;
  }
  void giveBack(std::vector<std::byte>&& bytes) {
    if (spare_.size() == kKept) return;  // dropped: freed with its segment
    bytes.clear();
    spare_.push_back(std::move(bytes));
  }

 private:
  static constexpr std::size_t kKept = 64;
  std::vector<std::vector<std::byte>> spare_;
};

/// Bytes arrived at a simulated socket and not read yet, kept as the
/// segments they came in (a read copies each byte once).
class SimInbox {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  void push(std::vector<std::byte>&& bytes) {
    if (bytes.empty()) return;
    size_ += bytes.size();
    segments_.push_back(std::move(bytes));
  }
  /// Moves the first `n` bytes (at most size()) to `into`; the buffers of
  /// segments read to the end go to `spare`.
  void take(std::byte* into, std::size_t n, SimSpareBytes& spare) {
    size_ -= n;
    while (n != 0) {
      std::vector<std::byte>& front = segments_.front();
      const std::size_t k = std::min(n, front.size() - head_);
      std::memcpy(into, front.data() + head_, k);
      into += k;
      n -= k;
      head_ += k;
      if (head_ == front.size()) {
        spare.giveBack(std::move(front));
        segments_.pop_front();
        head_ = 0;
      }
    }
  }
  void clear() noexcept {
    segments_.clear();
    head_ = 0;
    size_ = 0;
  }

 private:
  std::deque<std::vector<std::byte>> segments_;
  std::size_t head_ = 0;  // bytes of the first segment already read
  std::size_t size_ = 0;
};

/// One simulated socket: fresh, then listening, or connecting and then
/// connected (or failed: the connect's error).
struct SimSocket {
  enum class State : std::uint8_t { fresh, listening, connecting, connected, failed };
  int fd = -1;
  State state = State::fresh;
  bool open = true;           // not closed by its owner
  bool bound = false;         // `local` is taken
  bool finReceived = false;   // the peer's FIN arrived: reads end once `inbox` is drained
  bool readShut = false;      // shutdown(SHUT_RD): reads end now
  bool finSent = false;       // shutdown or close: no more sends
  bool reset = false;         // RST: every operation fails with ECONNRESET
  int error = 0;              // a failed connect's errno
  int peer = -1;              // connected: the other end's fd
  SimEndpoint local;
  SimEndpoint remote;         // connecting or connected: the peer's address
  std::deque<int> accepted;   // listening: connections made, not accepted yet
  std::size_t backlog = 0;    // listening: at most this many in `accepted`
  SimInbox inbox;               // arrived, not read yet
  std::size_t inFlight = 0;     // bytes sent to this socket, not arrived yet
  std::size_t acking = 0;       // bytes read whose window update is on its way to the sender
  std::size_t capacity = 0;     // inbox + inFlight + acking may not exceed it (the window)
  std::chrono::steady_clock::duration latency{};  // socketPair's (no address, no link): of segments to it
  std::chrono::steady_clock::time_point lastArrival{};  // of the segments to it: they arrive in order
  SimWaiter* reader = nullptr;
  SimWaiter* writer = nullptr;
  SimLoop* owner = nullptr;     // the reactor (process) it belongs to; socketPair's: none
};

}  // namespace coio::detail
