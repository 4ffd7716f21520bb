// coio-storage-server: creates a chunk dataset (init) and serves batched
// reads of it (serve) over TCP or RDMA, one StorageServer per reactor
// thread; runs a cluster manager (mgmtd), loads and shows a cluster's
// routing in etcd (cluster) or a chain table's (routing).
#include "programs/cli.hpp"
#include "programs/server/commands.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  CLI::App program("A 3FS-style chunk read server (docs/storage-example.md).", storage::cli::kServerProgram);
  storage::cli::lastOneCounts(program);
  program.require_subcommand(1);
  const std::vector<storage::cli::Command> commands{
      storage::cli::addInit(program), storage::cli::addServe(program), storage::cli::addMgmtd(program),
      storage::cli::addCluster(program), storage::cli::addRouting(program)};
  // CLI11 would only say that a subcommand is required: name the word it took for one.
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(commands.begin(), commands.end(), [&](const auto& c) { return c.app->get_name() == argv[1]; })) {
    return storage::cli::usageError(storage::cli::kServerProgram, std::string("unknown command ") + argv[1] +
                                                                      ": init, serve, mgmtd, cluster or routing");
  }
  if (const std::optional<int> exit = storage::cli::parse(program, argc, argv)) return *exit;
  for (const storage::cli::Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return storage::cli::usageError(storage::cli::kServerProgram, "missing command");
}
