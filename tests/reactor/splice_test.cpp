// splice, tee and sendfile (coio/reactor/splice.hpp) on every reactor:
// a file's bytes through a pipe into a socket, the waits for an end that
// is not ready, partial transfers, cancellation, and bad input: a file
// truncated under a transfer, fds the kernel cannot splice, a peer gone
// (EPIPE, not SIGPIPE), an O_DIRECT file, a pipe that cannot be made.
#include "../pattern_files.hpp"
#include "test_reactors.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/splice.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stop_token>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using coio::kNoOffset;
using coio::Pipe;
using coio::Result;
using coio::Task;
using coio::FileDescriptor;
using coio::testing::SocketPair;
using coio::testing::TempDir;
using coio::testing::TestReactors;

static_assert(coio::SpliceReactor<coio::EpollReactor>);
#if COIO_TEST_URING
static_assert(coio::SpliceReactor<coio::UringReactor>);
#endif
static_assert(coio::Reactor<coio::sim::SimReactor> && !coio::SpliceReactor<coio::sim::SimReactor>);

namespace {

Pipe makePipe(std::size_t capacity = 0) {
  Result<Pipe> pipe = Pipe::make(capacity);
  REQUIRE(pipe.hasValue());
  return std::move(*pipe);
}

FileDescriptor openFile(const std::string& path, int flags = O_RDONLY) {
  FileDescriptor fd(::open(path.c_str(), flags | O_CLOEXEC, 0644));
  REQUIRE(fd.valid());
  return fd;
}

// The bytes a transfer moved; an error fails the test.
std::size_t moved(const Result<std::size_t>& result) {
  INFO((result ? std::string() : result.error().message()));
  REQUIRE(result.hasValue());
  return *result;
}

// Reads what the (non-blocking) fd holds now.
std::vector<std::byte> readNow(int fd) {
  std::vector<std::byte> got;
  std::byte chunk[65536];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n <= 0) return got;
    got.insert(got.end(), chunk, chunk + n);
  }
}

