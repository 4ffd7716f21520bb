// coio's Mutex, BoundedQueue and collectAny beside the same primitives of
// other coroutine libraries, in one binary (issue 23; docs/benchmarks.md,
// "Peers", says what one op is in each row). Every row runs on one thread:
// peers differ in how (and whether) they wake a coroutine from another
// thread, so the rows measure the coroutine hand-off itself. Each peer row's
// ratio is to the coio row of the same name: below 1 the peer is faster.
// Same method as core_bench: 5 repetitions, randomly interleaved, median.
#include "bench_driver.hpp"
#include "ratio_reporter.hpp"

#include <coio/core/bounded_queue.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/task.hpp>

#include <benchmark/benchmark.h>

#include <coroutine>
#include <cstddef>
#include <deque>
#include <type_traits>
#include <utility>
#include <vector>

#if COIO_PEER_ASYNC_SIMPLE
#include <async_simple/coro/Collect.h>
#include <async_simple/coro/Lazy.h>
#include <async_simple/coro/Mutex.h>
#endif
#if COIO_PEER_LIBCORO
#include <coro/mutex.hpp>
#include <coro/ring_buffer.hpp>
#include <coro/task.hpp>
#include <coro/when_any.hpp>
#endif
#if COIO_PEER_CPPCORO
#include <cppcoro/async_mutex.hpp>
#endif
#if COIO_PEER_ASIO
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/channel.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#endif

namespace {

using coio::bench::Driver;

// ---------------------------------------------------------------------------
// Mutex. Each peer's mutex behind the same two calls; every lock is awaited
// from a Driver, so only the mutex's awaiter differs between rows.

auto lockOp(coio::Mutex& m) { return m.lock(); }
void unlockOp(coio::Mutex& m) { m.unlock(); }
#if COIO_PEER_ASYNC_SIMPLE
auto lockOp(async_simple::coro::Mutex& m) { return m.coLock(); }
void unlockOp(async_simple::coro::Mutex& m) { m.unlock(); }
#endif
#if COIO_PEER_LIBCORO
auto lockOp(coro::mutex& m) { return m.lock(); }
void unlockOp(coro::mutex& m) { m.unlock(); }
#endif
#if COIO_PEER_CPPCORO
auto lockOp(cppcoro::async_mutex& m) { return m.lock_async(); }
void unlockOp(cppcoro::async_mutex& m) { m.unlock(); }
#endif

// One op: `co_await` a lock that finds the mutex free (no suspension), then
// unlock.
template <typename M>
void mutexUncontended(benchmark::State& state) {
  M mutex;
  [](benchmark::State& s, M& m) -> Driver {
    for (auto _ : s) {
      co_await lockOp(m);
      unlockOp(m);
    }
  }(state, mutex);
}

// A FIFO of ready coroutines, the least a one-thread scheduler can be: the
// same for every peer, so it adds the same cost to each row that uses it.
class RunQueue {
 public:
  auto yield() noexcept {
    struct Awaiter {
      RunQueue& queue;
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) { queue.ready_.push_back(h); }
      void await_resume() noexcept {}
    };
    return Awaiter{*this};
  }

  // Resumes the oldest ready coroutine; false if there is none.
  bool runOne() {
    if (ready_.empty()) return false;
    std::coroutine_handle<> h = ready_.front();
    ready_.pop_front();
    h.resume();
    return true;
  }

 private:
  std::deque<std::coroutine_handle<>> ready_;
};

constexpr int kContenders = 4;

