// What only UringReactor has: feature probing and fallback, the submission
// policy and the operation API for other layers, CQ overflow, and buffer
// ownership across cancellation, the task-run modes (TaskRun), the timer's
// timeout op. Its receive modes are uring_recv_test.cpp's.
#include "test_reactors.hpp"
#include "uring_streams.hpp"

#if COIO_TEST_URING
#include <coio/core/async_scope.hpp>
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor_kind.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using coio::UringReactor;
using coio::RecvMode;
using coio::FileDescriptor;
using coio::testing::StreamPair;
using coio::testing::connectPair;

static_assert(coio::Reactor<UringReactor>);

TEST_CASE("io_uring is usable on this machine", "[uring]") {
  std::string why;
  const coio::Result<void> probe = UringReactor::probe(&why);
  INFO(why);
  CHECK(probe.hasValue());
  CHECK(coio::usableReactorKind(coio::ReactorKind::uring) == coio::ReactorKind::uring);
  CHECK(coio::parseReactorKind("epoll").value() == coio::ReactorKind::epoll);
  CHECK(coio::parseReactorKind("uring").value() == coio::ReactorKind::uring);
  CHECK(coio::parseReactorKind("kqueue").error() == coio::Errc::invalidArgument);
}

#if defined(__x86_64__)
TEST_CASE("with io_uring denied by seccomp, construction names the cause and the helper picks epoll", "[uring]") {
  // The filter applies to one thread only (no TSYNC): the rest of the test
  // process keeps io_uring.
  std::string constructionError, probeReason;
  std::error_code probeError;
  coio::ReactorKind picked = coio::ReactorKind::uring;
  bool ranOnEpoll = false;
  std::thread denied([&] {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0) {
      return;
    }
    try {
      UringReactor reactor;
    } catch (const std::system_error& e) {
      constructionError = e.what();
    }
    probeError = UringReactor::probe(&probeReason).error();
    picked = coio::usableReactorKind(coio::ReactorKind::uring);
    coio::withReactor(picked, [&](auto& reactor) {
      ranOnEpoll = std::is_same_v<std::remove_cvref_t<decltype(reactor)>, coio::EpollReactor>;
    });
  });
  denied.join();
  INFO(constructionError);
  CHECK(constructionError.find("disabled") != std::string::npos);
  CHECK(constructionError.find("seccomp") != std::string::npos);
  CHECK(probeError == std::errc::operation_not_permitted);
  CHECK(probeReason == constructionError.substr(0, probeReason.size()));
  CHECK(picked == coio::ReactorKind::epoll);
  CHECK(ranOnEpoll);
}
#endif

TEST_CASE("submit: a custom operation completes through user_data, per the submission policy", "[uring]") {
  UringReactor reactor;
  struct NopOperation : coio::UringOperation {
    int result = -1;
    bool done = false;
  };
  auto test = [](UringReactor& r, coio::SubmitPolicy policy) -> Task<void> {
    r.setSubmitPolicy(policy);
    const std::size_t baseline = r.inFlight();
    NopOperation op;
    op.complete = [](coio::UringOperation* o, int res, unsigned) noexcept {
      auto* nop = static_cast<NopOperation*>(o);
      nop->result = res;
      nop->done = true;
    };
    const unsigned queued = io_uring_sq_ready(&r.ring());
    r.submit(op, [](io_uring_sqe* sqe) { io_uring_prep_nop(sqe); });
    CHECK(r.inFlight() == baseline + 1);
    // Batched: still in the SQ until the loop's next io_uring_enter.
    CHECK(io_uring_sq_ready(&r.ring()) == (policy == coio::SubmitPolicy::batched ? queued + 1 : 0u));
    while (!op.done) co_await r.schedule();
    CHECK(op.result == 0);
    CHECK(r.inFlight() == baseline);
  };
  reactor.runUntil(test(reactor, coio::SubmitPolicy::batched));
  reactor.runUntil(test(reactor, coio::SubmitPolicy::eager));
}

