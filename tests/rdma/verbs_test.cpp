// RDMA tests on a real verbs stack (label `rdma`): run them where a device
// exists, e.g. in the Soft-RoCE guest (tests/rdma/vm/run.sh). A missing
// device is a failure here, not a skip. COIO_RDMA_DEVICE picks the device.
// One file, though long: the cases share the device, the pair set-up and
// the peer-process helpers above them, and run only in the guest, as one
// binary (split, each part would repeat the helpers or need a header of them).
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/disk/buffer_pool.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/rdma/rdma.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/with_timeout.hpp>
#if COIO_TEST_URING
#include <coio/reactor/uring_reactor.hpp>
#endif

#include <catch2/catch.hpp>

#include "../killed_at_end.hpp"
#include "connected_pair.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace coio;
using namespace coio::rdma;
using namespace std::chrono_literals;

namespace {

#if COIO_TEST_URING
using Reactors = std::tuple<EpollReactor, UringReactor>;
#else
using Reactors = std::tuple<EpollReactor>;
#endif

template <typename R>
bool usable() {
#if COIO_TEST_URING
  if constexpr (std::is_same_v<R, UringReactor>) {
    std::string why;
    if (!UringReactor::probe(&why)) {
      WARN("io_uring reactor unusable on this kernel, its variant is skipped: " << why);
      return false;
    }
  }
#endif
  return true;
}

const Device& device() {
  static const std::unique_ptr<Device> opened = [] {
    const char* name = std::getenv("COIO_RDMA_DEVICE");
    std::string why;
    Result<std::unique_ptr<Device>> d = Device::open({name ? name : ""}, &why);
    if (!d) FAIL("no usable RDMA device: " << why);
    return std::move(*d);
  }();
  return *opened;
}

// Registered memory for RDMA in both directions.
struct Registered {
  explicit Registered(std::size_t n) : bytes(n), mr(*MemoryRegion::create(device(), bytes, kAccessAll)) {}
  std::span<std::byte> span(std::size_t offset, std::size_t n) { return std::span(bytes).subspan(offset, n); }
  void fill(std::uint8_t seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 131 + seed);
  }
  bool matches(std::size_t offset, std::size_t n, std::uint8_t seed, std::size_t seedOffset) const {
    for (std::size_t i = 0; i < n; ++i) {
      if (bytes[offset + i] != static_cast<std::byte>((seedOffset + i) * 131 + seed)) return false;
    }
    return true;
  }
  std::vector<std::byte> bytes;
  MemoryRegion mr;
};

template <typename R>
using Qp = std::unique_ptr<QueuePair<R>>;
using rdma::testing::acceptOne;

// Connects two queue pairs, runs body(a, b), then closes both (also when the
// body throws: an unclosed QueuePair would abort the test binary).
template <typename R, typename Body>
Task<void> withPair(R& reactor, Body body, QueuePairConfig configA = {}, QueuePairConfig configB = {}) {
  std::string why;
  Result<rdma::testing::ConnectedPair<R>> pair = co_await rdma::testing::connectPair(reactor, device(), configA, configB, &why);
  INFO(why);
  REQUIRE(pair);
  std::exception_ptr failure;
  try {
    REQUIRE(pair->connected);
    CHECK(pair->a->state() == QueuePairState::ready);
    CHECK(pair->b->state() == QueuePairState::ready);
    co_await body(*pair->a, *pair->b);
  } catch (...) {
    failure = std::current_exception();
  }
  Result<void> closedB = co_await pair->b->close();
  Result<void> closedA = co_await pair->a->close();
  CHECK(closedA);
  CHECK(closedB);
  if (failure) std::rethrow_exception(failure);
}

template <typename R, typename Body>
void runPair(Body body, QueuePairConfig configA = {}, QueuePairConfig configB = {}) {
  R reactor;
  reactor.runUntil(withPair(reactor, std::move(body), configA, configB));
}

std::span<const std::byte> bytesOf(const std::string& s) { return std::as_bytes(std::span(s)); }

template <typename R>
Task<void> sendAll(QueuePair<R>& qp, std::vector<std::string> messages) {
  for (const std::string& m : messages) {
    Result<void> sent = co_await qp.send(bytesOf(m));
    REQUIRE(sent);
  }
}

// With `reactor`, pauses now and then so that the sender runs out of credits.
template <typename R>
Task<std::vector<std::string>> recvN(QueuePair<R>& qp, std::size_t n, R* reactor = nullptr) {
  std::vector<std::string> got;
  std::vector<std::byte> buffer(qp.config().messageSize);
  for (std::size_t i = 0; i < n; ++i) {
    if (reactor && i % 7 == 0) co_await reactor->sleepFor(2ms);
    Result<std::size_t> size = co_await qp.recv(buffer);
    REQUIRE(size);
    got.emplace_back(reinterpret_cast<const char*>(buffer.data()), *size);
  }
  co_return got;
}

