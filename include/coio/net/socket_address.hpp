#pragma once
#include <coio/core/result.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace coio {

/// An IPv4 or IPv6 socket address (address and port), a plain value.
///
/// Text form: `1.2.3.4:80` and `[::1]:80`, as `parse` accepts and
/// `toString` produces. A default-constructed SocketAddress is empty
/// (family AF_UNSPEC).
class SocketAddress {
 public:
  SocketAddress() noexcept = default;

  /// Parses `host:port` (IPv4) or `[host]:port` (IPv6); numeric hosts only.
  /// Errc::invalidArgument on anything else.
  static Result<SocketAddress> parse(std::string_view text) {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return Errc::invalidArgument;
    std::string_view host = text.substr(0, colon);
    const std::string_view portText = text.substr(colon + 1);
    unsigned port = 0;
    const auto [end, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
    if (portText.empty() || ec != std::errc{} || end != portText.data() + portText.size() || port > 65535) {
      return Errc::invalidArgument;
    }
    const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
    if (bracketed) host = host.substr(1, host.size() - 2);
    const std::string hostText(host);  // inet_pton needs a terminated string
    const auto p = static_cast<std::uint16_t>(port);
    if (bracketed) {
      in6_addr v6{};
      if (::inet_pton(AF_INET6, hostText.c_str(), &v6) != 1) return Errc::invalidArgument;
      return ipv6(v6, p);
    }
    in_addr v4{};
    if (::inet_pton(AF_INET, hostText.c_str(), &v4) != 1) return Errc::invalidArgument;
    return ipv4(v4, p);
  }

  /// host:port from a binary IPv4 address (network byte order).
  static SocketAddress ipv4(in_addr host, std::uint16_t port) noexcept {
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_port = htons(port);
    v4.sin_addr = host;
    SocketAddress a;
    a.assign(&v4, sizeof v4);
    return a;
  }

  /// [host]:port from a binary IPv6 address.
  static SocketAddress ipv6(const in6_addr& host, std::uint16_t port) noexcept {
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(port);
    v6.sin6_addr = host;
    SocketAddress a;
    a.assign(&v6, sizeof v6);
    return a;
  }

  /// 127.0.0.1:port
  static SocketAddress loopbackV4(std::uint16_t port = 0) noexcept { return ipv4(in_addr{htonl(INADDR_LOOPBACK)}, port); }

  /// The IPv6 loopback address, ::1, with `port`.
  static SocketAddress loopbackV6(std::uint16_t port = 0) noexcept { return ipv6(in6addr_loopback, port); }

  /// From what getsockname/accept filled in; Errc::invalidArgument unless
  /// it is an IPv4 or IPv6 address.
  static Result<SocketAddress> fromSockaddr(const sockaddr* address, socklen_t length) noexcept {
    const bool ok = (address->sa_family == AF_INET && length >= sizeof(sockaddr_in)) ||
                    (address->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6));
    if (!ok) return Errc::invalidArgument;
    SocketAddress a;
    a.assign(address, address->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    return a;
  }

  /// AF_INET or AF_INET6.
  int family() const noexcept { return storage_.ss_family; }
  /// The port, in host byte order.
  std::uint16_t port() const noexcept {
    switch (family()) {
      case AF_INET: return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
      case AF_INET6: return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
      default: return 0;
    }
  }

  /// The address as a sockaddr, for system calls.
  const sockaddr* data() const noexcept { return reinterpret_cast<const sockaddr*>(&storage_); }
  /// Bytes of data() in use.
  socklen_t size() const noexcept { return length_; }

  /// `1.2.3.4:80`, `[::1]:80`, or an empty string for an empty address.
  std::string toString() const {
    char host[INET6_ADDRSTRLEN] = {};
    switch (family()) {
      case AF_INET:
        ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, host, sizeof host);
        return std::string(host) + ':' + std::to_string(port());
      case AF_INET6:
        ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, host, sizeof host);
        return '[' + std::string(host) + "]:" + std::to_string(port());
      default: return {};
    }
  }

  /// Equal when family, address and port are.
  friend bool operator==(const SocketAddress& a, const SocketAddress& b) noexcept {
    return a.length_ == b.length_ && std::memcmp(&a.storage_, &b.storage_, a.length_) == 0;
  }

 private:
  void assign(const void* address, socklen_t length) noexcept {
    std::memcpy(&storage_, address, length);
    length_ = length;
  }

  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

}  // namespace coio