// Sends into the non-blocking socket until it takes no more: the bytes sent.
std::size_t fillSocket(int fd) {
  std::size_t sent = 0;
  std::vector<char> chunk(65536, 'x');
  for (std::size_t size : {chunk.size(), std::size_t{1}}) {  // then byte by byte: not a byte of room left
    for (;;) {
      const ssize_t n = ::send(fd, chunk.data(), size, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
  }
  return sent;
}

// The reactor's transfers waited for an end to be ready (a reader that
// started late let the socket fill): epoll waits (counted as `other`),
// io_uring polls.
template <typename R>
bool waited(const R& r) {
  constexpr bool kEpoll = std::is_same_v<R, coio::EpollReactor>;
  return r.stats()[kEpoll ? coio::OpKind::other : coio::OpKind::poll].submitted > 0;
}

// Receives `n` bytes from socket `fd`; with `afterWait`, starting only once
// the reactor has waited.
template <typename R>
Task<std::vector<std::byte>> receive(R& r, int fd, std::size_t n, bool afterWait = false) {
  // Reading only once the sender has waited makes its wait certain, however
  // slowly a loaded machine runs it (a fixed delay did not: a reader that
  // started before the socket filled could keep up all the way). Bounded, so
  // a sender that never waits fails the check instead of hanging.
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       afterWait && !waited(r) && std::chrono::steady_clock::now() < deadline;) {
    co_await r.sleepFor(1ms);
  }
  std::vector<std::byte> got(n);
  std::size_t at = 0;
  while (at < n) {
    Result<std::size_t> k = co_await r.recv(fd, std::span(got).subspan(at));
    const std::size_t n = moved(k);
    REQUIRE(n > 0);
    at += n;
  }
  co_return got;
}

// Moves the first `size` bytes of a file, `step(offset)` at a time (an
// awaitable yielding the bytes it moved, which leaves `pipe` empty): the
// number of steps.
template <typename Step>
Task<std::size_t> inSteps(std::size_t size, Pipe& pipe, Step step) {
  std::size_t offset = 0;
  std::size_t steps = 0;
  while (offset < size) {
    Result<std::size_t> stepped = co_await step(offset);
    const std::size_t n = moved(stepped);
    REQUIRE(n > 0);
    CHECK(pipe.buffered() == 0);
    ++steps;
    offset += n;
  }
  co_return steps;
}

// A step with splice: from the file at `offset` into `pipe`, then all of
// that out of it into `out`.
template <typename R>
Task<Result<std::size_t>> spliceThrough(R& r, int file, std::size_t offset, std::size_t length, int out, Pipe& pipe) {
  Result<std::size_t> in = co_await r.splice(file, static_cast<std::int64_t>(offset), pipe.writeFd(), kNoOffset, length);
  CHECK(moved(in) <= pipe.capacity());
  for (std::size_t left = *in; left > 0;) {
    Result<std::size_t> sent = co_await r.splice(pipe.readFd(), kNoOffset, out, kNoOffset, left);
    left -= moved(sent);
  }
  co_return in;
}

// Requests a stop on `source` after `delay`, on the loop thread.
template <typename R>
Task<void> stopAfter(R& r, std::chrono::milliseconds delay, std::stop_source& source) {
  co_await r.sleepFor(delay, std::stop_token{});
  source.request_stop();
}

// `op(token)` stopped 20 ms in: what it yields.
template <typename R, typename Op>
Task<Result<std::size_t>> stoppedSoon(R& r, Op op) {
  std::stop_source source;
  auto run = [](Op& op, std::stop_token stop) -> Task<Result<std::size_t>> { co_return co_await op(std::move(stop)); };
  auto [result, unit] = co_await coio::collectAll(run(op, source.get_token()), stopAfter(r, 20ms, source));
  co_return result;
}

// `op()` (an operation's awaitable) as a Task, for collectAll.
template <typename Op>
Task<Result<std::size_t>> asTask(Op op) {
  co_return co_await op();
}

// Writes `bytes` into the fd after `delay`.
template <typename R>
Task<void> writeAfter(R& r, std::chrono::milliseconds delay, int fd, std::string bytes) {
  co_await r.sleepFor(delay);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("splice moves a file through a pipe into a socket, waiting for room; every byte arrives",
                        "[reactor][splice]", TestReactors) {
  constexpr std::size_t kSize = 3 * 1024 * 1024 + 123;  // many pipe- and socket-fulls, and a short end
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(1, kSize));
  SocketPair sockets;
  Pipe pipe = makePipe();
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    auto step = [&](std::size_t offset) {
      return spliceThrough(r, file.get(), offset, kSize - offset, sockets.b.get(), pipe);
    };
    auto [fills, got] =
        co_await coio::collectAll(inSteps(kSize, pipe, step), receive(r, sockets.a.get(), kSize, true));
    CHECK(fills >= kSize / pipe.capacity());
    CHECK(coio::testing::matchesPattern(1, 0, got));
    CHECK(waited(r));
    // The file's end: 0.
    Result<std::size_t> end = co_await r.splice(file.get(), kSize, pipe.writeFd(), kNoOffset, 4096);
    CHECK(moved(end) == 0);
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
}

TEMPLATE_LIST_TEST_CASE("splice from a socket waits for its data, and reads its close as 0", "[reactor][splice]",
                        TestReactors) {
  SocketPair sockets;
  Pipe pipe = makePipe();
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    auto [spliced, unit] = co_await coio::collectAll(
        asTask([&] { return r.splice(sockets.a.get(), kNoOffset, pipe.writeFd(), kNoOffset, 100); }), writeAfter(r, 10ms, sockets.b.get(), "late bytes"));
    CHECK(moved(spliced) == 10);
    const std::vector<std::byte> got = readNow(pipe.readFd());
    CHECK(std::string(reinterpret_cast<const char*>(got.data()), got.size()) == "late bytes");
    REQUIRE(::shutdown(sockets.b.get(), SHUT_WR) == 0);
    Result<std::size_t> end = co_await r.splice(sockets.a.get(), kNoOffset, pipe.writeFd(), kNoOffset, 100);
    CHECK(moved(end) == 0);
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
  reactor.forget(sockets.a.get());
  reactor.forget(sockets.b.get());
}

TEMPLATE_LIST_TEST_CASE("splice into a full pipe waits until it is drained", "[reactor][splice]", TestReactors) {
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(2, 65536));
  Pipe pipe = makePipe(4096);
  const std::vector<char> filler(pipe.capacity(), 'f');
  REQUIRE(::write(pipe.writeFd(), filler.data(), filler.size()) == static_cast<ssize_t>(filler.size()));
  TestType reactor;
  auto drainAfter = [](TestType& r, Pipe& p) -> Task<std::size_t> {
    co_await r.sleepFor(10ms);
    co_return p.discard();
  };
  auto test = [&](TestType& r) -> Task<void> {
    auto [spliced, drained] = co_await coio::collectAll(
        asTask([&] { return r.splice(file.get(), 8192, pipe.writeFd(), kNoOffset, 65536); }), drainAfter(r, pipe));
    CHECK(drained == filler.size());  // nothing of the file went in before the drain
    const std::size_t n = moved(spliced);
    CHECK(n > 0);
    CHECK(n <= pipe.capacity());
    const std::vector<std::byte> got = readNow(pipe.readFd());
    CHECK(got.size() == n);
    CHECK(coio::testing::matchesPattern(2, 8192, got));
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
}

TEMPLATE_LIST_TEST_CASE("tee copies a pipe's bytes into another without consuming them; from an empty one it waits",
                        "[reactor][splice]", TestReactors) {
  Pipe from = makePipe();
  Pipe to = makePipe();
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    auto [copied, unit] =
        co_await coio::collectAll(asTask([&] { return r.tee(from.readFd(), to.writeFd(), 100); }),
                                  writeAfter(r, 10ms, from.writeFd(), "hello"));
    CHECK(moved(copied) == 5);
    CHECK(from.buffered() == 5);  // still there
    CHECK(to.buffered() == 5);
    Result<std::size_t> again = co_await r.tee(from.readFd(), to.writeFd(), 3);  // a partial tee
    CHECK(moved(again) == 3);
    const std::vector<std::byte> got = readNow(to.readFd());
    CHECK(std::string(reinterpret_cast<const char*>(got.data()), got.size()) == "hellohel");
  };
  reactor.runUntil(test(reactor));
  from.close(reactor);
  to.close(reactor);
}

