#pragma once
// Running coroutines on a reactor's loop thread from the program's main
// thread, which waits for signals.
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>

#include <future>
#include <list>
#include <stop_token>
#include <utility>

namespace storage::cli {

/// Runs `task` on `reactor`'s loop thread and waits for it (from another thread).
template <coio::Reactor R>
void runOn(R& reactor, coio::Task<void> task) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  reactor.spawn([](coio::Task<void> t, std::promise<void>& signal) -> coio::Task<void> {
    co_await std::move(t);
    signal.set_value();
  }(std::move(task), done));
  finished.get();
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

  void start(coio::Task<void> task) {
    done_.emplace_back();
    reactor_.spawn([](coio::Task<void> t, std::promise<void>& signal) -> coio::Task<void> {
      co_await std::move(t);
      signal.set_value();
    }(std::move(task), done_.back()));
  }
  std::stop_token token() const noexcept { return source_.get_token(); }
  void stop() {
    if (done_.empty()) return;
    runOn(reactor_, [](std::stop_source& source) -> coio::Task<void> {
      source.request_stop();  // here: the stop callbacks touch the loop's operations
      co_return;
    }(source_));
    for (std::promise<void>& d : done_) d.get_future().get();
    done_.clear();
  }

 private:
  R& reactor_;
  std::stop_source source_;
  std::list<std::promise<void>> done_;  // a list: the coroutines hold references
};

}  // namespace storage::cli
