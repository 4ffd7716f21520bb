#pragma once
// Command-line helpers shared by coio-storage-server and coio-storage-bench.
#if COIO_STORAGE_RDMA
#include "rdma_channel.hpp"
#endif

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace storage::cli {

/// A byte count with an optional binary suffix: 4096, 64K, 4M, 1G (KiB, MiB, GiB).
inline std::optional<std::uint64_t> parseSize(std::string_view text) {
  std::uint64_t shift = 0;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      default: break;
    }
    if (shift != 0) text.remove_suffix(1);
  }
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  if (shift != 0 && value > (UINT64_MAX >> shift)) return std::nullopt;
  return value << shift;
}

/// A plain non-negative integer.
inline std::optional<std::uint64_t> parseCount(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
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
