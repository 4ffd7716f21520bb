// readable()/writable() on arbitrary fds, as the disk ring's eventfd and the
// RDMA completion channel use them: drain, then wait again.
#include "test_reactors.hpp"

#include <coio/core/blocking_wait.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

using namespace std::chrono_literals;
using coio::Task;
using coio::FileDescriptor;
using coio::testing::TestReactors;

namespace {

std::uint64_t drainEventFd(int fd) {
  std::uint64_t value = 0;
  return ::read(fd, &value, sizeof value) == sizeof value ? value : 0;
}

void signalEventFd(int fd, std::uint64_t n = 1) { REQUIRE(::write(fd, &n, sizeof n) == sizeof n); }

}  // namespace

TEMPLATE_LIST_TEST_CASE("readable reports an edge that came before the call, and not a drained fd",
                        "[reactor][readiness]", TestReactors) {
  FileDescriptor efd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    signalEventFd(efd.get());
    coio::Result<void> early = co_await r.readable(efd.get());
    CHECK(early.hasValue());  // ready before the wait started
    coio::Result<void> again = co_await r.readable(efd.get());
    CHECK(again.hasValue());  // level: still ready, not drained
    CHECK(drainEventFd(efd.get()) == 1);
    auto wait = [&](std::stop_token stop) { return r.readable(efd.get(), std::move(stop)); };
    coio::Result<void> idle = co_await coio::withTimeout(r, wait, 20ms);
    CHECK(idle.error() == std::errc::timed_out);  // drained: nothing to report
    signalEventFd(efd.get());
    coio::Result<void> signalled = co_await coio::withTimeout(r, wait, 10s);
    CHECK(signalled.hasValue());
  };
  reactor.runUntil(test(reactor));
  reactor.forget(efd.get());
}

TEMPLATE_LIST_TEST_CASE("drain-then-wait on an eventfd signalled from another thread loses no wake-up",
                        "[reactor][readiness][threads]", TestReactors) {
  FileDescriptor efd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TestType reactor;
  constexpr std::uint64_t kSignals = 20000;
  std::atomic<bool> go{false};
  std::thread producer([&] {
    while (!go) std::this_thread::yield();
    for (std::uint64_t i = 0; i < kSignals; ++i) {
      const std::uint64_t one = 1;
      (void)!::write(efd.get(), &one, sizeof one);
    }
  });
  auto consumer = [&](TestType& r) -> Task<std::uint64_t> {
    go = true;
    std::uint64_t total = 0;
    while (total < kSignals) {
      total += drainEventFd(efd.get());
      if (total < kSignals) {
        coio::Result<void> ready = co_await r.readable(efd.get());
        REQUIRE(ready.hasValue());
      }
    }
    co_return total;
  };
  CHECK(reactor.runUntil(consumer(reactor)) == kSignals);
  producer.join();
  reactor.forget(efd.get());
}

TEMPLATE_LIST_TEST_CASE("writable on a full pipe completes once the reader drains it", "[reactor][readiness]",
                        TestReactors) {
  int fds[2];
  REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
  FileDescriptor readEnd(fds[0]), writeEnd(fds[1]);
  TestType reactor;
  char chunk[4096] = {};
  while (::write(writeEnd.get(), chunk, sizeof chunk) > 0) {
  }
  auto drainLater = [&](TestType& r) -> Task<void> {
    co_await r.sleepFor(5ms);
    while (::read(readEnd.get(), chunk, sizeof chunk) > 0) {
    }
  };
  auto test = [&](TestType& r) -> Task<void> {
    r.spawn(drainLater(r));
    coio::Result<void> writable = co_await r.writable(writeEnd.get());
    CHECK(writable.hasValue());
    CHECK(::write(writeEnd.get(), chunk, sizeof chunk) == sizeof chunk);
  };
  reactor.runUntil(test(reactor));
  reactor.forget(writeEnd.get());
}

TEMPLATE_LIST_TEST_CASE("a stop token cancels a readiness wait", "[reactor][readiness]", TestReactors) {
  FileDescriptor efd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    std::stop_source source;
    auto stopSoon = [](TestType& rr, std::stop_source& s) -> Task<void> {
      co_await rr.sleepFor(1ms);
      s.request_stop();
    };
    r.spawn(stopSoon(r, source));
    coio::Result<void> res = co_await r.readable(efd.get(), source.get_token());
    CHECK(res.error() == std::errc::operation_canceled);
    // The fd can be waited on again afterwards.
    signalEventFd(efd.get());
    coio::Result<void> ready = co_await r.readable(efd.get());
    CHECK(ready.hasValue());
  };
  reactor.runUntil(test(reactor));
  reactor.forget(efd.get());
}

TEMPLATE_LIST_TEST_CASE("a signal interrupting the loop's wait is harmless", "[reactor][threads]", TestReactors) {
  struct sigaction action {};
  action.sa_handler = [](int) {};
  ::sigemptyset(&action.sa_mask);  // no SA_RESTART: the wait fails with EINTR
  struct sigaction previous {};
  REQUIRE(::sigaction(SIGUSR1, &action, &previous) == 0);
  TestType reactor;
  std::atomic<pthread_t> loopThread{};
  std::atomic<bool> waiting{false};
  auto test = [&](TestType& r) -> Task<bool> {
    loopThread = ::pthread_self();
    waiting = true;
    co_await r.sleepFor(50ms);
    co_return true;
  };
  std::thread interrupter([&] {
    while (!waiting) std::this_thread::yield();
    for (int i = 0; i < 5; ++i) {
      ::pthread_kill(loopThread.load(), SIGUSR1);
      std::this_thread::sleep_for(2ms);
    }
  });
  CHECK(reactor.runUntil(test(reactor)));
  interrupter.join();
  ::sigaction(SIGUSR1, &previous, nullptr);
}
