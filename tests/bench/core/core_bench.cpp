// Core micro-benchmarks. Every coio figure is printed next to a baseline
// measured in the same run (docs/benchmarks.md says what each row measures):
//   - a bare hand-written lazy task (malloc'd frame) for Task and fan-out,
//     and the same task with coio's frame pool to isolate the allocator,
//     also 1,000 of them built in a vector and awaited one by one (what a
//     fan-out of 1,000 costs without any coordination),
//   - one uncontended atomic exchange for Baton and the semaphores,
//   - std::mutex for coio::Mutex, uncontended and contended by two threads,
//   - a std::mutex + condition_variable ping-pong for two-thread hand-offs,
//   - a std::mutex + two condition_variables bounded queue for BoundedQueue.
// Single-threaded rows use CPU time, ping-pongs wall time. By default each
// benchmark is repeated 5 times, interleaved at random with the others, and
// the table takes the median.
#include "bench_driver.hpp"
#include "ratio_reporter.hpp"

#include <coio/core/baton.hpp>
#include <coio/core/batch_semaphore.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/bounded_queue.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/detail/frame_allocator.hpp>
#include <coio/core/mutex.hpp>
#include <coio/core/semaphore.hpp>
#include <coio/core/task.hpp>

#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

using coio::bench::Driver;

// Baseline (a): the least a lazy task can be: an int result slot, no
// exception transport, symmetric transfer both ways, exactly like
// coio::Task otherwise. FrameAlloc supplies the frame's operator new/delete:
// HeapFrame (none: global operator new, i.e. malloc) for the baseline, and
// coio's PooledFrame for a reference row that isolates the allocator.
struct HeapFrame {};

template <typename FrameAlloc>
class BareTask {
 public:
  struct promise_type;
  using Handle = std::coroutine_handle<promise_type>;

  struct promise_type : FrameAlloc {
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(Handle h) noexcept { return h.promise().continuation; }
      void await_resume() noexcept {}
    };
    BareTask get_return_object() noexcept { return BareTask{Handle::from_promise(*this)}; }
    std::suspend_always initial_suspend() noexcept { return {}; }
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_value(int v) noexcept { value = v; }
    void unhandled_exception() noexcept { std::terminate(); }
    int value = 0;
    std::coroutine_handle<> continuation;
  };

  struct Awaiter {
    Handle handle;
    bool await_ready() noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
      handle.promise().continuation = awaiting;
      return handle;
    }
    int await_resume() noexcept { return handle.promise().value; }
  };

  BareTask(BareTask&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  BareTask& operator=(BareTask&&) = delete;
  ~BareTask() {
    if (handle_) handle_.destroy();
  }
  Awaiter operator co_await() && noexcept { return Awaiter{handle_}; }

 private:
  explicit BareTask(Handle h) noexcept : handle_(h) {}
  Handle handle_;
};

using MallocTask = BareTask<HeapFrame>;
using PooledTask = BareTask<coio::detail::PooledFrame>;

// The awaited coroutines. noinline keeps the compiler from inlining the ramp
// and eliding the frame allocation (HALO), which would measure neither
// allocator; it applies equally to both task types.
template <typename TaskT>
[[gnu::noinline]] TaskT leaf(int x) {
  co_return x + 1;
}

template <typename TaskT>
[[gnu::noinline]] TaskT chain(int depth) {
  if (depth == 1) co_return 1;
  co_return 1 + co_await chain<TaskT>(depth - 1);
}

constexpr int kChainDepth = 10;

// One op: create a task, await it (it runs to completion and resumes us by
// symmetric transfer), destroy it.
template <typename TaskT>
void taskAwait(benchmark::State& state) {
  [](benchmark::State& s) -> Driver {
    int i = 0;
    for (auto _ : s) benchmark::DoNotOptimize(co_await leaf<TaskT>(i++));
  }(state);
}

// One op: a chain of kChainDepth tasks, each awaiting the next.
template <typename TaskT>
void taskChain(benchmark::State& state) {
  [](benchmark::State& s) -> Driver {
    for (auto _ : s) benchmark::DoNotOptimize(co_await chain<TaskT>(kChainDepth));
  }(state);
}