// One op: a hand-off. kContenders coroutines loop on lock, yield to the run
// queue while holding the lock, unlock; so the others are always queued on
// the mutex. Each op resumes the holder, whose unlock resumes a waiter
// inline (every peer here does), which yields; the old holder then queues
// on the mutex again.
template <typename M>
void mutexHandOff(benchmark::State& state) {
  M mutex;
  RunQueue queue;
  bool stop = false;
  int running = kContenders;
  for (int i = 0; i < kContenders; ++i) {
    [](M& m, RunQueue& q, const bool& stop, int& running) -> Driver {
      while (!stop) {
        co_await lockOp(m);
        co_await q.yield();
        unlockOp(m);
      }
      --running;
    }(mutex, queue, stop, running);
  }
  for (auto _ : state) queue.runOne();
  stop = true;
  while (queue.runOne()) {
  }
  if (running != 0) state.SkipWithError("a contender did not finish");
}

// ---------------------------------------------------------------------------
// Channel: an int channel of a fixed capacity behind push(int&) and pop(),
// each returning the peer's own awaitable, and valueOf(pop's result).

template <std::size_t Capacity>
class CoioChannel {
 public:
  auto push(int& v) noexcept { return queue_.push(std::move(v)); }
  auto pop() noexcept { return queue_.pop(); }
  static int valueOf(const coio::Result<int>& r) { return *r; }

 private:
  coio::BoundedQueue<int> queue_{Capacity};
};

#if COIO_PEER_LIBCORO
template <std::size_t Capacity>
class LibcoroChannel {
 public:
  auto push(int& v) { return ring_.produce(v); }
  auto pop() { return ring_.consume(); }
  template <typename Expected>
  static int valueOf(const Expected& r) {
    return *r;
  }

 private:
  coro::ring_buffer<int, Capacity> ring_;
};
#endif

constexpr int kStop = -1;  // the item that ends a consumer

// A consumer that pops until it gets kStop, echoing each item to `echo` if
// there is one.
template <typename Channel, typename Echo>
Driver consume(Channel& in, Echo* echo) {
  for (;;) {
    int v = Channel::valueOf(co_await in.pop());
    if (v == kStop) co_return;
    if constexpr (!std::is_same_v<Echo, std::nullptr_t>) benchmark::DoNotOptimize(co_await echo->push(v));
  }
}

// One op: a round trip between two coroutines on this thread through two
// channels of capacity 1: push to the partner, pop its answer.
template <template <std::size_t> class Channel>
void channelPingPong(benchmark::State& state) {
  Channel<1> there, back;
  consume(there, &back);
  [](benchmark::State& s, Channel<1>& out, Channel<1>& in) -> Driver {
    int i = 0;
    for (auto _ : s) {
      int v = i++ & 0x7fffffff;
      benchmark::DoNotOptimize(co_await out.push(v));
      benchmark::DoNotOptimize(Channel<1>::valueOf(co_await in.pop()));
    }
    int stop = kStop;
    benchmark::DoNotOptimize(co_await out.push(stop));
  }(state, there, back);
}

constexpr std::size_t kChannelCapacity = 64;

// One op: one item from a producer coroutine to a consumer coroutine on this
// thread, through a channel of capacity kChannelCapacity.
template <template <std::size_t> class Channel>
void channelThroughput(benchmark::State& state) {
  Channel<kChannelCapacity> channel;
  consume(channel, static_cast<std::nullptr_t*>(nullptr));
  [](benchmark::State& s, Channel<kChannelCapacity>& out) -> Driver {
    int i = 0;
    for (auto _ : s) {
      int v = i++ & 0x7fffffff;
      benchmark::DoNotOptimize(co_await out.push(v));
    }
    int stop = kStop;
    benchmark::DoNotOptimize(co_await out.push(stop));
  }(state, channel);
}

// ---------------------------------------------------------------------------
// collectAny. A Peer gives its task type, two kinds of child and its
// collectAny of two tasks and of a vector.

// A one-shot gate a child suspends on (`co_await gate.wait()`) until the
// benchmark opens it. The awaiter holds a reference, as async_simple's Lazy
// copies what it awaits.
class Gate {
 public:
  auto wait() noexcept {
    struct Awaiter {
      Gate& gate;
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<> h) noexcept { gate.waiter_ = h; }
      void await_resume() noexcept {}
    };
    return Awaiter{*this};
  }
  void open() { std::exchange(waiter_, nullptr).resume(); }

 private:
  std::coroutine_handle<> waiter_;
};

