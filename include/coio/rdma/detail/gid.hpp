#pragma once
// RoCE GID selection, kept free of verbs calls so it is testable anywhere.
#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <span>

namespace coio::rdma::detail {

inline bool isZeroGid(const ibv_gid& g) noexcept {
  for (std::uint8_t b : g.raw) {
    if (b != 0) return false;
  }
  return true;
}
inline bool isLinkLocalGid(const ibv_gid& g) noexcept { return g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80; }
inline bool isIpv4MappedGid(const ibv_gid& g) noexcept {
  for (int i = 0; i < 10; ++i) {
    if (g.raw[i] != 0) return false;
  }
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}

/// The GID index to use on `port` of a RoCE device: never a zero or a
/// link-local GID (fe80::/10 does not route, and index 0 is usually one);
/// prefer RoCE v2 with an IPv4-mapped address, then other RoCE v2 GIDs,
/// then RoCE v1. nullopt when the port has none (no IP on its netdev).
inline std::optional<std::uint32_t> selectRoceGid(std::span<const ibv_gid_entry> table, std::uint32_t port) noexcept {
  std::optional<std::uint32_t> best;
  int bestRank = 0;
  for (const ibv_gid_entry& e : table) {
    if (e.port_num != port || isZeroGid(e.gid) || isLinkLocalGid(e.gid)) continue;
    int rank = 0;
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2) rank = isIpv4MappedGid(e.gid) ? 3 : 2;
    else if (e.gid_type == IBV_GID_TYPE_ROCE_V1) rank = 1;
    if (rank > bestRank || (rank == bestRank && best && e.gid_index < *best)) {
      best = e.gid_index;
      bestRank = rank;
    }
  }
  return best;
}

}  // namespace coio::rdma::detail
