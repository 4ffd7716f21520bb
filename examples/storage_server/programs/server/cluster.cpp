// coio-storage-server cluster load FILE | cluster status, against --etcd:
// one call on an epoll reactor.
#include "cluster/chain_table.hpp"
#include "cluster/cluster_manager.hpp"
#include "cluster/cluster_status.hpp"
#include "programs/cli.hpp"
#include "programs/server/commands.hpp"
#include "programs/server/etcd_session.hpp"
#include "programs/server/on_loop.hpp"

#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace storage::cli {
namespace {

struct ClusterSettings {
  std::vector<std::string> endpoints;
  std::string file;  // load's FILE; empty: status
  bool force = false;
};

// On the reactor: loads `routing` into etcd, or prints etcd's (routing empty).
coio::Task<void> talkToEtcd(etcd::EtcdClient<coio::EpollReactor>& etcd, const std::optional<ChainTable>& routing,
                            bool overwrite, int& result) {
  if (routing) {
    coio::Result<std::int64_t> done = co_await loadRouting(etcd, *routing, overwrite);
    if (done) {
      std::printf("loaded %zu chains and %zu servers at revision %lld\n", routing->chains().size(),
                  routing->servers().size(), static_cast<long long>(*done));
    } else if (done.error() == std::errc::file_exists) {
      std::fprintf(stderr, "coio-storage-server: etcd holds chains already (cluster status shows them); "
                   "--force replaces them\n");
      result = 1;
    } else {
      std::fprintf(stderr, "coio-storage-server: cannot write to etcd: %s\n", etcd.lastError().c_str());
      result = 1;
    }
    co_return;
  }
  std::string why;
  coio::Result<StoredRouting> stored = co_await readRouting(etcd, &why);
  coio::Result<ChainTable> assembled =
      stored ? ChainTable::assemble(stored->records, &why) : coio::Result<ChainTable>(stored.error());
  if (!assembled) {
    std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
    result = 1;
    co_return;
  }
  std::fputs(clusterStatus(*assembled).c_str(), stdout);
  std::string live;
  for (const std::string& name : stored->live) live += " " + name;
  std::printf("\nregistered:%s\nleader lease: %s\n", live.empty() ? " none" : live.c_str(),
              stored->leaderLease == 0 ? "none (no mgmtd leads)" : std::to_string(stored->leaderLease).c_str());
}

int cluster(const ClusterSettings& settings) {
  std::optional<ChainTable> table;
  if (!settings.file.empty()) {
    std::string why;
    coio::Result<ChainTable> loaded = ChainTable::load(settings.file, &why);
    if (!loaded) {
      std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
      return 1;
    }
    table = std::move(*loaded);
  }
  coio::ReactorPool<coio::EpollReactor> pool(1);
  std::unique_ptr<etcd::EtcdClient<coio::EpollReactor>> client = connectEtcd(pool.reactor(0), settings.endpoints);
  if (!client) return 1;
  int status = 0;
  runOn(pool.reactor(0), talkToEtcd(*client, table, settings.force, status));
  disconnectEtcd(pool.reactor(0), client);
  pool.stop();
  return status;
}

}  // namespace

Command addCluster(CLI::App& program) {
  auto settings = std::make_shared<ClusterSettings>();
  CLI::App* sub = program.add_subcommand("cluster", "A cluster's routing in etcd: load FILE, or status.");
  sub->require_subcommand(1);
  CLI::App* load = sub->add_subcommand("load", "Puts the chain table FILE (CHAINS.md) into etcd as records.");
  load->footer("Refuses if chains are there already, unless --force (replaces them all).");
  load->add_option("FILE", settings->file, "the chain table")->required()->check(nonEmpty());
  addEtcdOption(*load, settings->endpoints, "etcd's endpoints, http://IP:PORT[,...]")->required();
  load->add_flag("--force", settings->force, "replace the chains there");
  CLI::App* status = sub->add_subcommand(
      "status", "Prints the routing in etcd: servers (registered or not), targets and chains with their states.");
  addEtcdOption(*status, settings->endpoints, "etcd's endpoints, http://IP:PORT[,...]")->required();
  return {sub, [settings] { return cluster(*settings); }};
}

}  // namespace storage::cli
