#pragma once
// Two QueuePairs of one process connected to each other over a loopback TCP
// connection: the set-up shared by the verbs tests and rdma_bench.
#include <coio/core/collect_all.hpp>
#include <coio/core/task.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/rdma/rdma.hpp>

#include <memory>
#include <string>
#include <utility>

namespace coio::rdma::testing {

template <typename R>
struct ConnectedPair {
  std::unique_ptr<QueuePair<R>> a;
  std::unique_ptr<QueuePair<R>> b;
  Result<void> connected;  ///< both QueuePairs exist (and need close()) even when this failed
};

template <typename R>
Task<Result<TcpStream<R>>> acceptOne(TcpListener<R>& listener) {
  co_return co_await listener.accept();
}

/// Creates and connects a pair; `why` explains a creation failure.
template <typename R>
Task<Result<ConnectedPair<R>>> connectPair(R& reactor, const Device& device, const QueuePairConfig& configA,
                                           const QueuePairConfig& configB, std::string* why = nullptr) {
  Result<TcpListener<R>> listener = TcpListener<R>::bind(reactor, SocketAddress::loopbackV4());
  if (!listener) co_return listener.error();
  Result<SocketAddress> address = listener->localAddress();
  if (!address) co_return address.error();
  auto [accepted, connected] = co_await collectAll(acceptOne(*listener), TcpStream<R>::connect(reactor, *address));
  if (!accepted) co_return accepted.error();
  if (!connected) co_return connected.error();
  Result<std::unique_ptr<QueuePair<R>>> a = QueuePair<R>::create(reactor, device, configA, why);
  if (!a) co_return a.error();
  Result<std::unique_ptr<QueuePair<R>>> b = QueuePair<R>::create(reactor, device, configB, why);
  if (!b) {
    Result<void> closed = co_await (*a)->close();
    (void)closed;
    co_return b.error();
  }
  auto [ra, rb] = co_await collectAll((*a)->connect(*connected), (*b)->connect(*accepted));
  co_return ConnectedPair<R>{std::move(*a), std::move(*b), !ra ? ra : rb};
}

}  // namespace coio::rdma::testing
