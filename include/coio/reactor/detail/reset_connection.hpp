#pragma once
// resetConnection: RFC 793's ABORT on a TCP socket, shared by KernelSockets (TcpStream::abort)
// and UringReactor's shutdown of zero-copy sends.
#include <coio/reactor/detail/syscall.hpp>

#include <sys/socket.h>

namespace coio::detail {

/// Aborts the TCP connection on `fd` (connect(2) to AF_UNSPEC: the kernel's
/// tcp_disconnect): the data still queued to send is dropped, the peer gets
/// a reset, and the fd stays open, unconnected. 0 or -errno.
inline long resetConnection(int fd) noexcept {
  sockaddr unspecified{};
  unspecified.sa_family = AF_UNSPEC;
  return retryOnEintr([&] { return ::connect(fd, &unspecified, sizeof unspecified); });
}

}  // namespace coio::detail