// Baseline (b): one uncontended locked read-modify-write.
void atomicExchange(benchmark::State& state) {
  std::atomic<std::uint64_t> word{0};
  std::uint64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(word.exchange(++i));
}

// Baseline (c): an uncontended std::mutex.
void mutexLockUnlock(benchmark::State& state) {
  std::mutex mutex;
  for (auto _ : state) {
    mutex.lock();
    mutex.unlock();
  }
}

// One op: `co_await lock()` that finds the coio::Mutex free, then unlock().
void coioMutexLockUnlock(benchmark::State& state) {
  coio::Mutex mutex;
  [](benchmark::State& s, coio::Mutex& m) -> Driver {
    for (auto _ : s) {
      co_await m.lock();
      m.unlock();
    }
  }(state, mutex);
}

// One op: a coroutine parked on a Baton is resumed by post(), then parks on
// a fresh Baton (one Baton per event, as a caller awaiting one completion
// uses it). That is post()'s exchange + resume, plus the waiter's
// await_ready load and its publishing CAS in await_suspend.
void batonPostResume(benchmark::State& state) {
  struct Slot {
    coio::Baton* baton = nullptr;
    bool stop = false;
  } slot;
  [](Slot& s) -> Driver {
    while (!s.stop) {
      coio::Baton baton;
      s.baton = &baton;
      co_await baton;
    }
  }(slot);
  for (auto _ : state) slot.baton->post();
  slot.stop = true;
  slot.baton->post();
}

auto acquireOne(coio::Semaphore& sem) { return sem.acquire(); }
auto acquireOne(coio::BatchSemaphore& sem) { return sem.acquire(1); }

// One op: `co_await acquire` that finds a token free (no suspension), then
// release.
template <typename Sem>
void semaphoreAcquireRelease(benchmark::State& state) {
  Sem sem(1);
  [](benchmark::State& s, Sem& sem) -> Driver {
    for (auto _ : s) {
      co_await acquireOne(sem);
      sem.release(1);
    }
  }(state, sem);
}

// One op: build kFanOut tasks in a vector, then await them one by one: what
// a fan-out of kFanOut costs at least, with every frame built before any
// runs (the table divides by kFanOut).
template <typename TaskT, int kFanOut>
void taskAwaitEach(benchmark::State& state) {
  [](benchmark::State& s) -> Driver {
    for (auto _ : s) {
      std::vector<TaskT> tasks;
      tasks.reserve(kFanOut);
      for (int i = 0; i < kFanOut; ++i) tasks.push_back(leaf<TaskT>(i));
      for (TaskT& task : tasks) benchmark::DoNotOptimize(co_await std::move(task));
    }
  }(state);
}

// One op: build kFanOut Task<int>s and await collectAllRange over them; the
// table divides by kFanOut to give the cost per child.
template <int kFanOut>
void collectAllRangeFanOut(benchmark::State& state) {
  [](benchmark::State& s) -> Driver {
    for (auto _ : s) {
      std::vector<coio::Task<int>> tasks;
      tasks.reserve(kFanOut);
      for (int i = 0; i < kFanOut; ++i) tasks.push_back(leaf<coio::Task<int>>(i));
      benchmark::DoNotOptimize(co_await coio::collectAllRange(std::move(tasks)));
    }
  }(state);
}

// The same after the frame pool's 64-byte class was refilled in a random
// order, as a service's pool is after children that finished in any order:
// the pool must not make each frame wait on the one freed before it (a free
// list threaded through the frames did: 10 % more per child).
template <int kFanOut>
void collectAllRangeFanOutScattered(benchmark::State& state) {
  using coio::detail::FramePool;
  std::vector<void*> blocks(FramePool::capacity(0));
  for (void*& block : blocks) block = coio::detail::allocateFrame(FramePool::kGranule);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(42));
  for (void* block : blocks) coio::detail::deallocateFrame(block, FramePool::kGranule);
  collectAllRangeFanOut<kFanOut>(state);
}

// Two one-way signals between two threads: [0] main -> partner, [1] back.
// Baseline: an auto-reset event made of std::mutex + condition_variable
// (notify after unlocking, the faster idiom).
class CondvarEvents {
 public:
  void post(int i) {
    {
      std::lock_guard lock(events_[i].mutex);
      events_[i].set = true;
    }
    events_[i].cv.notify_one();
  }
  void wait(int i) {
    std::unique_lock lock(events_[i].mutex);
    events_[i].cv.wait(lock, [&] { return events_[i].set; });
    events_[i].set = false;
  }

