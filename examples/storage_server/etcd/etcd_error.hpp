#pragma once
// The errors of the etcd client that are etcd's own (the transport's are
// std::errc / coio::Errc, the HTTP layer's http1::HttpErrc).
#include <string>
#include <system_error>

namespace storage::etcd {

/// What etcd answered (the gRPC status its gateway relays), or what the
/// client made of the answer. The message etcd sent goes to the log and to
/// EtcdClient::lastError().
enum class EtcdErrc {
  badResponse = 1,   ///< a reply that is not JSON, or not the shape the call expects
  httpStatus,        ///< an HTTP status other than 200 without an etcd error in the body
  invalidArgument,   ///< etcd refused the request (gRPC InvalidArgument, e.g. an empty key)
  leaseNotFound,     ///< no such lease: never granted, revoked, or expired
  compacted,         ///< the revision asked for was compacted: events or versions are lost
  futureRevision,    ///< the revision asked for is beyond etcd's current one
  unavailable,       ///< etcd cannot serve now (gRPC Unavailable: no leader, shutting down)
  watchCanceled,     ///< etcd ended a watch for a reason other than compaction
  server,            ///< any other error etcd reported
};

}  // namespace storage::etcd

/// @cond INTERNAL
template <>
struct std::is_error_code_enum<storage::etcd::EtcdErrc> : std::true_type {};
/// @endcond

namespace storage::etcd {

namespace detail {
class EtcdCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "etcd"; }
  std::string message(int ev) const override {
    switch (static_cast<EtcdErrc>(ev)) {
      case EtcdErrc::badResponse: return "etcd reply not understood (not JSON, or not the expected shape)";
      case EtcdErrc::httpStatus: return "etcd gateway answered with an HTTP error status";
      case EtcdErrc::invalidArgument: return "etcd: invalid argument";
      case EtcdErrc::leaseNotFound: return "etcd: lease not found (expired or revoked)";
      case EtcdErrc::compacted: return "etcd: revision compacted (events lost)";
      case EtcdErrc::futureRevision: return "etcd: revision not reached yet";
      case EtcdErrc::unavailable: return "etcd: unavailable";
      case EtcdErrc::watchCanceled: return "etcd: watch canceled by the server";
      case EtcdErrc::server: return "etcd: server error";
    }
    return "unknown etcd error";
  }
};
}  // namespace detail

/// The error category of EtcdErrc ("etcd").
inline const std::error_category& etcdCategory() noexcept {
  static const detail::EtcdCategory category;
  return category;
}

/// Makes EtcdErrc usable as a std::error_code (found by ADL).
inline std::error_code make_error_code(EtcdErrc e) noexcept {  // NOLINT: name fixed by the standard
  return {static_cast<int>(e), etcdCategory()};
}

/// The error for an etcd error reply: its gRPC status code and message
/// (etcd's wording tells compaction from a future revision, both OutOfRange).
inline EtcdErrc errorOfGrpc(long code, const std::string& message) noexcept {
  switch (code) {
    case 3: return EtcdErrc::invalidArgument;
    case 5: return message.find("lease") != std::string::npos ? EtcdErrc::leaseNotFound : EtcdErrc::server;
    case 11:
      if (message.find("compacted") != std::string::npos) return EtcdErrc::compacted;
      if (message.find("future") != std::string::npos) return EtcdErrc::futureRevision;
      return EtcdErrc::server;
    case 14: return EtcdErrc::unavailable;
    default: return EtcdErrc::server;
  }
}

}  // namespace storage::etcd
