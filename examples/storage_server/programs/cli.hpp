#pragma once
// Command-line helpers shared by coio-storage-server and coio-storage-bench:
// parsing with CLI11 (one line on stderr and exit code 2 for a bad command
// line), the options' units, and the limits the programs derive.
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif
#include "cluster/numbers.hpp"

#include <CLI/CLI.hpp>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace storage::cli {

/// The exit code of a command line that does not parse or check.
inline constexpr int kUsageError = 2;

/// A command-line problem found after parsing (a combination CLI11 does not
/// check): one line on stderr, "PROGRAM: PROBLEM (see --help)"; returns
/// kUsageError.
inline int usageError(std::string_view program, std::string_view problem) {
  std::fprintf(stderr, "%.*s: %.*s (see --help)\n", static_cast<int>(program.size()), program.data(),
               static_cast<int>(problem.size()), problem.data());
  return kUsageError;
}

/// Parses `argv` into `app`. nullopt: go on; else the exit code: 0 after
/// --help (the help of the (sub)command it follows, on stdout), kUsageError
/// after a bad command line (one line on stderr, as usageError's).
/// Options given twice take the last value unless declared otherwise.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& done) {  // --help
    return app.exit(done);
  } catch (const CLI::ParseError& error) {
    return usageError(app.get_name(), error.what());
  }
}

/// The options of `app` and of the subcommands added to it afterwards:
/// given twice, the last one counts (as the programs always did).
inline void lastOneCounts(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

/// CLI11 transforms for the options' units; each checks the range too, so
/// that a bad value is one message naming the option ("--reactors: 0 is not
/// a count from 1 to 256"). The value then goes on in decimal.
/// A plain non-negative integer from `min` to `max`.
inline CLI::Validator countIn(std::uint64_t min, std::uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const std::optional<std::uint64_t> n = parseCount(text);
        if (!n || *n < min || *n > max) {
          return text + " is not a count from " + std::to_string(min) + " to " + std::to_string(max);
        }
        text = std::to_string(*n);
        return {};
      },
      "COUNT");
}

/// A byte size (4096, 64K, 4M, 1G: binary suffixes) from `min` to `max`,
/// a multiple of `multiple`.
inline CLI::Validator sizeIn(std::uint64_t min, std::uint64_t max, std::uint64_t multiple = 1) {
  return CLI::Validator(
      [min, max, multiple](std::string& text) -> std::string {
        const std::optional<std::uint64_t> n = parseSize(text);
        if (!n || *n < min || *n > max || *n % multiple != 0) {
          std::string why = text + " is not a size (4096, 64K, 4M, 1G) from " + std::to_string(min) + " to " +
                            std::to_string(max);
          return multiple == 1 ? why : why + ", a multiple of " + std::to_string(multiple);
        }
        text = std::to_string(*n);
        return {};
      },
      "SIZE");
}

/// A non-empty value.
inline CLI::Validator nonEmpty() {
  return CLI::Validator([](std::string& text) { return text.empty() ? std::string("is empty") : std::string(); }, "");
}

/// The longest deadline an option takes, in ms: no clock arithmetic overflows.
inline constexpr std::uint64_t kDayMs = 24 * 3600 * 1000;

/// "a,b,c" as its items; none if any item is empty ("a,,b", "", "a,").
inline std::vector<std::string> splitList(std::string_view text) {
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma == start) return {};
    items.emplace_back(text.substr(start, comma - start));
    if (comma == text.size()) return items;
    start = comma + 1;
  }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (allowed without
/// privilege); returns the soft limit in force afterwards.
inline std::uint64_t raiseFdLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;  // the usual default
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
}

/// The CPUs this process may run on (its affinity mask: a container's or
/// taskset's share, not the machine's count), at least 1: the default
/// number of reactor threads.
inline std::size_t usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

/// The fds a connection holds: its TCP socket, and over RDMA also its
/// queue pair's completion channel.
inline std::uint64_t fdsPerConnection(bool rdma) { return rdma ? 2 : 1; }

/// The default --max-connections: 10,000, or, if less, half of the fds
/// that `reservedFds` (data files, rings, the listener) leave under
/// `fdLimit`, at `perConnection` fds each; at least 1.
inline std::uint64_t defaultMaxConnections(std::uint64_t fdLimit, std::uint64_t reservedFds,
                                           std::uint64_t perConnection) {
  const std::uint64_t spare = fdLimit > reservedFds ? fdLimit - reservedFds : 0;
  return std::clamp<std::uint64_t>(spare / 2 / perConnection, 1, 10000);
}

/// --transport rdma: opens the RDMA device `name` (the first one if empty)
/// into `settings.device`. Without one, or in a build without libibverbs,
/// tells the user why and to use TCP instead, and returns false.
template <typename Settings>
bool openRdmaDevice(const char* program, const std::string& name, Settings& settings) {
#if COIO_STORAGE_RDMA
  std::string why;
  coio::Result<std::unique_ptr<coio::rdma::Device>> device = coio::rdma::Device::open({.name = name}, &why);
  if (device) {
    settings.device = std::move(*device);
    return true;
  }
  // `why` is the whole story when the device layer gave one.
  if (why.empty()) why = device.error().message();
  std::fprintf(stderr, "%s: cannot use RDMA: %s\n  use TCP instead: --transport tcp\n", program, why.c_str());
#else
  (void)name;
  (void)settings;
  std::fprintf(stderr, "%s: this build has no RDMA support (libibverbs was not found when it was built); "
               "use --transport tcp\n", program);
#endif
  return false;
}

}  // namespace storage::cli
