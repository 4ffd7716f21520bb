// rdma_bench: coio's RDMA WRITE / READ bandwidth and SEND message rate on
// one device (two queue pairs of this process connected over loopback), for
// comparison with perftest's ib_write_bw / ib_read_bw / ib_send_bw at the
// same size, iteration count and depth (run_rdma_bench.sh does both).
//
//   rdma_bench write|read|send --size BYTES --iters N --depth D [--reactor epoll|uring]
//
// Prints `RESULT <op> <size> <MiB/s> <Mmsg/s>`; MiB = 2^20 bytes, as perftest.
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/rdma/rdma.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include "../../rdma/connected_pair.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

using namespace coio;
using namespace coio::rdma;

namespace {

struct Options {
  std::string op = "write";
  std::size_t size = 65536;
  std::size_t iters = 1000;
  std::size_t depth = 16;
  ReactorKind reactor = ReactorKind::epoll;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "rdma_bench: %s\nusage: rdma_bench write|read|send --size B --iters N --depth D "
                       "[--reactor epoll|uring]\n", why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) usage("no operation");
  o.op = argv[1];
  if (o.op != "write" && o.op != "read" && o.op != "send") usage("unknown operation");
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view key = argv[i];
    const char* value = argv[i + 1];
    if (key == "--size") o.size = std::strtoull(value, nullptr, 10);
    else if (key == "--iters") o.iters = std::strtoull(value, nullptr, 10);
    else if (key == "--depth") o.depth = std::strtoull(value, nullptr, 10);
    else if (key == "--reactor") o.reactor = parseReactorKind(value).valueOr(ReactorKind::epoll);
    else usage("unknown option");
  }
  if (o.size == 0 || o.iters == 0 || o.depth == 0) usage("size, iters and depth must be positive");
  return o;
}

using Clock = std::chrono::steady_clock;

// `depth` coroutines, each keeping one RDMA operation in flight on its own
// slice, until `iters` operations are done.
template <typename R>
Task<Result<void>> rdmaLoop(QueuePair<R>& qp, const Options& o, const MemoryRegion& local, const MemoryRegion& remote) {
  std::size_t issued = 0;
  const RdmaOp op = o.op == "write" ? RdmaOp::write : RdmaOp::read;
  auto slot = [&](std::size_t k) -> Task<Result<void>> {
    const LocalBuffer mine = local.local(k * o.size, o.size);
    const RemoteBuffer theirs = remote.remote(remote.memory().subspan(k * o.size, o.size));
    while (issued < o.iters) {
      ++issued;
      // What rdmaWrite / rdmaRead do, with the operation picked at run time.
      RdmaBatch<R> batch = qp.rdmaBatch(op);
      Result<void> r = batch.add(theirs, mine);
      if (r) r = co_await batch.post();
      if (!r) co_return r;
    }
    co_return Result<void>{};
  };
  std::vector<Task<Result<void>>> slots;
  for (std::size_t k = 0; k < o.depth; ++k) slots.push_back(slot(k));
  std::vector<Result<void>> results = co_await collectAllRange(std::move(slots));
  for (Result<void>& r : results) {
    if (!r) co_return r;
  }
  co_return Result<void>{};
}

template <typename R>
Task<Result<void>> sendLoop(QueuePair<R>& a, QueuePair<R>& b, const Options& o) {
  auto sender = [&]() -> Task<Result<void>> {
    std::vector<std::byte> message(o.size, std::byte{0x5a});
    for (std::size_t i = 0; i < o.iters; ++i) {
      Result<void> r = co_await a.send(message);
      if (!r) co_return r;
    }
    co_return Result<void>{};
  };
  auto receiver = [&]() -> Task<Result<void>> {
    std::vector<std::byte> buffer(o.size);
    for (std::size_t i = 0; i < o.iters; ++i) {
      Result<std::size_t> r = co_await b.recv(buffer);
      if (!r) co_return r.error();
    }
    co_return Result<void>{};
  };
  auto [sent, received] = co_await collectAll(sender(), receiver());
  co_return !sent ? sent : received;
}

template <typename R>
Task<int> run(R& reactor, const Device& device, const Options& o) {
  QueuePairConfig config;
  config.maxRdmaWr = static_cast<std::uint32_t>(o.depth);
  config.maxRdmaWrPerPost = std::min<std::uint32_t>(config.maxRdmaWr, 32);
  if (o.op == "send") {
    config.messageSize = static_cast<std::uint32_t>(o.size);
    config.messageBuffers = static_cast<std::uint32_t>(std::max<std::size_t>(o.depth, 2));
    config.ackBatch = config.signalBatch = std::max<std::uint32_t>(config.messageBuffers / 4, 1);
  }
  std::string why;
  Result<testing::ConnectedPair<R>> pair = co_await testing::connectPair(reactor, device, config, config, &why);
  if (!pair) {
    std::fprintf(stderr, "rdma_bench: %s (%s)\n", pair.error().message().c_str(), why.c_str());
    co_return 1;
  }
  std::vector<std::byte> localMemory(o.op == "send" ? 1 : o.size * o.depth);
  std::vector<std::byte> remoteMemory(localMemory.size());
  Result<MemoryRegion> local = MemoryRegion::create(device, localMemory, kAccessAll);
  Result<MemoryRegion> remote = MemoryRegion::create(device, remoteMemory, kAccessAll);
  Result<void> outcome = pair->connected;
  double seconds = 0;
  if (outcome && local && remote) {
    const Clock::time_point start = Clock::now();
    if (o.op == "send") {
      outcome = co_await sendLoop(*pair->a, *pair->b, o);
    } else {
      outcome = co_await rdmaLoop(*pair->a, o, *local, *remote);
    }
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } else if (outcome) {
    outcome = local ? remote.error() : local.error();
  }
  Result<void> closedA = co_await pair->a->close();
  Result<void> closedB = co_await pair->b->close();
  if (!outcome) {
    std::fprintf(stderr, "rdma_bench: %s\n", outcome.error().message().c_str());
    co_return 1;
  }
  if (!closedA || !closedB) std::fprintf(stderr, "rdma_bench: close failed\n");
  const double bytes = static_cast<double>(o.size) * static_cast<double>(o.iters);
  std::printf("RESULT %s %zu %.2f %.4f\n", o.op.c_str(), o.size, bytes / seconds / (1 << 20),
              static_cast<double>(o.iters) / seconds / 1e6);
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const char* name = std::getenv("COIO_RDMA_DEVICE");
  std::string why;
  Result<std::unique_ptr<Device>> device = Device::open({name ? name : ""}, &why);
  if (!device) {
    std::fprintf(stderr, "rdma_bench: %s\n", why.c_str());
    return 1;
  }
  return withReactor(usableReactorKind(options.reactor),
                     [&](auto& reactor) { return reactor.runUntil(run(reactor, **device, options)); });
}
