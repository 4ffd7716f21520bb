// How fast the simulation runs the example storage cluster (issue 35's
// speed goals): one seed of a long fault schedule at about 1,000 requests
// per simulated second, and seeds per minute of CI's scenario.
//   sim_cluster_bench [--seconds S] [--gap-ms G | --gap-us G] [--seed N] [--seeds N]
// (--gap-us: batches drawn 0 to G us apart in steps of 100 us, to set the
// schedule's rate finer than --gap-ms's whole milliseconds; 0: --gap-ms's.)
// Prints one line per measurement: virtual seconds, requests, wall
// seconds, requests per wall second, seeds per minute.
#include "sim_cluster.hpp"

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string_view>

namespace {

std::uint64_t argument(int argc, char** argv, std::string_view name, std::uint64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] != name) continue;
    std::uint64_t value = 0;
    const std::string_view text = argv[i + 1];
    if (std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc{}) {
      std::fprintf(stderr, "sim_cluster_bench: %s takes a number, not '%s'\n", argv[i], argv[i + 1]);
      std::exit(2);
    }
    return value;
  }
  return fallback;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  using namespace storage::simcluster;
  const std::uint64_t simulated = argument(argc, argv, "--seconds", 60);
  const std::uint64_t seed = argument(argc, argv, "--seed", 1);
  const std::uint64_t seeds = argument(argc, argv, "--seeds", 200);
  ClusterData data;
  const ClusterFaults faults{.partitions = true, .corruptOne = true};

  // A long schedule: batches of 16 IOs 0-2 ms apart (--gap-ms), about 2.4
  // requests each (one per server the batch touches, and the failovers):
  // about 1,000 requests per simulated second for `simulated` seconds.
  const int batches = static_cast<int>(simulated * 1000 * 10 / 24);
  auto start = std::chrono::steady_clock::now();
  // --gap-us: 100 us steps; else --gap-ms's whole milliseconds (the draws of the figures before it).
  const std::uint64_t gapUs = argument(argc, argv, "--gap-us", 0);
  const RunReport one =
      gapUs != 0 ? clusterRun(seed, data, faults, batches, std::chrono::microseconds(gapUs), std::chrono::microseconds(100))
                 : clusterRun(seed, data, faults, batches, std::chrono::milliseconds(argument(argc, argv, "--gap-ms", 2)));
  double wall = seconds(std::chrono::steady_clock::now() - start);
  std::printf("long schedule: seed %llu, %.1f s simulated, %llu requests (%.0f per simulated second), %llu IOs, "
              "%llu failed, %llu wrong bytes; %.2f s of wall time, %.0f requests per wall second\n",
              static_cast<unsigned long long>(seed), seconds(one.took), static_cast<unsigned long long>(one.requests),
              static_cast<double>(one.requests) / seconds(one.took), static_cast<unsigned long long>(one.ok),
              static_cast<unsigned long long>(failures(one)), static_cast<unsigned long long>(one.wrongBytes), wall,
              static_cast<double>(one.requests) / wall);

  // CI's scenario ([cluster-network]): seeds per minute.
  std::uint64_t requests = 0;
  start = std::chrono::steady_clock::now();
  for (std::uint64_t s = 1; s <= seeds; ++s) requests += clusterRun(s, data, faults).requests;
  wall = seconds(std::chrono::steady_clock::now() - start);
  std::printf("seeds: %llu of the CI scenario in %.2f s of wall time: %.0f seeds per minute, %.0f requests per wall "
              "second\n",
              static_cast<unsigned long long>(seeds), wall, static_cast<double>(seeds) * 60 / wall,
              static_cast<double>(requests) / wall);
}
