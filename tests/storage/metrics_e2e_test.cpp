// coio-storage-server's metrics and stall report end to end: the real
// binary in a child process (serve --metrics --stall-threshold-ms
// --inject-stall-ms), a storage client and HTTP clients in this one. The
// page must parse as Prometheus' text format and count what was served, a
// stall injected with SIGUSR2 must be logged and counted, and bad HTTP
// clients must get errors without disturbing storage clients.
#include "store/chunk_store.hpp"
#include "e2e_support.hpp"
#include "client/storage_client.hpp"

#include "../killed_at_end.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/epoll_reactor.hpp>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using coio::Task;
using R = coio::EpollReactor;  // the clients'; the server runs each kind

namespace {

constexpr std::uint32_t kChunkSize = 64 * 1024;
constexpr std::uint64_t kChunks = 12;
constexpr auto kInjectedStall = 200ms;  // far above the threshold, so no chance turn is taken for it

// The server's stdout up to the line starting with `prefix`: that line's rest.
std::string awaitLine(int fd, std::string& seen, const std::string& prefix) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    for (std::size_t at = 0, end; (end = seen.find('\n', at)) != std::string::npos; at = end + 1) {
      if (seen.compare(at, prefix.size(), prefix) == 0) return seen.substr(at + prefix.size(), end - at - prefix.size());
    }
    pollfd ready{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    REQUIRE(left.count() > 0);
    REQUIRE(::poll(&ready, 1, static_cast<int>(left.count())) == 1);
    char buffer[4096];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    INFO("the server's output so far: " << seen);
    REQUIRE(n > 0);
    seen.append(buffer, static_cast<std::size_t>(n));
  }
}

// The server binary serving `dir`, its stderr into `log`; its data and
// metrics addresses from its banner.
struct ServerBinary {
  ServerBinary(const std::string& dir, const std::string& reactor, const std::string& log) {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    const pid_t parent = ::getpid();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(120);
      const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (err < 0 || ::dup2(out[1], STDOUT_FILENO) < 0 || ::dup2(err, STDERR_FILENO) < 0) ::_exit(121);
      const std::string stall = std::to_string(kInjectedStall.count());
      const char* argv[] = {COIO_STORAGE_SERVER_BIN, "serve", "--dir", dir.c_str(), "--listen", "127.0.0.1:0",
                            "--reactor", reactor.c_str(), "--reactors", "2", "--pool", "8M", "--piece-size", "16K",
                            "--metrics", "127.0.0.1:0", "--stall-threshold-ms", "40", "--inject-stall-ms",
                            stall.c_str(), nullptr};
      ::execv(argv[0], const_cast<char* const*>(argv));
      ::_exit(122);
    }
    guard.emplace(pid);
    ::close(out[1]);
    stdoutFd = out[0];
    std::string seen;
    data = *coio::SocketAddress::parse(awaitLine(stdoutFd, seen, "listening on "));
    const std::string url = awaitLine(stdoutFd, seen, "metrics on http://");
    metrics = *coio::SocketAddress::parse(url.substr(0, url.find('/')));
  }
  ServerBinary(const ServerBinary&) = delete;
  ServerBinary& operator=(const ServerBinary&) = delete;
  ~ServerBinary() { ::close(stdoutFd); }

  // SIGTERM; its exit status once it has stopped (within 20 s).
  int stop() {
    REQUIRE(::kill(pid, SIGTERM) == 0);
    for (int i = 0; i < 2000; ++i) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        guard.reset();  // reaped: nothing left to kill
        return status;
      }
      ::usleep(10000);
    }
    FAIL("the server did not stop within 20 s of SIGTERM");
    return -1;
  }

  pid_t pid = 0;
  int stdoutFd = -1;
  std::optional<coio::testing::KilledAtEnd> guard;
  coio::SocketAddress data;
  coio::SocketAddress metrics;
};

// Sends `request` on a fresh connection and reads the reply to its end.
Task<std::string> httpExchange(R& reactor, coio::SocketAddress at, std::string request) {
  coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, at);
  REQUIRE(stream);
  const coio::Result<void> sent = co_await stream->writeAll(std::as_bytes(std::span(request)));
  REQUIRE(sent);
  std::string reply;
  char buffer[4096];
  for (;;) {
    const coio::Result<std::size_t> n = co_await stream->read(std::as_writable_bytes(std::span(buffer)));
    if (!n) break;
    reply.append(buffer, *n);
  }
  co_return reply;
}

