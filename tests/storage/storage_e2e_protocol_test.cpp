// The server and client end to end: PROTOCOL.md's rules on the wire (bad frames, the rules a
// receiver enforces, requests with nothing to read, the remote buffer over TCP).
#include "storage_e2e_fixture.hpp"

TEMPLATE_LIST_TEST_CASE("bad frames get an Error frame and a close; other clients keep being served",
                        "[storage][e2e]", Setups) {
  using storage::proto::ProtocolErrc;
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto good = co_await fx.client();
    auto header = [](std::uint32_t magic, std::uint16_t type, std::uint32_t length) {
      std::vector<std::byte> h;
      storage::proto::detail::Writer w(h);
      w.put(magic);
      w.put(storage::proto::kVersion);
      w.put(type);
      w.put(std::uint64_t{42});
      w.put(length);
      w.put(std::uint32_t{0});
      return h;
    };
    std::vector<std::byte> truncated = requestFrame(9, {{1, 0, 10, {}}, {1, 0, 10, {}}});
    truncated[16] = std::byte{8 + storage::proto::kIoSize};  // payloadLength says one IO; ioCount says two
    truncated.resize(storage::proto::kHeaderSize + 8 + storage::proto::kIoSize);
    std::vector<std::byte> unexpectedGrant;
    storage::proto::encodeEmpty(unexpectedGrant, storage::proto::MessageType::transmitGrant, 77);
    std::vector<std::byte> versionThree = requestFrame(5, {{1, 0, 10, {}}});
    versionThree[4] = std::byte{3};  // a version 3 peer: its IOs carry no chain version
    // An ioCount no payload could hold (over 26,214; 408 over RDMA), with a
    // payload far shorter than it implies: the count is checked first.
    std::vector<std::byte> tooMany = requestFrame(12, {});
    tooMany[storage::proto::kHeaderSize + 4] = std::byte{0xFF};
    tooMany[storage::proto::kHeaderSize + 5] = std::byte{0xFF};
    tooMany[storage::proto::kHeaderSize + 6] = std::byte{0xFF};
    std::vector<std::byte> reservedHeader = header(storage::proto::kMagic, 1, 0);
    reservedHeader[20] = std::byte{1};
    // TransmitRequest (a server's) and TransmitGrant carry nothing.
    std::vector<std::byte> grantWithPayload = header(storage::proto::kMagic, 3, 4);
    grantWithPayload.resize(grantWithPayload.size() + 4);
    std::vector<std::byte> askWithPayload = header(storage::proto::kMagic, 2, 4);
    askWithPayload.resize(askWithPayload.size() + 4);
    std::vector<std::byte> serverAsk;  // a valid frame in the wrong direction
    storage::proto::encodeEmpty(serverAsk, storage::proto::MessageType::transmitRequest, 13);
    // Each frame, the error it gets, and the requestId the Error frame carries.
    const std::vector<std::tuple<std::vector<std::byte>, ProtocolErrc, std::uint64_t>> cases = {
        {header(0x12345678, 1, 0), ProtocolErrc::badMagic, 0},
        {header(storage::proto::kMagic, 9, 0), ProtocolErrc::unknownType, 42},
        {header(storage::proto::kMagic, 1, 0xFFFFFFFF), ProtocolErrc::payloadTooLarge, 42},
        {truncated, ProtocolErrc::truncated, 9},
        {unexpectedGrant, ProtocolErrc::unexpectedMessage, 77},
        {versionThree, ProtocolErrc::unsupportedVersion, 5},
        {tooMany, ProtocolErrc::tooManyIos, 12},
        {reservedHeader, ProtocolErrc::reservedNotZero, 42},
        {grantWithPayload, ProtocolErrc::trailingBytes, 42},
        {askWithPayload, ProtocolErrc::trailingBytes, 42},
        {serverAsk, ProtocolErrc::unexpectedMessage, 13},
    };
    for (const auto& [bytes, expected, id] : cases) {
      auto raw = co_await fx.channel();
      co_await sendRaw(*raw, bytes);
      Result<storage::IncomingFrame> frame = co_await readRaw(*raw);
      REQUIRE(frame);
      REQUIRE(frame->header.type == storage::proto::MessageType::error);
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == expected);
      CHECK(frame->header.requestId == id);
      Result<storage::IncomingFrame> after = co_await readRaw(*raw);
      CHECK(after.error() == coio::Errc::eof);  // and then it closes
      co_await raw->close();
      const std::vector<ReadOp> probe = {{5, 100, 1000, {}}};
      const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *good, probe);
      CHECK(served[0].status == IoStatus::ok);
    }
    CHECK(fx.server->stats().protocolErrors == cases.size());
    co_await good->close();
  });
}

