#pragma once
// Runs a list of benchmarks with Google Benchmark and, after its usual
// console output, prints one markdown table giving each figure in ns/op and
// as a ratio to a baseline measured in the same run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace coio::bench {

enum class Measured { cpuTime, realTime };

struct Row;

struct Baseline {
  const Row* row = nullptr;
  double goal = 0;  // the ratio must not exceed it; 0: no goal
};

struct Row {
  const char* name;
  void (*run)(benchmark::State&);
  Baseline baseline{};
  Measured measured = Measured::cpuTime;
  int opsPerIteration = 1;  // the table reports time per iteration / this
};

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(std::span<const Row> rows) : rows_(rows) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool real = run.run_name.time_type == "real_time";
      const double ns = (real ? run.GetAdjustedRealTime() : run.GetAdjustedCPUTime()) * 1e9 /
                        benchmark::GetTimeUnitMultiplier(run.time_unit);
      Samples& s = samples_[run.run_name.function_name];
      if (run.run_type == Run::RT_Iteration) {
        s.perRepetition.push_back(ns);
      } else if (run.aggregate_name == "median") {
        s.median = ns;
      }
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::ostream& out = GetOutputStream();
    out << "\n" << kCompiler << ". Median of the repetitions; CPU time, wall time for ping-pongs.\n\n"
           "| benchmark | ns/op | baseline | ratio | goal |\n|---|---:|---|---:|---|\n";
    for (const Row& row : rows_) {
      const std::optional<double> ns = nsPerOp(row);
      if (!ns) continue;  // filtered out
      out << "| " << row.name << " | " << fixed(*ns, 1) << " |";
      const std::optional<double> base = row.baseline.row ? nsPerOp(*row.baseline.row) : std::nullopt;
      if (!base) {
        out << " | | |\n";
        continue;
      }
      const double ratio = *ns / *base;
      out << " " << row.baseline.row->name << " | " << fixed(ratio, 2) << " |";
      if (row.baseline.goal > 0) {
        out << " <= " << fixed(row.baseline.goal, 1) << (ratio <= row.baseline.goal ? " met" : " MISSED");
      }
      out << " |\n";
    }
    out.flush();
  }

 private:
#if defined(__clang__)
  static constexpr const char* kCompiler = __VERSION__;
#else
  static constexpr const char* kCompiler = "g++ " __VERSION__;
#endif

  struct Samples {
    std::vector<double> perRepetition;
    std::optional<double> median;  // Google Benchmark's, when it made aggregates
  };

  std::optional<double> nsPerOp(const Row& row) {
    auto it = samples_.find(row.name);
    if (it == samples_.end()) return std::nullopt;
    Samples& s = it->second;
    if (!s.median) {
      if (s.perRepetition.empty()) return std::nullopt;
      auto mid = s.perRepetition.begin() + static_cast<std::ptrdiff_t>(s.perRepetition.size() / 2);
      std::nth_element(s.perRepetition.begin(), mid, s.perRepetition.end());
      s.median = *mid;
    }
    return *s.median / row.opsPerIteration;
  }

  static std::string fixed(double v, int decimals) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
  }

  std::span<const Row> rows_;
  std::map<std::string, Samples> samples_;
};

/// Registers `rows`, runs them (5 repetitions, randomly interleaved, unless
/// the command line says otherwise) and prints the ratio table.
inline int runWithRatioTable(int argc, char** argv, std::span<const Row> rows) {
  // Defaults go first so that the same flags given on the command line win.
  std::vector<char*> args{argv[0]};
  static char repetitions[] = "--benchmark_repetitions=5";
  static char aggregatesOnly[] = "--benchmark_display_aggregates_only=true";
  static char interleave[] = "--benchmark_enable_random_interleaving=true";
  args.insert(args.end(), {repetitions, aggregatesOnly, interleave});
  args.insert(args.end(), argv + 1, argv + argc);
  args.push_back(nullptr);
  int n = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;

  // glibc drops the atomics from std::mutex (and libstdc++ from shared_ptr
  // counts) until a process starts its first thread. Start one now, so every
  // benchmark sees the multi-threaded costs a server pays, whatever the
  // filter and the order in which the benchmarks run.
  std::thread([] {}).join();

  for (const Row& row : rows) {
    benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(row.name, row.run);
    if (row.measured == Measured::realTime) b->UseRealTime();
  }
  RatioReporter reporter(rows);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace coio::bench