TEMPLATE_LIST_TEST_CASE("sendfile sends a whole file in as many calls as it takes, leaving the pipe empty",
                        "[reactor][splice]", TestReactors) {
  constexpr std::size_t kSize = 2 * 1024 * 1024 + 77;
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(3, kSize));
  SocketPair sockets;
  Pipe pipe = makePipe(16384);
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    auto step = [&](std::size_t offset) {
      return r.sendfile(sockets.b.get(), file.get(), static_cast<std::int64_t>(offset), kSize - offset, pipe);
    };
    auto [calls, got] =
        co_await coio::collectAll(inSteps(kSize, pipe, step), receive(r, sockets.a.get(), kSize, true));
    CHECK(calls >= 1);
    CHECK(coio::testing::matchesPattern(3, 0, got));
    CHECK(waited(r));
    Result<std::size_t> end = co_await r.sendfile(sockets.b.get(), file.get(), kSize, 4096, pipe);
    CHECK(moved(end) == 0);
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
  reactor.forget(sockets.a.get());
  reactor.forget(sockets.b.get());
}

TEMPLATE_LIST_TEST_CASE("a file truncated under a transfer reads short, then as its end; what was spliced still goes",
                        "[reactor][splice]", TestReactors) {
  TempDir dir;
  const std::string path = dir.patternFile(4, 65536);
  FileDescriptor file = openFile(path);
  SocketPair sockets;
  Pipe pipe = makePipe();
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    Result<std::size_t> first = co_await r.splice(file.get(), 0, pipe.writeFd(), kNoOffset, 16384);
    CHECK(moved(first) == 16384);
    CHECK(pipe.discard() == 16384);
    REQUIRE(::truncate(path.c_str(), 20000) == 0);
    Result<std::size_t> shortened = co_await r.splice(file.get(), 16384, pipe.writeFd(), kNoOffset, 16384);
    CHECK(moved(shortened) == 20000 - 16384);
    CHECK(coio::testing::matchesPattern(4, 16384, readNow(pipe.readFd())));
    Result<std::size_t> gone = co_await r.splice(file.get(), 20000, pipe.writeFd(), kNoOffset, 16384);
    CHECK(moved(gone) == 0);

    REQUIRE(::truncate(path.c_str(), 10000) == 0);
    Result<std::size_t> sentShort = co_await r.sendfile(sockets.b.get(), file.get(), 8192, 16384, pipe);
    CHECK(moved(sentShort) == 10000 - 8192);
    CHECK(pipe.buffered() == 0);
    CHECK(coio::testing::matchesPattern(4, 8192, readNow(sockets.a.get())));
    Result<std::size_t> sentNone = co_await r.sendfile(sockets.b.get(), file.get(), 10000, 16384, pipe);
    CHECK(moved(sentNone) == 0);

    // Truncated with its pages in the pipe: they still go out, as spliced.
    Result<std::size_t> held = co_await r.splice(file.get(), 0, pipe.writeFd(), kNoOffset, 8192);
    CHECK(moved(held) == 8192);
    REQUIRE(::truncate(path.c_str(), 0) == 0);
    Result<std::size_t> out = co_await r.splice(pipe.readFd(), kNoOffset, sockets.b.get(), kNoOffset, 8192);
    CHECK(moved(out) == 8192);
    CHECK(coio::testing::matchesPattern(4, 0, readNow(sockets.a.get())));
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
}

