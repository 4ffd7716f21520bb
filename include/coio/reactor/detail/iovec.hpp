#pragma once
// Gather writes over the caller's iovecs, shared by both reactors and TcpStream.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <span>

namespace coio::detail {

/// A msghdr that sends `parts` (no address, no control data). The kernel
/// only reads the iovecs, whatever msghdr's type says.
inline msghdr messageOf(std::span<const iovec> parts) noexcept {
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(parts.data());
  message.msg_iovlen = parts.size();
  return message;
}

inline std::size_t totalBytes(std::span<const iovec> parts) noexcept {
  std::size_t total = 0;
  for (const iovec& part : parts) total += part.iov_len;
  return total;
}

/// What is left of `parts` once `n` bytes of it went out: whole parts are
/// dropped, the first one left is trimmed (in place).
inline std::span<iovec> advance(std::span<iovec> parts, std::size_t n) noexcept {
  while (!parts.empty() && n >= parts.front().iov_len) {
    n -= parts.front().iov_len;
    parts = parts.subspan(1);
  }
  if (n > 0) {
    parts.front().iov_base = static_cast<std::byte*>(parts.front().iov_base) + n;
    parts.front().iov_len -= n;
  }
  return parts;
}

}  // namespace coio::detail