// Awaits a peer's collectAny from a Driver, then sets `done`.
struct AwaitFromDriver {
  template <typename Awaitable>
  static void launch(Awaitable any, bool& done) {
    [](Awaitable any, bool& done) -> Driver {
      benchmark::DoNotOptimize(co_await std::move(any));
      done = true;
    }(std::move(any), done);
  }
};

// Children are noinline so that no peer's frame allocation is elided.
struct CoioPeer : AwaitFromDriver {
  using IntTask = coio::Task<int>;
  [[gnu::noinline]] static IntTask ready(int i) { co_return i; }
  [[gnu::noinline]] static IntTask gated(Gate& gate, int i) {
    co_await gate.wait();
    co_return i;
  }
  static auto any(IntTask a, IntTask b) { return coio::collectAny(std::move(a), std::move(b)); }
  static auto anyRange(std::vector<IntTask> tasks) { return coio::collectAnyRange(std::move(tasks)); }
};

#if COIO_PEER_ASYNC_SIMPLE
struct AsyncSimplePeer {
  using IntTask = async_simple::coro::Lazy<int>;
  [[gnu::noinline]] static IntTask ready(int i) { co_return i; }
  [[gnu::noinline]] static IntTask gated(Gate& gate, int i) {
    co_await gate.wait();
    co_return i;
  }
  static auto any(IntTask a, IntTask b) { return async_simple::coro::collectAny(std::move(a), std::move(b)); }
  static auto anyRange(std::vector<IntTask> tasks) { return async_simple::coro::collectAny(std::move(tasks)); }
  // A Lazy may be awaited only by a Lazy or by start()'s detached coroutine.
  template <typename Lazy>
  static void launch(Lazy any, bool& done) {
    std::move(any).start([&done](auto&& result) {
      benchmark::DoNotOptimize(result);
      done = true;
    });
  }
};
#endif

#if COIO_PEER_LIBCORO
struct LibcoroPeer : AwaitFromDriver {
  using IntTask = coro::task<int>;
  [[gnu::noinline]] static IntTask ready(int i) { co_return i; }
  [[gnu::noinline]] static IntTask gated(Gate& gate, int i) {
    co_await gate.wait();
    co_return i;
  }
  static auto any(IntTask a, IntTask b) { return coro::when_any(std::move(a), std::move(b)); }
  static auto anyRange(std::vector<IntTask> tasks) { return coro::when_any(std::move(tasks)); }
};
#endif

enum class Children { ready, suspended };

// One op: collectAny over kN children. ready: each child returns at once
// (the first one wins). suspended: each child suspends on its own Gate and
// the benchmark opens the gates in order, so child 0 wins and the losers
// finish normally afterwards (no peer's cancellation is involved); the op
// ends once the collectAny's awaiter has resumed and every child finished.
// Either way an op includes the awaiting coroutine's frame (a Driver, or
// for async_simple the detached coroutine of Lazy::start).
template <typename Peer, int kN, Children kind>
void collectAnyOf(benchmark::State& state) {
  std::vector<Gate> gates(kN);
  auto child = [&](int i) {
    return kind == Children::ready ? Peer::ready(i) : Peer::gated(gates[static_cast<std::size_t>(i)], i);
  };
  bool done = false;
  for (auto _ : state) {
    if constexpr (kN == 2) {
      Peer::launch(Peer::any(child(0), child(1)), done);
    } else {
      std::vector<typename Peer::IntTask> tasks;
      tasks.reserve(kN);
      for (int i = 0; i < kN; ++i) tasks.push_back(child(i));
      Peer::launch(Peer::anyRange(std::move(tasks)), done);
    }
    if constexpr (kind == Children::suspended) {
      for (Gate& gate : gates) gate.open();
    }
    if (!std::exchange(done, false)) {
      state.SkipWithError("collectAny did not finish");
      break;
    }
  }
}