TEMPLATE_LIST_TEST_CASE("an output whose reader is gone yields EPIPE, and no SIGPIPE", "[reactor][splice]",
                        TestReactors) {
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(5, 65536));
  SocketPair sockets;
  Pipe pipe = makePipe();
  int ends[2];
  REQUIRE(::pipe2(ends, O_NONBLOCK | O_CLOEXEC) == 0);
  FileDescriptor readerless(ends[1]);
  ::close(ends[0]);
  sockets.a.reset();  // the peer
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    REQUIRE(::write(pipe.writeFd(), "data", 4) == 4);
    Result<std::size_t> spliced = co_await r.splice(pipe.readFd(), kNoOffset, sockets.b.get(), kNoOffset, 4);
    CHECK(spliced.error() == std::errc::broken_pipe);
    Result<std::size_t> teed = co_await r.tee(pipe.readFd(), readerless.get(), 4);
    CHECK(teed.error() == std::errc::broken_pipe);
    CHECK(pipe.discard() == 4);
    Result<std::size_t> sent = co_await r.sendfile(sockets.b.get(), file.get(), 0, 65536, pipe);
    CHECK(sent.error() == std::errc::broken_pipe);
    CHECK(pipe.buffered() == 0);  // what could not go was dropped
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
  reactor.forget(sockets.b.get());
  reactor.forget(readerless.get());
}

