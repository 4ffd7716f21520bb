// The server and client end to end: transmission control (grants, the limit, a client that never
// grants).
#include "storage_e2e_fixture.hpp"

TEMPLATE_LIST_TEST_CASE("a request waiting for its grant holds no read buffers: a granted one is served meanwhile",
                        "[storage][e2e]", Setups) {
  // Request 1 (ungranted, never granted for now) asks for the whole pool;
  // then a client with a free slot grants with its request. Were request 1
  // to take the buffers while it waits, the granted request would wait for
  // them until request 1's transmit timeout (30 s) while holding the slot.
  storage::ServerOptions options = Fixture<TestType>::small();
  options.poolBytes = 8 * options.pieceSize;  // two whole chunks
  options.transmitTimeout = 30s;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    std::span<std::byte> into = fx.buffer(2 * kChunkSize);
    const std::vector<std::byte> request = requestFrame(
        1, {{1, 0, kChunkSize, remoteOf(*raw, into.first(kChunkSize))},
            {2, 0, kChunkSize, remoteOf(*raw, into.subspan(kChunkSize))}});
    co_await sendRaw(*raw, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    REQUIRE(ask->header.type == storage::proto::MessageType::transmitRequest);
    CHECK(fx.server->buffersInUse() == 0);
    auto client = co_await fx.client();
    const auto start = std::chrono::steady_clock::now();
    const std::vector<ReadOp> ios = {{3, 100, 1000, {}}};
    const std::vector<ReadOutcome> served = co_await readAndCheck(fx, *client, ios);
    CHECK(served[0].status == IoStatus::ok);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
    // Request 1, granted now, is served in full.
    co_await sendGrant(*raw, 1);
    std::size_t delivered = 0;
    for (;;) {
      Result<storage::IncomingFrame> frame = co_await readRaw(*raw);
      REQUIRE(frame);
      if (frame->header.type == storage::proto::MessageType::batchReadResponse) {
        auto response = storage::proto::decodeBatchReadResponse(frame->payload, 2);
        REQUIRE(response);
        for (const auto& r : response->results) CHECK(r.status == IoStatus::ok);
        break;
      }
      REQUIRE(frame->header.type == storage::proto::MessageType::ioData);  // TCP: both IOs' pieces
      auto piece = storage::proto::decodeIoData(frame->payload);
      REQUIRE(piece);
      REQUIRE(piece->ioIndex < 2);
      const Result<void> got =
          co_await raw->receiveData(into.subspan(piece->ioIndex * kChunkSize + piece->offset, piece->length), {});
      REQUIRE(got);
      delivered += piece->length;
    }
    if (!TestType::rdma) CHECK(delivered == 2 * kChunkSize);
    CHECK(storage::matchesChunkBytes(1, 0, into.first(kChunkSize)));
    CHECK(storage::matchesChunkBytes(2, 0, into.subspan(kChunkSize)));
    co_await client->close();
    co_await raw->close();
  });
}

TEMPLATE_LIST_TEST_CASE("a client that never grants times out; its buffers are released", "[storage][e2e]",
                        Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.transmitTimeout = 100ms;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto raw = co_await fx.channel();
    // The third IO is invalid (no such chunk): timedOut goes to it too.
    const std::vector<std::byte> request = requestFrame(
        5, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}, {2, 0, 200, remoteOf(*raw, fx.buffer(200))}, {999, 0, 10, {}}});
    co_await sendRaw(*raw, request);
    Result<storage::IncomingFrame> ask = co_await readRaw(*raw);
    REQUIRE(ask);
    CHECK(ask->header.type == storage::proto::MessageType::transmitRequest);
    Result<storage::IncomingFrame> reply = co_await readRaw(*raw);
    REQUIRE(reply);
    REQUIRE(reply->header.type == storage::proto::MessageType::batchReadResponse);
    auto response = storage::proto::decodeBatchReadResponse(reply->payload, 3);
    REQUIRE(response);
    REQUIRE(response->results.size() == 3);
    for (const auto& r : response->results) {
      CHECK(r.status == IoStatus::timedOut);
      CHECK(r.bytes == 0);
    }
    CHECK(fx.server->buffersInUse() == 0);
    CHECK(fx.server->stats().transmitTimeouts == 1);
    // A grant that crossed the timedOut response is not an error.
    std::vector<std::byte> late;
    storage::proto::encodeEmpty(late, storage::proto::MessageType::transmitGrant, 5);
    co_await sendRaw(*raw, late);
    const std::vector<std::byte> next = requestFrame(6, {{1, 0, 100, remoteOf(*raw, fx.buffer(100))}});
    co_await sendRaw(*raw, next);
    Result<storage::IncomingFrame> again = co_await readRaw(*raw);
    REQUIRE(again);
    CHECK(again->header.type == storage::proto::MessageType::transmitRequest);
    CHECK(again->header.requestId == 6);
    co_await raw->close();
  });
}

TEMPLATE_LIST_TEST_CASE("the transmission limit is never exceeded, across 64 concurrent clients",
                        "[storage][e2e]", Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  // 192 requests through 3 slots: on a slow device (Soft-RoCE under TCG)
  // the last grants come seconds after their reads; this test is about the
  // bound, not the transmit timeout.
  options.transmitTimeout = 30s;
  Fixture<TestType> f(options, kTransmissionLimit);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    std::vector<std::unique_ptr<storage::StorageClient<typename TestType::R>>> clients;
    for (int c = 0; c < 64; ++c) clients.push_back(co_await fx.client());
    std::vector<Task<std::vector<ReadOutcome>>> reads;
    for (std::size_t c = 0; c < clients.size(); ++c) {
      for (std::uint32_t r = 0; r < 3; ++r) {
        std::vector<ReadOp> ios = {{(c + r) % kChunks, r * 1000, 20000, {}}, {c % kChunks, 7, 3, {}}};
        reads.push_back(readAndCheck(fx, *clients[c], std::move(ios)));
      }
    }
    const std::vector<std::vector<ReadOutcome>> all = co_await coio::collectAllRange(std::move(reads));
    for (const auto& outcomes : all) {
      for (const ReadOutcome& o : outcomes) CHECK(o.status == IoStatus::ok);
    }
    CHECK(fx.server->stats().maxTransmitting <= kTransmissionLimit);
    CHECK(fx.server->stats().maxTransmitting >= 1);
    for (auto& c : clients) co_await c->close();
  });
  CHECK(f.server->buffersInUse() == 0);
}