// A scrape: each sample's value by its name and labels as written
// (`name{labels}`); the test fails unless every line is a comment or a sample.
struct Scrape {
  std::map<std::string, double> samples;
  double operator[](const std::string& key) const {
    const auto found = samples.find(key);
    INFO("no sample " << key);
    REQUIRE(found != samples.end());
    return found->second;
  }
  // The sum of `name` over its reactor="0" and reactor="1" samples.
  double perReactor(const std::string& name) const {
    return (*this)[name + "{reactor=\"0\"}"] + (*this)[name + "{reactor=\"1\"}"];
  }
};

Task<Scrape> scrape(R& reactor, coio::SocketAddress at) {
  const std::string reply = co_await httpExchange(reactor, at, "GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n");
  REQUIRE(reply.rfind("HTTP/1.0 200 OK\r\n", 0) == 0);
  const std::size_t body = reply.find("\r\n\r\n");
  REQUIRE(body != std::string::npos);
  CHECK(reply.find("Content-Length: " + std::to_string(reply.size() - body - 4) + "\r\n") != std::string::npos);
  static const std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")"
                                 R"((,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})?) (-?[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?))");
  static const std::regex comment(R"(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+)");
  Scrape out;
  std::istringstream lines(reply.substr(body + 4));
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, comment)) continue;
    INFO("line: " << line);
    REQUIRE(std::regex_match(line, m, sample));
    CHECK(out.samples.emplace(m[1].str(), std::stod(m[4].str())).second);  // no sample twice
  }
  co_return out;
}

// Checks that histogram `name`'s buckets are cumulative and end at its count; returns the count.
double histogramCount(const Scrape& s, const std::string& name) {
  double below = 0;
  for (std::size_t i = 0; i < storage::LatencyHistogram::kBuckets; ++i) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%.9g",
                  std::chrono::duration<double>(storage::LatencyHistogram::upperBound(i)).count());
    const double bucket = s[name + "_bucket{le=\"" + bound + "\"}"];
    CHECK(bucket >= below);
    below = bucket;
  }
  const double count = s[name + "_count"];
  CHECK(s[name + "_bucket{le=\"+Inf\"}"] == count);
  CHECK(below <= count);
  return count;
}

