#pragma once
// Running coroutines on a reactor's loop thread from the program's main
// thread, which waits for signals.
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>

#include <exception>
#include <future>
#include <stop_token>
#include <utility>
#include <vector>

namespace storage::cli {

/// Spawns `task` on `reactor`: the future is ready when it returns, holds
/// what it threw, and is broken (std::future_error) if the reactor destroys
/// the task unrun (a stopped reactor): a waiter never waits forever.
template <coio::Reactor R>
std::future<void> spawnWatched(R& reactor, coio::Task<void> task) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  // The promise lives in the frame: destroyed unrun, the frame breaks it.
  reactor.spawn([](coio::Task<void> t, std::promise<void> signal) -> coio::Task<void> {
    try {
      co_await std::move(t);
    } catch (...) {
      signal.set_exception(std::current_exception());
      co_return;
    }
    signal.set_value();
  }(std::move(task), std::move(done)));
  return finished;
}

/// Runs `task` on `reactor`'s loop thread and waits for it (from another
/// thread); rethrows what it threw, or std::future_error if the reactor
/// stopped before running it.
template <coio::Reactor R>
void runOn(R& reactor, coio::Task<void> task) {
  spawnWatched(reactor, std::move(task)).get();
}

/// Coroutines run in the background on one reactor's loop thread, each
/// given the same stop token; stop() (from another thread) requests the stop
/// on that loop thread and waits for every one to return.
template <coio::Reactor R>
class Background {
 public:
  explicit Background(R& reactor) : reactor_(reactor) {}
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  ~Background() { stop(); }

  void start(coio::Task<void> task) { done_.push_back(spawnWatched(reactor_, std::move(task))); }
  std::stop_token token() const noexcept { return source_.get_token(); }
  void stop() {
    if (done_.empty()) return;
    runOn(reactor_, [](std::stop_source& source) -> coio::Task<void> {
      source.request_stop();  // here: the stop callbacks touch the loop's operations
      co_return;
    }(source_));
    std::vector<std::future<void>> done = std::move(done_);
    done_.clear();
    for (std::future<void>& d : done) d.get();
  }

 private:
  R& reactor_;
  std::stop_source source_;
  std::vector<std::future<void>> done_;
};

}  // namespace storage::cli
