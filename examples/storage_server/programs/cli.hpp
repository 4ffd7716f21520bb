#pragma once
// Command-line helpers shared by coio-storage-server and coio-storage-bench.
#if COIO_STORAGE_RDMA
#include "transport/rdma_channel.hpp"
#endif

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

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
