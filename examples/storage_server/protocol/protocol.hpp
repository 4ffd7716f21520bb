#pragma once
// The storage server's wire format (PROTOCOL.md is the normative text):
// length-prefixed little-endian frames, every length bounded, decoded
// without trusting a single byte.
#include <coio/core/result.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace storage::proto {

inline constexpr std::uint32_t kMagic = 0x4F494F43;  // the bytes "COIO"
inline constexpr std::uint16_t kVersion = 5;
inline constexpr std::size_t kHeaderSize = 24;
inline constexpr std::uint32_t kMaxPayload = 1u << 20;  // control payloads; data travels outside frames
inline constexpr std::size_t kIoSize = 40;              // one ReadIo on the wire
inline constexpr std::size_t kResultSize = 16;          // one IoResult on the wire
inline constexpr std::uint32_t kIoDataPayload = 16;     // an IoData frame's payload (its data follows it)
inline constexpr std::size_t kMaxErrorMessage = 1024;
inline constexpr std::uint32_t kMaxIosPerFrame = (kMaxPayload - 8) / kIoSize;  // what a payload can hold
inline constexpr std::uint8_t kGrantedFlag = 1;  // BatchReadRequest flags: transmission granted with the request

enum class MessageType : std::uint16_t {
  batchReadRequest = 1,
  transmitRequest = 2,  // server -> client: may I send this request's data?
  transmitGrant = 3,    // client -> server: yes
  batchReadResponse = 4,  // a request's last frame
  error = 5,              // then the sender closes the connection
  ioData = 6,             // server -> client, TCP: one piece of an IO's data follows the frame
};

enum class ChecksumMode : std::uint8_t { none = 0, crc32c = 1 };

/// Per-IO outcome in a BatchReadResponse.
enum class IoStatus : std::int32_t {
  ok = 0,
  chunkNotFound = 1,
  rangeOutsideChunk = 2,  // offset + length beyond the chunk
  bufferTooSmall = 3,     // length > the client's remote buffer
  ioError = 4,            // the disk read failed
  batchTooLarge = 5,      // the batch exceeds the server's IO count or byte limits
  timedOut = 6,           // the client never granted transmission
  internalError = 7,
  unavailable = 8,        // the server is shutting down: nothing was read, ask another replica
  targetNotFound = 9,     // the server serves no target of that id
  staleRouting = 10,      // the IO's chainVersion is older than the server's: nothing was read, refresh the routing
  corrupt = 11,           // a block the IO read failed its stored CRC: nothing more was sent, read another replica
};

/// The status's name, as PROTOCOL.md writes it ("ok", "staleRouting", ...);
/// "unknown" for a value outside the table.
constexpr const char* toString(IoStatus status) noexcept {
  switch (status) {
    case IoStatus::ok: return "ok";
    case IoStatus::chunkNotFound: return "chunkNotFound";
    case IoStatus::rangeOutsideChunk: return "rangeOutsideChunk";
    case IoStatus::bufferTooSmall: return "bufferTooSmall";
    case IoStatus::ioError: return "ioError";
    case IoStatus::batchTooLarge: return "batchTooLarge";
    case IoStatus::timedOut: return "timedOut";
    case IoStatus::internalError: return "internalError";
    case IoStatus::unavailable: return "unavailable";
    case IoStatus::targetNotFound: return "targetNotFound";
    case IoStatus::staleRouting: return "staleRouting";
    case IoStatus::corrupt: return "corrupt";
  }
  return "unknown";
}

/// Why a frame was rejected; carried in Error frames.
enum class ProtocolErrc {
  badMagic = 1,
  unsupportedVersion,
  unknownType,
  payloadTooLarge,
  truncated,       // the payload is shorter than its own counts require
  trailingBytes,   // ... or longer
  reservedNotZero,
  badChecksumMode,
  badStatus,
  tooManyIos,
  unexpectedMessage,  // a valid frame that is not allowed at this point
  tooManyRequests,    // more requests in flight on the connection than the server allows
  frameTimeout,       // a frame (or an RDMA handshake) stalled past the deadline after its first byte
  idleTimeout,        // nothing in flight for longer than the idle timeout: a routine close
};

struct FrameHeader {
  MessageType type;
  std::uint64_t requestId;
  std::uint32_t payloadLength;
};

