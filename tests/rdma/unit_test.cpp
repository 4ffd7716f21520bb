// RDMA layer tests that need no device: they run on any host.
#include <coio/rdma/config.hpp>
#include <coio/rdma/detail/gid.hpp>
#include <coio/rdma/detail/handshake.hpp>
#include <coio/rdma/detail/wr_id.hpp>
#include <coio/rdma/device.hpp>
#include <coio/rdma/queue_pair_state.hpp>
#include <coio/rdma/rdma_batch.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using namespace coio::rdma;
using detail::WrId;
using detail::WrType;

TEST_CASE("work-request ids carry the type and a context or small integer", "[rdma]") {
  int context = 0;
  const WrId last = WrId::rdma(&context, true);
  CHECK(last.type() == WrType::rdmaLast);
  CHECK(last.context() == &context);
  const WrId middle = WrId::fromRaw(WrId::rdma(&context, false).raw());
  CHECK(middle.type() == WrType::rdma);
  CHECK(middle.context() == &context);
  CHECK(middle.raw() != last.raw());

  const WrId send = WrId::fromRaw(WrId::send(8).raw());
  CHECK(send.type() == WrType::send);
  CHECK(send.signalCount() == 8);
  CHECK(WrId::send(0).signalCount() == 0);
  const WrId recv = WrId::fromRaw(WrId::recv(0xFFFFFFu).raw());
  CHECK(recv.type() == WrType::recv);
  CHECK(recv.bufferIndex() == 0xFFFFFFu);
  CHECK(WrId::ack().type() == WrType::ack);
  CHECK(WrId::close().type() == WrType::close);
  // Same integer, different types: different ids.
  CHECK(WrId::send(3).raw() != WrId::recv(3).raw());
}

TEST_CASE("immediates encode the control kind and a 24-bit count", "[rdma]") {
  const auto ack = detail::Immediate::fromHost(detail::Immediate::ack(1234).host());
  CHECK(ack.kind() == detail::Immediate::Kind::ack);
  CHECK(ack.count() == 1234);
  CHECK(detail::Immediate::ack(detail::Immediate::kMaxCount).count() == detail::Immediate::kMaxCount);
  CHECK(detail::Immediate::close().kind() == detail::Immediate::Kind::close);
}

TEST_CASE("queue-pair state machine", "[rdma]") {
  using S = QueuePairState;
  CHECK(canTransition(S::init, S::connecting));
  CHECK(canTransition(S::connecting, S::ready));
  CHECK(canTransition(S::ready, S::close));
  CHECK(canTransition(S::ready, S::error));
  CHECK(canTransition(S::connecting, S::error));
  CHECK(canTransition(S::error, S::close));
  CHECK(canTransition(S::init, S::close));
  CHECK_FALSE(canTransition(S::init, S::ready));  // never skips the handshake
  CHECK_FALSE(canTransition(S::ready, S::connecting));
  CHECK_FALSE(canTransition(S::close, S::error));  // flushes after close are not errors
  CHECK_FALSE(canTransition(S::close, S::close));
  CHECK_FALSE(canTransition(S::error, S::ready));
  CHECK_FALSE(canTransition(S::error, S::error));  // the first error stays
  CHECK(toString(S::ready) == "ready");
}

TEST_CASE("queue sizes make overflow impossible by construction", "[rdma]") {
  QueuePairConfig c;  // 128 RDMA WRs, 32 message buffers, ACK every 8
  const QueuePairSizes s = QueuePairSizes::of(c);
  CHECK(s.ackSlots == 32 / 8 + 1);
  CHECK(s.recvBuffers == 32 + 5 + 1);
  CHECK(s.maxSendWr == 128 + 32 + 5 + 1);
  CHECK(s.maxRecvWr == s.recvBuffers);
  CHECK(s.cqe == s.maxSendWr + s.maxRecvWr);

  c.maxRdmaWr = UINT32_MAX;  // no 32-bit wrap-around
  CHECK(QueuePairSizes::of(c).maxSendWr == std::uint64_t{UINT32_MAX} + 32 + 5 + 1);
}

