#pragma once
// runSeeds: a simulation run over many seeds, each failure with the line
// that replays it.
#include <coio/testing/sim_reactor.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace coio::sim {

/// The seeds a run covers: `count` seeds from `first` on.
struct SeedRange {
  std::uint64_t first = 1;  ///< the first seed
  std::uint64_t count = 0;  ///< how many seeds, first, first + 1, ...
  /// A replay's: the trace hash the run had when it failed. runSeeds fails
  /// a run whose trace differs: the program changed since, and the seed no
  /// longer replays that failure.
  std::optional<std::uint64_t> expectedTrace{};

  /// From the environment, so that CI and a developer run more seeds, or
  /// one, with the same binary: COIO_SIM_SEED=N runs seed N alone (a
  /// replay; with COIO_SIM_TRACE set to a trace hash in hexadecimal, the
  /// trace it must have); else
  /// COIO_SIM_SEEDS=N runs N seeds (default `defaultCount`) from
  /// COIO_SIM_FIRST_SEED (default 1). A value that is not a number throws
  /// std::invalid_argument naming the variable.
  static SeedRange fromEnvironment(std::uint64_t defaultCount) {
    if (const std::optional<std::uint64_t> one = number("COIO_SIM_SEED")) return {*one, 1, number("COIO_SIM_TRACE", 16)};
    return {number("COIO_SIM_FIRST_SEED").value_or(1), number("COIO_SIM_SEEDS").value_or(defaultCount)};
  }

 private:
  static std::optional<std::uint64_t> number(const char* name, int base = 10) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const unsigned long long value = std::strtoull(text, &end, base);
    if (*end != '\0' || errno != 0 || *text == '-') {
      throw std::invalid_argument(std::string("coio::sim: ") + name + "='" + text + "' is not a " +
                                  (base == 10 ? "seed number" : "trace hash (hexadecimal)"));
    }
    return value;
  }
};

/// A seed whose run failed: what failed (an invariant's message, or the
/// exception it threw: sim::Deadlock, an assertion...).
struct SeedFailure {
  std::uint64_t seed = 0;  ///< the seed whose run failed
  std::string what;        ///< what failed
};

/// What runSeeds did.
struct SeedReport {
  std::uint64_t runs = 0;              ///< seeds run
  std::vector<SeedFailure> failures;  ///< the seeds that failed, in order
  /// The runs' trace hashes combined, in seed order: the same for the
  /// same seeds and program, on every compiler.
  std::uint64_t trace = 0xCBF29CE484222325ull;
  std::chrono::duration<double> wall{};  ///< wall time of all the runs
};

/// Runs `run(seed)` for every seed of `seeds`, one after another. `run`
/// returns the run's trace hash (SimReactor::traceHash) when every
/// invariant held, or throws: a std::exception's what() (e.g. a
/// sim::Deadlock's) is the failure, anything else is "an exception (a
/// test assertion?)". Each failure is written to `log` at once, with the
/// line that replays it: `COIO_SIM_SEED=seed COIO_SIM_TRACE=hash
/// replay` (`replay`: the command and arguments that run this again,
/// e.g. the test binary and its filter; the hash: the failed run's trace,
/// lastTraceHash()). With `seeds.expectedTrace`, a run whose trace differs
/// fails, saying the seed no longer replays. Stops after `maxFailures`
/// failures. Guarantees: seeds run in order, each alone; nothing is
/// retried.
template <typename Run>
SeedReport runSeeds(SeedRange seeds, Run&& run, std::string_view replay, std::FILE* log = stderr,
                    std::size_t maxFailures = 10) {
  SeedReport report;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < seeds.count && report.failures.size() < maxFailures; ++i) {
    const std::uint64_t seed = seeds.first + i;
    std::optional<std::string> failure;
    std::uint64_t hash = 0;
    try {
      hash = run(seed);
      report.trace = (report.trace ^ hash) * 0x100000001B3ull;
    } catch (const std::exception& e) {
      failure = e.what();
      hash = lastTraceHash();
    } catch (...) {
      failure = "an exception (a test assertion?)";
      hash = lastTraceHash();
    }
    ++report.runs;
    if (seeds.expectedTrace && hash != *seeds.expectedTrace) {
      char traces[80];
      std::snprintf(traces, sizeof traces, "its trace is %016llx, not %016llx",
                    static_cast<unsigned long long>(hash), static_cast<unsigned long long>(*seeds.expectedTrace));
      failure = "this seed no longer replays the run asked for (" + std::string(traces) +
                "): the program changed since, or its build; this run " +
                (failure ? "failed too: " + *failure : std::string("passed"));
    }
    if (failure) {
      if (log != nullptr) {
        std::fprintf(log, "coio::sim: seed %llu failed: %s\n  replay: COIO_SIM_SEED=%llu COIO_SIM_TRACE=%016llx %.*s\n",
                     static_cast<unsigned long long>(seed), failure->c_str(), static_cast<unsigned long long>(seed),
                     static_cast<unsigned long long>(hash), static_cast<int>(replay.size()), replay.data());
      }
      report.failures.push_back({seed, std::move(*failure)});
    }
  }
  report.wall = std::chrono::steady_clock::now() - start;
  return report;
}

/// The path of the running program (for runSeeds' replay line).
inline std::string thisProgram() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  return n > 0 ? path.substr(0, static_cast<std::size_t>(n)) : std::string("<this program>");
}

}  // namespace coio::sim
