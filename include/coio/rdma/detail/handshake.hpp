#pragma once
// The connection parameters two QueuePairs exchange over TCP before moving
// to RTR/RTS: a fixed 48-byte big-endian record.
#include <coio/core/result.hpp>
#include <coio/rdma/error.hpp>

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace coio::rdma::detail {

struct ConnectInfo {
  static constexpr std::uint32_t kMagic = 0x434f5231;  // "COR1": coio RDMA, version 1
  static constexpr std::size_t kWireSize = 48;

  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;  // 24 bits
  std::uint16_t lid = 0;
  std::uint8_t port = 0;
  std::uint8_t mtu = 0;          // ibv_mtu: active MTU of the sender's port
  std::uint8_t linkLayer = 0;    // IBV_LINK_LAYER_*
  std::uint8_t maxRdAtomic = 0;  // READs the sender accepts as responder
  std::array<std::uint8_t, 16> gid{};
  std::uint32_t messageSize = 0;
  std::uint32_t messageBuffers = 0;
  std::uint32_t ackBatch = 0;

  using Wire = std::array<std::byte, kWireSize>;

  Wire encode() const noexcept {
    Wire w{};
    std::size_t at = 0;
    const auto put = [&](std::uint64_t v, int bytes) {
      for (int i = bytes - 1; i >= 0; --i) w[at++] = static_cast<std::byte>(v >> (8 * i));
    };
    put(kMagic, 4);
    put(qpn, 4);
    put(psn, 4);
    put(lid, 2);
    put(port, 1);
    put(mtu, 1);
    put(linkLayer, 1);
    put(maxRdAtomic, 1);
    for (std::uint8_t b : gid) put(b, 1);
    put(messageSize, 4);
    put(messageBuffers, 4);
    put(ackBatch, 4);
    return w;  // 46 bytes used, 2 reserved (zero)
  }

  /// RdmaErrc::handshake if the record is not ours or is out of range.
  static Result<ConnectInfo> decode(const Wire& w) noexcept {
    std::size_t at = 0;
    const auto get = [&](int bytes) {
      std::uint64_t v = 0;
      for (int i = 0; i < bytes; ++i) v = (v << 8) | std::to_integer<std::uint64_t>(w[at++]);
      return v;
    };
    if (get(4) != kMagic) return RdmaErrc::handshake;
    ConnectInfo c;
    c.qpn = static_cast<std::uint32_t>(get(4));
    c.psn = static_cast<std::uint32_t>(get(4));
    c.lid = static_cast<std::uint16_t>(get(2));
    c.port = static_cast<std::uint8_t>(get(1));
    c.mtu = static_cast<std::uint8_t>(get(1));
    c.linkLayer = static_cast<std::uint8_t>(get(1));
    c.maxRdAtomic = static_cast<std::uint8_t>(get(1));
    for (std::uint8_t& b : c.gid) b = static_cast<std::uint8_t>(get(1));
    c.messageSize = static_cast<std::uint32_t>(get(4));
    c.messageBuffers = static_cast<std::uint32_t>(get(4));
    c.ackBatch = static_cast<std::uint32_t>(get(4));
    if (c.qpn >= (1u << 24) || c.psn >= (1u << 24) || c.mtu < IBV_MTU_256 || c.mtu > IBV_MTU_4096) {
      return RdmaErrc::handshake;
    }
    return c;
  }
};

/// The path MTU of a connection: the smaller active MTU of the two ports.
constexpr ibv_mtu pathMtu(ibv_mtu local, ibv_mtu remote) noexcept { return std::min(local, remote); }

}  // namespace coio::rdma::detail