std::vector<std::string> makeMessages(std::size_t n, std::size_t maxSize, char tag) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) {
    std::string m = std::string(1, tag) + std::to_string(i) + ":";
    m.resize(std::min(maxSize, m.size() + (i * 977) % maxSize), static_cast<char>('a' + i % 26));
    out.push_back(std::move(m));
  }
  return out;
}

using Clock = std::chrono::steady_clock;

// Timing slack for a TCG guest on a loaded host: the bounds asserted below
// are the documented ones plus this.
constexpr auto kSlack = 2s;

// Awaits `task`, and how long it took.
template <typename T>
Task<std::pair<T, Clock::duration>> timed(Task<T> task) {
  const auto start = Clock::now();
  T result = co_await std::move(task);
  co_return std::pair<T, Clock::duration>{std::move(result), Clock::now() - start};
}

// What an operation on a queue pair whose peer died may fail with: the
// oldest unacknowledged work request's retry exhaustion, a flush of the
// others, or the queue pair's error state for those waiting.
bool deadPeerError(std::error_code e) {
  return e == completionError(IBV_WC_RETRY_EXC_ERR) || e == completionError(IBV_WC_WR_FLUSH_ERR) ||
         e == RdmaErrc::queuePairError;
}

// How the peer of the dead-peer tests goes away.
enum class PeerDeath { abortQp, killProcess };

constexpr std::size_t kPeerBytes = 64 * 1024;

// Keeps RDMA WRITEs, READs and SENDs to the peer in flight and a recv()
// waiting on `a`, lets the peer die (`die`) mid-way, and checks that each
// of them fails within the transport's bound of a's config, and that
// close() then returns at once (nothing is left to drain).
template <typename R, typename Die>
Task<void> outstandingWorkFailsWhenThePeerDies(R& reactor, QueuePair<R>& a, RemoteBuffer peer, Die die) {
  const std::optional<std::chrono::microseconds> bound = transportFailureBound(a.config());
  REQUIRE(bound);
  Registered local(2 * kPeerBytes);
  const LocalBuffer out = local.mr.local(0, kPeerBytes);
  const LocalBuffer in = local.mr.local(kPeerBytes, kPeerBytes);
  const std::string message(1000, 'm');
  std::vector<std::byte> inbox(a.config().messageSize);
  struct Ended {
    std::size_t succeeded = 0;
    std::error_code error;
    Clock::time_point at;
  };
  Ended writes, reads, sends, recvs;
  auto untilFailure = [](auto op, Ended& e) -> Task<void> {
    for (;;) {
      Result<void> r = co_await op();
      if (!r) {
        e.error = r.error();
        e.at = Clock::now();
        co_return;
      }
      ++e.succeeded;
    }
  };
  auto write = [&] { return a.rdmaWrite(peer, std::span(&out, 1)); };
  auto read = [&] { return a.rdmaRead(peer, std::span(&in, 1)); };
  auto send = [&] { return a.send(bytesOf(message)); };
  auto recv = [&]() -> Task<Result<void>> {
    Result<std::size_t> n = co_await a.recv(inbox);  // the peer sends nothing: waits until the end
    if (!n) co_return n.error();
    co_return Result<void>{};
  };
  // The peer dies once a WRITE, a READ and a SEND have each succeeded (not
  // after a fixed time: a TCG guest on a loaded host may take longer), 10 s at most.
  auto dieOnceFlowing = [&]() -> Task<Clock::time_point> {
    for (int i = 0; i < 1000 && (writes.succeeded == 0 || reads.succeeded == 0 || sends.succeeded == 0); ++i) {
      co_await reactor.sleepFor(10ms);
    }
    const Clock::time_point at = Clock::now();
    die();
    co_return at;
  };
  auto [w, r, s, v, diedAt] = co_await collectAll(untilFailure(write, writes), untilFailure(read, reads),
                                                  untilFailure(send, sends), untilFailure(recv, recvs), dieOnceFlowing());
  (void)w, (void)r, (void)s, (void)v;
  CHECK(writes.succeeded > 0);  // work was flowing when the peer died
  CHECK(reads.succeeded > 0);
  CHECK(sends.succeeded > 0);
  const std::pair<const char*, const Ended*> ended[] = {
      {"WRITE", &writes}, {"READ", &reads}, {"SEND", &sends}, {"recv", &recvs}};
  for (const auto& [what, e] : ended) {
    INFO(what << " failed with " << e->error.message() << " after " << (e->at - diedAt) / 1ms
              << " ms; bound " << bound->count() / 1000 << " ms");
    CHECK(deadPeerError(e->error));
    CHECK(e->at >= diedAt);  // not before
    CHECK(e->at - diedAt <= *bound + kSlack);
  }
  CHECK(a.state() == QueuePairState::error);
  CHECK(a.error() == completionError(IBV_WC_RETRY_EXC_ERR));
  auto [closed, closing] = co_await timed(a.close());
  CHECK(closed);
  CHECK(closing < kSlack);
}

