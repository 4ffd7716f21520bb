#include "protocol/protocol.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

using namespace storage::proto;

namespace {

std::span<const std::byte> payloadOf(const std::vector<std::byte>& frame) {
  return std::span(frame).subspan(kHeaderSize);
}

BatchReadRequest sampleRequest(std::size_t n) {
  BatchReadRequest req;
  req.checksum = ChecksumMode::crc32c;
  for (std::size_t i = 0; i < n; ++i) {
    req.ios.push_back({i * 7, static_cast<std::uint32_t>(i * 4096), 4096,
                       {0x7f00'0000'0000 + i, 8192, static_cast<std::uint32_t>(0xABC0 + i)},
                       static_cast<std::uint32_t>(100 + i)});
  }
  return req;
}

}  // namespace

TEST_CASE("A BatchReadRequest round-trips through the wire format", "[protocol]") {
  std::vector<std::byte> frame;
  encode(frame, 42, sampleRequest(3));
  REQUIRE(frame.size() == kHeaderSize + 8 + 3 * kIoSize);
  auto header = decodeHeader(std::span(frame).first(kHeaderSize));
  REQUIRE(header);
  CHECK(header->type == MessageType::batchReadRequest);
  CHECK(header->requestId == 42);
  CHECK(header->payloadLength == 8 + 3 * kIoSize);
  auto req = decodeBatchReadRequest(payloadOf(frame), 256);
  REQUIRE(req);
  CHECK(req->checksum == ChecksumMode::crc32c);
  CHECK(req->ios == sampleRequest(3).ios);
}

TEST_CASE("The header is little-endian with the documented layout", "[protocol]") {
  std::vector<std::byte> frame;
  encodeEmpty(frame, MessageType::transmitGrant, 0x0102030405060708);
  REQUIRE(frame.size() == kHeaderSize);
  const unsigned char expected[kHeaderSize] = {'C', 'O', 'I', 'O', 5, 0, 3, 0, 8, 7, 6, 5, 4, 3, 2, 1,
                                               0,   0,   0,   0,   0, 0, 0, 0};
  CHECK(std::memcmp(frame.data(), expected, kHeaderSize) == 0);
}

TEST_CASE("Responses and error frames round-trip", "[protocol]") {
  BatchReadResponse resp;
  resp.results = {{IoStatus::ok, 4096, 0xDEADBEEF}, {IoStatus::rangeOutsideChunk, 0, 0}};
  std::vector<std::byte> frame;
  encode(frame, 7, resp);
  auto back = decodeBatchReadResponse(payloadOf(frame), 256);
  REQUIRE(back);
  CHECK(back->results == resp.results);

  frame.clear();
  encode(frame, 9, ErrorFrame{ProtocolErrc::unknownType, "unknown message type 77"});
  auto err = decodeError(payloadOf(frame));
  REQUIRE(err);
  CHECK(err->code == ProtocolErrc::unknownType);
  CHECK(err->message == "unknown message type 77");
}

TEST_CASE("Every truncation and every extension of a valid payload is rejected", "[protocol]") {
  std::vector<std::byte> frame;
  encode(frame, 1, sampleRequest(4));
  const auto payload = payloadOf(frame);
  for (std::size_t n = 0; n < payload.size(); ++n) {
    auto r = decodeBatchReadRequest(payload.first(n), 256);
    REQUIRE_FALSE(r);
    CHECK(r.error() == ProtocolErrc::truncated);
  }
  std::vector<std::byte> longer(payload.begin(), payload.end());
  longer.push_back(std::byte{0});
  CHECK(decodeBatchReadRequest(longer, 256).error() == ProtocolErrc::trailingBytes);
}

TEST_CASE("Bad headers are rejected with a reason", "[protocol]") {
  std::vector<std::byte> frame;
  encodeEmpty(frame, MessageType::transmitRequest, 1);
  auto corrupt = [&](std::size_t at, std::uint8_t value) {
    auto copy = frame;
    copy[at] = std::byte{value};
    return decodeHeader(copy).error();
  };
  CHECK(corrupt(0, 'X') == ProtocolErrc::badMagic);
  CHECK(corrupt(4, 1) == ProtocolErrc::unsupportedVersion);  // a version 1 peer
  CHECK(corrupt(4, 2) == ProtocolErrc::unsupportedVersion);  // a version 2 peer: its IOs name no target
  CHECK(corrupt(4, 3) == ProtocolErrc::unsupportedVersion);  // a version 3 peer: its IOs carry no chain version
  CHECK(corrupt(4, 4) == ProtocolErrc::unsupportedVersion);  // a version 4 peer: it knows no `corrupt` status
  CHECK(corrupt(4, 6) == ProtocolErrc::unsupportedVersion);
  CHECK(corrupt(6, 0) == ProtocolErrc::unknownType);
  CHECK(corrupt(6, 77) == ProtocolErrc::unknownType);
  CHECK(corrupt(20, 1) == ProtocolErrc::reservedNotZero);
  CHECK(corrupt(16, 1) == ProtocolErrc::trailingBytes);  // a grant carries no payload
  CHECK(corrupt(19, 0xFF) == ProtocolErrc::payloadTooLarge);  // ~4 GiB: absurd
  CHECK(decodeHeader(std::span(frame).first(10)).error() == ProtocolErrc::truncated);
  CHECK(std::error_code(ProtocolErrc::badMagic).message().find("magic") != std::string::npos);
}

