#pragma once
#include <coio/core/result.hpp>
#include <coio/rdma/device.hpp>

#include <fcntl.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <utility>

namespace coio::rdma {

/// A completion queue with its own completion channel, whose fd a reactor
/// watches (`readable(fd())`), so completions wake the event loop and no
/// thread busy-polls.
///
/// Guarantees:
/// - The channel fd is non-blocking and the CQ is armed at creation, so the
///   very first completion raises an event.
/// - `drain()` never loses a wake-up: it consumes the pending event (if
///   any), polls in batches of 16 until empty, re-arms, and polls again
///   (a completion that landed between the first poll and the re-arm raises
///   no new event; the second poll catches it). The channel therefore holds
///   at most one event per arm, which is what edge-triggered waiting needs.
/// - Events are acknowledged in batches, and all of them before the CQ is
///   destroyed (ibv_destroy_cq requires it).
/// Move-only; use from one thread (the reactor's) at a time. The handler
/// passed to drain() runs on the calling thread.
class CompletionQueue {
 public:
  /// Completions polled per ibv_poll_cq call in drain().
  static constexpr int kPollBatch = 16;

  /// A CQ of `entries` completions; `eventAckBatch` events are acknowledged at a time.
  static Result<CompletionQueue> create(const Device& device, int entries, std::uint32_t eventAckBatch) {
    CompletionQueue q;
    q.ackBatch_ = eventAckBatch;
    q.channel_.reset(::ibv_create_comp_channel(device.context()));
    if (!q.channel_) return systemError(errno ? errno : ENOMEM);
    const int flags = ::fcntl(q.channel_->fd, F_GETFL);
    if (flags < 0 || ::fcntl(q.channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) return systemError(errno);
    q.cq_.reset(::ibv_create_cq(device.context(), entries, nullptr, q.channel_.get(), 0));
    if (!q.cq_) return systemError(errno ? errno : ENOMEM);
    if (int rc = ::ibv_req_notify_cq(q.cq_.get(), 0); rc != 0) return systemError(rc);
    return q;
  }

  /// Takes over `other`'s CQ and channel.
  CompletionQueue(CompletionQueue&& other) noexcept = default;
  CompletionQueue& operator=(CompletionQueue&&) = delete;  // would drop the unacknowledged events
  ~CompletionQueue() {
    if (cq_ && unacked_ > 0) ::ibv_ack_cq_events(cq_.get(), unacked_);
  }

  /// The verbs CQ.
  ibv_cq* get() const noexcept { return cq_.get(); }
  /// The completion channel's fd: readable when an event is pending.
  int fd() const noexcept { return channel_->fd; }

  /// Takes the pending event and calls `onCompletion(const ibv_wc&)` for
  /// every completion (see the class comment for the order of steps): how
  /// many. An error only if the CQ is broken (overrun: impossible when
  /// sized as QueuePairSizes says) or re-arming fails.
  template <typename F>
  Result<std::size_t> drain(F&& onCompletion) {
    ibv_cq* eventCq = nullptr;
    void* eventContext = nullptr;
    // EAGAIN (no event: a spurious wake-up) is fine.
    if (::ibv_get_cq_event(channel_.get(), &eventCq, &eventContext) == 0 && ++unacked_ >= ackBatch_) {
      ::ibv_ack_cq_events(cq_.get(), unacked_);
      unacked_ = 0;
    }
    Result<std::size_t> before = poll(onCompletion);
    if (!before) return before.error();
    if (int rc = ::ibv_req_notify_cq(cq_.get(), 0); rc != 0) return systemError(rc);
    Result<std::size_t> after = poll(onCompletion);
    if (!after) return after.error();
    return *before + *after;
  }

  /// Calls `onCompletion` for every completion there is now, without
  /// touching the channel or the arming: how many. Polling between drains
  /// (while armed) loses nothing: a completion that raised an event is just
  /// not found by the drain that event causes.
  template <typename F>
  Result<std::size_t> poll(F&& onCompletion) {
    ibv_wc wc[kPollBatch];
    std::size_t total = 0;
    for (;;) {
      const int n = ::ibv_poll_cq(cq_.get(), kPollBatch, wc);
      if (n < 0) return systemError(EIO);
      for (int i = 0; i < n; ++i) onCompletion(static_cast<const ibv_wc&>(wc[i]));
      total += static_cast<std::size_t>(n);
      if (n < kPollBatch) return total;
    }
  }

 private:
  CompletionQueue() = default;

  struct DestroyChannel {
    void operator()(ibv_comp_channel* c) const noexcept { ::ibv_destroy_comp_channel(c); }
  };
  struct DestroyCq {
    void operator()(ibv_cq* c) const noexcept { ::ibv_destroy_cq(c); }
  };

  std::uint32_t ackBatch_ = 1;
  std::uint32_t unacked_ = 0;
  // Declared first: the CQ must be destroyed before its channel.
  std::unique_ptr<ibv_comp_channel, DestroyChannel> channel_;
  std::unique_ptr<ibv_cq, DestroyCq> cq_;
};

}  // namespace coio::rdma
