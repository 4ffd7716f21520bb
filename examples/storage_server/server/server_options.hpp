#pragma once
// A StorageServer's options (the serve command's flags), counters and
// latency histograms.
#include "metrics/latency_histogram.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace storage {

/// A target to serve: a chunk store's directory (typically one per disk,
/// several per disk allowed) and its id, unique across the cluster.
struct TargetSpec {
  std::uint32_t id = 0;
  std::string dir;
};

/// How a StorageServer sends the data of a target read through the page
/// cache (not O_DIRECT) over TCP (--data-path).
enum class DataPath {
  /// Spliced for requests whose IOs are all at least kSpliceMinIo bytes,
  /// else copied: splicing a small IO costs more than copying it
  /// (docs/benchmarks.md, "Splice or copy").
  automatic,
  /// Spliced wherever it can be (below), whatever the IO size.
  splice,
  /// Read into pool buffers, checked, and sent from them, always.
  copy,
};

/// The smallest IO DataPath::automatic splices.
inline constexpr std::uint32_t kSpliceMinIo = 64 * 1024;

/// A StorageServer's options. Its durations, and its latency histograms,
/// run on the reactor's clock (now(): steady_clock, or virtual time in a
/// simulation).
struct ServerOptions {
  std::uint32_t maxBatch = 256;                      ///< IOs per batch (--max-batch)
  std::uint64_t maxBatchBytes = 64ull << 20;         ///< requested bytes per batch (--max-batch-bytes)
  std::chrono::steady_clock::duration transmitTimeout = std::chrono::seconds(10);  ///< --transmit-timeout
  /// How long a connection's sends may make no progress (none finishes
  /// while some are pending) before it is dropped, within 1.25 x this: a
  /// client that stops reading cannot pin buffers.
  std::chrono::steady_clock::duration sendTimeout = std::chrono::seconds(10);
  /// Requests in flight per connection (--max-requests); one more is a
  /// protocol error (tooManyRequests): one client cannot queue unbounded work.
  std::uint32_t maxRequestsPerConnection = 256;
  /// shutdown(): how long in-flight requests may take to finish before
  /// their connections are cut.
  std::chrono::steady_clock::duration drainTimeout = std::chrono::seconds(5);
  /// One pool buffer (--piece-size); larger reads are split into pieces,
  /// each its own request to the device (ReadBatch::keepApart), sent as
  /// soon as it is read.
  std::size_t pieceSize = 128 * 1024;
  std::size_t poolBytes = 128u << 20;                ///< this reactor's read-buffer pool
  bool directIo = true;                              ///< O_DIRECT, if the file system allows it
  /// How long a connection dropped for a protocol error gets to read its Error frame.
  std::chrono::steady_clock::duration errorGrace = std::chrono::seconds(1);
  /// How long a frame may take from its first byte to its last, and an
  /// RDMA handshake from the accept (--frame-timeout-ms): a peer that
  /// stalls mid-frame cannot hold its connection.
  std::chrono::steady_clock::duration frameTimeout = std::chrono::seconds(10);
  /// How long a connection may have nothing in flight (no request being
  /// served, no frame begun) before it is closed (--idle-timeout-ms).
  std::chrono::steady_clock::duration idleTimeout = std::chrono::seconds(60);
  /// Connections this server serves at once, from accept to close; one
  /// more is accepted and closed at once (--max-connections, split
  /// between the reactors).
  std::size_t maxConnections = 1024;
  /// The congestion control of the connections' sends (--tcp-congestion,
  /// TcpStream::setCongestionControl); empty: the system's default.
  std::string tcpCongestion;
  /// TCP: send the data pieces without copying them, straight from the
  /// pool buffers (--zero-copy-send; TcpStream::writeZeroCopy), where the
  /// reactor can (UringReactor on Linux 6.1+; note() says), else copy. A
  /// request's buffers go back to the pool only once the kernel has let go
  /// of every piece of it (the client acknowledged the data), so a client
  /// that reads slowly holds buffers longer. A loss over loopback, where
  /// the kernel copies anyway to deliver to the local socket and buffers
  /// wait for the ACKs (docs/benchmarks.md, storage over TCP).
  bool zeroCopySend = false;
  /// Splice or copy the data of buffered targets (--data-path). A request
  /// is spliced (file -> pipe -> socket, no copy in the server) when the
  /// path allows it, the reactor can splice (coio::SpliceReactor), the
  /// transport is TCP, it asks for the response CRC (checksumMode 1: its
  /// whole blocks are checked by the client against the CRC derived from
  /// the stored ones, PROTOCOL.md "Checksums") and every IO it reads is on
  /// a target opened without O_DIRECT whose file system splices. Otherwise,
  /// and when its pipes cannot be had (the fd limit), it is copied.
  DataPath dataPath = DataPath::automatic;
  /// A spliced request's pieces, each through a pipe of its own of that
  /// capacity (--splice-piece-size): a multiple of pieceSize (so whole
  /// blocks). Larger pieces make fewer splices; past 1 MiB
  /// (fs.pipe-max-size) pipes need CAP_SYS_RESOURCE, and a request whose
  /// pipes cannot be had is copied. Its bytes in flight count against the
  /// pool as a copied request's do.
  std::size_t splicePieceSize = 1u << 20;
  /// A debugging aid (--poison-buffers): pool buffers are filled with a
  /// pattern when they go back to the pool and, under AddressSanitizer,
  /// poisoned until taken again (BufferPool::Options::poisonOnRelease).
  bool poisonBuffers = false;
};

