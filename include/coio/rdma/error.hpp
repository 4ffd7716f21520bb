#pragma once
#include <infiniband/verbs.h>

#include <string>
#include <system_error>
#include <type_traits>

namespace coio::rdma {

/// RDMA failures that have no errno equivalent.
enum class RdmaErrc {
  noDevice = 1,    ///< libibverbs lists no RDMA device at all
  noActivePort,    ///< the device(s) have no port in the ACTIVE state
  noGid,           ///< a RoCE port has no usable (non-zero, non-link-local) GID
  deviceTooSmall,  ///< the requested queue-pair capacities exceed the device's limits
  queuePairError,  ///< the queue pair is in the ERROR state (an earlier work request failed)
  notConnected,    ///< the queue pair is not READY yet
  handshake,       ///< the peer's connection parameters are malformed or incompatible
  messageTooLarge, ///< a message exceeds the configured message buffer size
  bufferTooSmall,  ///< recv(): the next message does not fit the caller's buffer (it stays queued)
};

}  // namespace coio::rdma

/// @cond INTERNAL
template <>
struct std::is_error_code_enum<coio::rdma::RdmaErrc> : std::true_type {};
/// @endcond

namespace coio::rdma {

namespace detail {

class RdmaCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "coio.rdma"; }
  std::string message(int ev) const override {
    switch (static_cast<RdmaErrc>(ev)) {
      case RdmaErrc::noDevice:
        return "no RDMA device found (libibverbs lists none): use the TCP transport (coio::TcpStream), "
               "or create a Soft-RoCE device (modprobe rdma_rxe; rdma link add rxe0 type rxe netdev <if>)";
      case RdmaErrc::noActivePort: return "no RDMA port is ACTIVE (check the link, or the netdev under Soft-RoCE)";
      case RdmaErrc::noGid: return "the RoCE port has no usable GID (assign an IP address to its netdev)";
      case RdmaErrc::deviceTooSmall: return "the requested queue-pair capacities exceed the RDMA device's limits";
      case RdmaErrc::queuePairError: return "the RDMA queue pair is in the ERROR state";
      case RdmaErrc::notConnected: return "the RDMA queue pair is not connected";
      case RdmaErrc::handshake: return "the RDMA peer sent malformed or incompatible connection parameters";
      case RdmaErrc::messageTooLarge: return "the message exceeds the queue pair's message buffer size";
      case RdmaErrc::bufferTooSmall: return "the next message does not fit the receive buffer";
    }
    return "unknown coio.rdma error";
  }
};

// Work-completion statuses (ibv_wc_status) as error codes.
class CompletionCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "coio.rdma.wc"; }
  std::string message(int ev) const override { return ::ibv_wc_status_str(static_cast<ibv_wc_status>(ev)); }
};

}  // namespace detail

/// The error category of RdmaErrc.
inline const std::error_category& rdmaCategory() noexcept {
  static const detail::RdmaCategory category;
  return category;
}

/// The error category of failed work completions (ibv_wc_status values); see completionError().
inline const std::error_category& completionCategory() noexcept {
  static const detail::CompletionCategory category;
  return category;
}

/// Makes RdmaErrc usable as a std::error_code (found by ADL).
inline std::error_code make_error_code(RdmaErrc e) noexcept {  // NOLINT: found by ADL
  return {static_cast<int>(e), rdmaCategory()};
}

/// A failed work completion's status, e.g. IBV_WC_REM_ACCESS_ERR for a bad
/// rkey, IBV_WC_RETRY_EXC_ERR when the peer is gone, IBV_WC_WR_FLUSH_ERR for
/// work flushed after the queue pair entered the ERROR state.
inline std::error_code completionError(ibv_wc_status status) noexcept {
  return {static_cast<int>(status), completionCategory()};
}

}  // namespace coio::rdma
