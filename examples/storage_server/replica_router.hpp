#pragma once
// Which replica each IO of a ClusterClient batch reads (cluster_client.hpp).
#include "chain_table.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

namespace storage {

/// One request of a round of a ClusterClient batchRead: IOs of the batch
/// (by index, ascending) for one server, each with the replica it reads.
struct SubBatch {
  std::size_t server = 0;                 ///< index into ChainTable::servers()
  std::vector<std::size_t> ios;           ///< indices into the batch
  std::vector<std::uint32_t> positions;   ///< per IO: its replica's position in its chain
  std::vector<std::uint32_t> targets;     ///< per IO: that replica's target id
};

/// Which replica each IO reads: the routing of ClusterClient, a plain value
/// (used on one thread).
///
/// Guarantees of route():
/// - An IO reads a replica of the chain of its chunk (ChainTable) that it
///   has not tried yet, whose server is not marked down and that is not
///   known to hold a corrupt copy of the chunk; an IO with no such replica
///   is returned as unroutable.
/// - Among those, the replica whose server has the fewest IOs outstanding
///   (load(), plus the IOs this call routed to it before) wins: a batch
///   spreads over the servers, and away from busy ones. Ties go to the
///   replica met first from position `chunkId mod replicas` on, so that
///   equally loaded replicas share a chain's chunks.
/// - Sub-batches come in server order, each with its IOs in batch order
///   and at most `maxIos` of them (a server's larger share is split).
class ReplicaRouter {
 public:
  static_assert(ChainTable::kMaxReplicas <= 32, "a tried set is a 32-bit mask");

  /// What route() could not place: IOs with no replica left to try.
  struct Routes {
    std::vector<SubBatch> batches;
    std::vector<std::size_t> unroutable;
  };

  /// Routes over `table`, which must outlive the router.
  explicit ReplicaRouter(const ChainTable& table)
      : table_(table), down_(table.servers().size(), false), load_(table.servers().size(), 0) {}

  void setDown(std::size_t server, bool down) { down_.at(server) = down; }
  bool isDown(std::size_t server) const { return down_.at(server); }
  /// IOs outstanding on `server` (ClusterClient counts them up and down).
  std::size_t load(std::size_t server) const { return load_.at(server); }
  void addLoad(std::size_t server, std::size_t ios) { load_.at(server) += ios; }
  void removeLoad(std::size_t server, std::size_t ios) { load_.at(server) -= ios; }

  /// Remembers that `targetId` holds a corrupt copy of `chunkId`; true the
  /// first time (the caller reports it once).
  bool markCorrupt(std::uint32_t targetId, std::uint64_t chunkId) { return corrupt_.emplace(targetId, chunkId).second; }
  /// The positions (bit mask) of the replicas known to be corrupt for `chunkId`.
  std::uint32_t corruptMask(std::uint64_t chunkId) const {
    std::uint32_t mask = 0;
    if (corrupt_.empty()) return mask;
    const Chain& chain = table_.chains()[table_.chainIndexOf(chunkId)];
    for (std::size_t p = 0; p < chain.replicas.size(); ++p) {
      if (corrupt_.count({chain.replicas[p].targetId, chunkId}) != 0) mask |= 1u << p;
    }
    return mask;
  }

  /// Routes the IOs `pending` (indices into `chunkIds`, ascending), the
  /// replicas in `tried[io]` (a bit per position) excluded.
  Routes route(std::span<const std::uint64_t> chunkIds, std::span<const std::size_t> pending,
               std::span<const std::uint32_t> tried, std::size_t maxIos) const {
    Routes routes;
    std::vector<std::size_t> extra(load_.size(), 0);
    std::vector<std::vector<std::size_t>> byServer(load_.size());  // per server: positions into `pending`
    std::vector<std::uint32_t> position(pending.size());
    for (std::size_t k = 0; k < pending.size(); ++k) {
      const std::size_t io = pending[k];
      const std::optional<std::uint32_t> p = pick(chunkIds[io], tried[io], extra);
      if (!p) {
        routes.unroutable.push_back(io);
        continue;
      }
      const std::size_t server = replicaOf(chunkIds[io], *p).server;
      ++extra[server];
      byServer[server].push_back(k);
      position[k] = *p;
    }
    for (std::size_t server = 0; server < byServer.size(); ++server) {
      for (std::size_t first = 0; first < byServer[server].size(); first += std::max<std::size_t>(maxIos, 1)) {
        SubBatch batch{server, {}, {}, {}};
        const std::size_t end = std::min(byServer[server].size(), first + std::max<std::size_t>(maxIos, 1));
        for (std::size_t j = first; j < end; ++j) {
          const std::size_t k = byServer[server][j];
          batch.ios.push_back(pending[k]);
          batch.positions.push_back(position[k]);
          batch.targets.push_back(replicaOf(chunkIds[pending[k]], position[k]).targetId);
        }
        routes.batches.push_back(std::move(batch));
      }
    }
    return routes;
  }

  /// The replica at `position` of `chunkId`'s chain.
  const Replica& replicaOf(std::uint64_t chunkId, std::uint32_t position) const {
    return table_.chains()[table_.chainIndexOf(chunkId)].replicas[position];
  }

 private:
  std::optional<std::uint32_t> pick(std::uint64_t chunkId, std::uint32_t tried,
                                    const std::vector<std::size_t>& extra) const {
    const Chain& chain = table_.chains()[table_.chainIndexOf(chunkId)];
    const std::size_t n = chain.replicas.size();
    const std::uint32_t excluded = tried | corruptMask(chunkId);
    std::optional<std::uint32_t> best;
    std::size_t bestLoad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto p = static_cast<std::uint32_t>((chunkId + i) % n);
      const std::size_t server = chain.replicas[p].server;
      if ((excluded >> p & 1u) != 0 || down_[server]) continue;
      const std::size_t load = load_[server] + extra[server];
      if (!best || load < bestLoad) {
        best = p;
        bestLoad = load;
      }
    }
    return best;
  }

  const ChainTable& table_;
  std::vector<bool> down_;
  std::vector<std::size_t> load_;
  std::set<std::pair<std::uint32_t, std::uint64_t>> corrupt_;  // (target, chunk)
};

}  // namespace storage
