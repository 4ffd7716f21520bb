#pragma once
#include <coio/core/result.hpp>
#include <coio/rdma/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace coio::rdma {

/// The capacities and protocol parameters of a QueuePair. Both ends of a
/// connection must use the same message-layer values (messageSize,
/// messageBuffers, ackBatch): the handshake rejects a mismatch, because the
/// credits one side counts are the buffers the other side posted.
struct QueuePairConfig {
  // RDMA READ/WRITE.
  std::uint32_t maxRdmaWr = 128;        ///< RDMA work requests outstanding at once (a BatchSemaphore)
  std::uint32_t maxRdmaWrPerPost = 32;  ///< work requests per ibv_post_send chain (only the last is signalled)
  std::uint32_t maxSge = 16;            ///< local buffers gathered into one work request
  std::uint32_t maxRdAtomic = 16;       ///< outstanding RDMA READs; lowered to what the device allows
  // Messages (SEND/RECV over pre-registered buffers).
  std::uint32_t messageSize = 16 * 1024;  ///< bytes per message buffer (largest message)
  std::uint32_t messageBuffers = 32;      ///< send ring size = receive credits granted to the peer
  std::uint32_t ackBatch = 8;             ///< the receiver returns credits every ackBatch messages consumed
  std::uint32_t signalBatch = 8;          ///< every signalBatch-th send is signalled
  std::uint32_t eventAckBatch = 128;      ///< completion events acknowledged per ibv_ack_cq_events
  /// Adaptive polling: after completions were found, the completion watcher
  /// yields to the loop (the coroutines it resumed run, the loop polls its
  /// other I/O without waiting) and polls the CQ again, up to this many
  /// times in a row without finding any, before it sleeps on the completion
  /// channel. Saves the channel's wake-up path (event read, re-arm, the
  /// loop's wait) under a steady stream of completions, at the price of
  /// that many empty loop iterations after each burst; an idle queue pair
  /// costs nothing. 0: always sleep. 16 measured +10-15 % message rate on
  /// one reactor thread and +50 % with sender and receiver on two
  /// (docs/benchmarks.md); storage over RDMA unchanged.
  std::uint32_t pollBeforeSleep = 16;
  /// Within each of those iterations, an empty CQ is polled up to this
  /// many more times in a row before the watcher yields: a poll reads user
  /// memory, a loop iteration costs a system call (the reactor's
  /// non-blocking wait). Bounds the time other coroutines on the thread
  /// wait, to spinPolls CQ polls per iteration. 0: one poll per iteration.
  /// 16 measured +17 % message rate with sender and receiver on two
  /// threads, 64 and 256 no better (docs/benchmarks.md).
  std::uint32_t spinPolls = 16;
  // Transport (RTR/RTS attributes). Work the peer does not acknowledge
  // (its process died, its QP was aborted, the path is down) is sent
  // retryCount + 1 times, one ACK timeout each, then fails with
  // IBV_WC_RETRY_EXC_ERR: see transportFailureBound() (defaults: ~0.47 s).
  /// Local ACK timeout: 4.096 us * 2^timeout per try (14: ~67 ms). 0 means
  /// no timer: unacknowledged work is never retried nor failed.
  std::uint8_t timeout = 14;
  /// Transport retries before IBV_WC_RETRY_EXC_ERR (0-7). Not 7 by default:
  /// Soft-RoCE (rxe) retries forever at 7 (its completer never counts a 7
  /// down), so work sent to a dead peer would never fail there, and close()
  /// would wait out drainTimeout; hardware that follows the spec retries 7
  /// times. 6 costs one try (~67 ms) of tolerance on hardware.
  std::uint8_t retryCount = 6;
  /// RNR policy: the credit scheme guarantees a posted receive for every
  /// SEND, so by default an RNR NAK is not retried (0) and surfaces as
  /// IBV_WC_RNR_RETRY_EXC_ERR: a bug made visible instead of a silent stall.
  std::uint8_t rnrRetry = 0;
  std::uint8_t minRnrTimer = 12;  ///< 0.64 ms; only matters when rnrRetry > 0
  /// close(): how long posted work may take to finish. Work to a dead peer
  /// fails sooner, within transportFailureBound(); this bounds the rest
  /// (a peer that acknowledges but is slow, a device that stops completing).
  std::chrono::milliseconds drainTimeout{5000};
};

/// How long, nominally, work sent to a peer that stopped answering (its
/// process died, its QP was aborted, the path is down) is retried before
/// it fails with IBV_WC_RETRY_EXC_ERR, counted from the peer's last answer
/// or the post, whichever is later: retryCount + 1 tries of one ACK timeout,
/// (retryCount + 1) * 4.096 us * 2^timeout. The defaults: 7 * 67 ms =
/// 0.47 s. The queue pair then enters `error`: the first unacknowledged
/// work request fails with IBV_WC_RETRY_EXC_ERR, the rest are flushed.
/// Providers round each timeout up to their timer's tick (rxe: a kernel
/// jiffy, 4 ms at HZ=250: noticeable only for small timeouts), and a
/// device may wait longer than asked (some enforce a minimum timeout).
/// std::nullopt where a provider coio supports never gives up: timeout 0
/// (no ACK timer anywhere) or retryCount 7 (rxe retries forever).
inline std::optional<std::chrono::microseconds> transportFailureBound(const QueuePairConfig& c) noexcept {
  if (c.timeout == 0 || c.timeout > 31 || c.retryCount >= 7) return std::nullopt;
  const std::uint64_t nanosPerTry = std::uint64_t{4096} << c.timeout;  // < 2^44: no overflow below
  return std::chrono::microseconds((std::uint64_t{c.retryCount} + 1) * nanosPerTry / 1000);
}

