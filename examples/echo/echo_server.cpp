// An echo server on either reactor.
//   echo_server [--reactor epoll|uring] [--address 127.0.0.1:7000]
// Prints "listening on <address>" once ready; SIGINT/SIGTERM stop it.
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <signal.h>
#include <sys/signalfd.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

template <coio::Reactor R>
coio::Task<void> echo(coio::TcpStream<R> stream) {
  std::vector<std::byte> buffer(64 * 1024);
  for (;;) {
    coio::Result<std::size_t> n = co_await stream.read(buffer);
    if (!n) co_return;  // end of stream or reset: this connection is done
    coio::Result<void> written = co_await stream.writeAll(std::span(buffer).first(*n));
    if (!written) co_return;
  }
}

template <coio::Reactor R>
coio::Task<void> serve(R& reactor, coio::TcpListener<R>& listener) {
  for (;;) {
    coio::Result<coio::TcpStream<R>> stream = co_await listener.accept();
    if (!stream) {
      std::fprintf(stderr, "accept: %s\n", stream.error().message().c_str());
      continue;
    }
    (void)stream->setNoDelay(true);
    reactor.spawn(echo(std::move(*stream)));
  }
}

// The signals arrive through a signalfd watched like any other fd.
template <coio::Reactor R>
coio::Task<void> stopOnSignal(R& reactor, int signalFd) {
  (void)co_await reactor.readable(signalFd);
  std::puts("stopping");
  reactor.stop();
}

int usage() {
  std::fputs("usage: echo_server [--reactor epoll|uring] [--address host:port]\n", stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  coio::ReactorKind kind = coio::ReactorKind::uring;
  std::string address = "127.0.0.1:7000";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view option = argv[i];
    if (option == "--reactor") {
      auto parsed = coio::parseReactorKind(argv[i + 1]);
      if (!parsed) return usage();
      kind = *parsed;
    } else if (option == "--address") {
      address = argv[i + 1];
    } else {
      return usage();
    }
  }
  if (argc % 2 == 0) return usage();
  coio::Result<coio::SocketAddress> bindTo = coio::SocketAddress::parse(address);
  if (!bindTo) return usage();

  std::string why;
  if (const coio::ReactorKind usable = coio::usableReactorKind(kind, &why); usable != kind) {
    std::fprintf(stderr, "%s; using epoll\n", why.c_str());
    kind = usable;
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  coio::FileDescriptor signalFd(::signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC));

  return coio::withReactor(kind, [&](auto& reactor) {
    using R = std::remove_reference_t<decltype(reactor)>;
    coio::Result<coio::TcpListener<R>> listener = coio::TcpListener<R>::bind(reactor, *bindTo);
    if (!listener) {
      std::fprintf(stderr, "bind %s: %s\n", address.c_str(), listener.error().message().c_str());
      return 1;
    }
    std::printf("echo server (%s) listening on %s\n", std::string(coio::toString(kind)).c_str(),
                listener->localAddress()->toString().c_str());
    std::fflush(stdout);
    reactor.spawn(serve(reactor, *listener));
    reactor.spawn(stopOnSignal(reactor, signalFd.get()));
    reactor.run();
    reactor.forget(signalFd.get());
    return 0;
  });
}
