#pragma once
// The simulation's public vocabulary (coio::sim): its error, its random
// generator, and what a link and the disk's faults are. SimReactor
// (<coio/testing/sim_reactor.hpp>) and its backend use them.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace coio::sim {

/// A simulation that cannot go on: nothing is ready to run, no timer is
/// set, no segment is on its way and no disk operation will complete, yet
/// the loop was asked to wait (every task
/// waits for something that will never happen). Thrown out of run() /
/// runUntil() instead of waiting for ever.
class Deadlock : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// How a node dies (Node::kill): `reset`, its process crashed on a
/// machine that stays up: the kernel resets its connections (their peers
/// get an RST) and refuses connects to its ports; `silent`, its machine is
/// gone: nothing answers, what is sent to it is lost and connects to it
/// time out, until it restarts.
enum class KillMode { reset, silent };

/// splitmix64: one 64-bit state, the same sequence on every compiler and
/// standard library (std::shuffle and the distributions are not).
class Random {
 public:
  /// The sequence of `seed`.
  explicit Random(std::uint64_t seed) noexcept : state_(seed) {}
  /// The next 64 bits of the sequence.
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

/// A link between two hosts of the simulated network (SimReactor::setLink),
/// both ways: how long a segment takes to arrive, how many bytes may be
/// unread or on their way to a connection's end (the window, fixed when
/// the connection is made), and how fast bytes go out.
struct Link {
  std::chrono::steady_clock::duration latency = std::chrono::microseconds(50);  ///< each way
  std::size_t window = 64 * 1024;  ///< bytes unread or on their way to one end, at most
  std::uint64_t bandwidth = 0;     ///< bytes per second each way; 0: no limit
};

/// What the simulated disk (<coio/testing/sim_disk.hpp>) does to each
/// operation, drawn from the seed (SimReactor::setDiskFaults). Each fault
/// is a probability per operation, 0 to 1.
struct DiskFaults {
  std::chrono::steady_clock::duration minLatency = std::chrono::microseconds(20);  ///< per operation, uniform
  std::chrono::steady_clock::duration maxLatency = std::chrono::microseconds(200);  ///< between these
  double eio = 0;        ///< a read, write or fsync fails with EIO (nothing is transferred)
  double shortRead = 0;  ///< a read of more than a byte returns a shorter prefix of it
  double hang = 0;       ///< a read or write never completes until cancelled
  double enospc = 0;     ///< a write fails with ENOSPC (nothing is written)
};

}  // namespace coio::sim