TEST_CASE("Request bodies: IO count limit, checksum mode and reserved bytes are checked", "[protocol]") {
  std::vector<std::byte> frame;
  encode(frame, 1, sampleRequest(5));
  CHECK(decodeBatchReadRequest(payloadOf(frame), 4).error() == ProtocolErrc::tooManyIos);
  auto copy = frame;
  copy[kHeaderSize] = std::byte{9};
  CHECK(decodeBatchReadRequest(payloadOf(copy), 256).error() == ProtocolErrc::badChecksumMode);
  copy = frame;
  copy[kHeaderSize + 2] = std::byte{1};
  CHECK(decodeBatchReadRequest(payloadOf(copy), 256).error() == ProtocolErrc::reservedNotZero);
  copy = frame;
  copy[kHeaderSize + 1] = std::byte{2};  // a flag this version does not define
  CHECK(decodeBatchReadRequest(payloadOf(copy), 256).error() == ProtocolErrc::reservedNotZero);
  // A count claiming 2^32-1 IOs in a small payload: rejected before any allocation.
  copy = frame;
  for (int i = 4; i < 8; ++i) copy[kHeaderSize + static_cast<std::size_t>(i)] = std::byte{0xFF};
  CHECK(decodeBatchReadRequest(payloadOf(copy), 0xFFFFFFFFu).error() == ProtocolErrc::truncated);
}

TEST_CASE("An IO is 40 bytes: target id, chain version, chunk id, offset, length, remote buffer", "[protocol]") {
  BatchReadRequest req;
  req.ios.push_back({0x1122334455667788, 0x01020304, 0x0A0B0C0D, {0x8877665544332211, 0x10203040, 0x50607080},
                     0xDEADBEEF, 0xCAFEF00D});
  std::vector<std::byte> frame;
  encode(frame, 1, req);
  REQUIRE(frame.size() == kHeaderSize + 8 + 40);
  const unsigned char io[40] = {0xEF, 0xBE, 0xAD, 0xDE, 0x0D, 0xF0, 0xFE, 0xCA,                 // target, chain version
                                0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,                 // chunk id
                                0x04, 0x03, 0x02, 0x01, 0x0D, 0x0C, 0x0B, 0x0A,                 // offset, length
                                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,                 // remote.addr
                                0x40, 0x30, 0x20, 0x10, 0x80, 0x70, 0x60, 0x50};                // length, rkey
  CHECK(std::memcmp(frame.data() + kHeaderSize + 8, io, sizeof io) == 0);
  auto back = decodeBatchReadRequest(payloadOf(frame), 256);
  REQUIRE(back);
  CHECK(back->ios == req.ios);
  CHECK(back->ios[0].chainVersion == 0xCAFEF00D);
  // Any chain version is well-formed (0: a client without routing); whether it is stale is the server's call.
  auto copy = frame;
  for (std::size_t at = 4; at < 8; ++at) copy[kHeaderSize + 8 + at] = std::byte{0};
  back = decodeBatchReadRequest(payloadOf(copy), 256);
  REQUIRE(back);
  CHECK(back->ios[0].chainVersion == 0);
  CHECK(kMaxIosPerFrame == (kMaxPayload - 8) / 40);
}

