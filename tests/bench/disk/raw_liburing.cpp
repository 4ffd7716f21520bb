// The baseline for the CPU-bound path: a minimal loop over raw liburing,
// as a C programmer would write it: prepare `depth` reads, one
// io_uring_submit_and_wait for all of them, reap, repeat.
#include "disk_bench.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace disk_bench {

Outcome runRaw(const Config& config) {
  const int fd = ::open(config.file.c_str(), O_RDONLY | (config.direct ? O_DIRECT : 0));
  if (fd < 0) {
    std::perror("open");
    std::exit(1);
  }
  io_uring ring;
  if (io_uring_queue_init(config.depth, &ring, 0) < 0) {
    std::perror("io_uring_queue_init");
    std::exit(1);
  }
  void* memory = nullptr;
  if (::posix_memalign(&memory, 4096, config.blockSize * config.depth) != 0) std::exit(1);
  auto* buffers = static_cast<char*>(memory);
  Random random(config.seed);
  const std::uint64_t blocks = config.fileSize / config.blockSize;
  Outcome outcome;
  const auto start = Clock::now();
  const auto end = start + config.duration;
  while (Clock::now() < end) {
    for (unsigned i = 0; i < config.depth; ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(sqe, fd, buffers + i * config.blockSize, static_cast<unsigned>(config.blockSize),
                         random.below(blocks) * config.blockSize);
    }
    io_uring_submit_and_wait(&ring, config.depth);
    io_uring_cqe* cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++n;
      if (cqe->res != static_cast<int>(config.blockSize)) ++outcome.errors;
    }
    io_uring_cq_advance(&ring, n);
    outcome.operations += n;
  }
  outcome.elapsed = Clock::now() - start;
  io_uring_queue_exit(&ring);
  std::free(memory);
  ::close(fd);
  return outcome;
}

}  // namespace disk_bench