// Consumes messages on `qp` until it fails.
template <typename R>
Task<void> consume(QueuePair<R>& qp) {
  std::vector<std::byte> buffer(qp.config().messageSize);
  for (;;) {  // not `while (co_await ...)`: g++ 12 lays such frames out wrongly
    const auto received = co_await qp.recv(buffer);
    if (!received) break;
  }
}

// In a forked child (a device and reactor of its own; no Catch2 here, exit
// codes instead): connects a queue pair to the parent at `address`, sends
// it a RemoteBuffer of kPeerBytes registered bytes over the stream, then
// consumes messages until it is killed.
[[noreturn]] void runPeerProcess(SocketAddress address, QueuePairConfig config) {
  const char* name = std::getenv("COIO_RDMA_DEVICE");
  Result<std::unique_ptr<Device>> dev = Device::open({name ? name : ""});
  if (!dev) ::_exit(2);
  std::vector<std::byte> memory(kPeerBytes);
  Result<MemoryRegion> mr = MemoryRegion::create(**dev, memory, kAccessAll);
  if (!mr) ::_exit(3);
  EpollReactor reactor;
  reactor.runUntil([&]() -> Task<void> {
    Result<TcpStream<EpollReactor>> stream = co_await TcpStream<EpollReactor>::connect(reactor, address);
    if (!stream) ::_exit(4);
    Result<Qp<EpollReactor>> qp = QueuePair<EpollReactor>::create(reactor, **dev, config);
    if (!qp) ::_exit(5);
    if (!co_await (*qp)->connect(*stream)) ::_exit(6);
    const RemoteBuffer remote = mr->remote();
    if (!co_await stream->writeAll(std::as_bytes(std::span(&remote, 1)))) ::_exit(7);
    co_await consume(**qp);
    for (;;) ::pause();  // until SIGKILL
  }());
  ::_exit(8);
}

// Connects a queue pair of `config` to a child process (runPeerProcess),
// runs body(qp, the child's memory, a function that SIGKILLs the child),
// then closes the queue pair and reaps the child.
template <typename R, typename Body>
Task<void> withPeerProcess(R& reactor, const QueuePairConfig& config, Body body) {
  Result<TcpListener<R>> listener = TcpListener<R>::bind(reactor, SocketAddress::loopbackV4());
  REQUIRE(listener);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) runPeerProcess(*listener->localAddress(), config);
  const coio::testing::KilledAtEnd reap(child);
  Result<TcpStream<R>> stream =
      co_await withTimeout(reactor, [&](std::stop_token stop) { return listener->accept(std::move(stop)); }, 10s);
  REQUIRE(stream);
  Result<Qp<R>> qp = QueuePair<R>::create(reactor, device(), config);
  REQUIRE(qp);
  std::exception_ptr failure;
  try {
    Result<void> connected = co_await (*qp)->connect(*stream);
    REQUIRE(connected);
    RemoteBuffer peer;
    Result<void> got = co_await stream->readExact(std::as_writable_bytes(std::span(&peer, 1)));
    REQUIRE(got);
    co_await body(**qp, peer, [child] { ::kill(child, SIGKILL); });
  } catch (...) {
    failure = std::current_exception();
  }
  Result<void> closed = co_await (*qp)->close();
  CHECK(closed);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

TEST_CASE("the device is found and described", "[rdma]") {
  const Device& d = device();
  INFO(d.name());
  CHECK(d.protectionDomain() != nullptr);
  CHECK(d.port() >= 1);
  CHECK(d.limits().maxQpWr > 0);
  CHECK(d.limits().maxMsgSize > 0);
  if (d.isRoce()) {
    // Index 0 is the link-local GID on Soft-RoCE; never use it blindly.
    CHECK_FALSE(rdma::detail::isLinkLocalGid(d.gid()));
    CHECK_FALSE(rdma::detail::isZeroGid(d.gid()));
  }
  const std::vector<std::string> names = Device::list();
  CHECK(std::find(names.begin(), names.end(), d.name()) != names.end());
}

TEMPLATE_LIST_TEST_CASE("queue pairs connect and exchange messages both ways", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  runPair<R>([](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
    CHECK(a.qpNumber() != b.qpNumber());
    const std::vector<std::string> ab = makeMessages(3, 100, 'a');
    const std::vector<std::string> ba = makeMessages(3, 100, 'b');
    auto [u1, gotB, u2, gotA] = co_await collectAll(sendAll(a, ab), recvN(b, ab.size()), sendAll(b, ba),
                                                    recvN(a, ba.size()));
    CHECK(gotB == ab);
    CHECK(gotA == ba);
  });
}