TEST_CASE("completions beyond the CQ size and submissions beyond the SQ size are not lost", "[uring]") {
  constexpr int kPipes = 300;
  std::vector<FileDescriptor> readEnds, writeEnds;
  for (int i = 0; i < kPipes; ++i) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    readEnds.emplace_back(fds[0]);
    writeEnds.emplace_back(fds[1]);
  }
  UringReactor reactor(UringReactor::Options{.entries = 4, .cqEntries = 8, .submitPolicy = coio::SubmitPolicy::batched});
  int completed = 0;
  auto waiter = [](UringReactor& r, int fd, int& count) -> Task<void> {
    coio::Result<void> ready = co_await r.readable(fd);
    CHECK(ready.hasValue());
    ++count;
  };
  auto test = [&](UringReactor& r) -> Task<void> {
    for (int i = 0; i < kPipes; ++i) r.spawn(waiter(r, readEnds[i].get(), completed));
    while (r.inFlight() < kPipes + 1) co_await r.sleepFor(1ms);  // all polls armed in the kernel
    for (auto& w : writeEnds) REQUIRE(::write(w.get(), "x", 1) == 1);  // 300 completions at once
    while (completed < kPipes) co_await r.sleepFor(1ms);
  };
  reactor.runUntil(test(reactor));
  CHECK(completed == kPipes);
}

TEST_CASE("a timed-out recv resumes only after its completion: the buffer is free when withTimeout returns",
          "[uring]") {
  UringReactor reactor;
  auto test = [](UringReactor& r) -> Task<void> {
    StreamPair pair = co_await connectPair(r);
    const std::size_t baseline = r.inFlight();
    for (int i = 0; i < 20; ++i) {
      auto buffer = std::make_unique<std::byte[]>(64);
      auto read = [&](std::stop_token stop) { return pair.client.read(std::span(buffer.get(), 64), std::move(stop)); };
      coio::Result<std::size_t> n = co_await coio::withTimeout(r, read, 1ms);
      CHECK(n.error() == std::errc::timed_out);
      CHECK(r.inFlight() == baseline);  // the kernel has let go of the buffer
      buffer.reset();                   // ASan would catch a late kernel write into it
    }
    const char byte = 'z';
    REQUIRE(::write(pair.server.fd(), &byte, 1) == 1);
    std::byte got[1];
    coio::Result<std::size_t> n = co_await pair.client.read(got);
    REQUIRE(n.hasValue());
    CHECK(got[0] == std::byte{'z'});
  };
  reactor.runUntil(test(reactor));
}

namespace {

// Makes io_uring_enter on `ring` fail (EBADF) until destroyed: the kernel
// refuses to take a full SQ, as it would for a ring gone bad.
class BreakRingFd {
 public:
  explicit BreakRingFd(io_uring& ring) noexcept : ring_(ring), fd_(ring.ring_fd), enterFd_(ring.enter_ring_fd) {
    ring.ring_fd = ring.enter_ring_fd = -1;
  }
  BreakRingFd(const BreakRingFd&) = delete;
  BreakRingFd& operator=(const BreakRingFd&) = delete;
  ~BreakRingFd() {
    ring_.ring_fd = fd_;
    ring_.enter_ring_fd = enterFd_;
  }

 private:
  io_uring& ring_;
  int fd_, enterFd_;
};

}  // namespace

TEST_CASE("a stop that finds the SQ full and unflushable defers the cancel instead of throwing", "[uring]") {
  // The stop callback (noexcept) called cancel(), whose SQE acquisition
  // threw when the full SQ could not be submitted: std::terminate before
  // the fix. Now the cancel goes out before the loop's next wait.
  UringReactor reactor(UringReactor::Options{.entries = 4});
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) == 0);
  FileDescriptor a(pair[0]), b(pair[1]);
  auto test = [&]() -> Task<void> {
    coio::AsyncScope scope;
    std::vector<std::stop_source> stops;
    std::vector<coio::Result<std::size_t>> results;
    stops.reserve(16);
    results.reserve(16);
    auto receive = [](UringReactor& r, int fd, std::stop_token stop, coio::Result<std::size_t>& out) -> Task<void> {
      std::byte buffer[8];
      out = co_await r.recv(fd, buffer, std::move(stop));
    };
    // Batched policy: each recv's SQE waits in the SQ until the loop enters.
    while (io_uring_sq_space_left(&reactor.ring()) > 0) {
      REQUIRE(stops.size() < 16);
      stops.emplace_back();
      results.emplace_back(coio::Errc::closed);
      scope.spawn(receive(reactor, a.get(), stops.back().get_token(), results.back()));
    }
    {
      BreakRingFd broken(reactor.ring());
      stops.front().request_stop();  // no SQE to be had: deferred
    }
    co_await reactor.schedule();  // a loop iteration: the deferred cancel goes in
    for (std::size_t i = 1; i < stops.size(); ++i) stops[i].request_stop();
    co_await scope.join();
    for (const auto& result : results) CHECK(result.error() == std::errc::operation_canceled);
  };
  reactor.runUntil(test());
}

