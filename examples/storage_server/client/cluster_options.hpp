#pragma once
// What a ClusterClient takes and gives: its options, its errors, one IO's
// outcome, and its figures (per server and in all).
#include "client/storage_client.hpp"
#include "cluster/chain_table.hpp"
#include "protocol/protocol.hpp"

#include <coio/core/result.hpp>
#include <coio/core/task.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <system_error>
#include <type_traits>

namespace storage {

/// Why a ClusterClient could not send an IO at all (ClusterOutcome::error).
enum class ClusterErrc {
  noServingTarget = 1,  ///< every target of the IO's chain is offline in the routing
};

/// The category of ClusterErrc ("storage-cluster").
inline const std::error_category& clusterCategory() noexcept {
  struct Category final : std::error_category {
    const char* name() const noexcept override { return "storage-cluster"; }
    std::string message(int ev) const override {
      if (static_cast<ClusterErrc>(ev) == ClusterErrc::noServingTarget) {
        return "no serving target: every target of the chunk's chain is offline";
      }
      return "unknown cluster error";
    }
  };
  static const Category category;
  return category;
}
inline std::error_code make_error_code(ClusterErrc e) noexcept {  // NOLINT: ADL name fixed by the standard
  return {static_cast<int>(e), clusterCategory()};
}

}  // namespace storage

template <>
struct std::is_error_code_enum<storage::ClusterErrc> : std::true_type {};

namespace storage {

/// A ClusterClient's options. Its durations run on the reactor's clock
/// (now(): steady_clock, or virtual time under coio::sim::SimReactor).
struct ClusterOptions {
  /// Each server connection's options. verifyChecksums is always on: a
  /// corrupted replica is noticed by its checksum only.
  ClientOptions connection{};
  /// Deadline of one request to one server (coio::withTimeout): a server
  /// that does not answer in time (hung, stopped) is marked down and the
  /// request's IOs go to other replicas.
  std::chrono::steady_clock::duration requestTimeout = std::chrono::seconds(2);
  /// Hedged reads: a request still unanswered after this long is sent to
  /// other replicas too, and the first to deliver every IO wins (the other
  /// is cancelled). Zero: off. See ClusterClient for what it costs.
  std::chrono::steady_clock::duration hedgeAfter{};
  /// A server marked down is probed again after this long, then after
  /// twice as long each time, up to reconnectMax.
  std::chrono::steady_clock::duration reconnectMin = std::chrono::milliseconds(50);
  std::chrono::steady_clock::duration reconnectMax = std::chrono::seconds(2);
  /// How long a batchRead keeps trying an IO that every replica has failed
  /// (or whose replicas' servers are all down), from the call: after a
  /// pause (reconnectMin, doubling up to reconnectMax) every replica not
  /// known corrupt may be asked again, as 3FS's client retries until its
  /// max_retry_time. For a cluster whose servers may all stall at once
  /// (an overloaded machine) longer than requestTimeout. Zero: such an IO
  /// fails at once.
  std::chrono::steady_clock::duration retryFor{};
  /// Requests granted transmission at once per server connection (its
  /// TransmissionLimiter): the bound of a single-server client, per server.
  std::size_t maxTransmissionsPerServer = 64;
  /// Most IOs in one request; a server's larger share of a batch is split.
  /// At most the servers' --max-batch (and 408 over RDMA).
  std::size_t maxIosPerRequest = 256;
  /// Where reports go (a corrupted replica; a server down, back); empty: stderr.
  std::function<void(const std::string&)> log;
  /// Fetches a fresh routing when a server answers staleRouting (a file
  /// re-read, a cluster manager asked), under requestTimeout (it should
  /// end when its stop token is stopped, as coio's operations do); empty:
  /// a stale answer counts as a failed replica. It must not call
  /// updateRouting() itself.
  std::function<coio::Task<coio::Result<ChainTable>>()> refreshRouting;
  /// Fresh routings one batchRead may fetch; its IOs still stale after
  /// that many are read from other replicas.
  unsigned maxRoutingRefreshes = 3;
  /// Called with each routing the client puts in use (the first, and each
  /// later one that changed something), on the loop thread, as it becomes
  /// the one new requests use; e.g. to log when a change reached the client.
  std::function<void(const ChainTable&)> routingApplied;
};

/// One IO's outcome from a ClusterClient: the last replica's answer.
struct ClusterOutcome {
  /// ok, or the last status: a replica's (`corrupt`: a block of its copy
  /// failed the server's check; also when every replica left was known
  /// corrupt), `unavailable` when the last request failed as a whole (or
  /// every replica's server was down), or `timedOut` when it missed its
  /// deadline.
  proto::IoStatus status = proto::IoStatus::unavailable;
  std::uint32_t bytes = 0;
  std::uint32_t checksum = 0;
  /// The last replica's bytes failed the response's checksum (damaged
  /// after the server's check: network, memory); that copy is then not
  /// read again either.
  bool checksumMismatch = false;
  std::error_code error;          ///< why the last request failed as a whole (or nothing was sent), if it did
  std::size_t server = SIZE_MAX;  ///< the last replica's server (ClusterClient's server index); none: SIZE_MAX
  std::uint32_t attempts = 0;     ///< replicas asked
  std::optional<std::uint32_t> target;  ///< the last replica's target, if one was asked
  /// The bytes are there and passed their checksum.
  bool ok() const noexcept { return status == proto::IoStatus::ok && !checksumMismatch; }
};

/// Figures per server (ClusterClient::serverStats).
struct ClusterServerStats {
  std::uint64_t requests = 0;        ///< requests sent
  std::uint64_t ios = 0;             ///< IOs it delivered (ok, checksum good)
  std::uint64_t bytes = 0;           ///< their bytes
  std::uint64_t failedRequests = 0;  ///< requests that failed as a whole (connection, deadline)
  std::uint64_t timeouts = 0;        ///< ... of which missed their deadline
  std::uint64_t downs = 0;           ///< times marked down
  std::uint64_t ups = 0;             ///< times found back
  std::uint64_t staleIos = 0;        ///< IOs it answered staleRouting
};

/// Figures of the whole client (ClusterClient::stats).
struct ClusterStats {
  std::uint64_t retries = 0;          ///< IOs sent again, to another replica
  std::uint64_t failovers = 0;        ///< servers marked down
  std::uint64_t hedges = 0;           ///< requests hedged (sent to other replicas too)
  std::uint64_t hedgeWins = 0;        ///< ... whose hedge delivered first
  std::uint64_t corruptReplicas = 0;  ///< (target, chunk) copies found corrupt
  std::uint64_t failedIos = 0;        ///< IOs that failed on every replica
  /// Pauses before IOs that every replica had failed went round again (retryFor)
  std::uint64_t retryPauses = 0;
  std::uint64_t routingUpdates = 0;   ///< routings applied that changed something (updateRouting, refreshes)
  std::uint64_t routingRefreshes = 0; ///< fresh routings fetched after a staleRouting answer
  std::uint64_t staleRoutingRetries = 0;  ///< IOs sent again on a fresh routing after a staleRouting answer
  /// IOs sent (requests, hedges, probes) to a target that the routing in
  /// use at that moment has offline: 0 unless something bypasses the routing.
  std::uint64_t offlineIos = 0;
};

}  // namespace storage
