#pragma once
// coio-storage-bench's settings, as its command line gives them (main.cpp).
#include "cluster/chain_table.hpp"
#include "store/chunk_store.hpp"
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <coio/net/socket_address.hpp>
#include <coio/reactor/reactor_kind.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace storage::bench {

using Clock = std::chrono::steady_clock;

// Now, in Unix time: milliseconds (what the logs write).
inline double unixMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Settings {
  coio::SocketAddress server;
  storage::ChunkStoreLayout layout;
  std::uint32_t ioSize = 64 * 1024;
  std::uint32_t align = 1;  // --align: offsets are multiples of it
  std::uint32_t target = 0;
  std::size_t batch = 16, depth = 8, connections = 4, maxTransmissions = 64;
  std::size_t reactors = 1;  // --reactors: threads the connections are spread over
  double duration = 10;
  std::chrono::milliseconds timeout{30000};
  coio::ReactorKind kind = coio::ReactorKind::uring;
  bool verify = false, json = false;
  bool checksums = false;  // --checksums: CRC32C asked for and checked (--verify: and the content)
  std::string transport = "tcp";
  std::string latencyLog;
  std::string routingLog;                    // --routing-log: a cluster client's routings, as applied
  std::string clusterFile;                   // --cluster: read through ClusterClient
  std::vector<std::string> etcdEndpoints;    // --etcd: the routing from there, not from clusterFile
  std::optional<storage::ChainTable> table;  // ... loaded from the file (etcd's: in runCluster)
  std::chrono::milliseconds requestTimeout{2000}, hedge{0}, retryFor{0};
#if COIO_STORAGE_RDMA
  std::unique_ptr<coio::rdma::Device> device;  // opened for --transport rdma
#endif
};

}  // namespace storage::bench