 private:
  struct Event {
    std::mutex mutex;
    std::condition_variable cv;
    bool set = false;
  };
  Event events_[2];
};

// A thread blocks on a coio primitive through blockingWait: the releasing
// thread resumes the waiter inline, which wakes the blocked thread.
template <typename Sem>
class SemaphoreEvents {
 public:
  SemaphoreEvents() {
    for (int i : {0, 1}) wait(i);  // start empty (BatchSemaphore starts full)
  }
  void post(int i) { sems_[i].release(1); }
  void wait(int i) { coio::blockingWait(acquireOne(sems_[i])); }

 private:
  Sem sems_[2]{Sem(1), Sem(1)};
};

class BatonEvents {
 public:
  void post(int i) { batons_[i].post(); }
  void wait(int i) {
    coio::blockingWait(batons_[i]);
    batons_[i].reset();  // before answering, so the next post is not lost
  }

 private:
  coio::Baton batons_[2];
};

// Where the two threads of a ping-pong run. Unpinned, the scheduler flips
// between both placements from run to run, and they differ tenfold here:
// on one CPU a hand-off is a context switch, across two it is a cross-CPU
// wake-up (35-40 us on this VM).
enum class Placement { sameCpu, twoCpus };

// Pins the calling thread to one CPU; restores its previous mask on exit.
class PinnedThread {
 public:
  explicit PinnedThread(int cpu) {
    pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  PinnedThread(const PinnedThread&) = delete;
  PinnedThread& operator=(const PinnedThread&) = delete;
  ~PinnedThread() { pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_); }

 private:
  cpu_set_t saved_;
};

// The first two CPUs this process may use (-1 where there is none).
std::pair<int, int> twoAllowedCpus() {
  cpu_set_t set;
  std::pair<int, int> cpus{-1, -1};
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.second < 0; ++cpu) {
    if (CPU_ISSET(cpu, &set)) (cpus.first < 0 ? cpus.first : cpus.second) = cpu;
  }
  return cpus;
}

// Runs the benchmark loop `measured()` on this thread while `partner(stop)`
// runs on a second one, placed per `placement`; then sets `stop` and calls
// `wakePartner()` so that a partner blocked in a wait sees it.
template <Placement placement, typename Partner, typename Loop, typename Wake>
void withPartner(benchmark::State& state, Partner partner, Loop measured, Wake wakePartner) {
  const auto [mainCpu, otherCpu] = twoAllowedCpus();
  const int partnerCpu = placement == Placement::sameCpu ? mainCpu : otherCpu;
  if (mainCpu < 0 || partnerCpu < 0) {
    state.SkipWithError("not enough CPUs for this placement");
    return;
  }
  PinnedThread pinned(mainCpu);
  std::atomic<bool> stop{false};
  std::thread partnerThread([&] {
    PinnedThread partnerPinned(partnerCpu);
    partner(stop);
  });
  measured();
  stop.store(true, std::memory_order_relaxed);  // published by wakePartner()
  wakePartner();
  partnerThread.join();
}

// One op: a round trip main -> partner -> main between two threads.
template <typename Events, Placement placement>
void pingPong(benchmark::State& state) {
  Events events;
  withPartner<placement>(
      state,
      [&](const std::atomic<bool>& stop) {
        for (;;) {
          events.wait(0);
          if (stop.load(std::memory_order_relaxed)) return;
          events.post(1);
        }
      },
      [&] {
        for (auto _ : state) {
          events.post(0);
          events.wait(1);
        }
      },
      [&] { events.post(0); });
}

// A lock that threads take, blocking while another thread holds it.
class StdMutexLock {
 public:
  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

// A thread takes the coio::Mutex with its lock-free path, or blocks through
// blockingWait until an unlock on the other thread hands it over.
class CoioMutexLock {
 public:
  void lock() {
    if (!mutex_.tryLock()) coio::blockingWait(mutex_.lock());
  }
  void unlock() { mutex_.unlock(); }

