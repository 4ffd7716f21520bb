// Loopback TCP benchmark for both reactors: request/response rate and
// streaming throughput. The server runs on its own thread and reactor, the
// client on the main thread; pin the process (taskset) to place both.
//   net_bench --reactor epoll|uring --mode rr|stream [--connections N]
//             [--size BYTES] [--seconds S] [--submit batched|eager]
//             [--taskrun immediate|cooperative|deferred]
//             [--recv plain|multishot|adaptive]
// --recv: the uring reactors' Options::recvMode (default: the reactor's).
// Prints one line: key=value pairs, the figure last.
#include <coio/core/collect_all.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

enum class Mode { rr, stream };

struct Settings {
  coio::ReactorKind kind = coio::ReactorKind::epoll;
  Mode mode = Mode::rr;
  std::size_t connections = 1;
  std::size_t size = 64;
  double seconds = 3;
  coio::SubmitPolicy submit = coio::SubmitPolicy::batched;
  coio::TaskRun taskRun = coio::UringReactor::Options{}.taskRun;
  coio::RecvMode recvMode = coio::UringReactor::Options{}.recvMode;
};

// Reactors are built through this (the uring one with the options above).
template <coio::Reactor R>
R makeReactor(const Settings& settings) {
  if constexpr (std::is_same_v<R, coio::UringReactor>) {
    return R(coio::UringReactor::Options{
        .submitPolicy = settings.submit, .taskRun = settings.taskRun, .recvMode = settings.recvMode});
  } else {
    return R();
  }
}

// Server side: echo what arrives (rr), or send `size`-byte messages until
// the client goes away (stream).
// Reads go to buffers of at least this size, as a server's would (sockperf's
// too): a read shorter than its buffer tells the epoll reactor that the
// socket is drained, which spares the next read a failing recv.
constexpr std::size_t kReadBuffer = 64 * 1024;

template <coio::Reactor R>
coio::Task<void> serveConnection(coio::TcpStream<R> stream, Settings settings) {
  std::vector<std::byte> buffer(settings.mode == Mode::rr ? std::max(settings.size, kReadBuffer) : settings.size);
  for (;;) {
    if (settings.mode == Mode::rr) {
      coio::Result<std::size_t> n = co_await stream.read(buffer);
      if (!n) co_return;
      coio::Result<void> written = co_await stream.writeAll(std::span(buffer).first(*n));
      if (!written) co_return;
    } else {
      coio::Result<void> written = co_await stream.writeAll(buffer);
      if (!written) co_return;
    }
  }
}

template <coio::Reactor R>
coio::Task<void> acceptAll(R& reactor, coio::TcpListener<R>& listener, Settings settings) {
  for (std::size_t i = 0; i < settings.connections; ++i) {
    coio::Result<coio::TcpStream<R>> stream = co_await listener.accept();
    if (!stream) co_return;
    (void)stream->setNoDelay(true);
    reactor.spawn(serveConnection(std::move(*stream), settings));
  }
}

struct Meter {
  std::uint64_t count = 0;  // round trips, or bytes received
  bool done = false;
};

template <coio::Reactor R>
coio::Task<void> clientConnection(R& reactor, coio::SocketAddress server, Settings settings, Meter& meter) {
  coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, server);
  if (!stream) {
    std::fprintf(stderr, "connect: %s\n", stream.error().message().c_str());
    co_return;
  }
  (void)stream->setNoDelay(true);
  std::vector<std::byte> request(settings.size, std::byte{1}), reply(std::max(settings.size, kReadBuffer));
  while (!meter.done) {
    if (settings.mode == Mode::rr) {
      coio::Result<void> written = co_await stream->writeAll(request);
      if (!written) co_return;
      for (std::size_t got = 0; got < settings.size;) {
        coio::Result<std::size_t> n = co_await stream->read(std::span(reply).subspan(got));
        if (!n) co_return;
        got += *n;
      }
      ++meter.count;
    } else {
      coio::Result<std::size_t> n = co_await stream->read(std::span(reply).first(settings.size));
      if (!n) co_return;
      meter.count += *n;
    }
  }
}