TEMPLATE_LIST_TEST_CASE("messages wrap around the buffer rings under credit flow control", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.messageBuffers = 4;
  c.messageSize = 512;
  c.ackBatch = 2;
  c.signalBatch = 3;
  // The watcher sleeps at once; polls first, once per loop iteration; or
  // polls first and spins on an empty CQ within each iteration.
  std::tie(c.pollBeforeSleep, c.spinPolls) =
      GENERATE(table<std::uint32_t, std::uint32_t>({{0u, 0u}, {8u, 0u}, {8u, 16u}}));
  R reactor;
  reactor.runUntil(withPair(
      reactor,
      [&reactor](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
        // 200 messages through 4 buffers: each ring wraps 50 times; the
        // slow receiver makes the sender wait for credits.
        const std::vector<std::string> ab = makeMessages(200, 512, 'a');
        const std::vector<std::string> ba = makeMessages(120, 512, 'b');
        auto [u1, gotB, u2, gotA] = co_await collectAll(sendAll(a, ab), recvN(b, ab.size(), &reactor),
                                                        sendAll(b, ba), recvN(a, ba.size()));
        CHECK(gotB == ab);
        CHECK(gotA == ba);
        // Empty and maximal messages, and one too large.
        std::vector<std::string> edge{"", std::string(512, 'x')};
        auto [u3, gotEdge] = co_await collectAll(sendAll(a, edge), recvN(b, edge.size()));
        CHECK(gotEdge == edge);
        const std::string big(513, 'y');
        Result<void> tooBig = co_await a.send(bytesOf(big));
        CHECK(tooBig.error() == RdmaErrc::messageTooLarge);
        // A receive buffer too small leaves the message queued.
        Result<void> sent = co_await a.send(bytesOf(std::string(100, 'z')));
        REQUIRE(sent);
        std::vector<std::byte> small(10);
        Result<std::size_t> tooSmall = co_await b.recv(small);
        CHECK(tooSmall.error() == RdmaErrc::bufferTooSmall);
        std::vector<std::byte> enough(100);
        Result<std::size_t> fits = co_await b.recv(enough);
        CHECK(fits.valueOr(0) == 100);
      },
      c, c));
}

TEMPLATE_LIST_TEST_CASE("RDMA WRITE and READ move 1 byte to several MiB intact", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  runPair<R>([](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
    (void)b;
    constexpr std::size_t kMax = 4 * 1024 * 1024 + 3;
    Registered local(kMax);
    Registered remote(kMax);
    for (std::size_t size : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{65537},
                             std::size_t{1} << 20, kMax}) {
      INFO("size " << size);
      local.fill(static_cast<std::uint8_t>(size));
      std::memset(remote.bytes.data(), 0, size + (size < kMax));
      // One scatter/gather element, and the same range in three slices.
      const LocalBuffer whole = local.mr.local(0, size);
      Result<void> wrote = co_await a.rdmaWrite(remote.mr.remote(remote.span(0, size)), std::span(&whole, 1));
      REQUIRE(wrote);
      CHECK(remote.matches(0, size, static_cast<std::uint8_t>(size), 0));
      if (size < kMax) CHECK(remote.bytes[size] == std::byte{0});  // not one byte more

      remote.fill(static_cast<std::uint8_t>(size + 1));
      std::memset(local.bytes.data(), 0, size);
      std::vector<LocalBuffer> slices;
      const std::size_t third = size / 3;
      if (third > 0) slices.push_back(local.mr.local(0, third));
      slices.push_back(local.mr.local(third, size - 2 * third));
      if (third > 0) slices.push_back(local.mr.local(size - third, third));
      Result<void> read = co_await a.rdmaRead(remote.mr.remote(remote.span(0, size)), slices);
      REQUIRE(read);
      CHECK(local.matches(0, size, static_cast<std::uint8_t>(size + 1), 0));
    }
  });
}

