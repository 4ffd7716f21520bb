// The storage example's latency histograms and their exposition.
#include "metrics/exposition.hpp"
#include "metrics/latency_histogram.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

using namespace std::chrono_literals;
using storage::LatencyHistogram;

TEST_CASE("A latency lands in the first power-of-two bucket of microseconds that holds it", "[storage][metrics]") {
  LatencyHistogram h;
  h.observe(0ns);      // bucket 0: up to 1 µs
  h.observe(1us);      // bucket 0
  h.observe(1001ns);   // 2 µs rounded up: bucket 1
  h.observe(2us);      // bucket 1
  h.observe(3us);      // bucket 2: (2, 4] µs
  h.observe(1ms);      // 1000 µs: bucket 10, (512, 1024] µs
  h.observe(1025us);   // bucket 11
  h.observe(-5ns);     // a clock that went back counts as 0
  h.observe(1h);       // past the last bound: the overflow bucket
  CHECK(h.bucket(0) == 3);
  CHECK(h.bucket(1) == 2);
  CHECK(h.bucket(2) == 1);
  CHECK(h.bucket(10) == 1);
  CHECK(h.bucket(11) == 1);
  CHECK(h.bucket(LatencyHistogram::kBuckets) == 1);
  CHECK(h.count() == 9);
  CHECK(h.sum() == 0ns + 1us + 1001ns + 2us + 3us + 1ms + 1025us + 1h);
  CHECK(LatencyHistogram::upperBound(LatencyHistogram::kBuckets - 1) == 16777216us);

  LatencyHistogram other;
  other.observe(3us);
  h += other;
  CHECK(h.bucket(2) == 2);
  CHECK(h.count() == 10);
}

TEST_CASE("A histogram's exposition: cumulative buckets, +Inf equal to the count, sum in seconds",
          "[storage][metrics]") {
  LatencyHistogram h;
  h.observe(1us);
  h.observe(3us);
  h.observe(3us);
  h.observe(1h);
  storage::Exposition page;
  page.histogram("x_seconds", "Help text.", h);
  page.family("y_total", "counter", "A counter.");
  page.sample("y_total", "reactor=\"0\"", 7);
  page.sample("y_total", "reactor=\"1\"", 1500ms);
  const std::string& text = page.text();
  CHECK(text.rfind("# HELP x_seconds Help text.\n# TYPE x_seconds histogram\n"
                   "x_seconds_bucket{le=\"1e-06\"} 1\n"
                   "x_seconds_bucket{le=\"2e-06\"} 1\n"
                   "x_seconds_bucket{le=\"4e-06\"} 3\n",
                   0) == 0);
  CHECK(text.find("x_seconds_bucket{le=\"16.777216\"} 3\nx_seconds_bucket{le=\"+Inf\"} 4\n"
                  "x_seconds_sum 3600.000007000\nx_seconds_count 4\n") != std::string::npos);
  CHECK(text.find("# TYPE y_total counter\ny_total{reactor=\"0\"} 7\ny_total{reactor=\"1\"} 1.500000000\n") !=
        std::string::npos);
}