struct RemoteBuffer {
  std::uint64_t addr = 0;
  std::uint32_t length = 0;
  std::uint32_t rkey = 0;
  friend bool operator==(const RemoteBuffer&, const RemoteBuffer&) = default;
};

struct ReadIo {
  std::uint64_t chunkId = 0;
  std::uint32_t offset = 0;
  std::uint32_t length = 0;
  RemoteBuffer remote;  // RDMA only; zero over TCP
  std::uint32_t targetId = 0;  // which of the server's targets holds the chunk (first on the wire)
  /// The version of the target's chain in the routing the client chose
  /// the target with; 0: no routing (never stale).
  std::uint32_t chainVersion = 0;
  friend bool operator==(const ReadIo&, const ReadIo&) = default;
};

struct BatchReadRequest {
  ChecksumMode checksum = ChecksumMode::none;
  bool granted = false;  // transmission granted with the request: no TransmitRequest
  std::vector<ReadIo> ios;
};

/// An IoData frame: `length` bytes of IO `ioIndex`, starting `offset`
/// bytes into its requested range, follow the frame on the stream.
struct IoData {
  std::uint32_t ioIndex = 0;
  std::uint32_t offset = 0;
  std::uint32_t length = 0;
  friend bool operator==(const IoData&, const IoData&) = default;
};

struct IoResult {
  IoStatus status = IoStatus::ok;
  std::uint32_t bytes = 0;
  std::uint32_t checksum = 0;  // CRC32C of the bytes sent, when asked for
  friend bool operator==(const IoResult&, const IoResult&) = default;
};

struct BatchReadResponse {
  std::vector<IoResult> results;
};

struct ErrorFrame {
  ProtocolErrc code;
  std::string message;
};

const std::error_category& protocolCategory() noexcept;
inline std::error_code make_error_code(ProtocolErrc e) noexcept {  // NOLINT: ADL name fixed by the standard
  return {static_cast<int>(e), protocolCategory()};
}

}  // namespace storage::proto

template <>
struct std::is_error_code_enum<storage::proto::ProtocolErrc> : std::true_type {};

namespace storage::proto {

namespace detail {

class CategoryImpl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "storage-protocol"; }
  std::string message(int ev) const override {
    switch (static_cast<ProtocolErrc>(ev)) {
      case ProtocolErrc::badMagic: return "bad magic: not a coio storage frame";
      case ProtocolErrc::unsupportedVersion: return "unsupported protocol version";
      case ProtocolErrc::unknownType: return "unknown message type";
      case ProtocolErrc::payloadTooLarge: return "payload length above the limit";
      case ProtocolErrc::truncated: return "payload shorter than its counts require";
      case ProtocolErrc::trailingBytes: return "payload longer than its counts require";
      case ProtocolErrc::reservedNotZero: return "reserved field not zero";
      case ProtocolErrc::badChecksumMode: return "unknown checksum mode";
      case ProtocolErrc::badStatus: return "unknown IO status";
      case ProtocolErrc::tooManyIos: return "more IOs than the limit";
      case ProtocolErrc::unexpectedMessage: return "message not expected here";
      case ProtocolErrc::tooManyRequests: return "too many requests in flight on this connection";
      case ProtocolErrc::frameTimeout: return "frame not completed within the deadline";
      case ProtocolErrc::idleTimeout: return "connection idle for longer than the idle timeout";
    }
    return "unknown protocol error";
  }
};