/// Counters of one server (read on its loop thread, or once it is idle).
struct ServerStats {
  std::uint64_t requests = 0;
  std::uint64_t protocolErrors = 0;
  std::uint64_t transmitTimeouts = 0;
  std::uint64_t sendTimeouts = 0;       ///< connections dropped because their sends made no progress in time
  std::uint64_t handshakeFailures = 0;  ///< accepted connections whose transport did not come up (RDMA)
  std::uint64_t frameTimeouts = 0;      ///< connections cut because a frame or an RDMA handshake stalled
  std::uint64_t idleTimeouts = 0;       ///< connections closed after idleTimeout with nothing in flight
  /// Accepted and closed at once: every shard was at maxConnections (on the accepting shard).
  std::uint64_t refusedConnections = 0;
  /// Failed accepts (e.g. EMFILE), each followed by a 10 ms back-off (on the accepting shard).
  std::uint64_t acceptErrors = 0;
  /// IOs answered staleRouting: their chain version was older than the server's.
  std::uint64_t staleIos = 0;
  /// IOs answered corrupt: a block they read failed its stored CRC.
  std::uint64_t corruptIos = 0;
  /// Requests whose data was spliced (file -> pipe -> socket).
  std::uint64_t splicedRequests = 0;
  /// Requests that would have been spliced but were copied: no pipe could be had (EMFILE, EPERM).
  std::uint64_t spliceFallbacks = 0;
  /// Connection or accept tasks ended by an exception: a bug, each told on stderr.
  std::uint64_t taskFailures = 0;
  std::size_t connections = 0;
  std::size_t transmitting = 0;      ///< requests between grant and the end of their data
  std::size_t maxTransmitting = 0;   ///< high-water mark of `transmitting`
};

/// The latencies one StorageServer measures (its phases, PROTOCOL.md "A
/// request's life"), on its loop thread.
struct ServerLatencies {
  /// Per request: from its frame read whole to its response sent whole
  /// (to the socket, or over RDMA), whatever the outcome, timedOut included; not for a
  /// request whose connection ended first.
  LatencyHistogram request;
  /// Per IO read from disk: from the request's reads' submission to the
  /// completion of the IO's last piece.
  LatencyHistogram diskRead;
  /// Per request that came without the granted flag: from its
  /// TransmitRequest sent to the TransmitGrant (or the transmit timeout).
  LatencyHistogram transmitWait;

  ServerLatencies& operator+=(const ServerLatencies& other) noexcept {
    request += other.request;
    diskRead += other.diskRead;
    transmitWait += other.transmitWait;
    return *this;
  }
};

}  // namespace storage
