// The API reference's examples: each block between two `//! [name]` lines
// is shown in a header's doc comment (`\snippet api_examples.cpp name`),
// and the test case after it runs it and checks what its comments claim.
// Edit them here; Doxygen copies them as they are.
#include <coio/coio.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

using namespace std::chrono_literals;

namespace task_example {

//! [task]
coio::Task<int> answer() { co_return 42; }

coio::Task<int> twice() {
  const int a = co_await answer();  // runs answer() to its end, then goes on here
  co_return 2 * a;
}

int runTwice() {
  coio::Task<int> task = twice();              // lazy: nothing has run yet
  return coio::blockingWait(std::move(task));  // runs it on this thread: 84
}
//! [task]

}  // namespace task_example

TEST_CASE("api example: Task", "[api-example]") { CHECK(task_example::runTwice() == 84); }

namespace blocking_wait_example {

//! [blockingWait]
coio::Task<int> valueOnceDone(const coio::Baton& done, const int& value) {
  co_await done;  // suspends until post(), then goes on on the posting thread
  co_return value;
}

int computedElsewhere() {
  coio::Baton done;
  int value = 0;
  std::thread worker([&] {
    value = 6 * 7;
    done.post();
  });
  // Starts valueOnceDone() here; if it suspended before the post, it
  // finishes on `worker` while this thread sleeps until it is done.
  const int got = coio::blockingWait(valueOnceDone(done, value));
  worker.join();
  return got;  // 42
}
//! [blockingWait]

}  // namespace blocking_wait_example

TEST_CASE("api example: blockingWait", "[api-example][threads]") {
  CHECK(blocking_wait_example::computedElsewhere() == 42);
}

namespace collect_all_example {

//! [collectAll]
coio::Task<std::size_t> length(std::string s) { co_return s.size(); }
coio::Task<void> touch(int& counter) {
  ++counter;
  co_return;
}

coio::Task<std::size_t> total(int& counter) {
  // Both start at once, here; the tuple holds a coio::Unit for the Task<void>.
  auto [a, unit] = co_await coio::collectAll(length("hello"), touch(counter));
  (void)unit;
  // A vector of tasks: the results in input order.
  std::vector<coio::Task<std::size_t>> tasks;
  for (const char* word : {"a", "bb", "ccc"}) tasks.push_back(length(word));
  const std::vector<std::size_t> lengths = co_await coio::collectAllRange(std::move(tasks));
  co_return a + lengths[0] + lengths[1] + lengths[2];  // 5 + 1 + 2 + 3 = 11
}
//! [collectAll]

}  // namespace collect_all_example

TEST_CASE("api example: collectAll", "[api-example]") {
  int counter = 0;
  CHECK(coio::blockingWait(collect_all_example::total(counter)) == 11);
  CHECK(counter == 1);
}

namespace collect_any_example {

//! [collectAny]
coio::Task<std::string> fromCache() { co_return "cached"; }

coio::Task<std::string> fromDisk(coio::Event& loaded) {
  // A default token: the one this task runs under, which collectAny stops
  // once another task has won. The wait then yields false.
  const bool isLoaded = co_await loaded.wait(std::stop_token{});
  co_return isLoaded ? "loaded" : "abandoned";
}

coio::Task<std::string> lookup(coio::Event& loaded) {
  // fromDisk() starts first and waits; fromCache() finishes at once and wins.
  // collectAny returns once both have finished: no task outlives it.
  std::variant<std::string, std::string> first = co_await coio::collectAny(fromDisk(loaded), fromCache());
  co_return first.index() == 1 ? std::get<1>(first) : std::get<0>(first);  // "cached"
}
//! [collectAny]

}  // namespace collect_any_example

TEST_CASE("api example: collectAny", "[api-example]") {
  coio::Event loaded;
  CHECK(coio::blockingWait(collect_any_example::lookup(loaded)) == "cached");
}