TEST_CASE("task-run modes parse from and print as their names", "[uring]") {
  for (const coio::TaskRun mode : {coio::TaskRun::immediate, coio::TaskRun::cooperative, coio::TaskRun::deferred}) {
    CHECK(coio::parseTaskRun(coio::toString(mode)).value() == mode);
  }
  CHECK(coio::parseTaskRun("lazy").error() == coio::Errc::invalidArgument);
}

TEST_CASE("every task-run mode serves TCP, timers and hand-over from other threads", "[uring][threads]") {
  for (const coio::TaskRun mode : {coio::TaskRun::immediate, coio::TaskRun::cooperative, coio::TaskRun::deferred}) {
    INFO("TaskRun " << static_cast<int>(mode));
    // Built here, run on another thread: a deferred ring is bound to the
    // thread that first runs the loop, not to the one that built it.
    UringReactor reactor(UringReactor::Options{.taskRun = mode});
    if (mode == coio::TaskRun::deferred) {  // falls back before Linux 6.1
      CHECK((reactor.taskRun() == coio::TaskRun::deferred || reactor.taskRun() == coio::TaskRun::cooperative));
    } else {
      CHECK(reactor.taskRun() == mode);
    }
    coio::Result<coio::TcpListener<UringReactor>> listener =
        coio::TcpListener<UringReactor>::bind(reactor, coio::SocketAddress::loopbackV4());
    REQUIRE(listener.hasValue());
    const coio::SocketAddress address = *listener->localAddress();
    auto echo = [](coio::TcpListener<UringReactor>& l) -> Task<void> {
      coio::Result<coio::TcpStream<UringReactor>> conn = co_await l.accept();
      if (!conn) co_return;
      std::byte buf[4];
      coio::Result<void> got = co_await conn->readExact(buf);
      if (got) (void)co_await conn->writeAll(buf);
    };
    bool handedOver = false;
    std::string reply;
    auto client = [&](UringReactor& r) -> Task<void> {
      coio::Result<coio::TcpStream<UringReactor>> conn = co_await coio::TcpStream<UringReactor>::connect(r, address);
      CHECK(conn.hasValue());
      if (!conn) {
        r.stop();
        co_return;
      }
      coio::Result<void> sent = co_await conn->writeAll(std::as_bytes(std::span("ping", 4)));
      CHECK(sent.hasValue());
      char buf[4];
      coio::Result<void> got = co_await conn->readExact(std::as_writable_bytes(std::span(buf)));
      if (got) reply.assign(buf, 4);
      co_await r.sleepFor(1ms);
      std::thread other([&] {
        r.spawn([](bool& flag) -> Task<void> {
          flag = true;
          co_return;
        }(handedOver));
      });
      other.join();
      while (!handedOver) co_await r.sleepFor(1ms);
      r.stop();  // quiesces on the loop thread: the reactor may then be destroyed here
    };
    reactor.spawn(echo(*listener));
    reactor.spawn(client(reactor));
    std::thread loop([&] { reactor.run(); });
    loop.join();
    CHECK(reply == "ping");
    CHECK(handedOver);
  }
}

TEST_CASE("a deferred reactor that ran on one thread is destroyed on another", "[uring][threads]") {
  // Its ring is bound to the loop thread, and only that thread may wait on
  // it: destroying the reactor here must not wait for the wake-up poll it
  // always has armed (before: io_uring_enter -EEXIST, std::terminate).
  std::optional<UringReactor> reactor(std::in_place, UringReactor::Options{.taskRun = coio::TaskRun::deferred});
  bool slept = false;
  std::thread loop([&] {
    reactor->runUntil([](UringReactor& r, bool& done) -> Task<void> {
      co_await r.sleepFor(1ms);
      done = true;
    }(*reactor, slept));
  });
  loop.join();
  CHECK(slept);
  reactor.reset();
  CHECK_FALSE(reactor.has_value());
}

