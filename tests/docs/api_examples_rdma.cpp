// The API reference's QueuePair example (coio::rdma): see api_examples.cpp.
// Compiled everywhere; it runs only with an RDMA device, in the hidden
// [device] case below, which CTest runs as coio_api_examples_device
// (label `rdma`) in the Soft-RoCE guest (.ci/rdma.sh); there a missing
// device is a failure.
#include <coio/rdma.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace queue_pair_example {

//! [QueuePair]
using Reactor = coio::EpollReactor;  // or coio::UringReactor: the same code

// One end of a connection whose peer said (over `control`, say) where to
// write: RDMA-WRITEs `data` into the peer's memory, then tells it with a SEND.
coio::Task<coio::Result<void>> writeThenTell(Reactor& reactor, const coio::rdma::Device& device,
                                             coio::TcpStream<Reactor>& control, coio::rdma::RemoteBuffer target,
                                             std::span<std::byte> data) {
  coio::Result<coio::rdma::MemoryRegion> region =
      coio::rdma::MemoryRegion::create(device, data, coio::rdma::kAccessAll);
  if (!region) co_return region.error();
  coio::Result<std::unique_ptr<coio::rdma::QueuePair<Reactor>>> qp =
      coio::rdma::QueuePair<Reactor>::create(reactor, device);
  if (!qp) co_return qp.error();
  coio::Result<void> result = co_await (*qp)->connect(control);  // the peer connects its own over `control`
  if (result) {
    const coio::rdma::LocalBuffer local = region->local(0, data.size());
    result = co_await (*qp)->rdmaWrite(target, std::span(&local, 1));  // resumes on the loop thread once done
  }
  if (result) result = co_await (*qp)->send(std::as_bytes(std::span("done", 4)));  // arrives after the data
  coio::Result<void> closed = co_await (*qp)->close();  // always, also after an error: tells the peer
  co_return !result ? result : closed;
}
//! [QueuePair]

// The peer, whose memory the writer writes into: waits for the SEND.
coio::Task<coio::Result<std::string>> receive(Reactor& reactor, const coio::rdma::Device& device,
                                              coio::TcpListener<Reactor>& listener) {
  coio::Result<coio::TcpStream<Reactor>> control = co_await listener.accept();
  if (!control) co_return control.error();
  auto qp = coio::rdma::QueuePair<Reactor>::create(reactor, device);
  if (!qp) co_return qp.error();
  coio::Result<void> connected = co_await (*qp)->connect(*control);
  char message[16] = {};
  coio::Result<std::size_t> got = connected ? co_await (*qp)->recv(std::as_writable_bytes(std::span(message)))
                                            : coio::Result<std::size_t>(connected.error());
  coio::Result<void> closed = co_await (*qp)->close();
  if (!got) co_return got.error();
  if (!closed) co_return closed.error();
  co_return std::string(message, *got);
}

coio::Task<coio::Result<std::string>> writeOverLoopback(Reactor& reactor, const coio::rdma::Device& device,
                                                        std::vector<std::byte>& source,
                                                        std::vector<std::byte>& sink) {
  coio::Result<coio::rdma::MemoryRegion> target = coio::rdma::MemoryRegion::create(device, sink, coio::rdma::kAccessAll);
  if (!target) co_return target.error();
  auto listener = coio::TcpListener<Reactor>::bind(reactor, coio::SocketAddress::loopbackV4());
  if (!listener) co_return listener.error();
  auto control = co_await coio::TcpStream<Reactor>::connect(reactor, *listener->localAddress());
  if (!control) co_return control.error();
  auto [written, told] = co_await coio::collectAll(writeThenTell(reactor, device, *control, target->remote(), source),
                                                   receive(reactor, device, *listener));
  if (!written) co_return written.error();
  co_return told;
}

}  // namespace queue_pair_example

TEST_CASE("api example: QueuePair, with a device", "[.][device]") {
  std::string why;
  coio::Result<std::unique_ptr<coio::rdma::Device>> device = coio::rdma::Device::open({}, &why);
  INFO(why);
  REQUIRE(device);
  std::vector<std::byte> source(4096, std::byte{'x'}), sink(4096);
  queue_pair_example::Reactor reactor;
  coio::Result<std::string> told =
      reactor.runUntil(queue_pair_example::writeOverLoopback(reactor, **device, source, sink));
  REQUIRE(told);
  CHECK(*told == "done");
  CHECK(sink == source);
}
