#pragma once
// Shared by disk_bench's engines: the run's configuration and outcome.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace disk_bench {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string engine = "uring";  // epoll | uring (coio on that reactor) | raw (hand-written liburing loop)
  std::string file;
  std::uint64_t fileSize = 0;
  std::size_t blockSize = 4096;
  unsigned depth = 32;
  bool write = false;             // random writes instead of reads (coio engines only)
  bool datasync = false;          // each write (or batch) followed by fdatasync, timed together
  unsigned batch = 1;             // operations per Read/WriteBatch (1: each worker awaits single ones)
  bool direct = true;
  bool fixed = false;             // registered buffers and file
  unsigned eagerBelow = 64;       // Disk::Options::eagerBelow
  bool latency = true;            // record per-read latency
  bool transparentHugePages = true;  // BufferPool::Options::transparentHugePages
  Clock::duration duration = std::chrono::seconds(5);
  // Where the offsets start: worker i draws from Random(seed + i). Drawn
  // afresh per run unless --seed is given, as fio's --randrepeat=0: a run
  // that repeats the last one's offsets finds blocks a cache below the
  // guest (the host's page cache, a virtual disk's) kept, and fio's do not.
  std::uint64_t seed = 0;
};

struct Outcome {
  std::uint64_t operations = 0;
  std::uint64_t errors = 0;
  Clock::duration elapsed{};
  std::vector<std::uint32_t> latencies;  // ns, one per operation (if recorded)
};

/// xorshift64*: cheap enough not to show in a 1 µs read.
class Random {
 public:
  explicit Random(std::uint64_t seed) noexcept : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t below(std::uint64_t n) noexcept {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return (state_ * 0x2545F4914F6CDD1Dull) % n;
  }

 private:
  std::uint64_t state_;
};

Outcome runRaw(const Config& config);

}  // namespace disk_bench
