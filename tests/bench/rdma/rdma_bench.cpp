// rdma_bench: coio's RDMA WRITE / READ bandwidth and SEND message rate on
// one device (two queue pairs of this process connected over loopback), for
// comparison with perftest's ib_write_bw / ib_read_bw / ib_send_bw at the
// same size, iteration count and depth (run_rdma_bench.sh does both).
//
//   rdma_bench write|read|send --size BYTES --iters N --depth D [--reactor epoll|uring]
//              [--poll-before-sleep N]   (QueuePairConfig::pollBeforeSleep)
//              [--spin-polls N]   (QueuePairConfig::spinPolls)
//              [--split 1]     (send: the receiving queue pair on a reactor thread
//                               of its own, as perftest runs its server apart)
//              [--ack-batch N] (send: ackBatch = signalBatch; default buffers / 4)
//
// Prints `RESULT <op> <size> <MiB/s> <Mmsg/s>`; MiB = 2^20 bytes, as perftest.
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/rdma/rdma.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include "../../rdma/connected_pair.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
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
  std::uint32_t pollBeforeSleep = QueuePairConfig{}.pollBeforeSleep;
  std::uint32_t spinPolls = QueuePairConfig{}.spinPolls;
  bool split = false;
  std::uint32_t ackBatch = 0;  // send: 0 = a quarter of the buffers
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "rdma_bench: %s\nusage: rdma_bench write|read|send --size B --iters N --depth D "
                       "[--reactor epoll|uring] [--poll-before-sleep N] [--spin-polls N] [--split 0|1] [--ack-batch N]\n", why);
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
    else if (key == "--split") o.split = std::string_view(value) == "1";
    else if (key == "--ack-batch") o.ackBatch = static_cast<std::uint32_t>(std::strtoul(value, nullptr, 10));
    else if (key == "--poll-before-sleep") o.pollBeforeSleep = static_cast<std::uint32_t>(std::strtoul(value, nullptr, 10));
    else if (key == "--spin-polls") o.spinPolls = static_cast<std::uint32_t>(std::strtoul(value, nullptr, 10));
    else usage("unknown option");
  }
  if (o.size == 0 || o.iters == 0 || o.depth == 0) usage("size, iters and depth must be positive");
  if (o.split && o.op != "send") usage("--split is for send");
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
Task<Result<void>> sendAll(QueuePair<R>& qp, const Options& o) {
  std::vector<std::byte> message(o.size, std::byte{0x5a});
  for (std::size_t i = 0; i < o.iters; ++i) {
    Result<void> r = co_await qp.send(message);
    if (!r) co_return r;
  }
  co_return Result<void>{};
}

template <typename R>
Task<Result<void>> receiveAll(QueuePair<R>& qp, const Options& o) {
  std::vector<std::byte> buffer(o.size);
  for (std::size_t i = 0; i < o.iters; ++i) {
    Result<std::size_t> r = co_await qp.recv(buffer);
    if (!r) co_return r.error();
  }
  co_return Result<void>{};
}

template <typename R>
Task<Result<void>> sendLoop(QueuePair<R>& a, QueuePair<R>& b, const Options& o) {
  auto [sent, received] = co_await collectAll(sendAll(a, o), receiveAll(b, o));
  co_return !sent ? sent : received;
}

// --split: the receiving side, on its own reactor thread. Tells where it
// listens through `where`; after the last message, one byte over the TCP
// stream tells the sender it is done.
template <typename R>
Task<Result<void>> splitReceiver(R& reactor, const Device& device, QueuePairConfig config, const Options& o,
                                 std::promise<Result<SocketAddress>>& where) {
  Result<TcpListener<R>> listener = TcpListener<R>::bind(reactor, SocketAddress::loopbackV4());
  Result<SocketAddress> address = listener ? listener->localAddress() : Result<SocketAddress>(listener.error());
  where.set_value(address);
  if (!address) co_return address.error();
  Result<TcpStream<R>> stream = co_await listener->accept();
  if (!stream) co_return stream.error();
  Result<std::unique_ptr<QueuePair<R>>> qp = QueuePair<R>::create(reactor, device, config);
  if (!qp) co_return qp.error();
  Result<void> outcome = co_await (*qp)->connect(*stream);
  if (outcome) outcome = co_await receiveAll(**qp, o);
  const std::byte done{1};
  if (outcome) outcome = co_await stream->writeAll(std::span(&done, 1));
  Result<void> closed = co_await (*qp)->close();
  co_return outcome ? closed : outcome;
}