// ---------------------------------------------------------------------------
// Asio: its awaitables await only Asio operations and run in an io_context,
// so its rows have their own loops, doing the same work as the generic ones.

#if COIO_PEER_ASIO
using AsioChannel = asio::experimental::channel<void(asio::error_code, int)>;

asio::awaitable<void> asioConsume(AsioChannel& in, AsioChannel* echo) {
  for (;;) {
    int v = co_await in.async_receive(asio::use_awaitable);
    if (v == kStop) co_return;
    if (echo) co_await echo->async_send(asio::error_code{}, v, asio::use_awaitable);
  }
}

asio::awaitable<void> asioPinger(benchmark::State& s, AsioChannel& out, AsioChannel& in) {
  int i = 0;
  for (auto _ : s) {
    co_await out.async_send(asio::error_code{}, i++ & 0x7fffffff, asio::use_awaitable);
    benchmark::DoNotOptimize(co_await in.async_receive(asio::use_awaitable));
  }
  co_await out.async_send(asio::error_code{}, kStop, asio::use_awaitable);
}

asio::awaitable<void> asioProducer(benchmark::State& s, AsioChannel& out) {
  int i = 0;
  for (auto _ : s) co_await out.async_send(asio::error_code{}, i++ & 0x7fffffff, asio::use_awaitable);
  co_await out.async_send(asio::error_code{}, kStop, asio::use_awaitable);
}

void asioChannelPingPong(benchmark::State& state) {
  asio::io_context context(1);
  AsioChannel there(context, 1), back(context, 1);
  asio::co_spawn(context, asioConsume(there, &back), asio::detached);
  asio::co_spawn(context, asioPinger(state, there, back), asio::detached);
  context.run();
}

void asioChannelThroughput(benchmark::State& state) {
  asio::io_context context(1);
  AsioChannel channel(context, kChannelCapacity);
  asio::co_spawn(context, asioConsume(channel, nullptr), asio::detached);
  asio::co_spawn(context, asioProducer(state, channel), asio::detached);
  context.run();
}

[[gnu::noinline]] asio::awaitable<int> asioReady(int i) { co_return i; }

// collectAny of 2 ready children: `a || b` (Asio 1.22 has no ranged
// parallel_group, hence no row of 100).
asio::awaitable<void> asioAnyOf2(benchmark::State& s) {
  using namespace asio::experimental::awaitable_operators;
  for (auto _ : s) benchmark::DoNotOptimize(co_await (asioReady(0) || asioReady(1)));
}

void asioCollectAnyOf2(benchmark::State& state) {
  asio::io_context context(1);
  asio::co_spawn(context, asioAnyOf2(state), asio::detached);
  context.run();
}
#endif

// ---------------------------------------------------------------------------

using coio::bench::Row;

const Row kMutexUncontended{"mutex/uncontended/coio", &mutexUncontended<coio::Mutex>};
const Row kMutexHandOff{"mutex/hand_off_of_4/coio", &mutexHandOff<coio::Mutex>};
const Row kPingPong{"channel/pingpong/coio", &channelPingPong<CoioChannel>};
const Row kThroughput{"channel/throughput_64/coio", &channelThroughput<CoioChannel>};
const Row kAny2Ready{"collect_any/2_ready/coio", &collectAnyOf<CoioPeer, 2, Children::ready>};
const Row kAny100Ready{"collect_any/100_ready/coio", &collectAnyOf<CoioPeer, 100, Children::ready>};
const Row kAny2Suspended{"collect_any/2_suspended/coio", &collectAnyOf<CoioPeer, 2, Children::suspended>};
const Row kAny100Suspended{"collect_any/100_suspended/coio", &collectAnyOf<CoioPeer, 100, Children::suspended>};

