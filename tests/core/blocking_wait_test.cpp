#include <coio/core/baton.hpp>
#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>

#include <coroutine>
#include <stdexcept>
#include <thread>

using coio::Baton;
using coio::Task;
using coio::blockingWait;

TEST_CASE("blockingWait returns the value of any awaitable", "[blockingWait]") {
  Baton posted(true);
  blockingWait(posted);  // a plain awaitable, already signalled
  CHECK(blockingWait([]() -> Task<int> { co_return 3; }()) == 3);
}

TEST_CASE("blockingWait rethrows", "[blockingWait]") {
  auto failing = []() -> Task<void> {
    throw std::logic_error("bad");
    co_return;
  };
  CHECK_THROWS_AS(blockingWait(failing()), std::logic_error);
}

TEST_CASE("blockingWait waits for work completed on another thread", "[blockingWait][threads]") {
  for (int round = 0; round < 200; ++round) {
    Baton baton;
    int produced = 0;
    auto waiter = [&]() -> Task<int> {
      co_await baton;
      co_return produced + 1;  // runs on the posting thread
    };
    std::thread poster([&] {
      produced = 41;  // published by post()
      baton.post();
    });
    CHECK(blockingWait(waiter()) == 42);
    poster.join();
  }
}

namespace {
// Always suspends, and resumes the awaiting coroutine on a new thread.
struct ResumeOnNewThread {
  std::thread& thread;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) { thread = std::thread([h] { h.resume(); }); }
  void await_resume() const noexcept {}
};
}  // namespace

TEST_CASE("blockingWait sleeps while another thread finishes the work", "[blockingWait][threads]") {
  std::thread worker;
  std::thread::id ranOn;
  auto task = [&]() -> Task<int> {
    co_await ResumeOnNewThread{worker};
    ranOn = std::this_thread::get_id();
    co_return 5;
  };
  CHECK(blockingWait(task()) == 5);
  const auto workerId = worker.get_id();
  worker.join();
  CHECK(ranOn == workerId);
  CHECK(ranOn != std::this_thread::get_id());
}