TEST_CASE("a deferred reactor left with a timer pending is destroyed on another thread", "[uring][threads]") {
  // The loop ends while its timer's timeout op is armed in the kernel (the
  // task finished on a readable fd, an hour-long sleep still pending): like
  // the wake-up poll, that op holds nothing of anyone's, so destruction off
  // the loop thread must not wait for it.
  std::optional<UringReactor> reactor(std::in_place, UringReactor::Options{.taskRun = coio::TaskRun::deferred});
  int fds[2];
  REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
  FileDescriptor readEnd(fds[0]), writeEnd(fds[1]);
  bool readable = false;  // no Catch2 assertion off the main thread: it is not thread-safe
  std::thread loop([&] {
    reactor->runUntil([](UringReactor& r, int fd, bool& ok) -> Task<void> {
      r.spawn([](UringReactor& rr) -> Task<void> { co_await rr.sleepFor(1h); }(r));
      coio::Result<void> ready = co_await r.readable(fd);
      ok = ready.hasValue();
    }(*reactor, readEnd.get(), readable));
  });
  std::this_thread::sleep_for(20ms);  // the loop waits, its hour-long deadline armed
  const bool written = ::write(writeEnd.get(), "x", 1) == 1;
  loop.join();
  REQUIRE(written);
  CHECK(readable);
  reactor.reset();
  CHECK_FALSE(reactor.has_value());
}

TEST_CASE("a reactor run by one thread, then another, is destroyed by a third", "[uring][threads]") {
  // Each run of the loop registers the ring fd in its thread's table, and
  // must undo that as it returns: another thread entering by the registered
  // slot fails (EINVAL, EBADF) or enters another ring. Immediate and
  // cooperative rings may change threads (a deferred one may not).
  for (const coio::TaskRun mode : {coio::TaskRun::immediate, coio::TaskRun::cooperative}) {
    INFO("TaskRun " << coio::toString(mode));
    std::optional<UringReactor> reactor(std::in_place, UringReactor::Options{.taskRun = mode});
    int fds[2];
    REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
    FileDescriptor readEnd(fds[0]), writeEnd(fds[1]);
    auto nap = [](UringReactor& r, bool& done) -> Task<void> {
      co_await r.sleepFor(1ms);
      done = true;
    };
    bool first = false;
    std::thread runner([&] {
      // Never readable: its poll is still in flight when the reactor goes.
      reactor->spawn([](UringReactor& r, int fd) -> Task<void> { (void)co_await r.readable(fd); }(*reactor,
                                                                                                   readEnd.get()));
      reactor->runUntil(nap(*reactor, first));
    });
    runner.join();
    CHECK(first);
    bool second = false;
    reactor->runUntil(nap(*reactor, second));
    CHECK(second);
    CHECK(reactor->inFlight() >= 1);
    std::thread destroyer([&] { reactor.reset(); });  // quiesce waits for the poll's cancel here
    destroyer.join();
    CHECK_FALSE(reactor.has_value());
  }
}

TEST_CASE("a timer set earlier than the armed deadline wakes the loop on time", "[uring][threads][timer]") {
  // The loop sleeps towards an hour-long deadline (one timeout op in the
  // kernel); a task handed over from another thread sets a 20 ms timer,
  // which must move that op, not wait behind it. A watchdog ends a hang.
  UringReactor reactor;
  reactor.spawn([](UringReactor& r) -> Task<void> { co_await r.sleepFor(1h); }(reactor));
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::duration> woke;
  std::thread other([&] {
    std::this_thread::sleep_for(20ms);
    reactor.spawn([](UringReactor& r, auto& at, auto t0) -> Task<void> {
      co_await r.sleepFor(20ms);
      at = std::chrono::steady_clock::now() - t0;
      r.stop();
    }(reactor, woke, start));
  });
  std::thread watchdog([&] {
    std::this_thread::sleep_for(5s);
    reactor.stop();
  });
  reactor.run();
  other.join();
  watchdog.join();
  REQUIRE(woke.has_value());
  CHECK(*woke >= 40ms);
  CHECK(*woke < 2s);
}
#endif
