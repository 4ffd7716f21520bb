#pragma once
// Which replica each IO of a ClusterClient batch reads (client/cluster_client.hpp).
#include "cluster/chain_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

namespace storage {

/// A routing as a ClusterClient routes with it: a ChainTable, and for each
/// of its servers the client's slot for that server (its connection, its
/// load, whether it is down), which outlives routing changes. A plain
/// value; the client shares each one immutable (shared_ptr to const), so
/// that a batch's requests keep theirs while a newer one is applied.
struct RoutedTable {
  ChainTable table;
  std::vector<std::size_t> slots;  ///< per server of `table`: its slot
};

/// One request of a round of a ClusterClient batchRead: IOs of the batch
/// (by index, ascending) for one server, each with the replica it reads.
struct SubBatch {
  std::size_t server = 0;                 ///< the server's slot (RoutedTable::slots)
  std::vector<std::size_t> ios;           ///< indices into the batch
  std::vector<std::uint32_t> positions;   ///< per IO: its replica's position in its chain
  std::vector<std::uint32_t> targets;     ///< per IO: that replica's target id
};

/// Which replica each IO reads: the routing of ClusterClient, a plain value
/// (used on one thread) that keeps per server slot its load and whether it
/// is down, and which (target, chunk) copies are corrupt.
///
/// Guarantees of route():
/// - An IO reads a serving replica of the chain of its chunk (ChainTable)
///   that it has not tried yet, whose server is not marked down and that
///   is not known to hold a corrupt copy of the chunk; an IO with no such
///   replica is returned as unroutable. With `alsoDown` given, a server
///   marked down whose flag there is set counts as not down (a caller's
///   last resort). An offline replica is never read.
/// - Among those, the replica whose server has the fewest IOs outstanding
///   (load(), plus the IOs this call routed to it before) wins: a batch
///   spreads over the servers, and away from busy ones. Ties go to the
///   serving replica met first, in chain order, from serving position
///   `chunkId mod serving replicas` on, so that equally loaded replicas
///   share a chain's chunks.
/// - Sub-batches come in slot order, each with its IOs in batch order
///   and at most `maxIos` of them (a server's larger share is split).
class ReplicaRouter {
 public:
  static_assert(ChainTable::kMaxReplicas <= 32, "a tried set is a 32-bit mask");

  /// What route() could not place: IOs with no replica left to try.
  struct Routes {
    std::vector<SubBatch> batches;
    std::vector<std::size_t> unroutable;
  };

  /// A router over slots 0 .. slots - 1, none down, none loaded.
  explicit ReplicaRouter(std::size_t slots = 0) : down_(slots, false), load_(slots, 0) {}

  /// One more slot (a server new in the routing); its index.
  std::size_t addSlot() {
    down_.push_back(false);
    load_.push_back(0);
    return load_.size() - 1;
  }
  std::size_t slots() const noexcept { return load_.size(); }

  void setDown(std::size_t slot, bool down) { down_.at(slot) = down; }
  bool isDown(std::size_t slot) const { return down_.at(slot); }
  /// IOs outstanding on `slot` (ClusterClient counts them up and down).
  std::size_t load(std::size_t slot) const { return load_.at(slot); }
  void addLoad(std::size_t slot, std::size_t ios) { load_.at(slot) += ios; }
  void removeLoad(std::size_t slot, std::size_t ios) { load_.at(slot) -= ios; }

  /// Remembers that `targetId` holds a corrupt copy of `chunkId`; true the
  /// first time (the caller reports it once).
  bool markCorrupt(std::uint32_t targetId, std::uint64_t chunkId) { return corrupt_.emplace(targetId, chunkId).second; }
  /// The positions (bit mask) in `table` of the replicas known to be corrupt for `chunkId`.
  std::uint32_t corruptMask(const ChainTable& table, std::uint64_t chunkId) const {
    std::uint32_t mask = 0;
    if (corrupt_.empty()) return mask;
    const Chain& chain = table.chains()[table.chainIndexOf(chunkId)];
    for (std::size_t p = 0; p < chain.replicas.size(); ++p) {
      if (corrupt_.count({chain.replicas[p].targetId, chunkId}) != 0) mask |= 1u << p;
    }
    return mask;
  }