// Little-endian writer and bounds-checked reader.
class Writer {
 public:
  explicit Writer(std::vector<std::byte>& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<std::byte>((u >> (8 * i)) & 0xFF));
  }
  void putBytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::size_t size() const { return out_.size(); }
  void patch32(std::size_t at, std::uint32_t v) {
    for (std::size_t i = 0; i < 4; ++i) out_[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
  }

 private:
  std::vector<std::byte>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  T get() {  // callers check remaining() first
    std::make_unsigned_t<T> u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) u |= static_cast<decltype(u)>(static_cast<std::uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }
  std::span<const std::byte> getBytes(std::size_t n) {
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  std::size_t remaining() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

// Writes a header with a placeholder length; returns where the payload starts.
inline std::size_t beginFrame(Writer& w, MessageType type, std::uint64_t requestId) {
  w.put(kMagic);
  w.put(kVersion);
  w.put(static_cast<std::uint16_t>(type));
  w.put(requestId);
  w.put(std::uint32_t{0});  // payload length, patched by endFrame
  w.put(std::uint32_t{0});  // reserved
  return w.size();
}
inline void endFrame(Writer& w, std::size_t payloadStart) {
  w.patch32(payloadStart - 8, static_cast<std::uint32_t>(w.size() - payloadStart));
}

// The exact payload size a count implies, or the error for `have` bytes.
inline coio::Result<void> expectSize(std::size_t have, std::size_t want) {
  if (have < want) return ProtocolErrc::truncated;
  if (have > want) return ProtocolErrc::trailingBytes;
  return {};
}

}  // namespace detail

inline const std::error_category& protocolCategory() noexcept {
  static const detail::CategoryImpl category;
  return category;
}

inline void encode(std::vector<std::byte>& out, std::uint64_t requestId, const BatchReadRequest& req) {
  detail::Writer w(out);
  const std::size_t start = detail::beginFrame(w, MessageType::batchReadRequest, requestId);
  w.put(static_cast<std::uint8_t>(req.checksum));
  w.put(static_cast<std::uint8_t>(req.granted ? kGrantedFlag : 0));
  w.put(std::uint16_t{0});
  w.put(static_cast<std::uint32_t>(req.ios.size()));
  for (const ReadIo& io : req.ios) {
    w.put(io.targetId);
    w.put(io.chainVersion);
    w.put(io.chunkId);
    w.put(io.offset);
    w.put(io.length);
    w.put(io.remote.addr);
    w.put(io.remote.length);
    w.put(io.remote.rkey);
  }
  detail::endFrame(w, start);
}

inline void encode(std::vector<std::byte>& out, std::uint64_t requestId, const BatchReadResponse& resp) {
  detail::Writer w(out);
  const std::size_t start = detail::beginFrame(w, MessageType::batchReadResponse, requestId);
  w.put(static_cast<std::uint32_t>(resp.results.size()));
  w.put(std::uint32_t{0});
  for (const IoResult& r : resp.results) {
    w.put(static_cast<std::int32_t>(r.status));
    w.put(r.bytes);
    w.put(r.checksum);
    w.put(std::uint32_t{0});
  }
  detail::endFrame(w, start);
}

inline void encode(std::vector<std::byte>& out, std::uint64_t requestId, const IoData& data) {
  detail::Writer w(out);
  const std::size_t start = detail::beginFrame(w, MessageType::ioData, requestId);
  w.put(data.ioIndex);
  w.put(data.offset);
  w.put(data.length);
  w.put(std::uint32_t{0});
  detail::endFrame(w, start);
}

inline void encode(std::vector<std::byte>& out, std::uint64_t requestId, const ErrorFrame& err) {
  detail::Writer w(out);
  const std::size_t start = detail::beginFrame(w, MessageType::error, requestId);
  const std::size_t n = std::min(err.message.size(), kMaxErrorMessage);
  w.put(static_cast<std::uint32_t>(err.code));
  w.put(static_cast<std::uint16_t>(n));
  w.put(std::uint16_t{0});
  w.putBytes(std::as_bytes(std::span(err.message.data(), n)));
  detail::endFrame(w, start);
}

/// TransmitRequest and TransmitGrant carry nothing but the request id.
inline void encodeEmpty(std::vector<std::byte>& out, MessageType type, std::uint64_t requestId) {
  detail::Writer w(out);
  detail::endFrame(w, detail::beginFrame(w, type, requestId));
}

inline coio::Result<FrameHeader> decodeHeader(std::span<const std::byte> bytes) {
  if (bytes.size() != kHeaderSize) return ProtocolErrc::truncated;
  detail::Reader r(bytes);
  if (r.get<std::uint32_t>() != kMagic) return ProtocolErrc::badMagic;
  if (r.get<std::uint16_t>() != kVersion) return ProtocolErrc::unsupportedVersion;
  const auto type = r.get<std::uint16_t>();
  if (type < 1 || type > static_cast<std::uint16_t>(MessageType::ioData)) return ProtocolErrc::unknownType;
  FrameHeader h{static_cast<MessageType>(type), r.get<std::uint64_t>(), r.get<std::uint32_t>()};
  if (r.get<std::uint32_t>() != 0) return ProtocolErrc::reservedNotZero;
  if (h.payloadLength > kMaxPayload) return ProtocolErrc::payloadTooLarge;
  const bool empty = h.type == MessageType::transmitRequest || h.type == MessageType::transmitGrant;
  if (empty && h.payloadLength != 0) return ProtocolErrc::trailingBytes;
  if (h.type == MessageType::ioData) {
    if (auto ok = detail::expectSize(h.payloadLength, kIoDataPayload); !ok) return ok.error();
  }
  return h;
}

inline coio::Result<BatchReadRequest> decodeBatchReadRequest(std::span<const std::byte> payload, std::uint32_t maxIos) {
  if (payload.size() < 8) return ProtocolErrc::truncated;
  detail::Reader r(payload);
  BatchReadRequest req;
  const auto mode = r.get<std::uint8_t>();
  if (mode > 1) return ProtocolErrc::badChecksumMode;
  req.checksum = static_cast<ChecksumMode>(mode);
  const auto flags = r.get<std::uint8_t>();
  if ((flags & ~kGrantedFlag) != 0 || r.get<std::uint16_t>() != 0) return ProtocolErrc::reservedNotZero;
  req.granted = (flags & kGrantedFlag) != 0;
  const auto count = r.get<std::uint32_t>();
  if (count > maxIos) return ProtocolErrc::tooManyIos;
  if (auto ok = detail::expectSize(r.remaining(), std::size_t{count} * kIoSize); !ok) return ok.error();
  req.ios.resize(count);
  for (ReadIo& io : req.ios) {
    io.targetId = r.get<std::uint32_t>();
    io.chainVersion = r.get<std::uint32_t>();
    io.chunkId = r.get<std::uint64_t>();
    io.offset = r.get<std::uint32_t>();
    io.length = r.get<std::uint32_t>();
    io.remote.addr = r.get<std::uint64_t>();
    io.remote.length = r.get<std::uint32_t>();
    io.remote.rkey = r.get<std::uint32_t>();
  }
  return req;
}

inline coio::Result<BatchReadResponse> decodeBatchReadResponse(std::span<const std::byte> payload, std::uint32_t maxIos) {
  if (payload.size() < 8) return ProtocolErrc::truncated;
  detail::Reader r(payload);
  const auto count = r.get<std::uint32_t>();
  if (r.get<std::uint32_t>() != 0) return ProtocolErrc::reservedNotZero;
  if (count > maxIos) return ProtocolErrc::tooManyIos;
  if (auto ok = detail::expectSize(r.remaining(), std::size_t{count} * kResultSize); !ok) return ok.error();
  BatchReadResponse resp;
  resp.results.resize(count);
  for (IoResult& res : resp.results) {
    const auto status = r.get<std::int32_t>();
    if (status < 0 || status > static_cast<std::int32_t>(IoStatus::corrupt)) return ProtocolErrc::badStatus;
    res.status = static_cast<IoStatus>(status);
    res.bytes = r.get<std::uint32_t>();
    res.checksum = r.get<std::uint32_t>();
    if (r.get<std::uint32_t>() != 0) return ProtocolErrc::reservedNotZero;
  }
  return resp;
}

inline coio::Result<IoData> decodeIoData(std::span<const std::byte> payload) {
  if (auto ok = detail::expectSize(payload.size(), kIoDataPayload); !ok) return ok.error();
  detail::Reader r(payload);
  IoData data{r.get<std::uint32_t>(), r.get<std::uint32_t>(), r.get<std::uint32_t>()};
  if (r.get<std::uint32_t>() != 0) return ProtocolErrc::reservedNotZero;
  return data;
}

inline coio::Result<ErrorFrame> decodeError(std::span<const std::byte> payload) {
  if (payload.size() < 8) return ProtocolErrc::truncated;
  detail::Reader r(payload);
  ErrorFrame err{static_cast<ProtocolErrc>(r.get<std::uint32_t>()), {}};
  const auto n = r.get<std::uint16_t>();
  if (r.get<std::uint16_t>() != 0) return ProtocolErrc::reservedNotZero;
  if (n > kMaxErrorMessage) return ProtocolErrc::payloadTooLarge;
  if (auto ok = detail::expectSize(r.remaining(), n); !ok) return ok.error();
  const auto text = r.getBytes(n);
  err.message.assign(reinterpret_cast<const char*>(text.data()), text.size());
  return err;
}

}  // namespace storage::proto
