#pragma once
// LatencyHistogram: durations counted in power-of-two buckets, cheap enough
// to observe on every request (a bit_width and three increments), kept per
// reactor and merged (added) when exported.
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace storage {

/// Counts durations in buckets of upper bounds 1 µs, 2 µs, 4 µs, ...,
/// 2^(kBuckets-1) µs (about 16.8 s), and one more for anything longer;
/// keeps their sum and count.
///
/// Guarantees: observe() is a handful of integer operations, no allocation
/// and no clock read; bucket(i) counts the durations d with
/// upperBound(i - 1) < d <= upperBound(i) (rounded up to whole
/// microseconds). Not thread-safe: one per loop thread, read there (or
/// copied there and merged elsewhere).
class LatencyHistogram {
 public:
  /// The finite buckets; bucket(kBuckets) is the overflow (+Inf) one.
  static constexpr std::size_t kBuckets = 25;

  /// The upper bound of finite bucket `i`.
  static constexpr std::chrono::microseconds upperBound(std::size_t i) noexcept {
    return std::chrono::microseconds(std::uint64_t{1} << i);
  }

  void observe(std::chrono::nanoseconds duration) noexcept {
    const std::uint64_t ns = duration.count() > 0 ? static_cast<std::uint64_t>(duration.count()) : 0;
    // Whole microseconds rounded up; bucket i holds (2^(i-1), 2^i] µs, bucket 0 also 0.
    const std::uint64_t us = (ns + 999) / 1000;
    const std::size_t i = us <= 1 ? 0 : static_cast<std::size_t>(std::bit_width(us - 1));
    ++buckets_[i < kBuckets ? i : kBuckets];
    sum_ += ns;
    ++count_;
  }

  /// Adds `other`'s observations to this one's.
  LatencyHistogram& operator+=(const LatencyHistogram& other) noexcept {
    for (std::size_t i = 0; i <= kBuckets; ++i) buckets_[i] += other.buckets_[i];
    sum_ += other.sum_;
    count_ += other.count_;
    return *this;
  }

  /// Observations in bucket `i` alone (0 <= i <= kBuckets), not cumulative.
  std::uint64_t bucket(std::size_t i) const noexcept { return buckets_[i]; }
  std::chrono::nanoseconds sum() const noexcept { return std::chrono::nanoseconds(sum_); }
  std::uint64_t count() const noexcept { return count_; }

 private:
  std::array<std::uint64_t, kBuckets + 1> buckets_{};
  std::uint64_t sum_ = 0;  // ns
  std::uint64_t count_ = 0;
};

}  // namespace storage
