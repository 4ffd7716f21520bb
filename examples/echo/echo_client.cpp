// An echo client on either reactor: opens connections, sends messages,
// checks every echo, and reports the round-trip rate.
//   echo_client [--reactor epoll|uring] [--address 127.0.0.1:7000]
//               [--connections 4] [--messages 1000] [--size 64]
#include <coio/core/collect_all.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

struct Settings {
  coio::ReactorKind kind = coio::ReactorKind::uring;
  coio::SocketAddress server;
  std::size_t connections = 4;
  std::size_t messages = 1000;
  std::size_t size = 64;
};

// Round trips one connection completed with every echo intact, or an error.
template <coio::Reactor R>
coio::Task<coio::Result<std::size_t>> converse(R& reactor, const Settings& settings, std::size_t id) {
  coio::Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(reactor, settings.server);
  if (!stream) co_return stream.error();
  (void)stream->setNoDelay(true);
  std::vector<std::byte> message(settings.size), reply(settings.size);
  for (std::size_t i = 0; i < settings.messages; ++i) {
    for (std::size_t b = 0; b < message.size(); ++b) message[b] = static_cast<std::byte>(id + i + b);
    coio::Result<void> written = co_await stream->writeAll(message);
    if (!written) co_return written.error();
    coio::Result<void> read = co_await stream->readExact(reply);
    if (!read) co_return read.error();
    if (reply != message) co_return coio::Errc::invalidArgument;
  }
  co_return settings.messages;
}

template <coio::Reactor R>
coio::Task<int> run(R& reactor, const Settings& settings) {
  std::vector<coio::Task<coio::Result<std::size_t>>> connections;
  for (std::size_t c = 0; c < settings.connections; ++c) connections.push_back(converse(reactor, settings, c));
  const auto start = std::chrono::steady_clock::now();
  std::vector<coio::Result<std::size_t>> results = co_await coio::collectAllRange(std::move(connections));
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  std::size_t roundTrips = 0;
  for (const auto& r : results) {
    if (!r) {
      std::fprintf(stderr, "connection failed: %s\n", r.error().message().c_str());
      co_return 1;
    }
    roundTrips += *r;
  }
  std::printf("%zu round trips of %zu bytes over %zu connections (%s): %.0f round trips/s, all echoes intact\n",
              roundTrips, settings.size, settings.connections, std::string(coio::toString(settings.kind)).c_str(),
              static_cast<double>(roundTrips) / elapsed.count());
  co_return 0;
}

bool parseCount(std::string_view text, std::size_t& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && end == text.data() + text.size() && out > 0;
}

int usage() {
  std::fputs("usage: echo_client [--reactor epoll|uring] [--address host:port] [--connections N] "
             "[--messages N] [--size BYTES]\n",
             stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  std::string address = "127.0.0.1:7000";
  if (argc % 2 == 0) return usage();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view option = argv[i], value = argv[i + 1];
    bool ok = true;
    if (option == "--reactor") {
      auto parsed = coio::parseReactorKind(value);
      ok = parsed.hasValue();
      if (ok) settings.kind = *parsed;
    } else if (option == "--address") {
      address = value;
    } else if (option == "--connections") {
      ok = parseCount(value, settings.connections);
    } else if (option == "--messages") {
      ok = parseCount(value, settings.messages);
    } else if (option == "--size") {
      ok = parseCount(value, settings.size);
    } else {
      ok = false;
    }
    if (!ok) return usage();
  }
  coio::Result<coio::SocketAddress> server = coio::SocketAddress::parse(address);
  if (!server) return usage();
  settings.server = *server;

  std::string why;
  if (const coio::ReactorKind usable = coio::usableReactorKind(settings.kind, &why); usable != settings.kind) {
    std::fprintf(stderr, "%s; using epoll\n", why.c_str());
    settings.kind = usable;
  }
  return coio::withReactor(settings.kind, [&](auto& reactor) { return reactor.runUntil(run(reactor, settings)); });
}