// `requests` batchReads of `iosEach` whole chunks each, every byte checked.
Task<void> readChunks(storage::StorageClient<R>& client, int requests, std::uint64_t iosEach) {
  std::vector<std::byte> memory(iosEach * kChunkSize);
  for (int r = 0; r < requests; ++r) {
    std::vector<storage::ReadOp> ios;
    for (std::uint64_t i = 0; i < iosEach; ++i) {
      const std::uint64_t chunk = (static_cast<std::uint64_t>(r) + i) % kChunks;
      ios.push_back({chunk, 0, kChunkSize, std::span(memory).subspan(i * kChunkSize, kChunkSize)});
    }
    const coio::Result<std::vector<storage::ReadOutcome>> read = co_await client.batchRead(ios);
    REQUIRE(read);
    for (std::size_t i = 0; i < ios.size(); ++i) {
      CHECK((*read)[i].status == storage::proto::IoStatus::ok);
      CHECK_FALSE((*read)[i].checksumMismatch);
      CHECK(storage::matchesChunkBytes(ios[i].chunkId, 0, ios[i].into));
    }
  }
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Task<void> exercise(R& reactor, ServerBinary& server, const std::string& log) {
  const Scrape before = co_await scrape(reactor, server.metrics);
  CHECK(before["storage_requests_total"] == 0);
  CHECK(histogramCount(before, "storage_request_duration_seconds") == 0);

  // Served requests show in the counters and histograms: 5 granted
  // requests of 3 IOs, then one that waits for its grant.
  storage::TransmissionLimiter limiter(1);
  coio::Result<std::unique_ptr<storage::StorageClient<R>>> client =
      co_await storage::StorageClient<R>::connect(reactor, server.data, limiter, {.verifyChecksums = true});
  REQUIRE(client);
  co_await readChunks(**client, 5, 3);
  REQUIRE(limiter.tryAcquire());  // the only slot: the next request goes ungranted
  auto grantLater = [](R& r, storage::TransmissionLimiter& slots) -> Task<void> {
    co_await r.sleepFor(100ms);
    slots.release();
  };
  co_await coio::collectAll(readChunks(**client, 1, 1), grantLater(reactor, limiter));
  const Scrape served = co_await scrape(reactor, server.metrics);
  CHECK(served["storage_requests_total"] == 6);
  CHECK(histogramCount(served, "storage_request_duration_seconds") == 6);
  CHECK(histogramCount(served, "storage_disk_read_duration_seconds") == 16);
  CHECK(histogramCount(served, "storage_transmit_wait_seconds") == 1);
  CHECK(served["storage_transmit_wait_seconds_sum"] >= 0.05);  // most of the 100 ms the grant was held back
  CHECK(served["storage_request_duration_seconds_sum"] >= served["storage_transmit_wait_seconds_sum"]);
  CHECK(served["storage_connections"] == 1);
  CHECK(served["storage_read_buffers_in_use"] == 0);
  // --metrics times the loops (a turn counts once it ends: after the first scrape's hops, by now).
  CHECK(served.perReactor("coio_loop_running_seconds_total") > 0);
  CHECK(served.perReactor("coio_loop_waiting_seconds_total") > 0);
  CHECK(served["coio_ops_completed_total{reactor=\"0\",kind=\"diskRead\"}"] +
            served["coio_ops_completed_total{reactor=\"1\",kind=\"diskRead\"}"] >=
        16 * (kChunkSize / (16 * 1024)));  // every piece read, through either reactor's ring

  // Bad HTTP clients get errors, or are cut at the timeout, while a
  // storage client is served meanwhile.
  auto slowClient = [](R& r, coio::SocketAddress at) -> Task<void> {
    coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(r, at);
    REQUIRE(stream);
    const std::string part = "GET /metr";  // and nothing more
    const coio::Result<void> sent = co_await stream->writeAll(std::as_bytes(std::span(part)));
    REQUIRE(sent);
    co_await r.sleepFor(300ms);
  };
  auto badClients = [](R& r, coio::SocketAddress at) -> Task<void> {
    const std::string garbage = co_await httpExchange(r, at, "\x01\x02garbage\r\n\r\n");
    CHECK(garbage.rfind("HTTP/1.0 400 ", 0) == 0);
    const std::string unknown = co_await httpExchange(r, at, "GET /other HTTP/1.1\r\n\r\n");
    CHECK(unknown.rfind("HTTP/1.0 404 ", 0) == 0);
    const std::string post = co_await httpExchange(r, at, "POST /metrics HTTP/1.0\r\n\r\n");
    CHECK(post.rfind("HTTP/1.0 405 ", 0) == 0);
    const std::string oversized = co_await httpExchange(r, at, "GET /metrics HTTP/1.0\r\n" + std::string(9000, 'x'));
    CHECK(oversized.rfind("HTTP/1.0 400 ", 0) == 0);
  };
  co_await coio::collectAll(slowClient(reactor, server.metrics), badClients(reactor, server.metrics),
                            readChunks(**client, 20, 2));
  const Scrape afterBad = co_await scrape(reactor, server.metrics);
  CHECK(afterBad["storage_requests_total"] == 26);
  CHECK(afterBad["storage_protocol_errors_total"] == 0);

  // An injected stall is logged and counted.
  const double stallsBefore = afterBad.perReactor("coio_loop_stalls_total");
  REQUIRE(::kill(server.pid, SIGUSR2) == 0);
  static const std::regex stallLine(R"(coio-storage-server: stall: reactor [01] ran a ([0-9.]+) ms turn \(threshold 40 )"
                                    R"(ms\), [0-9.]+ ms of it in its (completions|ready|timers) phase; completions .*)");
  std::size_t injected = 0;
  for (int i = 0; i < 500 && injected < 2; ++i) {  // each reactor's, within 10 s
    co_await reactor.sleepFor(20ms);
    std::istringstream lines(readFile(log));
    injected = 0;
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_match(line, m, stallLine) && std::stod(m[1].str()) >= 200) ++injected;
    }
  }
  INFO("stderr: " << readFile(log));
  CHECK(injected >= 2);
  const Scrape stalled = co_await scrape(reactor, server.metrics);
  CHECK(stalled.perReactor("coio_loop_stalls_total") >= stallsBefore + 2);
  CHECK(stalled["coio_loop_longest_turn_seconds{reactor=\"0\"}"] >= 0.2);
  co_await readChunks(**client, 1, 1);  // still serving
  co_await (*client)->close();
}

}  // namespace

TEST_CASE("serve --metrics: the page parses and counts what was served; a stall injected is logged and counted; "
          "bad HTTP clients get errors, storage clients are served meanwhile",
          "[storage][metrics][e2e]") {
  const std::string kind = GENERATE(as<std::string>{}, "uring", "epoll");
  INFO("--reactor " << kind);
  storage::testing::TempDir dir({kChunks, kChunkSize, 4});
  const std::string log = (dir.path / "stderr.log").string();
  ServerBinary server(dir.path.string(), kind, log);
  R reactor;
  reactor.runUntil(exercise(reactor, server, log));
  const int status = server.stop();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