// Counts over `seconds` after a warm-up, then ends every connection.
template <coio::Reactor R>
coio::Task<double> measure(R& reactor, coio::SocketAddress server, Settings settings) {
  Meter meter;
  auto window = [](R& r, Meter& m, double seconds) -> coio::Task<double> {
    co_await r.sleepFor(300ms);
    const std::uint64_t startCount = m.count;
    const auto start = Clock::now();
    co_await r.sleepFor(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
    const std::chrono::duration<double> elapsed = Clock::now() - start;
    const double rate = static_cast<double>(m.count - startCount) / elapsed.count();
    m.done = true;
    co_return rate;
  };
  std::vector<coio::Task<void>> clients;
  for (std::size_t i = 0; i < settings.connections; ++i) clients.push_back(clientConnection(reactor, server, settings, meter));
  auto [rate, unit] = co_await coio::collectAll(window(reactor, meter, settings.seconds),
                                                coio::collectAllRange(std::move(clients)));
  (void)unit;
  co_return rate;
}

template <coio::Reactor R>
int run(const Settings& settings) {
  R serverReactor = makeReactor<R>(settings);
  coio::Result<coio::TcpListener<R>> listener = coio::TcpListener<R>::bind(serverReactor, coio::SocketAddress::loopbackV4());
  if (!listener) {
    std::fprintf(stderr, "bind: %s\n", listener.error().message().c_str());
    return 1;
  }
  const coio::SocketAddress address = *listener->localAddress();
  serverReactor.spawn(acceptAll(serverReactor, *listener, settings));
  std::thread serverThread([&] { serverReactor.run(); });

  double rate;
  coio::RecvMode recvMode = coio::RecvMode::plain;  // in effect (the kernel may lack multishot recvs)
  {
    R clientReactor = makeReactor<R>(settings);
    if constexpr (std::is_same_v<R, coio::UringReactor>) recvMode = clientReactor.recvMode();
    rate = clientReactor.runUntil(measure(clientReactor, address, settings));
  }  // client sockets close here: the server's connections end
  serverReactor.stop();
  serverThread.join();

  std::printf("net_bench reactor=%s mode=%s connections=%zu size=%zu submit=%s taskrun=%s recv=%s ",
              std::string(coio::toString(settings.kind)).c_str(), settings.mode == Mode::rr ? "rr" : "stream",
              settings.connections, settings.size, settings.submit == coio::SubmitPolicy::batched ? "batched" : "eager",
              std::string(coio::toString(settings.taskRun)).c_str(), std::string(coio::toString(recvMode)).c_str());
  if (settings.mode == Mode::rr) {
    std::printf("round_trips_per_s=%.0f\n", rate);
  } else {
    std::printf("gbit_per_s=%.3f\n", rate * 8 / 1e9);
  }
  return 0;
}

int usage() {
  std::fputs("usage: net_bench --reactor epoll|uring --mode rr|stream [--connections N] [--size BYTES] "
             "[--seconds S] [--submit batched|eager] [--taskrun immediate|cooperative|deferred] "
             "[--recv plain|multishot|adaptive]\n",
             stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  if (argc % 2 == 0) return usage();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view option = argv[i], value = argv[i + 1];
    bool ok = true;
    if (option == "--reactor") {
      auto kind = coio::parseReactorKind(value);
      ok = kind.hasValue();
      if (ok) settings.kind = *kind;
    } else if (option == "--mode" && (value == "rr" || value == "stream")) {
      settings.mode = value == "rr" ? Mode::rr : Mode::stream;
    } else if (option == "--submit" && (value == "batched" || value == "eager")) {
      settings.submit = value == "batched" ? coio::SubmitPolicy::batched : coio::SubmitPolicy::eager;
    } else if (option == "--taskrun") {
      auto mode = coio::parseTaskRun(value);
      ok = mode.hasValue();
      if (ok) settings.taskRun = *mode;
    } else if (option == "--recv") {
      auto mode = coio::parseRecvMode(value);
      ok = mode.hasValue();
      if (ok) settings.recvMode = *mode;
    } else if (option == "--connections") {
      ok = std::from_chars(value.data(), value.data() + value.size(), settings.connections).ec == std::errc{} &&
           settings.connections > 0;
    } else if (option == "--size") {
      ok = std::from_chars(value.data(), value.data() + value.size(), settings.size).ec == std::errc{} &&
           settings.size > 0;
    } else if (option == "--seconds") {
      ok = std::from_chars(value.data(), value.data() + value.size(), settings.seconds).ec == std::errc{} &&
           settings.seconds > 0;
    } else {
      ok = false;
    }
    if (!ok) return usage();
  }
  std::string why;
  if (coio::usableReactorKind(settings.kind, &why) != settings.kind) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 1;
  }
  return settings.kind == coio::ReactorKind::uring ? run<coio::UringReactor>(settings)
                                                   : run<coio::EpollReactor>(settings);
}