TEMPLATE_LIST_TEST_CASE("fds the kernel cannot splice yield EINVAL; an offset on a pipe ESPIPE; no fd EBADF",
                        "[reactor][splice]", TestReactors) {
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(6, 4096));
  FileDescriptor copy = openFile((dir.path() / "copy").string(), O_WRONLY | O_CREAT);
  FileDescriptor efd(::eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC));
  Pipe pipe = makePipe();
  SocketPair sockets;
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    Result<std::size_t> noPipe = co_await r.splice(file.get(), 0, copy.get(), 0, 4096);
    CHECK(noPipe.error() == std::errc::invalid_argument);
    Result<std::size_t> noSplice = co_await r.splice(efd.get(), kNoOffset, pipe.writeFd(), kNoOffset, 8);
    CHECK(noSplice.error() == std::errc::invalid_argument);
    Result<std::size_t> teeFile = co_await r.tee(file.get(), pipe.writeFd(), 8);
    CHECK(teeFile.error() == std::errc::invalid_argument);
    Result<std::size_t> badOffset = co_await r.splice(file.get(), -7, pipe.writeFd(), kNoOffset, 8);
    CHECK(badOffset.error() == std::errc::invalid_argument);
    Result<std::size_t> pipeOffset = co_await r.splice(file.get(), 0, pipe.writeFd(), 0, 8);
    CHECK(pipeOffset.error() == std::errc::invalid_seek);
    Result<std::size_t> noFd = co_await r.splice(-1, kNoOffset, pipe.writeFd(), kNoOffset, 8);
    CHECK(noFd.error() == std::errc::bad_file_descriptor);
    Result<std::size_t> noOut = co_await r.splice(pipe.readFd(), kNoOffset, -1, kNoOffset, 8);
    CHECK(noOut.error() == std::errc::bad_file_descriptor);
    Result<std::size_t> negative = co_await r.sendfile(sockets.b.get(), file.get(), -1, 4096, pipe);
    CHECK(negative.error() == std::errc::invalid_argument);
    Result<std::size_t> fromSocket = co_await r.sendfile(sockets.b.get(), sockets.a.get(), 0, 4096, pipe);
    CHECK(fromSocket.error() == std::errc::invalid_argument);
    CHECK(pipe.buffered() == 0);  // none of it left anything behind
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
}

TEMPLATE_LIST_TEST_CASE("a stop cancels a waiting splice, tee or sendfile with operation_canceled; nothing moves",
                        "[reactor][splice][cancellation]", TestReactors) {
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(7, 65536));
  SocketPair sockets;
  Pipe pipe = makePipe();
  Pipe other = makePipe();
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    // From an empty pipe into a socket: waits for the pipe.
    Result<std::size_t> spliced = co_await stoppedSoon(
        r, [&](std::stop_token s) { return r.splice(pipe.readFd(), kNoOffset, sockets.b.get(), kNoOffset, 100, s); });
    CHECK(spliced.error() == std::errc::operation_canceled);
    Result<std::size_t> teed =
        co_await stoppedSoon(r, [&](std::stop_token s) { return r.tee(pipe.readFd(), other.writeFd(), 100, s); });
    CHECK(teed.error() == std::errc::operation_canceled);
    // The pipe still works.
    REQUIRE(::write(pipe.writeFd(), "abc", 3) == 3);
    Result<std::size_t> after = co_await r.splice(pipe.readFd(), kNoOffset, sockets.b.get(), kNoOffset, 100);
    CHECK(moved(after) == 3);
    CHECK(readNow(sockets.a.get()).size() == 3);

    // Into a full socket: waits for room, and sends nothing once stopped.
    const std::size_t filled = fillSocket(sockets.b.get());
    Result<std::size_t> sent = co_await stoppedSoon(
        r, [&](std::stop_token s) { return r.sendfile(sockets.b.get(), file.get(), 0, 65536, pipe, s); });
    CHECK(sent.error() == std::errc::operation_canceled);
    CHECK(pipe.buffered() == 0);
    CHECK(readNow(sockets.a.get()).size() == filled);
    CHECK(r.stats().inFlight == 0);
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
  other.close(reactor);
  reactor.forget(sockets.a.get());
  reactor.forget(sockets.b.get());
}

