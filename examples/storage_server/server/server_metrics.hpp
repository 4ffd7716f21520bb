#pragma once
// The storage server's metrics: a snapshot of every shard (its reactor's
// LoopStats, its ServerStats and latency histograms), taken on each shard's
// loop thread, and the /metrics page made of them (docs/storage-example.md,
// "Metrics", lists the names).
#include "metrics/exposition.hpp"
#include "server/storage_server.hpp"

#include <coio/core/task.hpp>
#include <coio/reactor/loop_stats.hpp>
#include <coio/reactor/reactor.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace storage {

/// One shard's figures, as of one moment of its loop.
struct ShardSnapshot {
  coio::LoopStats loop;
  ServerStats server;
  ServerLatencies latencies;
  std::size_t buffersInUse = 0;  ///< read buffers held by requests
  std::size_t buffers = 0;       ///< read buffers in the shard's pool
};

/// Adds `shard`'s counters and depths to `sum`; the high-water mark is the
/// largest.
inline void addStats(ServerStats& sum, const ServerStats& shard) noexcept {
  sum.requests += shard.requests;
  sum.protocolErrors += shard.protocolErrors;
  sum.transmitTimeouts += shard.transmitTimeouts;
  sum.sendTimeouts += shard.sendTimeouts;
  sum.handshakeFailures += shard.handshakeFailures;
  sum.frameTimeouts += shard.frameTimeouts;
  sum.idleTimeouts += shard.idleTimeouts;
  sum.refusedConnections += shard.refusedConnections;
  sum.acceptErrors += shard.acceptErrors;
  sum.staleIos += shard.staleIos;
  sum.corruptIos += shard.corruptIos;
  sum.splicedRequests += shard.splicedRequests;
  sum.spliceFallbacks += shard.spliceFallbacks;
  sum.taskFailures += shard.taskFailures;
  sum.connections += shard.connections;
  sum.transmitting += shard.transmitting;
  sum.maxTransmitting = std::max(sum.maxTransmitting, shard.maxTransmitting);
}

/// The whole server: every shard's snapshot added up (LoopStats aside).
inline ShardSnapshot total(const std::vector<ShardSnapshot>& shards) {
  ShardSnapshot sum;
  for (const ShardSnapshot& s : shards) {
    addStats(sum.server, s.server);
    sum.latencies += s.latencies;
    sum.buffersInUse += s.buffersInUse;
    sum.buffers += s.buffers;
  }
  return sum;
}

/// Snapshots each shard on its own loop thread, hopping from one to the
/// next, and resumes on `home`'s loop thread. Every shard's reactor must be
/// running (the hops need their loops).
template <coio::Reactor R>
coio::Task<std::vector<ShardSnapshot>> snapshotShards(std::vector<const StorageServer<R>*> shards, R& home) {
  std::vector<ShardSnapshot> out;
  out.reserve(shards.size());
  for (const StorageServer<R>* shard : shards) {
    co_await shard->reactor().schedule();
    out.push_back({shard->reactor().stats(), shard->stats(), shard->latencies(), shard->buffersInUse(),
                   shard->options().poolBytes / shard->options().pieceSize});
  }
  co_await home.schedule();
  co_return out;
}