TEST_CASE("a disk BufferPool's mapping registers as one memory region the NIC reads and writes", "[rdma]") {
  // The storage-server path: io_uring reads into pool buffers, the NIC sends
  // from the same pages. Only the pool's contiguous mapping is needed here.
  constexpr std::size_t kBuffer = 64 * 1024;
  BufferPool pool(BufferPool::Options{kBuffer, 4, false});
  Result<MemoryRegion> region = MemoryRegion::create(device(), {pool.data(), pool.size()}, kAccessAll);
  REQUIRE(region);
  for (std::size_t i = 0; i < pool.size(); ++i) pool.data()[i] = static_cast<std::byte>(i * 131 + 9);
  runPair<EpollReactor>([&](QueuePair<EpollReactor>& a, QueuePair<EpollReactor>&) -> Task<void> {
    Registered remote(kBuffer);
    const LocalBuffer third = region->local(2 * kBuffer, kBuffer);
    Result<void> wrote = co_await a.rdmaWrite(remote.mr.remote(), std::span(&third, 1));
    REQUIRE(wrote);
    CHECK(remote.matches(0, kBuffer, 9, 2 * kBuffer));
    // And back into buffer 0: the pool's memory as an RDMA READ target.
    const LocalBuffer first = region->local(0, kBuffer);
    Result<void> read = co_await a.rdmaRead(remote.mr.remote(), std::span(&first, 1));
    REQUIRE(read);
    CHECK(std::equal(pool.data(), pool.data() + kBuffer, pool.data() + 2 * kBuffer));
  });
}

TEMPLATE_LIST_TEST_CASE("batches larger than a post and than the semaphore", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.maxRdmaWr = 8;
  c.maxRdmaWrPerPost = 4;
  c.maxSge = 2;
  runPair<R>(
      [](QueuePair<R>& a, QueuePair<R>&) -> Task<void> {
        constexpr std::size_t kPieces = 150;  // 150 elements -> 75 work requests -> 19 chains of <= 4
        constexpr std::size_t kPiece = 1000;
        Registered local(kPieces * kPiece);
        Registered remote(kPieces * kPiece);
        local.fill(7);
        RdmaBatch<R> write = a.rdmaBatch(RdmaOp::write);
        // Reversed: remote piece i takes local piece kPieces-1-i, two per work request.
        for (std::size_t i = 0; i < kPieces; i += 2) {
          const LocalBuffer pieces[2] = {local.mr.local((kPieces - 1 - i) * kPiece, kPiece),
                                         local.mr.local((kPieces - 2 - i) * kPiece, kPiece)};
          REQUIRE(write.add(remote.mr.remote(remote.span(i * kPiece, 2 * kPiece)), pieces));
        }
        CHECK(write.workRequests() == kPieces / 2);
        Result<void> wrote = co_await write.post();
        REQUIRE(wrote);
        for (std::size_t i = 0; i < kPieces; ++i) {
          INFO("piece " << i);
          CHECK(remote.matches(i * kPiece, kPiece, 7, (kPieces - 1 - i) * kPiece));
        }
        // Read it all back in one batch of single-element work requests.
        std::memset(local.bytes.data(), 0, local.bytes.size());
        RdmaBatch<R> read = a.rdmaBatch(RdmaOp::read);
        for (std::size_t i = 0; i < kPieces; ++i) {
          REQUIRE(read.add(remote.mr.remote(remote.span(i * kPiece, kPiece)), local.mr.local(i * kPiece, kPiece)));
        }
        Result<void> readBack = co_await read.post();
        REQUIRE(readBack);
        CHECK(local.bytes == remote.bytes);
      },
      c, c);
}

TEMPLATE_LIST_TEST_CASE("many coroutines share a queue pair", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.maxRdmaWr = 16;
  c.maxRdmaWrPerPost = 4;
  c.pollBeforeSleep = GENERATE(0u, 8u);
  runPair<R>(
      [](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
        constexpr std::size_t kWorkers = 48;
        constexpr std::size_t kRounds = 6;
        constexpr std::size_t kBlock = 4096;
        Registered local(kWorkers * kBlock);
        Registered remote(kWorkers * kBlock);
        Registered back(kWorkers * kBlock);
        local.fill(3);
        auto worker = [&](std::size_t w) -> Task<std::size_t> {
          std::size_t good = 0;
          for (std::size_t round = 0; round < kRounds; ++round) {
            const RemoteBuffer target = remote.mr.remote(remote.span(w * kBlock, kBlock));
            const LocalBuffer src = local.mr.local(w * kBlock, kBlock);
            const LocalBuffer dst = back.mr.local(w * kBlock, kBlock);
            Result<void> wrote = co_await a.rdmaWrite(target, std::span(&src, 1));
            Result<void> read = co_await a.rdmaRead(target, std::span(&dst, 1));
            good += wrote && read && back.matches(w * kBlock, kBlock, 3, w * kBlock);
          }
          co_return good;
        };
        std::vector<Task<std::size_t>> workers;
        for (std::size_t w = 0; w < kWorkers; ++w) workers.push_back(worker(w));
        // Messages flow at the same time in the other direction.
        const std::vector<std::string> ba = makeMessages(50, 1000, 'b');
        auto [results, u, got] = co_await collectAll(collectAllRange(std::move(workers)), sendAll(b, ba),
                                                      recvN(a, ba.size()));
        for (std::size_t r : results) CHECK(r == kRounds);
        CHECK(got == ba);
      },
      c, c);
}