namespace batch_semaphore_example {

//! [BatchSemaphore]
// At most 1 MiB of reads in flight: each holds its size in tokens.
coio::Task<void> boundedRead(coio::EpollReactor& reactor, coio::BatchSemaphore& inFlight, std::size_t bytes,
                             std::size_t& peak) {
  co_await inFlight.acquire(bytes);  // FIFO: a large read is not passed by small ones
  peak = std::max(peak, inFlight.capacity() - inFlight.available());
  co_await reactor.sleepFor(std::chrono::milliseconds(1));  // stands for the I/O
  inFlight.release(bytes);  // resumes the reads that now fit, inline, oldest first
}

std::size_t readAll(coio::EpollReactor& reactor) {
  coio::BatchSemaphore inFlight(1 << 20);
  std::size_t peak = 0;
  std::vector<coio::Task<void>> reads;
  for (std::size_t kib : {512, 256, 1024, 128, 384}) reads.push_back(boundedRead(reactor, inFlight, kib << 10, peak));
  reactor.runUntil(coio::collectAllRange(std::move(reads)));
  return peak;  // 1 MiB (2.25 MiB without the semaphore): the 1 MiB read waited for the first two
}
//! [BatchSemaphore]

}  // namespace batch_semaphore_example

TEST_CASE("api example: BatchSemaphore", "[api-example]") {
  coio::EpollReactor reactor;
  CHECK(batch_semaphore_example::readAll(reactor) == 1 << 20);
}

namespace with_timeout_example {

//! [withTimeout]
coio::Task<int> slowAnswer(coio::EpollReactor& reactor) {
  co_await reactor.sleepFor(std::chrono::seconds(10));  // ends early once this task's token is stopped: at the deadline
  co_return 42;
}

coio::Task<std::error_code> askWithDeadline(coio::EpollReactor& reactor) {
  // Returns once slowAnswer() has finished, cancelled at 10 ms, not in 10 s.
  coio::Result<int> answer = co_await coio::withTimeout(reactor, slowAnswer(reactor), std::chrono::milliseconds(10));
  co_return answer ? std::error_code() : answer.error();  // std::errc::timed_out
}
//! [withTimeout]

}  // namespace with_timeout_example

TEST_CASE("api example: withTimeout", "[api-example]") {
  coio::EpollReactor reactor;
  const auto start = std::chrono::steady_clock::now();
  CHECK(reactor.runUntil(with_timeout_example::askWithDeadline(reactor)) == std::errc::timed_out);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

namespace tcp_stream_example {

//! [TcpStream]
using Reactor = coio::EpollReactor;  // or coio::UringReactor: the same code

// Counts the bytes a client sends until it ends its side, and answers with the count.
coio::Task<void> countBytes(coio::TcpListener<Reactor>& listener) {
  coio::Result<coio::TcpStream<Reactor>> conn = co_await listener.accept();  // resumes on the loop thread
  if (!conn) co_return;
  std::uint64_t count = 0;
  std::byte buffer[64];
  coio::Result<std::size_t> got = co_await conn->read(buffer);  // what is there, at least 1 byte
  while (got) {
    count += *got;
    got = co_await conn->read(buffer);
  }
  if (got.error() != coio::Errc::eof) co_return;  // the end of the stream is Errc::eof
  (void)co_await conn->writeAll(std::as_bytes(std::span(&count, 1)));
}

coio::Task<coio::Result<std::uint64_t>> countRemotely(Reactor& reactor, coio::SocketAddress server,
                                                      std::string_view text) {
  coio::Result<coio::TcpStream<Reactor>> conn = co_await coio::TcpStream<Reactor>::connect(reactor, server);
  if (!conn) co_return conn.error();
  if (coio::Result<void> sent = co_await conn->writeAll(std::as_bytes(std::span(text))); !sent) co_return sent.error();
  if (coio::Result<void> ended = conn->shutdown(); !ended) co_return ended.error();  // the server reads Errc::eof
  std::uint64_t count = 0;
  coio::Result<void> got = co_await conn->readExact(std::as_writable_bytes(std::span(&count, 1)));
  if (!got) co_return got.error();
  co_return count;
}

std::uint64_t countHello() {
  Reactor reactor;
  coio::Result<coio::TcpListener<Reactor>> listener =
      coio::TcpListener<Reactor>::bind(reactor, coio::SocketAddress::loopbackV4());  // a free port
  if (!listener) return 0;
  reactor.spawn(countBytes(*listener));
  coio::Result<std::uint64_t> count = reactor.runUntil(countRemotely(reactor, *listener->localAddress(), "hello"));
  return count ? *count : 0;  // 5
}
//! [TcpStream]

}  // namespace tcp_stream_example

TEST_CASE("api example: TcpStream", "[api-example]") { CHECK(tcp_stream_example::countHello() == 5); }