 private:
  coio::Mutex mutex_;
};

// One op: lock and unlock, while a partner thread does the same in a loop.
template <typename Lock, Placement placement>
void contendedLockUnlock(benchmark::State& state) {
  Lock lock;
  withPartner<placement>(
      state,
      [&](const std::atomic<bool>& stop) {
        while (!stop.load(std::memory_order_relaxed)) {
          lock.lock();
          lock.unlock();
        }
      },
      [&] {
        for (auto _ : state) {
          lock.lock();
          lock.unlock();
        }
      },
      [] {});
}

// Baseline: a bounded queue of ints made of std::mutex, two
// condition_variables and a std::deque (notify after unlocking).
class CondvarQueue {
 public:
  explicit CondvarQueue(std::size_t capacity) : capacity_(capacity) {}
  void push(int v) {
    {
      std::unique_lock lock(mutex_);
      notFull_.wait(lock, [&] { return items_.size() < capacity_; });
      items_.push_back(v);
    }
    notEmpty_.notify_one();
  }
  int pop() {
    int v;
    {
      std::unique_lock lock(mutex_);
      notEmpty_.wait(lock, [&] { return !items_.empty(); });
      v = items_.front();
      items_.pop_front();
    }
    notFull_.notify_one();
    return v;
  }

 private:
  std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable notFull_, notEmpty_;
  std::deque<int> items_;
};

// A thread uses a coio::BoundedQueue through its try operations, or blocks
// through blockingWait until the other thread makes room / hands an item.
class CoioQueue {
 public:
  explicit CoioQueue(std::size_t capacity) : queue_(capacity) {}
  void push(int v) {
    if (queue_.tryPush(std::move(v))) return;  // moved from only on success
    coio::blockingWait(queue_.push(std::move(v))).value();
  }
  int pop() {
    coio::Result<int> item = queue_.tryPop();
    if (!item) item = coio::blockingWait(queue_.pop());
    return *item;
  }

 private:
  coio::BoundedQueue<int> queue_;
};

// Ping-pong events made of two queues of capacity 1: post pushes, wait pops.
template <typename Queue>
class QueueEvents {
 public:
  void post(int i) { queues_[i].push(i); }
  void wait(int i) { benchmark::DoNotOptimize(queues_[i].pop()); }