TEMPLATE_LIST_TEST_CASE("a bad rkey fails the operation and the queue pair, resuming every waiter", "[rdma]",
                        Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.maxRdmaWr = 4;  // small: most of the writes below queue on the semaphore
  c.maxRdmaWrPerPost = 2;
  runPair<R>(
      [](QueuePair<R>& a, QueuePair<R>&) -> Task<void> {
        Registered local(64 * 1024);
        Registered remote(64 * 1024);
        RemoteBuffer bad = remote.mr.remote();
        bad.rkey ^= 0x5a5a00;
        const LocalBuffer src = local.mr.local(0, 64 * 1024);
        std::vector<Task<Result<void>>> ops;
        ops.push_back(a.rdmaWrite(bad, std::span(&src, 1)));
        for (int i = 0; i < 20; ++i) ops.push_back(a.rdmaWrite(remote.mr.remote(), std::span(&src, 1)));
        std::vector<std::byte> message(16);
        auto recvFails = [&]() -> Task<Result<std::size_t>> { co_return co_await a.recv(message); };
        auto [results, received] = co_await collectAll(collectAllRange(std::move(ops)), recvFails());
        CHECK(results[0].error() == completionError(IBV_WC_REM_ACCESS_ERR));
        std::size_t failed = 0;
        for (const Result<void>& r : results) failed += !r;
        CHECK(failed >= 18);  // those behind the bad one, at least, were flushed or refused
        CHECK_FALSE(received);
        CHECK(a.state() == QueuePairState::error);
        CHECK(a.error() == completionError(IBV_WC_REM_ACCESS_ERR));
        Result<void> after = co_await a.rdmaWrite(remote.mr.remote(), std::span(&src, 1));
        CHECK(after.error() == RdmaErrc::queuePairError);
        Result<void> sendAfter = co_await a.send(bytesOf("x"));
        CHECK(sendAfter.error() == RdmaErrc::queuePairError);
      },
      c, c);
}

TEMPLATE_LIST_TEST_CASE("a peer that disappears mid-transfer fails the transfer", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.timeout = 10;  // ~4 ms per retry: fail fast
  c.retryCount = 3;
  R reactor;
  reactor.runUntil(withPair(
      reactor,
      [&reactor](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
        Registered local(1 << 20);
        Registered remote(1 << 20);
        const LocalBuffer src = local.mr.local(0, 1 << 20);
        auto writer = [&]() -> Task<std::error_code> {
          for (int i = 0; i < 10000; ++i) {
            Result<void> wrote = co_await a.rdmaWrite(remote.mr.remote(), std::span(&src, 1));
            if (!wrote) co_return wrote.error();
          }
          co_return std::error_code{};
        };
        auto vanish = [&]() -> Task<void> {
          co_await reactor.sleepFor(50ms);
          b.abort();  // as if the peer's process died: no CLOSE is sent
        };
        const auto start = std::chrono::steady_clock::now();
        auto [error, u] = co_await collectAll(writer(), vanish());
        CHECK(error == completionError(IBV_WC_RETRY_EXC_ERR));
        CHECK(a.state() == QueuePairState::error);
        CHECK(std::chrono::steady_clock::now() - start < 30s);
      },
      c, c));
}

TEST_CASE("with the default config, work sent to a dead peer fails within the documented bound", "[rdma]") {
  // rxe retries forever at retryCount 7, the old default: this write never
  // failed and close() waited out drainTimeout (5 s), then flushed it.
  const QueuePairConfig defaults;
  const std::optional<std::chrono::microseconds> bound = transportFailureBound(defaults);
  REQUIRE(bound);
  EpollReactor reactor;
  reactor.runUntil(withPair(reactor, [&](QueuePair<EpollReactor>& a, QueuePair<EpollReactor>& b) -> Task<void> {
    Registered local(4096);
    Registered remote(4096);
    const LocalBuffer src = local.mr.local(0, 4096);
    b.abort();  // as a crash would: b's QP answers nothing from now on
    auto closeSoon = [&]() -> Task<Result<void>> {
      co_await reactor.sleepFor(10ms);
      co_return co_await a.close();  // with the write in flight
    };
    auto [wrote, closed] = co_await collectAll(timed(a.rdmaWrite(remote.mr.remote(), std::span(&src, 1))),
                                               timed(closeSoon()));
    INFO("the write failed after " << wrote.second / 1ms << " ms, close() took " << closed.second / 1ms
                                   << " ms; bound " << bound->count() / 1000 << " ms");
    CHECK(wrote.first.error() == completionError(IBV_WC_RETRY_EXC_ERR));
    CHECK(wrote.second >= *bound / 2);  // the transport retried: not some other failure
    CHECK(wrote.second <= *bound + kSlack);
    CHECK(closed.first);
    CHECK(closed.second <= *bound + kSlack);
    CHECK(closed.second < defaults.drainTimeout / 2);
  }));
}