// --split: the sending side, on the caller's reactor; how long from the
// first send until the receiver had every message.
template <typename R>
Task<Result<double>> splitSend(R& reactor, const Device& device, const QueuePairConfig& config, const Options& o) {
  R peer;
  std::promise<Result<SocketAddress>> where;
  Result<void> received = std::errc::operation_canceled;
  std::thread receiver([&] {
    try {
      received = peer.runUntil(splitReceiver(peer, device, config, o, where));
    } catch (const std::system_error& e) {  // stopped: see below
      received = e.code();
    }
  });
  // A way out before the receiver finished (a failed connect): stop it.
  struct StopAndJoin {
    R& peer;
    std::thread& thread;
    ~StopAndJoin() {
      if (!thread.joinable()) return;
      peer.stop();
      thread.join();
    }
  } guard{peer, receiver};
  Result<SocketAddress> address = where.get_future().get();  // blocks this loop briefly, before any I/O
  if (!address) co_return address.error();
  Result<TcpStream<R>> stream = co_await TcpStream<R>::connect(reactor, *address);
  if (!stream) co_return stream.error();
  Result<std::unique_ptr<QueuePair<R>>> qp = QueuePair<R>::create(reactor, device, config);
  if (!qp) co_return qp.error();
  Result<void> outcome = co_await (*qp)->connect(*stream);
  const Clock::time_point start = Clock::now();
  if (outcome) outcome = co_await sendAll(**qp, o);
  std::byte done{};
  if (outcome) outcome = co_await stream->readExact(std::span(&done, 1));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  Result<void> closed = co_await (*qp)->close();
  if (outcome) receiver.join();  // it finishes by itself: close() on its side
  if (!outcome) co_return outcome.error();
  if (!closed) co_return closed.error();
  if (!received) co_return received.error();
  co_return seconds;
}

void report(const Options& o, double seconds) {
  const double bytes = static_cast<double>(o.size) * static_cast<double>(o.iters);
  std::printf("RESULT %s %zu %.2f %.4f\n", o.op.c_str(), o.size, bytes / seconds / (1 << 20),
              static_cast<double>(o.iters) / seconds / 1e6);
}

template <typename R>
Task<int> run(R& reactor, const Device& device, const Options& o) {
  QueuePairConfig config;
  config.maxRdmaWr = static_cast<std::uint32_t>(o.depth);
  config.maxRdmaWrPerPost = std::min<std::uint32_t>(config.maxRdmaWr, 32);
  config.pollBeforeSleep = o.pollBeforeSleep;
  config.spinPolls = o.spinPolls;
  if (o.op == "send") {
    config.messageSize = static_cast<std::uint32_t>(o.size);
    config.messageBuffers = static_cast<std::uint32_t>(std::max<std::size_t>(o.depth, 2));
    config.ackBatch = config.signalBatch = o.ackBatch ? o.ackBatch : std::max<std::uint32_t>(config.messageBuffers / 4, 1);
  }
  if (o.split) {
    Result<double> seconds = co_await splitSend(reactor, device, config, o);
    if (!seconds) {
      std::fprintf(stderr, "rdma_bench: %s\n", seconds.error().message().c_str());
      co_return 1;
    }
    report(o, *seconds);
    co_return 0;
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
  report(o, seconds);
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