 private:
  Queue queues_[2]{Queue(1), Queue(1)};
};

constexpr std::size_t kQueueCapacity = 64;

// One op: an item pushed through a queue of kQueueCapacity to a partner
// thread that pops until it gets -1.
template <typename Queue, Placement placement>
void queueThroughput(benchmark::State& state) {
  Queue queue(kQueueCapacity);
  withPartner<placement>(
      state,
      [&](const std::atomic<bool>&) {
        while (queue.pop() >= 0) {
        }
      },
      [&] {
        int i = 0;
        for (auto _ : state) queue.push(i++ & 0x7fffffff);
      },
      [&] { queue.push(-1); });
}

using coio::bench::Measured;
using coio::bench::Row;

const Row kBareTask{"baseline/bare_task", &taskAwait<MallocTask>};
const Row kBareChain{"baseline/bare_task_chain10", &taskChain<MallocTask>};
const Row kExchange{"baseline/atomic_exchange", &atomicExchange};
const Row kCondvarSameCpu{"baseline/mutex_condvar_pingpong/same_cpu",
                          &pingPong<CondvarEvents, Placement::sameCpu>, {}, Measured::realTime};
const Row kCondvarTwoCpus{"baseline/mutex_condvar_pingpong/two_cpus",
                          &pingPong<CondvarEvents, Placement::twoCpus>, {}, Measured::realTime};
const Row kStdMutex{"baseline/std_mutex_lock_unlock", &mutexLockUnlock, {&kExchange}};
const Row kStdMutexContended{"baseline/std_mutex_contended/two_cpus",
                             &contendedLockUnlock<StdMutexLock, Placement::twoCpus>, {}, Measured::realTime};
const Row kCondvarQueueSameCpu{"baseline/condvar_queue_pingpong/same_cpu",
                               &pingPong<QueueEvents<CondvarQueue>, Placement::sameCpu>, {}, Measured::realTime};
const Row kCondvarQueueTwoCpus{"baseline/condvar_queue_pingpong/two_cpus",
                               &pingPong<QueueEvents<CondvarQueue>, Placement::twoCpus>, {}, Measured::realTime};
const Row kCondvarQueueThroughput{"baseline/condvar_queue_throughput/two_cpus",
                                  &queueThroughput<CondvarQueue, Placement::twoCpus>, {}, Measured::realTime};

using SemaphorePair = SemaphoreEvents<coio::Semaphore>;
using BatchSemaphorePair = SemaphoreEvents<coio::BatchSemaphore>;

const Row kRows[] = {
    kBareTask,
    kBareChain,
    {"baseline/bare_task_pooled", &taskAwait<PooledTask>, {&kBareTask}},
    {"baseline/bare_task_pooled_chain10", &taskChain<PooledTask>, {&kBareChain}},
    {"baseline/bare_task_pooled_each_of_1000", &taskAwaitEach<PooledTask, 1000>, {&kBareTask}, Measured::cpuTime, 1000},
    kExchange,
    kStdMutex,
    kStdMutexContended,
    kCondvarSameCpu,
    kCondvarTwoCpus,
    kCondvarQueueSameCpu,
    kCondvarQueueTwoCpus,
    kCondvarQueueThroughput,
    {"task/create_await_destroy", &taskAwait<coio::Task<int>>, {&kBareTask, 0.6}},
    {"task/chain10", &taskChain<coio::Task<int>>, {&kBareChain, 0.6}},
    {"collect_all_range/per_child_of_64", &collectAllRangeFanOut<64>, {&kBareTask}, Measured::cpuTime, 64},
    {"collect_all_range/per_child_of_1000", &collectAllRangeFanOut<1000>, {&kBareTask, 0.6}, Measured::cpuTime,
     1000},
    {"collect_all_range/per_child_of_1000_scattered", &collectAllRangeFanOutScattered<1000>, {&kBareTask},
     Measured::cpuTime, 1000},
    {"baton/post_resume", &batonPostResume, {&kExchange, 2.5}},
    {"semaphore/acquire_release", &semaphoreAcquireRelease<coio::Semaphore>, {&kExchange, 2.5}},
    {"batch_semaphore/acquire_release", &semaphoreAcquireRelease<coio::BatchSemaphore>, {&kExchange}},
    {"semaphore/pingpong/same_cpu", &pingPong<SemaphorePair, Placement::sameCpu>, {&kCondvarSameCpu},
     Measured::realTime},
    {"batch_semaphore/pingpong/same_cpu", &pingPong<BatchSemaphorePair, Placement::sameCpu>, {&kCondvarSameCpu},
     Measured::realTime},
    {"baton/pingpong/same_cpu", &pingPong<BatonEvents, Placement::sameCpu>, {&kCondvarSameCpu},
     Measured::realTime},
    {"semaphore/pingpong/two_cpus", &pingPong<SemaphorePair, Placement::twoCpus>, {&kCondvarTwoCpus},
     Measured::realTime},
    {"batch_semaphore/pingpong/two_cpus", &pingPong<BatchSemaphorePair, Placement::twoCpus>, {&kCondvarTwoCpus},
     Measured::realTime},
    {"baton/pingpong/two_cpus", &pingPong<BatonEvents, Placement::twoCpus>, {&kCondvarTwoCpus},
     Measured::realTime},
    {"mutex/lock_unlock", &coioMutexLockUnlock, {&kStdMutex}},
    {"mutex/contended/two_cpus", &contendedLockUnlock<CoioMutexLock, Placement::twoCpus>, {&kStdMutexContended},
     Measured::realTime},
    {"bounded_queue/pingpong/same_cpu", &pingPong<QueueEvents<CoioQueue>, Placement::sameCpu>,
     {&kCondvarQueueSameCpu}, Measured::realTime},
    {"bounded_queue/pingpong/two_cpus", &pingPong<QueueEvents<CoioQueue>, Placement::twoCpus>,
     {&kCondvarQueueTwoCpus}, Measured::realTime},
    {"bounded_queue/throughput/two_cpus", &queueThroughput<CoioQueue, Placement::twoCpus>,
     {&kCondvarQueueThroughput}, Measured::realTime},
};

}  // namespace

int main(int argc, char** argv) {
  return coio::bench::runWithRatioTable(argc, argv, kRows);
}
