#pragma once
// `coio-storage cluster status`: a routing's servers, targets and chains,
// with states and versions, as a text table for people.
#include "cluster/chain_table.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace storage {

/// The table of `routing`: the dataset's shape, then one line per server
/// (name, address, targets), per target (chain, server, state) and per
/// chain (version, targets in order with their states; a chain with no
/// serving target is flagged: its chunks cannot be read). Columns are
/// padded to their widest cell.
inline std::string clusterStatus(const ChainTable& routing) {
  using Row = std::vector<std::string>;
  const auto render = [](const std::vector<Row>& rows) {
    std::vector<std::size_t> width;
    for (const Row& row : rows) {
      width.resize(std::max(width.size(), row.size()), 0);
      for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    std::string out;
    for (const Row& row : rows) {
      std::string line;
      for (std::size_t c = 0; c < row.size(); ++c) {
        line += row[c];
        if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
      }
      out += line + '\n';
    }
    return out;
  };
  std::vector<Row> servers{{"SERVER", "ADDRESS", "TARGETS"}};
  std::vector<Row> targets{{"TARGET", "CHAIN", "SERVER", "STATE"}};
  std::vector<Row> chains{{"CHAIN", "VERSION", "TARGETS (in order)"}};
  std::vector<std::string> held(routing.servers().size());
  std::size_t unreadable = 0;
  for (const Chain& chain : routing.chains()) {
    std::string order;
    bool serving = false;
    for (const Replica& r : chain.replicas) {
      const std::string id = std::to_string(r.targetId);
      held[r.server] += (held[r.server].empty() ? "" : " ") + id;
      targets.push_back({id, std::to_string(chain.id), routing.serverName(r.server), toString(r.state)});
      order += (order.empty() ? "" : " ") + id + " (" + toString(r.state) + ")";
      serving = serving || r.state == ReplicaState::serving;
    }
    if (!serving) {
      order += "  NO SERVING TARGET: its chunks cannot be read";
      ++unreadable;
    }
    chains.push_back({std::to_string(chain.id), std::to_string(chain.version), order});
  }
  for (std::size_t s = 0; s < routing.servers().size(); ++s) {
    servers.push_back({routing.serverName(s), routing.servers()[s].toString(), held[s]});
  }
  std::string out = "dataset: " + std::to_string(routing.chunks()) + " chunks of " +
                    std::to_string(routing.chunkSize()) + " bytes on " + std::to_string(routing.chains().size()) +
                    " chains (" + std::to_string(unreadable) + " with no serving target)\n\n";
  return out + render(servers) + '\n' + render(targets) + '\n' + render(chains);
}

}  // namespace storage