TEMPLATE_LIST_TEST_CASE("a reactor stopped while a splice waits destroys it with the reactor; the pipe stays usable",
                        "[reactor][splice]", TestReactors) {
  Pipe pipe = makePipe();
  SocketPair sockets;
  bool started = false;
  bool finished = false;
  {
    TestType reactor;
    auto waiter = [](TestType& r, Pipe& p, int out, bool& started, bool& finished) -> Task<void> {
      started = true;
      Result<std::size_t> never = co_await r.splice(p.readFd(), kNoOffset, out, kNoOffset, 100);
      finished = true;
      (void)never;
    };
    auto stopper = [](TestType& r) -> Task<void> {
      co_await r.sleepFor(10ms);
      r.stop();
    };
    reactor.spawn(waiter(reactor, pipe, sockets.b.get(), started, finished));
    reactor.spawn(stopper(reactor));
    reactor.run();
  }
  CHECK(started);
  CHECK_FALSE(finished);
  REQUIRE(::write(pipe.writeFd(), "x", 1) == 1);
  CHECK(pipe.discard() == 1);
}

TEMPLATE_LIST_TEST_CASE("O_DIRECT files splice in and out at aligned offsets; unaligned for their device, EINVAL",
                        "[reactor][splice]", TestReactors) {
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(8, 65536), O_RDONLY | O_DIRECT);
  // The offset alignment O_DIRECT needs here (a block device's; a file
  // system that does not say, tmpfs, needs none).
  struct statx st {};
  REQUIRE(::statx(file.get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0);
  const std::uint32_t align = (st.stx_mask & STATX_DIOALIGN) ? st.stx_dio_offset_align : 0;
  INFO("O_DIRECT offset alignment " << align);
  FileDescriptor copy = openFile((dir.path() / "copy").string(), O_WRONLY | O_CREAT | O_DIRECT);
  Pipe pipe = makePipe();
  TestType reactor;
  auto test = [&](TestType& r) -> Task<void> {
    Result<std::size_t> aligned = co_await r.splice(file.get(), 8192, pipe.writeFd(), kNoOffset, 16384);
    CHECK(moved(aligned) == 16384);
    CHECK(coio::testing::matchesPattern(8, 8192, readNow(pipe.readFd())));
    if (align > 1) {
      Result<std::size_t> unaligned = co_await r.splice(file.get(), align / 2, pipe.writeFd(), kNoOffset, 4096);
      CHECK(unaligned.error() == std::errc::invalid_argument);
    }
    // And out of a pipe into an O_DIRECT file.
    Result<std::size_t> in = co_await r.splice(file.get(), 0, pipe.writeFd(), kNoOffset, 8192);
    CHECK(moved(in) == 8192);
    Result<std::size_t> out = co_await r.splice(pipe.readFd(), kNoOffset, copy.get(), 4096, 8192);
    CHECK(moved(out) == 8192);
    FileDescriptor reread = openFile((dir.path() / "copy").string());  // buffered: any memory will do
    std::vector<std::byte> back(8192);
    REQUIRE(::pread(reread.get(), back.data(), back.size(), 4096) == 8192);
    CHECK(coio::testing::matchesPattern(8, 0, back));
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
}

#if COIO_TEST_URING
TEST_CASE("UringReactor: sendfile through a pipe that holds bytes is refused with EBUSY; they stay",
          "[reactor][splice][uring]") {
  TempDir dir;
  FileDescriptor file = openFile(dir.patternFile(9, 65536));
  SocketPair sockets;
  Pipe pipe = makePipe();
  REQUIRE(::write(pipe.writeFd(), "stale", 5) == 5);
  coio::UringReactor reactor;
  auto test = [&](coio::UringReactor& r) -> Task<void> {
    Result<std::size_t> sent = co_await r.sendfile(sockets.b.get(), file.get(), 0, 65536, pipe);
    CHECK(sent.error() == std::errc::device_or_resource_busy);
    CHECK(pipe.buffered() == 5);
    CHECK(readNow(sockets.a.get()).empty());
  };
  reactor.runUntil(test(reactor));
}

TEST_CASE("UringReactor: a splice from a socket it reads ahead is refused with EBUSY; the bytes stay in order",
          "[reactor][splice][uring]") {
  SocketPair sockets;
  Pipe pipe = makePipe();
  coio::testing::MultishotUringReactor reactor;
  auto test = [&](coio::UringReactor& r) -> Task<void> {
    REQUIRE(::write(sockets.b.get(), "one", 3) == 3);
    char buf[8];
    Result<std::size_t> first = co_await r.recv(sockets.a.get(), std::as_writable_bytes(std::span(buf)));
    CHECK(std::string(buf, moved(first)) == "one");
    REQUIRE(r.readsAhead(sockets.a.get()));  // a multishot recv is armed on it
    REQUIRE(::write(sockets.b.get(), "two", 3) == 3);
    Result<std::size_t> spliced = co_await r.splice(sockets.a.get(), kNoOffset, pipe.writeFd(), kNoOffset, 3);
    CHECK(spliced.error() == std::errc::device_or_resource_busy);
    CHECK(pipe.buffered() == 0);
    Result<std::size_t> second = co_await r.recv(sockets.a.get(), std::as_writable_bytes(std::span(buf)));
    CHECK(std::string(buf, moved(second)) == "two");
  };
  reactor.runUntil(test(reactor));
  pipe.close(reactor);
  reactor.forget(sockets.a.get());
}
#endif

TEST_CASE("Pipe: sized at least as asked, EINVAL past INT_MAX, EBUSY below what it holds; discard empties it",
          "[reactor][splice][pipe]") {
  Pipe plain = makePipe();
  CHECK(plain.capacity() == 16 * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  CHECK((::fcntl(plain.readFd(), F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(plain.writeFd(), F_GETFD) & FD_CLOEXEC) != 0);
  Pipe big = makePipe(100000);
  CHECK(big.capacity() == 131072);
  const std::size_t fds = coio::testing::openFdCount();
  Result<Pipe> huge = Pipe::make(std::size_t{INT_MAX} + 1);  // made, then not sized: closed again
  CHECK(huge.error() == std::errc::invalid_argument);
  CHECK(coio::testing::openFdCount() == fds);

  const std::vector<char> bytes(8192, 'b');
  REQUIRE(::write(big.writeFd(), bytes.data(), bytes.size()) == 8192);
  CHECK(big.buffered() == 8192);
  Result<std::size_t> shrunk = big.resize(4096);
  CHECK(shrunk.error() == std::errc::device_or_resource_busy);
  CHECK(big.capacity() == 131072);
  CHECK(big.discard() == 8192);
  CHECK(big.buffered() == 0);
  CHECK(big.discard() == 0);
}

TEST_CASE("Pipe::make at the fd limit yields EMFILE and leaks no fd (in a child process)", "[reactor][splice][pipe]") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The lowest free fd number: every number below it is taken, so a soft
    // limit there leaves none, and one above it leaves one (a pipe needs two).
    const int lowest = ::dup(0);
    if (lowest < 0) ::_exit(10);
    ::close(lowest);
    for (const int room : {0, 1}) {
      rlimit limit{};
      if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(11);
      limit.rlim_cur = static_cast<rlim_t>(lowest + room);
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(12);
      Result<Pipe> pipe = Pipe::make(1 << 20);
      if (pipe.hasValue()) ::_exit(13);
      if (pipe.error() != std::errc::too_many_files_open) ::_exit(14);
      const int next = ::dup(0);  // still the same lowest free fd: nothing leaked
      if (room == 1 && next != lowest) ::_exit(15);
      if (room == 0 && next != -1) ::_exit(16);
      if (next >= 0) ::close(next);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