  /// Routes the IOs `pending` (indices into `chunkIds`, ascending) over
  /// `routing`, the replicas in `tried[io]` (a bit per position in
  /// `routing.table`) excluded; `alsoDown`: empty, or a flag per slot.
  Routes route(const RoutedTable& routing, std::span<const std::uint64_t> chunkIds,
               std::span<const std::size_t> pending, std::span<const std::uint32_t> tried, std::size_t maxIos,
               const std::vector<bool>& alsoDown = {}) const {
    Routes routes;
    std::vector<std::size_t> extra(load_.size(), 0);
    std::vector<std::vector<std::size_t>> bySlot(load_.size());  // per slot: positions into `pending`
    std::vector<std::uint32_t> position(pending.size());
    for (std::size_t k = 0; k < pending.size(); ++k) {
      const std::size_t io = pending[k];
      const std::optional<std::uint32_t> p = pick(routing, chunkIds[io], tried[io], extra, alsoDown);
      if (!p) {
        routes.unroutable.push_back(io);
        continue;
      }
      const std::size_t slot = routing.slots[replicaOf(routing.table, chunkIds[io], *p).server];
      ++extra[slot];
      bySlot[slot].push_back(k);
      position[k] = *p;
    }
    const std::size_t most = std::max<std::size_t>(maxIos, 1);
    for (std::size_t slot = 0; slot < bySlot.size(); ++slot) {
      for (std::size_t first = 0; first < bySlot[slot].size(); first += most) {
        SubBatch batch{slot, {}, {}, {}};
        const std::size_t end = std::min(bySlot[slot].size(), first + most);
        for (std::size_t j = first; j < end; ++j) {
          const std::size_t k = bySlot[slot][j];
          batch.ios.push_back(pending[k]);
          batch.positions.push_back(position[k]);
          batch.targets.push_back(replicaOf(routing.table, chunkIds[pending[k]], position[k]).targetId);
        }
        routes.batches.push_back(std::move(batch));
      }
    }
    return routes;
  }

  /// The replica at `position` of `chunkId`'s chain in `table`.
  static const Replica& replicaOf(const ChainTable& table, std::uint64_t chunkId, std::uint32_t position) {
    return table.chains()[table.chainIndexOf(chunkId)].replicas[position];
  }

 private:
  std::optional<std::uint32_t> pick(const RoutedTable& routing, std::uint64_t chunkId, std::uint32_t tried,
                                    const std::vector<std::size_t>& extra, const std::vector<bool>& alsoDown) const {
    const Chain& chain = routing.table.chains()[routing.table.chainIndexOf(chunkId)];
    std::uint32_t serving[ChainTable::kMaxReplicas];
    std::size_t n = 0;
    for (std::size_t p = 0; p < chain.replicas.size(); ++p) {
      if (chain.replicas[p].state == ReplicaState::serving) serving[n++] = static_cast<std::uint32_t>(p);
    }
    const std::uint32_t excluded = tried | corruptMask(routing.table, chunkId);
    std::optional<std::uint32_t> best;
    std::size_t bestLoad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t p = serving[(chunkId + i) % n];
      const std::size_t slot = routing.slots[chain.replicas[p].server];
      if ((excluded >> p & 1u) != 0 || (down_[slot] && (alsoDown.empty() || !alsoDown[slot]))) continue;
      const std::size_t load = load_[slot] + extra[slot];
      if (!best || load < bestLoad) {
        best = p;
        bestLoad = load;
      }
    }
    return best;
  }

  std::vector<bool> down_;
  std::vector<std::size_t> load_;
  std::set<std::pair<std::uint32_t, std::uint64_t>> corrupt_;  // (target, chunk)
};

}  // namespace storage