TEMPLATE_LIST_TEST_CASE("a peer killed or aborted with WRITEs, READs and SENDs outstanding fails them all in time",
                        "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.timeout = 12;  // ~17 ms a try, 4 tries: a short bound, not so short a busy guest misses an ACK
  c.retryCount = 3;
  const PeerDeath death = GENERATE(PeerDeath::abortQp, PeerDeath::killProcess);
  R reactor;
  if (death == PeerDeath::abortQp) {
    INFO("the peer's queue pair is aborted");
    reactor.runUntil(withPair(
        reactor,
        [&reactor](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
          Registered memory(kPeerBytes);
          co_await collectAll(
              outstandingWorkFailsWhenThePeerDies(reactor, a, memory.mr.remote(), [&b] { b.abort(); }), consume(b));
        },
        c, c));
  } else {
    INFO("the peer's process is killed");
    reactor.runUntil(withPeerProcess(reactor, c, [&reactor](QueuePair<R>& a, RemoteBuffer peer, auto kill) {
      return outstandingWorkFailsWhenThePeerDies(reactor, a, peer, kill);
    }));
  }
}

TEMPLATE_LIST_TEST_CASE("a stop ends a waiting RDMA operation cleanly and fails the queue pair under a posted one",
                        "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.maxRdmaWr = 1;  // the second write waits for the first
  c.maxRdmaWrPerPost = 1;
  c.timeout = 18;  // ~1.1 s a try: the stop ends the write, not the transport
  R reactor;
  reactor.runUntil(withPair(
      reactor,
      [&reactor](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
        Registered local(4096);
        Registered remote(4096);
        const LocalBuffer src = local.mr.local(0, 4096);
        b.abort();  // nothing will be acknowledged
        std::stop_source stopFirst;
        Clock::time_point stoppedAt;
        auto first = [&]() -> Task<Result<void>> {
          co_return co_await a.rdmaWrite(remote.mr.remote(), std::span(&src, 1), stopFirst.get_token());
        };
        auto thenTheRest = [&]() -> Task<void> {
          // withTimeout: how a caller bounds one operation in time.
          Result<void> second = co_await withTimeout(
              reactor, [&](std::stop_token t) { return a.rdmaWrite(remote.mr.remote(), std::span(&src, 1), t); },
              50ms);
          CHECK(second.error() == std::errc::timed_out);
          CHECK(a.state() == QueuePairState::ready);  // it never was posted: nothing to recall
          stoppedAt = Clock::now();
          stopFirst.request_stop();
        };
        auto [firstResult, unit] = co_await collectAll(first(), thenTheRest());
        (void)unit;
        const auto afterStop = Clock::now() - stoppedAt;
        INFO("the posted write returned " << afterStop / 1ms << " ms after its stop");
        CHECK(firstResult.error() == std::errc::operation_canceled);
        CHECK(afterStop < kSlack);
        // A posted write cannot be recalled: the queue pair went to error.
        CHECK(a.state() == QueuePairState::error);
        CHECK(a.error() == std::errc::operation_canceled);
        Result<void> after = co_await a.rdmaRead(remote.mr.remote(), std::span(&src, 1));
        CHECK(after.error() == RdmaErrc::queuePairError);
      },
      c, c));
}

