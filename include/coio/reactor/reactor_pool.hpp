#pragma once
#include <coio/core/detail/assert.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace coio {

/// One reactor per thread (thread-per-core, as the storage server runs).
///
/// Guarantees:
/// - The constructor builds `size` reactors (each with `args...`) and starts
///   one thread running each; `spawn` hands tasks out round-robin and may be
///   called from any thread. A task runs on, and resumes on, the thread of
///   the reactor it was given to, unless it hops with another reactor's
///   `schedule()`. If a thread cannot be started, the constructor stops and
///   joins those already running and rethrows.
/// - `stop()` (also run by the destructor) stops every reactor and joins the
///   threads, then rethrows the first exception that escaped a spawned task.
///   Tasks still pending are destroyed with the pool; a task must then be
///   suspended on its own reactor, not in the middle of a hop to another.
template <Reactor R>
class ReactorPool {
 public:
  /// Starts `size` reactors, each constructed from `args` and run on its own thread.
  template <typename... Args>
  explicit ReactorPool(std::size_t size, const Args&... args) {
    COIO_ASSERT(size > 0, "a ReactorPool needs at least one reactor");
    reactors_.reserve(size);
    for (std::size_t i = 0; i < size; ++i) reactors_.push_back(std::make_unique<R>(args...));
    threads_.reserve(size);
    try {
      for (auto& reactor : reactors_) {
        threads_.emplace_back([this, r = reactor.get()] {
          try {
            r->run();
          } catch (...) {
            std::lock_guard lock(mutex_);
            if (!failure_) failure_ = std::current_exception();
          }
        });
      }
    } catch (...) {
      // A thread failed to start: the destructor will not run, and a
      // joinable std::thread must not be destroyed (std::terminate).
      for (auto& reactor : reactors_) reactor->stop();
      for (auto& thread : threads_) thread.join();
      throw;
    }
  }
  ReactorPool(const ReactorPool&) = delete;
  ReactorPool& operator=(const ReactorPool&) = delete;
  ~ReactorPool() {
    try {
      stop();
    } catch (...) {  // the destructor cannot report a task's failure: stop() does
    }
  }

  /// Number of reactors.
  std::size_t size() const noexcept { return reactors_.size(); }
  /// Reactor `i` (0 <= i < size()).
  R& reactor(std::size_t i) noexcept { return *reactors_[i]; }

  /// The reactor the next spawn would use; advances the round robin.
  R& next() noexcept { return *reactors_[next_.fetch_add(1, std::memory_order_relaxed) % reactors_.size()]; }

  /// Spawns `task` on the next reactor (round robin); callable from any thread.
  void spawn(Task<void> task) { next().spawn(std::move(task)); }

  /// Stops every reactor and joins its thread (idempotent); rethrows the
  /// first exception a spawned task let escape.
  void stop() {
    for (auto& reactor : reactors_) reactor->stop();
    for (auto& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
    std::lock_guard lock(mutex_);
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

 private:
  std::vector<std::unique_ptr<R>> reactors_;  // destroyed after the threads are joined
  std::vector<std::thread> threads_;
  std::atomic<std::size_t> next_{0};
  std::mutex mutex_;
  std::exception_ptr failure_;
};

}  // namespace coio