const Row kRows[] = {
    kMutexUncontended,
#if COIO_PEER_ASYNC_SIMPLE
    {"mutex/uncontended/async_simple", &mutexUncontended<async_simple::coro::Mutex>, {&kMutexUncontended}},
#endif
#if COIO_PEER_LIBCORO
    {"mutex/uncontended/libcoro", &mutexUncontended<coro::mutex>, {&kMutexUncontended}},
#endif
#if COIO_PEER_CPPCORO
    {"mutex/uncontended/cppcoro", &mutexUncontended<cppcoro::async_mutex>, {&kMutexUncontended}},
#endif
    kMutexHandOff,
#if COIO_PEER_ASYNC_SIMPLE
    {"mutex/hand_off_of_4/async_simple", &mutexHandOff<async_simple::coro::Mutex>, {&kMutexHandOff}},
#endif
#if COIO_PEER_LIBCORO
    {"mutex/hand_off_of_4/libcoro", &mutexHandOff<coro::mutex>, {&kMutexHandOff}},
#endif
#if COIO_PEER_CPPCORO
    {"mutex/hand_off_of_4/cppcoro", &mutexHandOff<cppcoro::async_mutex>, {&kMutexHandOff}},
#endif
    kPingPong,
#if COIO_PEER_LIBCORO
    {"channel/pingpong/libcoro", &channelPingPong<LibcoroChannel>, {&kPingPong}},
#endif
#if COIO_PEER_ASIO
    {"channel/pingpong/asio", &asioChannelPingPong, {&kPingPong}},
#endif
    kThroughput,
#if COIO_PEER_LIBCORO
    {"channel/throughput_64/libcoro", &channelThroughput<LibcoroChannel>, {&kThroughput}},
#endif
#if COIO_PEER_ASIO
    {"channel/throughput_64/asio", &asioChannelThroughput, {&kThroughput}},
#endif
    kAny2Ready,
#if COIO_PEER_ASYNC_SIMPLE
    {"collect_any/2_ready/async_simple", &collectAnyOf<AsyncSimplePeer, 2, Children::ready>, {&kAny2Ready}},
#endif
#if COIO_PEER_LIBCORO
    {"collect_any/2_ready/libcoro", &collectAnyOf<LibcoroPeer, 2, Children::ready>, {&kAny2Ready}},
#endif
#if COIO_PEER_ASIO
    {"collect_any/2_ready/asio", &asioCollectAnyOf2, {&kAny2Ready}},
#endif
    kAny100Ready,
#if COIO_PEER_ASYNC_SIMPLE
    {"collect_any/100_ready/async_simple", &collectAnyOf<AsyncSimplePeer, 100, Children::ready>, {&kAny100Ready}},
#endif
#if COIO_PEER_LIBCORO
    {"collect_any/100_ready/libcoro", &collectAnyOf<LibcoroPeer, 100, Children::ready>, {&kAny100Ready}},
#endif
    kAny2Suspended,
#if COIO_PEER_ASYNC_SIMPLE
    {"collect_any/2_suspended/async_simple", &collectAnyOf<AsyncSimplePeer, 2, Children::suspended>,
     {&kAny2Suspended}},
#endif
#if COIO_PEER_LIBCORO
    {"collect_any/2_suspended/libcoro", &collectAnyOf<LibcoroPeer, 2, Children::suspended>, {&kAny2Suspended}},
#endif
    kAny100Suspended,
#if COIO_PEER_ASYNC_SIMPLE
    {"collect_any/100_suspended/async_simple", &collectAnyOf<AsyncSimplePeer, 100, Children::suspended>,
     {&kAny100Suspended}},
#endif
#if COIO_PEER_LIBCORO
    {"collect_any/100_suspended/libcoro", &collectAnyOf<LibcoroPeer, 100, Children::suspended>,
     {&kAny100Suspended}},
#endif
};

}  // namespace

int main(int argc, char** argv) {
  return coio::bench::runWithRatioTable(argc, argv, kRows);
}
