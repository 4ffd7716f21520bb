#include <coio/net/socket_address.hpp>

#include <catch2/catch.hpp>

using coio::SocketAddress;

TEST_CASE("SocketAddress parses and formats IPv4 and IPv6", "[net][address]") {
  auto v4 = SocketAddress::parse("10.1.2.3:8080");
  REQUIRE(v4.hasValue());
  CHECK(v4->family() == AF_INET);
  CHECK(v4->port() == 8080);
  CHECK(v4->toString() == "10.1.2.3:8080");
  CHECK(v4->size() == sizeof(sockaddr_in));

  auto v6 = SocketAddress::parse("[::1]:443");
  REQUIRE(v6.hasValue());
  CHECK(v6->family() == AF_INET6);
  CHECK(v6->port() == 443);
  CHECK(v6->toString() == "[::1]:443");
  CHECK(*v6 == SocketAddress::loopbackV6(443));

  CHECK(SocketAddress::loopbackV4(1).toString() == "127.0.0.1:1");
  CHECK(SocketAddress::parse("[fe80::1:2]:0")->toString() == "[fe80::1:2]:0");
  CHECK(SocketAddress{}.toString().empty());
}

TEST_CASE("SocketAddress rejects malformed text", "[net][address]") {
  for (const char* bad : {"", "1.2.3.4", "1.2.3.4:", "1.2.3.4:65536", "1.2.3.4:-1", "1.2.3.4:8x", "::1:80",
                          "[::1]", "[1.2.3.4]:80", "localhost:80", "1.2.3:80", "[::1:80"}) {
    INFO(bad);
    CHECK(SocketAddress::parse(bad).error() == coio::Errc::invalidArgument);
  }
}
