// coio-storage-server mgmtd --etcd URL --id ID [--ttl S]: a cluster manager
// until SIGINT/SIGTERM.
#include "cluster/cluster_manager.hpp"
#include "programs/cli.hpp"
#include "programs/server/commands.hpp"
#include "programs/server/etcd_session.hpp"
#include "programs/server/on_loop.hpp"

#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/reactor_pool.hpp>

#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace storage::cli {
namespace {

struct MgmtdSettings {
  std::vector<std::string> endpoints;
  std::string id;
  std::int64_t ttl = 3;
};

int mgmtd(const MgmtdSettings& settings) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  coio::ReactorPool<coio::EpollReactor> pool(1);
  std::unique_ptr<etcd::EtcdClient<coio::EpollReactor>> client = connectEtcd(pool.reactor(0), settings.endpoints);
  if (!client) return 1;
  const std::string& id = settings.id;
  ClusterManager<coio::EpollReactor> manager(*client, id, settings.ttl, [](const std::string& line) {
    std::printf("mgmtd %s\n", line.c_str());
    std::fflush(stdout);
  });
  {
    Background<coio::EpollReactor> background(pool.reactor(0));
    background.start(manager.run(background.token()));
    std::printf("mgmtd %s: managing the cluster in etcd (lease of %llds)\n", id.c_str(),
                static_cast<long long>(settings.ttl));
    std::fflush(stdout);
    int signal = 0;
    sigwait(&signals, &signal);
  }  // the manager stops: it revokes its lease, so that another leads at once
  disconnectEtcd(pool.reactor(0), client);
  pool.stop();
  std::printf("mgmtd %s: stopped\n", id.c_str());
  return 0;
}

}  // namespace

Command addMgmtd(CLI::App& program) {
  auto settings = std::make_shared<MgmtdSettings>();
  CLI::App* sub = program.add_subcommand("mgmtd", "A cluster manager, until SIGTERM.");
  sub->footer(
      "One of those running leads (a key bound to its lease); the leader marks the targets of a\n"
      "server whose registration is gone offline (to the end of their chains) and those of a server\n"
      "back serving, one transaction per change (CHAINS.md).");
  addEtcdOption(*sub, settings->endpoints, "etcd's endpoints, http://IP:PORT[,...]")->required();
  sub->add_option("--id", settings->id, "this manager's id")->required()->check(nonEmpty());
  sub->add_option("--ttl", settings->ttl, "its lease, in seconds")->transform(countIn(1, 3600))->capture_default_str();
  return {sub, [settings] { return mgmtd(*settings); }};
}

}  // namespace storage::cli
