#pragma once
#include <coio/core/stamped_ptr.hpp>

#include <cstdint>

namespace coio::rdma::detail {

/// What a work request is; the stamp of its WrId.
enum class WrType : std::uint16_t { send, recv, ack, rdma, rdmaLast, close };

/// A work-request id (`wr_id`): a StampedPtr whose stamp is the WrType and
/// whose pointer field is the operation context (RDMA) or a small integer
/// (recv: buffer index; send: how many sends a signalled completion covers),
/// as 3FS's IBSocket::WRId.
class WrId {
 public:
  static WrId send(std::uint32_t signalCount) noexcept { return WrId{Word::fromValue(signalCount, tag(WrType::send))}; }
  static WrId recv(std::uint32_t bufferIndex) noexcept { return WrId{Word::fromValue(bufferIndex, tag(WrType::recv))}; }
  static WrId ack() noexcept { return WrId{Word::fromValue(0, tag(WrType::ack))}; }
  static WrId close() noexcept { return WrId{Word::fromValue(0, tag(WrType::close))}; }
  static WrId rdma(void* context, bool last) noexcept {
    return WrId{Word::make(context, tag(last ? WrType::rdmaLast : WrType::rdma))};
  }
  static WrId fromRaw(std::uint64_t raw) noexcept { return WrId{Word::fromRaw(raw)}; }

  std::uint64_t raw() const noexcept { return word_.raw(); }
  WrType type() const noexcept { return static_cast<WrType>(word_.stamp()); }
  std::uint32_t signalCount() const noexcept { return static_cast<std::uint32_t>(word_.value()); }
  std::uint32_t bufferIndex() const noexcept { return static_cast<std::uint32_t>(word_.value()); }
  void* context() const noexcept { return word_.ptr(); }

 private:
  using Word = StampedPtr<void>;
  static std::uint16_t tag(WrType t) noexcept { return static_cast<std::uint16_t>(t); }
  explicit WrId(Word w) noexcept : word_(w) {}
  Word word_;
};

/// The 32-bit immediate of a control message (big-endian on the wire, as the
/// verbs API delivers it): the kind in bits 31..24, a count in 23..0.
class Immediate {
 public:
  enum class Kind : std::uint8_t { ack = 0, close = 1 };
  static constexpr std::uint32_t kMaxCount = (1u << 24) - 1;

  static Immediate ack(std::uint32_t count) noexcept { return Immediate{(count & kMaxCount)}; }
  static Immediate close() noexcept { return Immediate{std::uint32_t{1} << 24}; }
  static Immediate fromHost(std::uint32_t host) noexcept { return Immediate{host}; }

  Kind kind() const noexcept { return static_cast<Kind>(host_ >> 24); }
  std::uint32_t count() const noexcept { return host_ & kMaxCount; }
  std::uint32_t host() const noexcept { return host_; }

 private:
  explicit Immediate(std::uint32_t host) noexcept : host_(host) {}
  std::uint32_t host_;
};

}  // namespace coio::rdma::detail
