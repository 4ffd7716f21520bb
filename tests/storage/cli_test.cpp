#include "programs/cli.hpp"
#include "programs/server/on_loop.hpp"

#include <catch2/catch.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

TEST_CASE("The server raises its fd limit to the hard limit", "[storage][cli]") {
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &before) == 0);
  rlimit lowered = before;
  lowered.rlim_cur = std::min<rlim_t>(before.rlim_cur, 256);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  const std::uint64_t limit = storage::cli::raiseFdLimit();
  rlimit after{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &after) == 0);
  CHECK(after.rlim_cur == before.rlim_max);
  CHECK(limit == after.rlim_cur);
  (void)::setrlimit(RLIMIT_NOFILE, &before);
}

TEST_CASE("The default reactor count is the CPUs the process may run on, not the machine's", "[storage][cli]") {
  cpu_set_t mine;
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  CHECK(storage::cli::usableCpus() == static_cast<std::size_t>(CPU_COUNT(&mine)));
  // On a thread narrowed to one CPU (as taskset or a cpuset would): one.
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  std::size_t narrowed = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (::sched_setaffinity(0, sizeof one, &one) == 0) narrowed = storage::cli::usableCpus();
  }).join();
  CHECK(narrowed == 1);
}

TEST_CASE("The default connection limit stays well under the fd limit", "[storage][cli]") {
  using storage::cli::defaultMaxConnections;
  CHECK(defaultMaxConnections(1u << 20, 100, 1) == 10000);         // capped
  CHECK(defaultMaxConnections(4096, 96, 1) == 2000);               // half of what is left
  CHECK(defaultMaxConnections(4096, 96, storage::cli::fdsPerConnection(true)) == 1000);
  CHECK(defaultMaxConnections(1024, 2000, 1) == 1);                // nothing left: still one
}

namespace {

// `args` parsed by an app with one --size (sizeIn(512, 1G, 512)) and one
// --count (countIn(1, 100)) option; parse()'s verdict.
std::optional<int> parseSizeAndCount(std::vector<std::string> args, std::uint64_t& size, std::uint64_t& count) {
  CLI::App app("test", "cli-test");
  storage::cli::lastOneCounts(app);
  app.add_option("--size", size)->transform(storage::cli::sizeIn(512, 1u << 30, 512));
  app.add_option("--count", count)->transform(storage::cli::countIn(1, 100));
  args.insert(args.begin(), "cli-test");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return storage::cli::parse(app, static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("Sizes take binary suffixes, counts are decimal, both within their range", "[storage][cli]") {
  std::uint64_t size = 0, count = 0;
  CHECK_FALSE(parseSizeAndCount({"--size", "64K", "--count", "010"}, size, count));
  CHECK(size == 64 * 1024);
  CHECK(count == 10);  // decimal, not octal
  CHECK_FALSE(parseSizeAndCount({"--size", "1g", "--count", "1", "--count", "7"}, size, count));
  CHECK(size == 1u << 30);
  CHECK(count == 7);  // the last one counts
  CHECK_FALSE(parseSizeAndCount({"--size", "4096"}, size, count));
  CHECK(size == 4096);
  // Out of range, not a multiple, not a number, a negative, an overflow: exit code 2.
  for (const char* bad : {"2G", "1000", "4Q", "-4K", "", "99999999999999999999", "18014398509481984K"}) {
    INFO(bad);
    CHECK(parseSizeAndCount({"--size", bad}, size, count) == std::optional<int>(2));
  }
  for (const char* bad : {"0", "101", "0x10", "-1", "1K"}) {
    INFO(bad);
    CHECK(parseSizeAndCount({"--count", bad}, size, count) == std::optional<int>(2));
  }
  CHECK(parseSizeAndCount({"--unknown"}, size, count) == std::optional<int>(2));
}

namespace {
coio::Task<void> throwing() {
  throw std::runtime_error("the task failed");
  co_return;
}
coio::Task<void> setting(bool& ran) {
  ran = true;
  co_return;
}
}  // namespace

TEST_CASE("runOn passes on what its task threw, and never waits for a reactor that will not run it",
          "[storage][cli]") {
  coio::EpollReactor reactor;
  std::thread loop([&] { reactor.run(); });
  // Bounded: a task whose throw was lost would leave the future unset.
  std::future<void> failed = storage::cli::spawnWatched(reactor, throwing());
  REQUIRE(failed.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK_THROWS_AS(failed.get(), std::runtime_error);
  CHECK_THROWS_AS(storage::cli::runOn(reactor, throwing()), std::runtime_error);
  bool ran = false;
  storage::cli::runOn(reactor, setting(ran));  // the loop goes on after a task threw
  CHECK(ran);
  reactor.stop();
  loop.join();
  // Stopped: the reactor destroys the task unrun, which breaks the promise.
  std::future<void> unrun = storage::cli::spawnWatched(reactor, setting(ran));
  REQUIRE(unrun.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK_THROWS_AS(unrun.get(), std::future_error);
}