/// The device limits a QueuePairConfig is checked against (from
/// ibv_query_device / ibv_query_port).
struct DeviceLimits {
  /// Work requests per queue (max_qp_wr).
  std::uint32_t maxQpWr = 0;
  /// Scatter/gather elements per work request (max_sge).
  std::uint32_t maxSge = 0;
  /// Completions per CQ (max_cqe).
  std::uint32_t maxCqe = 0;
  std::uint32_t maxQpRdAtom = 0;      ///< as responder
  std::uint32_t maxQpInitRdAtom = 0;  ///< as initiator
  std::uint64_t maxMsgSize = 0;       ///< of the port
};

/// Queue sizes derived from a config. By construction nothing can overflow:
/// the send queue holds every RDMA work request the semaphore admits, every
/// send buffer, every ACK that may be in flight and the CLOSE; the receive
/// queue holds a buffer for every message the peer may send (its credits),
/// every ACK it may send and its CLOSE; the CQ holds both queues.
struct QueuePairSizes {
  // 64-bit: absurd configs must fail the limit checks, not wrap around.
  std::uint64_t ackSlots;     ///< ACKs that can be outstanding: messageBuffers / ackBatch + 1
  std::uint64_t recvBuffers;  ///< posted receives: messageBuffers + ackSlots + 1 (close)
  std::uint64_t maxSendWr;    ///< maxRdmaWr + messageBuffers + ackSlots + 1 (close)
  std::uint64_t maxRecvWr;    ///< recvBuffers
  std::uint64_t cqe;          ///< maxSendWr + maxRecvWr

  /// The sizes `c` needs.
  static QueuePairSizes of(const QueuePairConfig& c) noexcept {
    QueuePairSizes s{};
    const std::uint64_t buffers = c.messageBuffers;
    s.ackSlots = c.ackBatch == 0 ? 1 : buffers / c.ackBatch + 1;
    s.recvBuffers = buffers + s.ackSlots + 1;
    s.maxSendWr = std::uint64_t{c.maxRdmaWr} + buffers + s.ackSlots + 1;
    s.maxRecvWr = s.recvBuffers;
    s.cqe = s.maxSendWr + s.maxRecvWr;
    return s;
  }
};

/// Checks `config` for consistency and against `limits`. On failure returns
/// Errc::invalidArgument (inconsistent config) or RdmaErrc::deviceTooSmall,
/// and says which value is at fault in `why` (if given).
inline Result<void> checkConfig(const QueuePairConfig& c, const DeviceLimits& limits, std::string* why = nullptr) {
  const auto fail = [why](std::error_code ec, std::string text) -> Result<void> {
    if (why) *why = std::move(text);
    return ec;
  };
  const auto num = [](std::uint64_t v) { return std::to_string(v); };
  const std::error_code bad = make_error_code(Errc::invalidArgument);
  const std::error_code small = make_error_code(RdmaErrc::deviceTooSmall);
  if (c.maxRdmaWr == 0 || c.maxRdmaWrPerPost == 0 || c.maxSge == 0 || c.messageBuffers == 0 || c.messageSize == 0 ||
      c.ackBatch == 0 || c.signalBatch == 0 || c.eventAckBatch == 0) {
    return fail(bad, "every count in QueuePairConfig must be positive");
  }
  if (c.maxRdmaWrPerPost > c.maxRdmaWr) {
    return fail(bad, "maxRdmaWrPerPost " + num(c.maxRdmaWrPerPost) + " > maxRdmaWr " + num(c.maxRdmaWr));
  }
  // Credits come back every ackBatch messages; a batch larger than the
  // credits would never be completed and the sender would wait forever.
  if (c.ackBatch > c.messageBuffers || c.signalBatch > c.messageBuffers) {
    return fail(bad, "ackBatch and signalBatch must not exceed messageBuffers " + num(c.messageBuffers));
  }
  if (c.timeout > 31 || c.retryCount > 7 || c.rnrRetry > 7 || c.minRnrTimer > 31) {
    return fail(bad, "timeout/minRnrTimer must be <= 31, retryCount/rnrRetry <= 7");
  }
  const QueuePairSizes s = QueuePairSizes::of(c);
  if (c.maxSge > limits.maxSge) return fail(small, "maxSge " + num(c.maxSge) + " > device max_sge " + num(limits.maxSge));
  if (s.maxSendWr > limits.maxQpWr || s.maxRecvWr > limits.maxQpWr) {
    return fail(small, "send queue " + num(s.maxSendWr) + " / receive queue " + num(s.maxRecvWr) +
                           " work requests > device max_qp_wr " + num(limits.maxQpWr));
  }
  if (s.cqe > limits.maxCqe) return fail(small, "CQ of " + num(s.cqe) + " > device max_cqe " + num(limits.maxCqe));
  if (c.messageSize > limits.maxMsgSize) {
    return fail(small, "messageSize " + num(c.messageSize) + " > port max_msg_sz " + num(limits.maxMsgSize));
  }
  return {};
}

}  // namespace coio::rdma
