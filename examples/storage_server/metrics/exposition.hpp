#pragma once
// Exposition: writes metrics in Prometheus' text exposition format (version
// 0.0.4): each family's # HELP and # TYPE lines, then its samples.
#include "metrics/latency_histogram.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace storage {

/// Builds a /metrics page. Call family() before a family's samples and keep
/// them together (the format requires it). Labels are given preformatted
/// (`reactor="0",kind="recv"`, empty for none); names, help texts and label
/// values are the caller's constants, so nothing is escaped.
class Exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_.append("# HELP ").append(name).append(" ").append(help).append("\n");
    out_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }

  void sample(std::string_view name, std::string_view labels, std::uint64_t value) {
    line(name, labels, std::to_string(value));
  }
  void sample(std::string_view name, std::string_view labels, std::chrono::nanoseconds seconds) {
    line(name, labels, formatSeconds(seconds));
  }

  /// A whole histogram family (in seconds): `name` with the cumulative
  /// _bucket{le=...} samples, +Inf last, then _sum and _count.
  void histogram(std::string_view name, std::string_view help, const LatencyHistogram& h) {
    family(name, "histogram", help);
    const std::string bucket = std::string(name) + "_bucket";
    std::uint64_t below = 0;
    for (std::size_t i = 0; i < LatencyHistogram::kBuckets; ++i) {
      below += h.bucket(i);
      line(bucket, "le=\"" + formatBound(LatencyHistogram::upperBound(i)) + "\"", std::to_string(below));
    }
    line(bucket, "le=\"+Inf\"", std::to_string(h.count()));
    line(std::string(name) + "_sum", "", formatSeconds(h.sum()));
    line(std::string(name) + "_count", "", std::to_string(h.count()));
  }

  const std::string& text() const noexcept { return out_; }

 private:
  // Nanosecond resolution for sums and totals; le bounds short (1e-06, 0.000512, 16.777216).
  static std::string formatSeconds(std::chrono::nanoseconds d) {
    char text[48];
    std::snprintf(text, sizeof text, "%.9f", std::chrono::duration<double>(d).count());
    return text;
  }
  static std::string formatBound(std::chrono::nanoseconds d) {
    char text[48];
    std::snprintf(text, sizeof text, "%.9g", std::chrono::duration<double>(d).count());
    return text;
  }
  void line(std::string_view name, std::string_view labels, const std::string& value) {
    out_.append(name);
    if (!labels.empty()) out_.append("{").append(labels).append("}");
    out_.append(" ").append(value).append("\n");
  }

  std::string out_;
};

}  // namespace storage