TEMPLATE_LIST_TEST_CASE("close with operations in flight drains them and the peer sees it", "[rdma]", Reactors) {
  using R = TestType;
  if (!usable<R>()) return;
  QueuePairConfig c;
  c.maxRdmaWr = 8;
  c.maxRdmaWrPerPost = 2;
  c.pollBeforeSleep = GENERATE(0u, 8u);  // closing while the watcher polls stops it too
  R reactor;
  reactor.runUntil(withPair(
      reactor,
      [&reactor](QueuePair<R>& a, QueuePair<R>& b) -> Task<void> {
        Registered local(256 * 1024);
        Registered remote(256 * 1024);
        const LocalBuffer src = local.mr.local(0, 256 * 1024);
        // Messages sent before the close are still delivered to the peer.
        Result<void> sent = co_await a.send(bytesOf("last words"));
        REQUIRE(sent);
        std::vector<Task<Result<void>>> ops;
        for (int i = 0; i < 24; ++i) ops.push_back(a.rdmaWrite(remote.mr.remote(), std::span(&src, 1)));
        std::vector<std::byte> message(64);
        auto recvOnA = [&]() -> Task<Result<std::size_t>> { co_return co_await a.recv(message); };
        auto closeSoon = [&]() -> Task<Result<void>> {
          co_await reactor.sleepFor(1ms);
          co_return co_await a.close();
        };
        auto [results, received, closed] = co_await collectAll(collectAllRange(std::move(ops)), recvOnA(), closeSoon());
        CHECK(closed);
        CHECK(received.error() == Errc::closed);
        std::size_t ok = 0;
        for (const Result<void>& r : results) {
          ok += r.hasValue();
          if (!r) CHECK((r.error() == Errc::closed || r.error() == completionError(IBV_WC_WR_FLUSH_ERR)));
        }
        INFO("completed before the close: " << ok);
        CHECK(a.state() == QueuePairState::close);
        Result<void> after = co_await a.rdmaWrite(remote.mr.remote(), std::span(&src, 1));
        CHECK(after.error() == Errc::closed);

        std::vector<std::byte> buffer(64);
        Result<std::size_t> last = co_await b.recv(buffer);
        REQUIRE(last);
        CHECK(std::string(reinterpret_cast<const char*>(buffer.data()), *last) == "last words");
        Result<std::size_t> eof = co_await b.recv(buffer);
        CHECK(eof.error() == Errc::eof);
        CHECK(b.state() == QueuePairState::close);
        Result<void> sendToClosed = co_await b.send(bytesOf("anyone?"));
        CHECK(sendToClosed.error() == Errc::eof);
      },
      c, c));
}

TEST_CASE("a device smaller than the requested capacities is a clear error", "[rdma]") {
  EpollReactor reactor;
  const DeviceLimits limits = device().limits();
  QueuePairConfig c;
  c.maxSge = limits.maxSge + 1;
  std::string why;
  Result<Qp<EpollReactor>> qp = QueuePair<EpollReactor>::create(reactor, device(), c, &why);
  CHECK(qp.error() == RdmaErrc::deviceTooSmall);
  CHECK(why.find("max_sge") != std::string::npos);
  c = {};
  c.maxRdmaWr = limits.maxQpWr;
  qp = QueuePair<EpollReactor>::create(reactor, device(), c, &why);
  CHECK(qp.error() == RdmaErrc::deviceTooSmall);
  CHECK(why.find("max_qp_wr") != std::string::npos);
}

TEST_CASE("a queue pair destroyed without close() before its watcher first ran is caught", "[rdma]") {
  // The check is on in the test build (COIO_ENABLE_ASSERTS=1). The watcher
  // is spawned, not started, by create(): before, it escaped the check and
  // would have run later on the freed QueuePair.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no Catch2 here; a device of its own (not the parent's context)
    ::close(STDERR_FILENO);  // keep the expected assertion message out of the log
    const char* name = std::getenv("COIO_RDMA_DEVICE");
    Result<std::unique_ptr<Device>> dev = Device::open({name ? name : ""});
    if (!dev) ::_exit(3);
    EpollReactor reactor;
    Result<Qp<EpollReactor>> qp = QueuePair<EpollReactor>::create(reactor, **dev);
    if (!qp) ::_exit(4);
    qp->reset();  // never closed, watcher never ran: must abort here
    ::_exit(5);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("child exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << " (3: no device, 4: create failed)");
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
}

TEST_CASE("a queue pair closed before connecting, and a foreign handshake", "[rdma]") {
  EpollReactor reactor;
  reactor.runUntil([&]() -> Task<void> {
    Result<Qp<EpollReactor>> qp = QueuePair<EpollReactor>::create(reactor, device());
    REQUIRE(qp);
    Result<void> early = co_await (*qp)->send(bytesOf("x"));
    CHECK(early.error() == RdmaErrc::notConnected);
    Result<void> closed = co_await (*qp)->close();
    CHECK(closed);
    Result<void> again = co_await (*qp)->close();
    CHECK(again);

    // A peer that speaks something else fails the connect, not the process.
    Result<TcpListener<EpollReactor>> listener = TcpListener<EpollReactor>::bind(reactor, SocketAddress::loopbackV4());
    REQUIRE(listener);
    auto [accepted, connected] = co_await collectAll(acceptOne(*listener),
                                                     TcpStream<EpollReactor>::connect(reactor, *listener->localAddress()));
    REQUIRE(accepted);
    Result<Qp<EpollReactor>> victim = QueuePair<EpollReactor>::create(reactor, device());
    REQUIRE(victim);
    const std::string garbage(rdma::detail::ConnectInfo::kWireSize, 'G');
    auto [handshake, written] = co_await collectAll((*victim)->connect(*connected), accepted->writeAll(bytesOf(garbage)));
    CHECK(written);
    CHECK(handshake.error() == RdmaErrc::handshake);
    CHECK((*victim)->state() == QueuePairState::error);
    Result<void> closedVictim = co_await (*victim)->close();
    CHECK(closedVictim);
  }());
}
