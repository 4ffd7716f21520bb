#pragma once
// KernelSockets: the socket calls of the real reactors, the kernel's own.
// ReactorLoop makes, configures and closes sockets through its backend's
// calls when the backend has them (coio::sim's: simulated sockets), else
// through these: each is the system call, inline, as the net layer made it
// before the calls went through the reactor.
#include <coio/core/result.hpp>
#include <coio/reactor/detail/reset_connection.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace coio::detail {

struct KernelSockets {
  static Result<void> check(int r) noexcept {
    if (r != 0) return systemError(errno);
    return {};
  }

  static Result<int> openSocket(int family) noexcept {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (fd < 0) return systemError(errno);
    return fd;
  }
  static Result<void> bindSocket(int fd, const sockaddr* address, socklen_t length) noexcept {
    return check(::bind(fd, address, length));
  }
  static Result<void> listenSocket(int fd, int backlog) noexcept { return check(::listen(fd, backlog)); }
  static Result<void> setSocketOption(int fd, int level, int name, const void* value, socklen_t length) noexcept {
    return check(::setsockopt(fd, level, name, value, length));
  }
  static Result<socklen_t> socketName(int fd, bool peer, sockaddr_storage& out) noexcept {
    socklen_t length = sizeof out;
    auto* address = reinterpret_cast<sockaddr*>(&out);
    if ((peer ? ::getpeername(fd, address, &length) : ::getsockname(fd, address, &length)) != 0) {
      return systemError(errno);
    }
    return length;
  }
  static Result<void> shutdownSocket(int fd, int how) noexcept { return check(::shutdown(fd, how)); }
  static Result<void> resetSocket(int fd) noexcept {
    if (const long r = resetConnection(fd); r < 0) return systemError(static_cast<int>(-r));
    return {};
  }
  // close() is not retried on EINTR: on Linux the descriptor is gone anyway.
  static void closeSocket(int fd) noexcept { ::close(fd); }
};

}  // namespace coio::detail
