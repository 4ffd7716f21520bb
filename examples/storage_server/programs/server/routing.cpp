// coio-storage-server routing --chains FILE [--keys]: a chain table as
// people or a cluster manager read it.
#include "cluster/chain_table.hpp"
#include "cluster/cluster_status.hpp"
#include "cluster/routing_json.hpp"
#include "programs/server/commands.hpp"

#include <cstdio>
#include <memory>
#include <string>

namespace storage::cli {
namespace {

struct RoutingSettings {
  std::string chains;
  bool keys = false;
};

int routing(const RoutingSettings& settings) {
  std::string why;
  const coio::Result<ChainTable> table = ChainTable::load(settings.chains, &why);
  if (!table) {
    std::fprintf(stderr, "coio-storage-server: %s\n", why.c_str());
    return 1;
  }
  if (!settings.keys) {
    std::fputs(clusterStatus(*table).c_str(), stdout);
    return 0;
  }
  const RoutingRecords records = table->records();
  std::printf("%s %s\n", datasetKey().c_str(), toJson(records.dataset).c_str());
  for (const ServerRecord& server : records.servers) {
    std::printf("%s %s\n", serverKey(server.name).c_str(), toJson(server).c_str());
  }
  for (const ChainRecord& chain : records.chains) {
    std::printf("%s %s\n", chainKey(chain.id).c_str(), toJson(chain).c_str());
  }
  return 0;
}

}  // namespace

Command addRouting(CLI::App& program) {
  auto settings = std::make_shared<RoutingSettings>();
  CLI::App* sub = program.add_subcommand("routing", "Prints the routing of a chain table (CHAINS.md).");
  sub->footer(
      "Its servers, targets and chains with their states and versions; with --keys, one line per\n"
      "record instead, \"KEY JSON\", as a cluster manager stores them (CHAINS.md, \"Routing in a\n"
      "cluster manager\").");
  sub->add_option("--chains", settings->chains, "the chain table FILE")->required();
  sub->add_flag("--keys", settings->keys, "one line per record: KEY JSON");
  return {sub, [settings] { return routing(*settings); }};
}

}  // namespace storage::cli
