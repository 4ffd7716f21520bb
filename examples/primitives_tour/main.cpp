// A tour of coio's scheduling primitives, shaped like the storage server's
// read path: clients submit batches, a weighted semaphore bounds in-flight
// bytes, a FIFO semaphore bounds "RDMA writes", a slow client gives up
// after a timeout. It runs twice:
//  1. on the ManualExecutor in virtual time: the output is deterministic
//     and shows the FIFO/no-starvation guarantees as a timeline;
//  2. on real threads, under contention, checking the same invariants.
#include <coio/coio.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using coio::testing::ManualExecutor;

namespace {

constexpr std::size_t kPoolBytes = 8;  // read-buffer pool, in MiB
constexpr std::size_t kMaxWrites = 2;  // concurrent "RDMA writes"

struct Server {
  explicit Server(ManualExecutor& e) : ex(e) {}
  ManualExecutor& ex;
  coio::BatchSemaphore bufferPool{kPoolBytes};
  coio::Semaphore writeSlots{kMaxWrites};
  coio::AsyncScope requests;
  double lastDoneMs = 0;

  double ms() const { return std::chrono::duration<double, std::milli>(ex.now().time_since_epoch()).count(); }

  // One batchRead: take buffers for the whole batch at once (no hold-and-wait),
  // "read" 1 ms per MiB, then transmit each IO under the write limit.
  coio::Task<std::size_t> batchRead(std::string client, std::vector<std::size_t> ios, std::stop_token giveUp) {
    std::size_t total = 0;
    for (auto mib : ios) total += mib;
    const bool gotBuffers = co_await bufferPool.acquire(total, giveUp);
    if (!gotBuffers) {
      std::printf("%6.1f ms  %-9s gave up waiting for %zu MiB of buffers\n", ms(), client.c_str(), total);
      co_return 0;
    }
    std::printf("%6.1f ms  %-9s got %zu MiB of buffers, reading %zu IOs\n", ms(), client.c_str(), total, ios.size());
    co_await ex.sleepFor(std::chrono::milliseconds(total));
    std::vector<coio::Task<void>> writes;
    for (auto mib : ios) writes.push_back(transmit(mib));
    co_await coio::collectAllRange(std::move(writes));
    std::printf("%6.1f ms  %-9s done (%zu MiB), releasing its buffers\n", ms(), client.c_str(), total);
    lastDoneMs = ms();
    bufferPool.release(total);  // resumes the next queued batch inline
    co_return total;
  }

  coio::Task<void> transmit(std::size_t mib) {
    co_await writeSlots.acquire();
    co_await ex.sleepFor(500us * mib);
    writeSlots.release();
  }
};

coio::Task<void> client(Server& server, std::string name, std::chrono::milliseconds startAt,
                        std::vector<std::size_t> ios, std::chrono::milliseconds timeout, std::size_t& served) {
  co_await server.ex.sleepFor(startAt);
  std::stop_source deadline;
  server.requests.spawn([](ManualExecutor& ex, std::stop_source deadline, std::chrono::milliseconds t) -> coio::Task<void> {
    co_await ex.sleepFor(t);
    deadline.request_stop();
  }(server.ex, deadline, timeout));
  served += co_await server.batchRead(std::move(name), std::move(ios), deadline.get_token());
}

void virtualTimeTour() {
  std::printf("== 1. virtual time (ManualExecutor): pool %zu MiB, %zu concurrent writes\n", kPoolBytes, kMaxWrites);
  ManualExecutor ex;
  Server server(ex);
  std::size_t served = 0;
  // "big" arrives while "a" holds buffers; "small" arrives after "big" and
  // would fit, but FIFO makes it wait: large requests cannot starve.
  ex.spawn(client(server, "a", 0ms, {2, 2, 2}, 100ms, served));
  ex.spawn(client(server, "big", 1ms, {4, 4}, 100ms, served));
  ex.spawn(client(server, "small", 2ms, {1}, 100ms, served));
  ex.spawn(client(server, "impatient", 3ms, {8}, 5ms, served));
  ex.advance(1s);
  coio::blockingWait(server.requests.join());
  std::printf("served %zu MiB in %.1f virtual ms; %zu MiB of buffers free again\n\n", served, server.lastDoneMs,
              server.bufferPool.available());
}

void threadedTour() {
  constexpr int kThreads = 4, kIterations = 100000;
  std::printf("== 2. real threads: %d threads x %d acquire/release of %zu write slots\n", kThreads, kIterations,
              kMaxWrites);
  coio::Semaphore slots(kMaxWrites);
  std::atomic<int> inFlight{0}, peak{0};
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      coio::blockingWait([&]() -> coio::Task<void> {
        for (int i = 0; i < kIterations; ++i) {
          co_await slots.acquire();
          const int now = ++inFlight;
          for (int seen = peak.load(); now > seen && !peak.compare_exchange_weak(seen, now);) {
          }
          --inFlight;
          slots.release();
        }
      }());
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("peak concurrent holders %d (limit %zu), %.1f M acquire/release per second\n", peak.load(), kMaxWrites,
              kThreads * kIterations / secs / 1e6);
  if (peak.load() > static_cast<int>(kMaxWrites)) {
    std::printf("FAILED: the semaphore let too many holders in\n");
    std::exit(1);
  }

  // A work-request id as the RDMA layer will build it.
  struct WriteContext {
    int ios;
  } ctx{3};
  auto wrId = coio::StampedPtr<WriteContext>::make(&ctx, /*type tag: RDMA_LAST*/ 5);
  std::printf("work-request id 0x%016llx -> context with %d IOs, tag %u\n",
              static_cast<unsigned long long>(wrId.raw()), wrId.ptr()->ios, wrId.stamp());
}

}  // namespace

int main() {
  virtualTimeTour();
  threadedTour();
}