/// The /metrics page: the server's counters, gauges and latency histograms
/// summed over the shards, and each reactor's LoopStats labelled
/// reactor="i" (its index in `shards`).
inline std::string renderMetrics(const std::vector<ShardSnapshot>& shards) {
  Exposition page;
  const ShardSnapshot all = total(shards);
  const auto server = [&](const char* name, const char* type, const char* help, std::uint64_t value) {
    page.family(name, type, help);
    page.sample(name, "", value);
  };
  server("storage_requests_total", "counter", "BatchReadRequests received.", all.server.requests);
  server("storage_protocol_errors_total", "counter", "Connections closed for a protocol error.",
         all.server.protocolErrors);
  server("storage_transmit_timeouts_total", "counter", "Requests answered timedOut: no TransmitGrant in time.",
         all.server.transmitTimeouts);
  server("storage_send_timeouts_total", "counter", "Connections dropped because their sends made no progress.",
         all.server.sendTimeouts);
  server("storage_handshake_failures_total", "counter", "Accepted connections whose transport did not come up.",
         all.server.handshakeFailures);
  server("storage_frame_timeouts_total", "counter", "Connections cut at the frame deadline.", all.server.frameTimeouts);
  server("storage_idle_timeouts_total", "counter", "Connections closed idle.", all.server.idleTimeouts);
  server("storage_refused_connections_total", "counter", "Connections closed at once over --max-connections.",
         all.server.refusedConnections);
  server("storage_accept_errors_total", "counter", "Failed accepts (each backs off 10 ms).", all.server.acceptErrors);
  server("storage_task_failures_total", "counter", "Connection tasks ended by an exception (a bug).",
         all.server.taskFailures);
  server("storage_stale_routing_ios_total", "counter", "IOs answered staleRouting: routed with an older chain version.",
         all.server.staleIos);
  server("storage_corrupt_ios_total", "counter", "IOs answered corrupt: a block they read failed its stored CRC.",
         all.server.corruptIos);
  server("storage_spliced_requests_total", "counter", "Requests whose data was spliced (file -> pipe -> socket).",
         all.server.splicedRequests);
  server("storage_splice_fallbacks_total", "counter", "Requests copied for want of pipes (the fd limit, the pipe quota).",
         all.server.spliceFallbacks);
  server("storage_connections", "gauge", "Connections open.", all.server.connections);
  server("storage_transmitting", "gauge", "Requests whose data is being sent.", all.server.transmitting);
  server("storage_read_buffers_in_use", "gauge", "Read buffers held by requests.", all.buffersInUse);
  server("storage_read_buffers", "gauge", "Read buffers in the pools.", all.buffers);
  page.histogram("storage_request_duration_seconds",
                 "Per request: from its frame received to its response sent.", all.latencies.request);
  page.histogram("storage_disk_read_duration_seconds",
                 "Per IO read: from the request's reads submitted to the IO's last piece read.",
                 all.latencies.diskRead);
  page.histogram("storage_transmit_wait_seconds",
                 "Per request sent ungranted: from TransmitRequest to TransmitGrant (or the transmit timeout).",
                 all.latencies.transmitWait);

  // Each reactor's loop, one family at a time (the format keeps a family's samples together).
  const auto label = [](std::size_t reactor) { return "reactor=\"" + std::to_string(reactor) + "\""; };
  const auto loop = [&](const char* name, const char* type, const char* help, auto value) {
    page.family(name, type, help);
    for (std::size_t r = 0; r < shards.size(); ++r) page.sample(name, label(r), value(shards[r].loop));
  };
  for (const bool submitted : {true, false}) {
    const char* name = submitted ? "coio_ops_submitted_total" : "coio_ops_completed_total";
    page.family(name, "counter", submitted ? "Operations the loop started waiting on, by kind."
                                           : "Operations whose wait ended, whatever the result, by kind.");
    for (std::size_t r = 0; r < shards.size(); ++r) {
      for (std::size_t k = 0; k < coio::kOpKinds; ++k) {
        const coio::LoopStats::Ops& ops = shards[r].loop.ops[k];
        page.sample(name, label(r) + ",kind=\"" + std::string(coio::toString(static_cast<coio::OpKind>(k))) + "\"",
                    submitted ? ops.submitted : ops.completed);
      }
    }
  }
  using Stats = coio::LoopStats;
  loop("coio_ops_completed_inline_total", "counter", "Operations that needed no wait.",
       [](const Stats& s) { return s.completedInline; });
  loop("coio_ops_in_flight", "gauge", "Operations waiting now.", [](const Stats& s) { return std::uint64_t{s.inFlight}; });
  loop("coio_loop_ready", "gauge", "Coroutines queued for the next turn.",
       [](const Stats& s) { return std::uint64_t{s.ready}; });
  loop("coio_loop_timers", "gauge", "Timers set.", [](const Stats& s) { return std::uint64_t{s.timers}; });
  loop("coio_loop_events_total", "counter", "Events the loop's waits returned.", [](const Stats& s) { return s.events; });
  loop("coio_loop_resumed_total", "counter", "Coroutines resumed from the ready queue.",
       [](const Stats& s) { return s.resumed; });
  loop("coio_loop_iterations_total", "counter", "Turns of the loop.", [](const Stats& s) { return s.iterations; });
  loop("coio_loop_running_seconds_total", "counter", "Loop thread time in turns (timed loops only).",
       [](const Stats& s) { return s.running; });
  loop("coio_loop_waiting_seconds_total", "counter", "Loop thread time in waits that could block (timed loops only).",
       [](const Stats& s) { return s.waiting; });
  loop("coio_loop_longest_turn_seconds", "gauge", "The longest turn timed.",
       [](const Stats& s) { return s.longestTurn; });
  loop("coio_loop_stalls_total", "counter", "Turns longer than --stall-threshold-ms.",
       [](const Stats& s) { return s.stalls; });
  return page.text();
}

}  // namespace storage