// PROTOCOL.md, "Rules a receiver enforces": each rule, as the server keeps it.
TEMPLATE_LIST_TEST_CASE("protocol rules: a requestId already in flight, a grant for a granted request, an Error "
                        "from the client",
                        "[storage][e2e]", Setups) {
  using storage::proto::MessageType;
  using storage::proto::ProtocolErrc;
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    // The Error frame for `id` that ends a connection, after any other frames; then the close.
    auto expectError = [](storage::Channel<typename TestType::R>& raw, ProtocolErrc code,
                          std::uint64_t id) -> Task<void> {
      Result<storage::IncomingFrame> frame = co_await readRaw(raw);
      while (frame && frame->header.type != MessageType::error) frame = co_await readRaw(raw);
      REQUIRE(frame);
      Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(frame->payload);
      REQUIRE(error);
      CHECK(error->code == code);
      CHECK(frame->header.requestId == id);
      Result<storage::IncomingFrame> after = co_await readRaw(raw);
      CHECK(after.error() == coio::Errc::eof);
    };
    {  // The same requestId while the first is in flight (waiting for its grant).
      auto raw = co_await fx.channel();
      const std::vector<std::byte> request = requestFrame(7, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}});
      co_await sendRaw(*raw, request);
      Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
      REQUIRE(ask);
      CHECK(ask->header.type == MessageType::transmitRequest);
      co_await sendRaw(*raw, request);
      co_await expectError(*raw, ProtocolErrc::unexpectedMessage, 7);
      co_await raw->close();
    }
    {  // A TransmitGrant for a request sent granted: none was asked for.
      auto raw = co_await fx.channel();
      // Frames built before the co_await: g++ 12 cannot keep an initializer list's array across one.
      const std::vector<std::byte> request = requestFrame(8, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}}, true);
      co_await sendRaw(*raw, request);
      co_await sendGrant(*raw, 8);
      co_await expectError(*raw, ProtocolErrc::unexpectedMessage, 8);
      co_await raw->close();
    }
    const std::uint64_t protocolErrors = fx.server->stats().protocolErrors;
    CHECK(protocolErrors == 2);
    {  // An Error frame from the client: the server closes without answering.
      auto raw = co_await fx.channel();
      std::vector<std::byte> error;
      storage::proto::encode(error, 9, storage::proto::ErrorFrame{ProtocolErrc::idleTimeout, "giving up"});
      co_await sendRaw(*raw, error);
      Result<storage::IncomingFrame> after = co_await readRaw(*raw);
      CHECK(after.error() == coio::Errc::eof);
      co_await raw->close();
      CHECK(fx.server->stats().protocolErrors == protocolErrors);  // not the client's protocol error
    }
  });
}

TEMPLATE_LIST_TEST_CASE("nothing to read, no TransmitRequest: ioCount 0, zero-length and invalid IOs are answered "
                        "at once",
                        "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    const std::vector<std::byte> none = requestFrame(1, {});
    co_await sendRaw(*raw, none);
    Result<storage::IncomingFrame> empty = co_await readRaw(*raw);
    REQUIRE(empty);
    CHECK(empty->header.type == storage::proto::MessageType::batchReadResponse);
    CHECK(empty->header.requestId == 1);
    auto noResults = storage::proto::decodeBatchReadResponse(empty->payload, 0);
    REQUIRE(noResults);
    CHECK(noResults->results.empty());
    // A zero-length IO of a chunk it holds, and one of a chunk it does not.
    const std::vector<std::byte> nothingToRead =
        requestFrame(2, {{3, 100, 0, remoteOf(*raw, fx.buffer(1))}, {999, 0, 10, {}}});
    co_await sendRaw(*raw, nothingToRead);
    Result<storage::IncomingFrame> reply = co_await readRaw(*raw);
    REQUIRE(reply);
    CHECK(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 2);
    REQUIRE(response);
    CHECK(response->results[0].status == IoStatus::ok);
    CHECK(response->results[0].bytes == 0);
    CHECK(response->results[0].checksum == 0);  // the CRC32C of no bytes
    CHECK(response->results[1].status == IoStatus::chunkNotFound);
    co_await raw->close();
  });
}

#if !COIO_E2E_RDMA  // over RDMA the remote buffer is where the data goes
TEMPLATE_LIST_TEST_CASE("over TCP an IO's remote buffer is not read: any value is served", "[storage][e2e]", Setups) {
  Fixture<TestType> f;
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    const storage::proto::RemoteBuffer junk{0xdeadbeef000, 1, 77};  // 1 byte: too small, were it read
    const std::vector<std::byte> request = requestFrame(3, {{2, 0, 100, junk}}, true);
    co_await sendRaw(*raw, request);
    std::vector<std::byte> data(100);
    std::size_t delivered = 0;
    Result<storage::IncomingFrame> reply = co_await readResponse(*raw, data, delivered);
    REQUIRE(reply);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 1);
    REQUIRE(response);
    CHECK(response->results[0].status == IoStatus::ok);
    CHECK(delivered == 100);
    CHECK(storage::matchesChunkBytes(2, 0, data));
    co_await raw->close();
  });
}
#endif
