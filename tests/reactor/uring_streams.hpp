#pragma once
// TCP streams on a UringReactor for the uring tests: a connected pair, a
// byte pattern, a writer.
#include "test_reactors.hpp"

#if COIO_TEST_URING
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <span>
#include <utility>

namespace coio::testing {

/// A connected pair on one reactor: the accepted (server) end and the client end.
struct StreamPair {
  TcpStream<UringReactor> server;
  TcpStream<UringReactor> client;
};
inline Task<StreamPair> connectPair(UringReactor& r) {
  auto listener = TcpListener<UringReactor>::bind(r, SocketAddress::loopbackV4());
  REQUIRE(listener.hasValue());
  auto client = co_await TcpStream<UringReactor>::connect(r, *listener->localAddress());
  REQUIRE(client.hasValue());
  auto server = co_await listener->accept();
  REQUIRE(server.hasValue());
  co_return StreamPair{std::move(*server), std::move(*client)};
}

/// Byte i of a stream whose every offset is told apart from its neighbours'.
inline std::byte patternByte(std::size_t i) { return static_cast<std::byte>((i * 131 + i / 251) & 0xff); }

/// Writes all of `data` to `s`, checking it went out (a writer beside a reader).
inline Task<void> writeAllOf(TcpStream<UringReactor>& s, std::span<const std::byte> data) {
  Result<void> written = co_await s.writeAll(data);
  CHECK(written.hasValue());
}

}  // namespace coio::testing
#endif