TEST_CASE("configs are checked for consistency and against device limits", "[rdma]") {
  const DeviceLimits big{1u << 20, 32, 1u << 16, 128, 128, 1u << 30};
  QueuePairConfig c;
  std::string why;
  CHECK(checkConfig(c, big, &why));

  SECTION("device smaller than asked") {
    DeviceLimits small = big;
    small.maxQpWr = 100;
    const coio::Result<void> r = checkConfig(c, small, &why);
    CHECK(r.error() == RdmaErrc::deviceTooSmall);
    CHECK(why.find("max_qp_wr 100") != std::string::npos);
    small = big;
    small.maxSge = 6;  // the Intel E810 of 3FS issue #192
    CHECK(checkConfig(c, small, &why).error() == RdmaErrc::deviceTooSmall);
    CHECK(why.find("max_sge 6") != std::string::npos);
    small = big;
    small.maxCqe = 64;
    CHECK(checkConfig(c, small, &why).error() == RdmaErrc::deviceTooSmall);
    c.maxRdmaWr = UINT32_MAX;
    CHECK(checkConfig(c, big).error() == RdmaErrc::deviceTooSmall);
  }
  SECTION("batches larger than the credits would deadlock") {
    c.ackBatch = c.messageBuffers + 1;
    CHECK(checkConfig(c, big, &why).error() == coio::Errc::invalidArgument);
    c.ackBatch = 8;
    c.signalBatch = c.messageBuffers + 1;
    CHECK(checkConfig(c, big).error() == coio::Errc::invalidArgument);
  }
  SECTION("per-post chains cannot exceed the semaphore") {
    c.maxRdmaWrPerPost = c.maxRdmaWr + 1;
    CHECK(checkConfig(c, big).error() == coio::Errc::invalidArgument);
  }
  SECTION("zero counts are rejected") {
    c.messageBuffers = 0;
    CHECK(checkConfig(c, big).error() == coio::Errc::invalidArgument);
  }
}

TEST_CASE("work to a dead peer fails in a bounded time: (retryCount + 1) ACK timeouts, none at 7", "[rdma]") {
  using std::chrono::microseconds;
  const QueuePairConfig defaults;
  const std::optional<microseconds> bound = transportFailureBound(defaults);
  // rxe retries forever at retryCount 7: the defaults must not use it.
  REQUIRE(bound);
  CHECK(*bound == microseconds(469762));  // 7 tries of 4.096 us * 2^14
  CHECK(*bound < defaults.drainTimeout);  // so close() after the peer died returns before drainTimeout
  QueuePairConfig c;
  c.timeout = 10;
  c.retryCount = 3;
  CHECK(transportFailureBound(c) == microseconds(16777));
  c.retryCount = 0;
  CHECK(transportFailureBound(c) == microseconds(4194));
  c.timeout = 31;  // the largest: 2^43 ns per try, no overflow
  c.retryCount = 6;
  CHECK(transportFailureBound(c) == microseconds(61572651155));
  c.retryCount = 7;
  CHECK_FALSE(transportFailureBound(c));
  c.retryCount = 3;
  c.timeout = 0;  // no ACK timer at all
  CHECK_FALSE(transportFailureBound(c));
}

TEST_CASE("connection parameters round-trip and foreign records are rejected", "[rdma]") {
  detail::ConnectInfo info;
  info.qpn = 0x123456;
  info.psn = 0xabcdef;
  info.lid = 7;
  info.port = 1;
  info.mtu = IBV_MTU_1024;
  info.linkLayer = IBV_LINK_LAYER_ETHERNET;
  info.maxRdAtomic = 16;
  for (std::size_t i = 0; i < info.gid.size(); ++i) info.gid[i] = static_cast<std::uint8_t>(i * 17);
  info.messageSize = 16384;
  info.messageBuffers = 32;
  info.ackBatch = 8;
  detail::ConnectInfo::Wire wire = info.encode();
  const coio::Result<detail::ConnectInfo> back = detail::ConnectInfo::decode(wire);
  REQUIRE(back);
  CHECK(back->qpn == info.qpn);
  CHECK(back->psn == info.psn);
  CHECK(back->lid == 7);
  CHECK(back->mtu == IBV_MTU_1024);
  CHECK(back->gid == info.gid);
  CHECK(back->messageBuffers == 32);

  detail::ConnectInfo::Wire foreign = wire;
  foreign[0] = std::byte{'H'};  // e.g. an HTTP client
  CHECK(detail::ConnectInfo::decode(foreign).error() == RdmaErrc::handshake);
  detail::ConnectInfo::Wire badMtu = wire;
  badMtu[15] = std::byte{9};
  CHECK(detail::ConnectInfo::decode(badMtu).error() == RdmaErrc::handshake);

  CHECK(detail::pathMtu(IBV_MTU_4096, IBV_MTU_1024) == IBV_MTU_1024);
  CHECK(detail::pathMtu(IBV_MTU_512, IBV_MTU_2048) == IBV_MTU_512);
}

namespace {
ibv_gid_entry gidEntry(std::uint32_t index, std::uint32_t type, std::initializer_list<std::uint8_t> head,
                       std::initializer_list<std::uint8_t> tail, std::uint32_t port = 1) {
  ibv_gid_entry e{};
  e.gid_index = index;
  e.port_num = port;
  e.gid_type = type;
  std::size_t i = 0;
  for (std::uint8_t b : head) e.gid.raw[i++] = b;
  i = 16 - tail.size();
  for (std::uint8_t b : tail) e.gid.raw[i++] = b;
  return e;
}
}  // namespace

