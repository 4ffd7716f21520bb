// libFuzzer target for the storage protocol decoder: any byte string is fed
// through the same steps the server and client take (header, then the
// payload decoder its type selects). The decoders must reject or accept
// without crashing, reading out of bounds, or allocating beyond the limits;
// whatever they accept must re-encode to the same bytes (so every field,
// an IO's target id and the reserved word after it included, round-trips)
// and stay within the documented ranges.
#include "protocol/protocol.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

using namespace storage::proto;

namespace {

template <typename Message>
void checkRoundTrip(const FrameHeader& h, const Message& msg, std::span<const std::byte> frame) {
  std::vector<std::byte> again;
  encode(again, h.requestId, msg);
  if (again.size() != frame.size() || std::memcmp(again.data(), frame.data(), frame.size()) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  if (bytes.size() < kHeaderSize) {
    if (decodeHeader(bytes)) std::abort();  // a short header is never accepted
    return 0;
  }
  auto header = decodeHeader(bytes.first(kHeaderSize));
  if (!header) return 0;
  const auto rest = bytes.subspan(kHeaderSize);
  if (rest.size() < header->payloadLength) return 0;  // the server would wait for more
  const auto payload = rest.first(header->payloadLength);
  const auto frame = bytes.first(kHeaderSize + header->payloadLength);
  switch (header->type) {
    case MessageType::batchReadRequest:
      if (auto req = decodeBatchReadRequest(payload, kMaxIosPerFrame)) {
        if (payload.size() != 8 + req->ios.size() * kIoSize) std::abort();
        checkRoundTrip(*header, *req, frame);
      }
      break;
    case MessageType::batchReadResponse:
      if (auto resp = decodeBatchReadResponse(payload, kMaxIosPerFrame)) {
        for (const IoResult& r : resp->results) {
          if (r.status < IoStatus::ok || r.status > IoStatus::corrupt) std::abort();
        }
        checkRoundTrip(*header, *resp, frame);
      }
      break;
    case MessageType::error:
      if (auto err = decodeError(payload)) checkRoundTrip(*header, *err, frame);
      break;
    case MessageType::ioData:
      if (auto data = decodeIoData(payload)) checkRoundTrip(*header, *data, frame);
      break;
    case MessageType::transmitRequest:
    case MessageType::transmitGrant:
      break;  // no payload: decodeHeader already insisted on that
  }
  return 0;
}
