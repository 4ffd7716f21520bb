#pragma once
#include <cstdint>
#include <string_view>

namespace coio::rdma {

/// The life of a QueuePair (3FS IBSocket's states, without ACCEPTED: our
/// handshake ends with both sides at RTS).
///
///   init -> connecting -> ready -> close
///     \________\____________\---> error -> close
///
/// `close` is final; `error` (a failed completion or post) only moves on to
/// `close`. Work can be posted only in `ready`.
enum class QueuePairState : std::uint8_t { init, connecting, ready, close, error };

/// Whether the state machine allows `from` -> `to`.
constexpr bool canTransition(QueuePairState from, QueuePairState to) noexcept {
  using S = QueuePairState;
  switch (to) {
    case S::init: return false;
    case S::connecting: return from == S::init;
    case S::ready: return from == S::connecting;
    case S::error: return from == S::init || from == S::connecting || from == S::ready;
    case S::close: return from != S::close;
  }
  return false;
}

/// The state's name, for messages.
constexpr std::string_view toString(QueuePairState s) noexcept {
  switch (s) {
    case QueuePairState::init: return "init";
    case QueuePairState::connecting: return "connecting";
    case QueuePairState::ready: return "ready";
    case QueuePairState::close: return "close";
    case QueuePairState::error: return "error";
  }
  return "?";
}

}  // namespace coio::rdma