TEST_CASE("RoCE GID selection skips zero and link-local GIDs and prefers v2 IPv4", "[rdma]") {
  const ibv_gid_entry linkLocal = gidEntry(0, IBV_GID_TYPE_ROCE_V2, {0xfe, 0x80}, {0x12, 0x34});
  const ibv_gid_entry v1Ipv4 = gidEntry(1, IBV_GID_TYPE_ROCE_V1, {}, {0xff, 0xff, 10, 77, 0, 1});
  const ibv_gid_entry v2Ipv6 = gidEntry(2, IBV_GID_TYPE_ROCE_V2, {0x20, 0x01, 0x0d, 0xb8}, {0x01});
  const ibv_gid_entry v2Ipv4 = gidEntry(3, IBV_GID_TYPE_ROCE_V2, {}, {0xff, 0xff, 10, 77, 0, 1});
  const ibv_gid_entry zero = gidEntry(4, IBV_GID_TYPE_ROCE_V2, {}, {});
  const ibv_gid_entry otherPort = gidEntry(5, IBV_GID_TYPE_ROCE_V2, {}, {0xff, 0xff, 10, 0, 0, 1}, 2);

  CHECK(detail::selectRoceGid(std::vector{linkLocal, v1Ipv4, v2Ipv6, v2Ipv4, zero}, 1) == 3u);
  CHECK(detail::selectRoceGid(std::vector{linkLocal, v1Ipv4, v2Ipv6}, 1) == 2u);
  CHECK(detail::selectRoceGid(std::vector{linkLocal, v1Ipv4}, 1) == 1u);
  // What Soft-RoCE shows: index 0 link-local, index 1 the IPv4-mapped v2 GID.
  CHECK(detail::selectRoceGid(std::vector{linkLocal, gidEntry(1, IBV_GID_TYPE_ROCE_V2, {}, {0xff, 0xff, 10, 77, 0, 1})},
                              1) == 1u);
  CHECK_FALSE(detail::selectRoceGid(std::vector{linkLocal, zero, otherPort}, 1));
  CHECK(detail::selectRoceGid(std::vector{linkLocal, otherPort}, 2) == 5u);
}

TEST_CASE("work requests are cut by scatter/gather count and message size", "[rdma]") {
  std::vector<std::byte> memory(100);
  const RemoteBuffer remote{0x10000, 100, 42};
  std::vector<LocalBuffer> locals;
  for (int i = 0; i < 5; ++i) locals.push_back({memory.data() + i * 20, 20, 7});
  std::vector<detail::RdmaWr> wrs;
  std::vector<ibv_sge> sges;

  SECTION("by scatter/gather count") {
    REQUIRE(detail::appendWorkRequests(remote, locals, 2, 1000, wrs, sges).valueOr(0) == 100);
    REQUIRE(wrs.size() == 3);
    CHECK(wrs[0].remoteAddr == 0x10000);
    CHECK(wrs[1].remoteAddr == 0x10000 + 40);
    CHECK(wrs[2].remoteAddr == 0x10000 + 80);
    CHECK(wrs[2].sgeCount == 1);
    CHECK(wrs[1].firstSge == 2);
    CHECK(wrs[1].rkey == 42);
    CHECK(sges[4].addr == reinterpret_cast<std::uintptr_t>(memory.data() + 80));
    CHECK(sges[4].lkey == 7);
  }
  SECTION("by bytes, splitting a local buffer") {
    REQUIRE(detail::appendWorkRequests(remote, locals, 16, 30, wrs, sges));
    REQUIRE(wrs.size() == 4);  // 30 + 30 + 30 + 10
    CHECK(wrs[0].sgeCount == 2);  // 20 + 10
    CHECK(sges[1].length == 10);
    CHECK(wrs[1].remoteAddr == 0x10000 + 30);
    std::uint64_t total = 0;
    for (const ibv_sge& s : sges) total += s.length;
    CHECK(total == 100);
  }
  SECTION("invalid requests") {
    CHECK(detail::appendWorkRequests(remote.subrange(0, 99), locals, 16, 1000, wrs, sges).error() ==
          coio::Errc::invalidArgument);
    CHECK(detail::appendWorkRequests(remote, {}, 16, 1000, wrs, sges).error() == coio::Errc::invalidArgument);
    CHECK(wrs.empty());
  }
}

// The host kernel has no RDMA stack: this is the "no device" path for real.
TEST_CASE("without an RDMA device, opening fails with a clear message", "[rdma]") {
  if (!Device::list().empty()) {
    SUCCEED("an RDMA device is present here: the no-device path is not reachable");
    return;
  }
  std::string why;
  const auto device = Device::open({}, &why);
  REQUIRE_FALSE(device);
  CHECK(device.error() == RdmaErrc::noDevice);
  CHECK(device.error().message().find("no RDMA device found") != std::string::npos);
  CHECK(device.error().message().find("TCP") != std::string::npos);
  CHECK(why == device.error().message());
  CHECK(Device::open({"mlx5_0"}).error() == RdmaErrc::noDevice);
}