TEST_CASE("Statuses 0 to 11 decode; 12 is a protocol error", "[protocol]") {
  for (std::int32_t status = 0; status <= 12; ++status) {
    BatchReadResponse resp;
    resp.results.push_back({IoStatus::ok, 0, 0});
    std::vector<std::byte> frame;
    encode(frame, 1, resp);
    frame[kHeaderSize + 8] = static_cast<std::byte>(status);
    auto back = decodeBatchReadResponse(payloadOf(frame), 1);
    if (status <= 11) {
      REQUIRE(back);
      CHECK(back->results[0].status == static_cast<IoStatus>(status));
    } else {
      CHECK(back.error() == ProtocolErrc::badStatus);
    }
  }
  CHECK(static_cast<int>(IoStatus::targetNotFound) == 9);
  CHECK(static_cast<int>(IoStatus::staleRouting) == 10);
  CHECK(static_cast<int>(IoStatus::corrupt) == 11);
  // A corrupt IO carries no bytes, like any failed one; its status survives a round trip.
  BatchReadResponse resp{{{IoStatus::ok, 10, 0x55}, {IoStatus::corrupt, 0, 0}}};
  std::vector<std::byte> frame;
  encode(frame, 9, resp);
  auto back = decodeBatchReadResponse(payloadOf(frame), 2);
  REQUIRE(back);
  CHECK(back->results == resp.results);
}

TEST_CASE("Every status has its own name, as PROTOCOL.md writes it", "[protocol]") {
  const std::vector<std::string> names = {"ok", "chunkNotFound", "rangeOutsideChunk", "bufferTooSmall",
                                          "ioError", "batchTooLarge", "timedOut", "internalError",
                                          "unavailable", "targetNotFound", "staleRouting", "corrupt"};
  for (std::size_t s = 0; s < names.size(); ++s) CHECK(toString(static_cast<IoStatus>(s)) == names[s]);
  CHECK(std::string(toString(static_cast<IoStatus>(12))) == "unknown");
  CHECK(std::string(toString(static_cast<IoStatus>(-1))) == "unknown");
}

TEST_CASE("The granted flag is the request's second byte", "[protocol]") {
  BatchReadRequest req = sampleRequest(1);
  std::vector<std::byte> frame;
  encode(frame, 1, req);
  CHECK(frame[kHeaderSize + 1] == std::byte{0});
  CHECK_FALSE(decodeBatchReadRequest(payloadOf(frame), 256)->granted);
  req.granted = true;
  frame.clear();
  encode(frame, 1, req);
  CHECK(frame[kHeaderSize + 1] == std::byte{1});
  auto back = decodeBatchReadRequest(payloadOf(frame), 256);
  REQUIRE(back);
  CHECK(back->granted);
  CHECK(back->ios == req.ios);
}

TEST_CASE("IoData frames: a 16-byte payload, little-endian, checked in the header", "[protocol]") {
  std::vector<std::byte> frame;
  encode(frame, 5, IoData{3, 0x40000, 0x1000});
  REQUIRE(frame.size() == kHeaderSize + kIoDataPayload);
  auto header = decodeHeader(std::span(frame).first(kHeaderSize));
  REQUIRE(header);
  CHECK(header->type == MessageType::ioData);
  CHECK(header->payloadLength == kIoDataPayload);
  const unsigned char payload[kIoDataPayload] = {3, 0, 0, 0, 0, 0, 4, 0, 0, 0x10, 0, 0, 0, 0, 0, 0};
  CHECK(std::memcmp(frame.data() + kHeaderSize, payload, kIoDataPayload) == 0);
  auto data = decodeIoData(payloadOf(frame));
  REQUIRE(data);
  CHECK(*data == IoData{3, 0x40000, 0x1000});
  auto copy = frame;
  copy[16] = std::byte{15};  // payloadLength 15
  CHECK(decodeHeader(std::span(copy).first(kHeaderSize)).error() == ProtocolErrc::truncated);
  copy[16] = std::byte{17};
  CHECK(decodeHeader(std::span(copy).first(kHeaderSize)).error() == ProtocolErrc::trailingBytes);
  copy = frame;
  copy[kHeaderSize + 12] = std::byte{1};
  CHECK(decodeIoData(payloadOf(copy)).error() == ProtocolErrc::reservedNotZero);
  CHECK(decodeIoData(payloadOf(frame).first(8)).error() == ProtocolErrc::truncated);
}

TEST_CASE("Error codes keep their wire values (PROTOCOL.md), each with its own message", "[protocol]") {
  CHECK(static_cast<int>(ProtocolErrc::tooManyRequests) == 12);
  CHECK(static_cast<int>(ProtocolErrc::frameTimeout) == 13);
  CHECK(static_cast<int>(ProtocolErrc::idleTimeout) == 14);
  const std::string unknown = std::error_code(static_cast<ProtocolErrc>(15)).message();
  for (int code = 1; code <= 14; ++code) {
    const ProtocolErrc e = static_cast<ProtocolErrc>(code);
    CHECK(std::error_code(e).message() != unknown);
    std::vector<std::byte> frame;
    encode(frame, 0, ErrorFrame{e, std::error_code(e).message()});
    auto err = decodeError(payloadOf(frame));
    REQUIRE(err);
    CHECK(err->code == e);
  }
}
