#pragma once
#include <coio/core/result.hpp>
#include <coio/net/detail/transform_awaiter.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/reactor.hpp>

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <stop_token>
#include <utility>

namespace coio {

namespace detail {
template <typename R>
struct AcceptedStream {
  R* reactor;
  Result<TcpStream<R>> operator()(Result<int> fd) const {
    if (!fd) return fd.error();
    return TcpStream<R>(*reactor, FileDescriptor(*fd));
  }
};
}  // namespace detail

/// A listening TCP socket (IPv4 or IPv6) driven by a reactor of type R.
///
/// Guarantees: `accept()` is awaited on the reactor's thread and resumes
/// there, with a connected non-blocking TcpStream or an error; one accept
/// may be pending at a time. The socket is closed on destruction. Its
/// socket is made and closed through the reactor (Reactor: on a simulated
/// one, a simulated listener).
template <Reactor R>
class TcpListener {
 public:
  using AcceptAwaiter =
      detail::TransformAwaiter<decltype(std::declval<R&>().accept(0, {})), detail::AcceptedStream<R>>;

  /// Takes over `other`'s socket.
  TcpListener(TcpListener&&) noexcept = default;
  TcpListener& operator=(TcpListener&&) = delete;
  ~TcpListener() {
    if (fd_.valid()) reactor_->closeSocket(fd_.release());
  }

  /// Binds and listens (SO_REUSEADDR; IPv6 sockets are IPv6-only). Port 0
  /// picks a free port: see localAddress().
  static Result<TcpListener> bind(R& reactor, const SocketAddress& address, int backlog = SOMAXCONN) {
    Result<int> fd = reactor.openSocket(address.family());
    if (!fd) return fd.error();
    TcpListener listener(reactor, FileDescriptor(*fd));  // closes it on the errors below
    const int one = 1;
    if (Result<void> r = reactor.setSocketOption(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); !r) return r.error();
    if (address.family() == AF_INET6) {
      if (Result<void> r = reactor.setSocketOption(*fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one); !r) {
        return r.error();
      }
    }
    if (Result<void> r = reactor.bindSocket(*fd, address.data(), address.size()); !r) return r.error();
    if (Result<void> r = reactor.listenSocket(*fd, backlog); !r) return r.error();
    return listener;
  }

  /// The next connection.
  AcceptAwaiter accept(std::stop_token stop = {}) noexcept {
    return AcceptAwaiter{reactor_->accept(fd_.get(), std::move(stop)), detail::AcceptedStream<R>{reactor_}};
  }

  /// The address the listener is bound to (the port chosen when bound to port 0).
  Result<SocketAddress> localAddress() const { return detail::socketName(*reactor_, fd_.get(), false); }
  /// The listening socket's file descriptor.
  int fd() const noexcept { return fd_.get(); }

 private:
  TcpListener(R& reactor, FileDescriptor fd) noexcept : reactor_(&reactor), fd_(std::move(fd)) {}

  R* reactor_;
  FileDescriptor fd_;
};

}  // namespace coio
