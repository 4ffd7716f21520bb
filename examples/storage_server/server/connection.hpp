#pragma once
// One connection a StorageServer serves: the requests in flight and those
// waiting for their TransmitGrant, the sends that answer them (the response
// sender, tracked for the send deadline), and the deadlines that end it
// (a stalled frame, idleness, sends that make no progress).
#include "protocol/protocol.hpp"
#include "server/server_options.hpp"
#include "transport/channel.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/event.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/wait_for.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace storage {

template <coio::Reactor R>
struct ServedConnection;

/// A request waiting for its TransmitGrant: the connection's reader finds
/// it by request id while it lives (and sets `arrived`).
template <coio::Reactor R>
struct GrantWait {
  GrantWait(ServedConnection<R>& c, std::uint64_t requestId) : conn(c), id(requestId) { conn.awaiting.emplace(id, this); }
  GrantWait(const GrantWait&) = delete;
  GrantWait& operator=(const GrantWait&) = delete;
  ~GrantWait() { conn.awaiting.erase(id); }
  ServedConnection<R>& conn;
  std::uint64_t id;
  coio::Event arrived;
  bool granted = false;
};

/// Why enforceDeadlines() stopped a connection.
enum class ConnectionExpiry { none, frame, idle, send };

/// One connection a StorageServer serves: its channel and stop, the
/// requests in flight and those waiting for a grant, and its sends (the
/// response sender), watched by its deadlines.
template <coio::Reactor R>
struct ServedConnection {
  explicit ServedConnection(std::unique_ptr<Channel<R>> c)
      : channel(std::move(c)), idleSince(channel->reactor().now()) {}
  std::unique_ptr<Channel<R>> channel;
  std::stop_source stop;  // cancels the reader and every request
  std::chrono::steady_clock::time_point idleSince;  // inFlight last emptied (reactor.now(), as every time here)
  ConnectionExpiry expired = ConnectionExpiry::none;  // why enforceDeadlines() stopped it
  std::size_t sendsPending = 0;   // sends started and not finished (sendTracked)
  std::uint64_t sendsDone = 0;    // sends finished: enforceDeadlines sees progress by it
  coio::AsyncScope requests;
  std::unordered_set<std::uint64_t> inFlight;               // request ids being served
  std::unordered_map<std::uint64_t, GrantWait<R>*> awaiting;   // ... of which these wait for a grant
  std::deque<std::uint64_t> ignoredGrants;                  // recent ids answered without their grant

  // Stops the connection once a frame has taken frameTimeout since its
  // first byte, once it has had nothing in flight for idleTimeout, or once
  // its sends have made no progress (none finished while some were
  // pending) for sendTimeout: a client that stops reading must not pin
  // buffers. It wakes at least every min(frameTimeout, idleTimeout,
  // sendTimeout / 4), so that a deadline set while it sleeps (never sooner
  // than that from now) is not missed, and a stalled send is seen within
  // 1.25 x sendTimeout: nothing on the request path arms a timer.
  coio::Task<void> enforceDeadlines(R& reactor, const ServerOptions& options) {
    using Clock = std::chrono::steady_clock;
    const Clock::duration tick = std::min({options.frameTimeout, options.idleTimeout, options.sendTimeout / 4});
    std::uint64_t sendsSeen = sendsDone;
    Clock::time_point sendProgress = reactor.now();  // when sends were last seen idle or progressing
    for (;;) {
      const Clock::time_point now = reactor.now();
      if (sendsPending == 0 || sendsDone != sendsSeen) {
        sendsSeen = sendsDone;
        sendProgress = now;
      } else if (now - sendProgress >= options.sendTimeout) {
        expired = ConnectionExpiry::send;
        stop.request_stop();
        co_return;
      }
      Clock::time_point due = Clock::time_point::max();
      ConnectionExpiry expiry = ConnectionExpiry::none;
      if (const std::optional<Clock::time_point> started = channel->frameStartedAt()) {
        due = *started + options.frameTimeout;
        expiry = ConnectionExpiry::frame;
      } else if (inFlight.empty()) {
        due = idleSince + options.idleTimeout;
        expiry = ConnectionExpiry::idle;
      }
      if (now >= due) {
        expired = expiry;
        stop.request_stop();
        co_return;
      }
      const bool slept = co_await reactor.sleepUntil(std::min(due, now + tick), stop.get_token());
      if (!slept) co_return;  // the connection is ending
    }
  }

  coio::Task<void> sendPiece(OutgoingPiece piece) {
    co_await sendTracked([&](std::stop_token token) { return channel->sendData(piece, std::move(token)); });
  }
  coio::Task<void> sendFrame(std::span<const std::byte> frame) {
    co_await sendTracked([&](std::stop_token token) { return channel->send(frame, std::move(token)); });
  }

  // Runs `send(token)` under the connection's stop, watched by
  // enforceDeadlines (no timer of its own: one per piece would cost more
  // than the send). A send that fails ends the connection (a TCP stream cut
  // mid-frame, a QP in error).
  template <typename Send>
  coio::Task<void> sendTracked(Send send) {
    ++sendsPending;
    const coio::Result<void> sent = co_await send(stop.get_token());
    --sendsPending;
    ++sendsDone;
    if (!sent) stop.request_stop();
  }

  // Sends TransmitRequest (a send that fails stops the connection).
  coio::Task<void> askForGrant(std::uint64_t id) {
    std::vector<std::byte> frame;
    proto::encodeEmpty(frame, proto::MessageType::transmitRequest, id);
    co_await sendFrame(frame);
  }

  // Waits up to transmitTimeout for the grant asked for, unless it came
  // already. True if granted; false on timeout (a grant that comes later is
  // then ignored) or when the connection stops.
  coio::Task<bool> awaitGrant(R& reactor, std::chrono::steady_clock::duration transmitTimeout, GrantWait<R>& wait) {
    if (!wait.granted) {
      // The connection's stop ends the wait as a grant would.
      (void)co_await coio::withStopToken(stop.get_token(),
                                         coio::waitFor(reactor, wait.arrived, transmitTimeout));
    }
    if (!wait.granted) ignoreLateGrant(wait.id);
    co_return wait.granted;
  }

  // The request is answered without its grant: should the grant still
  // come, it crossed the response and is ignored, not a protocol error.
  void ignoreLateGrant(std::uint64_t id) {
    if (stop.stop_requested()) return;
    ignoredGrants.push_back(id);
    if (ignoredGrants.size() > kRememberIgnoredGrants) ignoredGrants.pop_front();
  }

  static constexpr std::size_t kRememberIgnoredGrants = 1024;
};

}  // namespace storage
