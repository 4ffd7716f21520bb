// The server and client end to end over TCP: a scripted server's pieces out of order, the
// channel's read-ahead and frame writer, the congestion control of accepted connections,
// zero-copy sends.
#include "storage_e2e_fixture.hpp"

#if !COIO_E2E_RDMA
namespace {

// One piece a scripted server sends: `length` bytes of IO `io` at `offset`.
struct ScriptedPiece {
  std::uint32_t io, offset, length;
};

std::byte scriptedByte(std::size_t io, std::size_t offset) { return static_cast<std::byte>((io * 97 + offset * 7) & 0xff); }

// A server written from PROTOCOL.md that answers one batchRead with the
// given pieces, in the given order, and then a response saying each IO is
// ok with `bytes[i]` bytes (and their CRC); then reads until the client
// goes. Yields the code of the Error frame the client sent, if it did.
template <typename R>
Task<std::optional<storage::proto::ProtocolErrc>> scriptedServer(coio::TcpListener<R>& listener, std::vector<ScriptedPiece> pieces,
                          std::vector<std::uint32_t> bytes) {
  Result<coio::TcpStream<R>> stream = co_await listener.accept();
  REQUIRE(stream);
  storage::TcpChannel<R> channel(std::move(*stream));
  storage::ReadFailure failure;
  Result<storage::IncomingFrame> frame = co_await channel.readFrame(failure, {});
  REQUIRE(frame);
  REQUIRE(frame->header.type == storage::proto::MessageType::batchReadRequest);
  Result<storage::proto::BatchReadRequest> request = storage::proto::decodeBatchReadRequest(frame->payload, 16);
  REQUIRE(request);
  CHECK(request->granted);  // the client had a free slot
  const std::uint64_t id = frame->header.requestId;
  for (const ScriptedPiece& p : pieces) {
    std::vector<std::byte> data(p.length);
    for (std::size_t k = 0; k < p.length; ++k) data[k] = scriptedByte(p.io, p.offset + k);
    const std::span<std::byte> buffers[] = {data};
    const storage::OutgoingPiece piece{id, {}, {p.io, p.offset, p.length}, buffers, {}};
    const Result<void> sent = co_await channel.sendData(piece, {});
    REQUIRE(sent);
  }
  storage::proto::BatchReadResponse response;
  for (std::size_t io = 0; io < bytes.size(); ++io) {
    std::vector<std::byte> whole(bytes[io]);
    for (std::size_t k = 0; k < whole.size(); ++k) whole[k] = scriptedByte(io, k);
    response.results.push_back({IoStatus::ok, bytes[io], storage::crc32c(whole)});
  }
  std::vector<std::byte> encoded;
  storage::proto::encode(encoded, id, response);
  const Result<void> sent = co_await channel.send(encoded, {});
  REQUIRE(sent);
  std::optional<storage::proto::ProtocolErrc> said;
  for (;;) {  // until the client closes
    Result<storage::IncomingFrame> next = co_await channel.readFrame(failure, {});
    if (!next) break;
    REQUIRE(next->header.type == storage::proto::MessageType::error);
    Result<storage::proto::ErrorFrame> error = storage::proto::decodeError(next->payload);
    REQUIRE(error);
    said = error->code;
  }
  co_await channel.close();
  co_return said;
}

// batchRead of IOs of `lengths` against scriptedServer(pieces, bytes);
// `clientSaid`: the Error frame the client sent the server, if any.
template <typename R>
Result<std::vector<ReadOutcome>> readFromScript(std::vector<std::uint32_t> lengths, std::vector<ScriptedPiece> pieces,
                                                std::vector<std::uint32_t> bytes,
                                                std::vector<std::vector<std::byte>>& into,
                                                std::optional<storage::proto::ProtocolErrc>& clientSaid) {
  R reactor;
  auto listener = coio::TcpListener<R>::bind(reactor, coio::SocketAddress::loopbackV4());
  REQUIRE(listener);
  storage::TransmissionLimiter limiter(4);
  auto client = [&]() -> Task<Result<std::vector<ReadOutcome>>> {
    auto connected = co_await storage::StorageClient<R>::connect(reactor, *listener->localAddress(), limiter,
                                                                 {.timeout = 5s, .verifyChecksums = true});
    REQUIRE(connected);
    std::vector<ReadOp> ios;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      into.emplace_back(lengths[i], std::byte{0xEE});
      ios.push_back({i, 0, lengths[i], into.back()});
    }
    Result<std::vector<ReadOutcome>> outcomes = co_await (*connected)->batchRead(ios);
    co_await (*connected)->close();
    co_return outcomes;
  };
  auto [served, read] =
      reactor.runUntil(coio::collectAll(scriptedServer(*listener, std::move(pieces), std::move(bytes)), client()));
  clientSaid = served;
  return read;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("pieces out of order, interleaved across IOs, each land in their own IO", "[storage][tcp]",
                        Setups) {
  using R = typename TestType::R;
  const std::vector<std::uint32_t> lengths = {10000, 5000, 7000};
  std::vector<std::vector<std::byte>> into;
  std::optional<storage::proto::ProtocolErrc> said;
  SECTION("in any order between IOs, in order within each") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(
        lengths, {{2, 0, 3000}, {0, 0, 4000}, {1, 0, 5000}, {2, 3000, 4000}, {0, 4000, 6000}}, lengths, into, said);
    REQUIRE(outcomes);
    CHECK_FALSE(said.has_value());
    for (std::size_t io = 0; io < lengths.size(); ++io) {
      CHECK((*outcomes)[io].status == IoStatus::ok);
      CHECK((*outcomes)[io].bytes == lengths[io]);
      CHECK_FALSE((*outcomes)[io].checksumMismatch);
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < lengths[io]; ++k) wrong += into[io][k] != scriptedByte(io, k);
      CHECK(wrong == 0);
    }
  }
  // PROTOCOL.md's checks: each is a protocol error for the whole connection.
  SECTION("a piece that skips ahead within its IO") {
    Result<std::vector<ReadOutcome>> outcomes =
        readFromScript<R>(lengths, {{0, 4000, 6000}, {0, 0, 4000}}, {10000, 0, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
  SECTION("a piece past its IO's length") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(lengths, {{1, 0, 5001}}, {0, 5001, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
  SECTION("a piece of an IO the request does not have") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(lengths, {{3, 0, 10}}, {0, 0, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
  SECTION("a response claiming more bytes than its pieces delivered") {
    Result<std::vector<ReadOutcome>> outcomes = readFromScript<R>(lengths, {{0, 0, 4000}}, {10000, 0, 0}, into, said);
    CHECK(outcomes.error() == storage::proto::ProtocolErrc::unexpectedMessage);
    CHECK(said == storage::proto::ProtocolErrc::unexpectedMessage);  // and the server was told
  }
}
#endif

#if !COIO_E2E_RDMA
TEMPLATE_LIST_TEST_CASE("the TCP channel's read-ahead: reads of every size across fills come out intact",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto listener = coio::TcpListener<R>::bind(r, coio::SocketAddress::loopbackV4());
    REQUIRE(listener);
    auto connected = co_await coio::TcpStream<R>::connect(r, *listener->localAddress());
    REQUIRE(connected);
    auto accepted = co_await listener->accept();
    REQUIRE(accepted);
    constexpr std::size_t kTotal = 1 << 20;
    const auto byteAt = [](std::size_t i) { return static_cast<std::byte>((i * 131 + i / 257) & 0xff); };
    // The writer sends in uneven pieces; the reader (a 1 KiB read-ahead)
    // asks for small, buffer-sized and larger-than-buffer spans.
    auto writer = [&](coio::TcpStream<R>& out) -> Task<Result<void>> {
      std::vector<std::byte> data(kTotal);
      for (std::size_t i = 0; i < kTotal; ++i) data[i] = byteAt(i);
      std::mt19937 rng(7);
      for (std::size_t at = 0; at < kTotal;) {
        const std::size_t n = std::min<std::size_t>(kTotal - at, 1 + rng() % 9000);
        Result<void> w = co_await out.writeAll(std::span(data).subspan(at, n));
        if (!w) co_return w;
        at += n;
      }
      out.close();
      co_return Result<void>{};
    };
    auto reader = [&](storage::BufferedReader<R>& in) -> Task<std::size_t> {
      std::vector<std::byte> got(kTotal);
      std::mt19937 rng(11);
      const std::size_t sizes[] = {1, 7, 100, 1023, 1024, 1025, 4096, 70000};
      std::size_t at = 0;
      while (at < kTotal) {
        const std::size_t n = std::min(kTotal - at, sizes[rng() % std::size(sizes)]);
        Result<void> r = co_await in.readExact(std::span(got).subspan(at, n), {});
        if (!r) break;
        at += n;
      }
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < at; ++i) wrong += got[i] != byteAt(i);
      std::byte more[1];
      Result<void> end = co_await in.readExact(more, {});  // the writer closed: the end, not stale bytes
      co_return at == kTotal && wrong == 0 && !end && end.error() == coio::Errc::eof ? 0 : 1 + wrong;
    };
    storage::BufferedReader<R> in(*accepted, 1024);
    auto [written, failures] = co_await coio::collectAll(writer(*connected), reader(in));
    CHECK(written);
    CHECK(failures == 0);
  }(reactor));
}

// A connected loopback pair on `r`: {connected, accepted}.
template <typename R>
Task<std::pair<coio::TcpStream<R>, coio::TcpStream<R>>> loopbackPair(R& r) {
  auto listener = coio::TcpListener<R>::bind(r, coio::SocketAddress::loopbackV4());
  REQUIRE(listener);
  auto connected = co_await coio::TcpStream<R>::connect(r, *listener->localAddress());
  REQUIRE(connected);
  auto accepted = co_await listener->accept();
  REQUIRE(accepted);
  co_return std::pair{std::move(*connected), std::move(*accepted)};
}

TEMPLATE_LIST_TEST_CASE("the TCP channel's read-ahead: after a large read, the next receive takes one frame header",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto [out, in] = co_await loopbackPair(r);
    // A 1 KiB read-ahead: small enough that everything sent fits in the
    // sockets at once, so each fill could take all that is left.
    constexpr std::size_t kLarge = 1024, kHeader = 40;
    std::vector<std::byte> sent(2 * kLarge + kHeader);
    for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<std::byte>(i * 7 + i / 251);
    const Result<void> written = co_await out.writeAll(sent);
    REQUIRE(written);
    storage::BufferedReader<R> reader(in, kLarge, kHeader);
    std::vector<std::byte> got(sent.size());
    Result<void> step = co_await reader.readExact(std::span(got).first(kLarge), {});  // straight into `got`
    REQUIRE(step);
    step = co_await reader.fill({});
    REQUIRE(step);
    CHECK(reader.buffered() == kHeader);  // not the next large piece's first bytes as well
    step = co_await reader.readExact(std::span(got).subspan(kLarge, kHeader), {});
    REQUIRE(step);
    step = co_await reader.readExact(std::span(got).subspan(kLarge + kHeader), {});
    REQUIRE(step);
    CHECK(got == sent);
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("the TCP frame writer: sends made at once go out whole, in call order", "[storage][tcp]",
                        Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto pair = co_await loopbackPair(r);  // not a structured binding: clang 14 cannot capture one
    coio::TcpStream<R>& out = pair.first;
    coio::TcpStream<R>& in = pair.second;
    storage::FrameWriter<R> writer(out);
    // 300 sends of 1..3 parts (8 B .. 64 KiB each) started in one turn: they
    // queue behind the first and go in group writes, which must keep each
    // send's parts together and the sends in order.
    constexpr int kSends = 300;
    std::mt19937 rng(5);
    std::vector<std::vector<std::vector<std::byte>>> sends(kSends);
    std::size_t total = 0;
    for (int i = 0; i < kSends; ++i) {
      // One send of more than IOV_MAX parts: it goes alone, and still whole.
      sends[i].resize(i == kSends / 2 ? IOV_MAX + 100 : 1 + rng() % 3);
      for (std::vector<std::byte>& part : sends[i]) {
        part.assign(rng() % 4 == 0 ? 1 + rng() % 65536 : 8 + rng() % 200, static_cast<std::byte>(i));
        total += part.size();
      }
    }
    int failed = 0;
    auto send = [&](int i) -> Task<void> {
      std::vector<iovec> parts;
      for (std::vector<std::byte>& part : sends[i]) parts.push_back({part.data(), part.size()});
      failed += !(co_await writer.send(parts, {}));
    };
    auto readAll = [&]() -> Task<std::vector<std::byte>> {
      std::vector<std::byte> got(total);
      storage::BufferedReader<R> reader(in, 4096);
      Result<void> r = co_await reader.readExact(got, {});
      CHECK(r);
      co_return got;
    };
    coio::AsyncScope scope;
    for (int i = 0; i < kSends; ++i) scope.spawn(send(i));
    std::vector<std::byte> got = co_await readAll();
    co_await scope.join();
    CHECK(failed == 0);
    std::size_t at = 0, wrong = 0;
    for (int i = 0; i < kSends; ++i) {
      for (const std::vector<std::byte>& part : sends[i]) {
        for (std::size_t k = 0; k < part.size(); ++k) wrong += got[at + k] != static_cast<std::byte>(i);
        at += part.size();
      }
    }
    CHECK(wrong == 0);
    CHECK(!writer.broken());
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("the TCP frame writer: a queued send cancelled before it is written leaves no bytes",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto pair = co_await loopbackPair(r);  // not a structured binding: clang 14 cannot capture one
    coio::TcpStream<R>& out = pair.first;
    coio::TcpStream<R>& in = pair.second;
    storage::FrameWriter<R> writer(out);
    // The first send is larger than the socket buffers take while nobody
    // reads: it stalls, and the two behind it queue.
    std::vector<std::byte> big(32u << 20, std::byte{1}), cancelled(1000, std::byte{2}), last(1000, std::byte{3});
    std::stop_source stop;
    Result<void> bigSent = coio::Errc::closed, cancelledSent = Result<void>{}, lastSent = coio::Errc::closed;
    // Named: a coroutine lambda's captures live in the lambda object.
    auto send = [&writer](Result<void>& sent, std::span<const std::byte> frame, std::stop_token token) -> Task<void> {
      sent = co_await writer.send(frame, std::move(token));
    };
    coio::AsyncScope scope;
    scope.spawn(send(bigSent, big, {}));
    co_await r.sleepFor(50ms);  // its write is under way (sends made in the same turn would join it)
    scope.spawn(send(cancelledSent, cancelled, stop.get_token()));
    scope.spawn(send(lastSent, last, {}));
    co_await r.sleepFor(10ms);
    stop.request_stop();
    REQUIRE(!cancelledSent);
    CHECK(cancelledSent.error() == std::errc::operation_canceled);
    CHECK(!writer.broken());
    std::vector<std::byte> got(big.size() + last.size());
    storage::BufferedReader<R> reader(in, 65536);
    // Not co_await inside CHECK: Catch's temporaries across a suspension hang g++ 12 here.
    const Result<void> read = co_await reader.readExact(got, {});
    CHECK(read);
    co_await scope.join();
    CHECK(bigSent);
    CHECK(lastSent);
    CHECK(std::count(got.begin(), got.begin() + big.size(), std::byte{1}) == static_cast<std::ptrdiff_t>(big.size()));
    CHECK(std::count(got.begin() + big.size(), got.end(), std::byte{3}) == static_cast<std::ptrdiff_t>(last.size()));
    out.close();
    std::byte more[1];
    Result<void> end = co_await reader.readExact(more, {});
    CHECK(end.error() == coio::Errc::eof);  // nothing of the cancelled send
  }(reactor));
}

TEMPLATE_LIST_TEST_CASE("the TCP frame writer: a write stopped part-way breaks it, for queued and later sends",
                        "[storage][tcp]", Setups) {
  using R = typename TestType::R;
  R reactor;
  reactor.runUntil([](R& r) -> Task<void> {
    auto pair = co_await loopbackPair(r);
    storage::FrameWriter<R> writer(pair.first);
    // Nobody reads pair.second: the big send stalls part-way, the small one queues behind.
    std::vector<std::byte> big(32u << 20, std::byte{1}), small(1000, std::byte{2});
    std::stop_source stop;
    Result<void> bigSent = Result<void>{}, queuedSent = Result<void>{};
    auto send = [&writer](Result<void>& sent, std::span<const std::byte> frame, std::stop_token token) -> Task<void> {
      sent = co_await writer.send(frame, std::move(token));
    };
    coio::AsyncScope scope;
    scope.spawn(send(bigSent, big, stop.get_token()));
    co_await r.sleepFor(50ms);
    scope.spawn(send(queuedSent, small, {}));
    co_await r.sleepFor(10ms);
    CHECK(!writer.broken());
    stop.request_stop();
    co_await scope.join();
    REQUIRE(!bigSent);
    CHECK(bigSent.error() == std::errc::operation_canceled);
    CHECK(writer.broken());
    REQUIRE(!queuedSent);  // the stream is cut mid-frame: nothing may follow
    CHECK(queuedSent.error() == coio::Errc::closed);
    const Result<void> later = co_await writer.send(small, {});
    REQUIRE(!later);
    CHECK(later.error() == coio::Errc::closed);
  }(reactor));
}
#endif

namespace {

// The congestion control of this process's sockets accepted on `port`.
std::vector<std::string> acceptedCongestionControls(std::uint16_t port) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage local{}, peer{};
    socklen_t localLength = sizeof local, peerLength = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLength) != 0 || local.ss_family != AF_INET ||
        ntohs(reinterpret_cast<sockaddr_in&>(local).sin_port) != port ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0) {
      continue;
    }
    char name[16] = {};
    socklen_t length = sizeof name;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length) == 0) names.emplace_back(name);
  }
  return names;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("tcpCongestion: every accepted connection sends with the named algorithm", "[storage][e2e]",
                        Setups) {
  storage::ServerOptions options = Fixture<TestType>::small();
  options.tcpCongestion = "reno";  // always built in; the system default may be anything else
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    auto first = co_await fx.client();
    auto second = co_await fx.client();
    const std::vector<ReadOp> ios = {{1, 0, 100, {}}};
    (void)co_await readAndCheck(fx, *first, ios);
    (void)co_await readAndCheck(fx, *second, ios);
    CHECK(acceptedCongestionControls(fx.address.port()) == std::vector<std::string>{"reno", "reno"});
    co_await first->close();
    co_await second->close();
  });
}

#if !COIO_E2E_RDMA
namespace {

// A TCP channel to `to` whose socket takes little before the server's sends
// stall: its receive buffer (64 KiB) is set before the handshake.
template <typename R>
Task<std::unique_ptr<storage::TcpChannel<R>>> connectNarrow(R& reactor, coio::SocketAddress to) {
  coio::FileDescriptor fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  const int receiveBuffer = 64 * 1024;
  REQUIRE(::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer) == 0);
  coio::TcpStream<R> stream(reactor, std::move(fd));
  const Result<void> connected = co_await reactor.connect(stream.fd(), to.data(), to.size());
  REQUIRE(connected);
  co_return std::make_unique<storage::TcpChannel<R>>(std::move(stream));
}

// Reads request `id`'s pieces and response off `channel` and checks every
// IO: ok, every byte delivered in order and equal to the dataset's, the
// checksum that of the bytes.
template <typename Channel>
Task<void> readVerified(Channel& channel, std::uint64_t id, const std::vector<storage::proto::ReadIo>& ios) {
  std::vector<std::vector<std::byte>> data;
  for (const storage::proto::ReadIo& io : ios) data.emplace_back(io.length);
  std::vector<std::size_t> delivered(ios.size(), 0);
  Result<storage::IncomingFrame> frame = co_await readRaw(channel);
  for (; frame && frame->header.type == storage::proto::MessageType::ioData; frame = co_await readRaw(channel)) {
    REQUIRE(frame->header.requestId == id);
    const Result<storage::proto::IoData> piece = storage::proto::decodeIoData(frame->payload);
    REQUIRE(piece);
    REQUIRE(piece->ioIndex < ios.size());
    REQUIRE(piece->offset == delivered[piece->ioIndex]);
    REQUIRE(piece->offset + piece->length <= ios[piece->ioIndex].length);
    const Result<void> got =
        co_await channel.receiveData(std::span(data[piece->ioIndex]).subspan(piece->offset, piece->length), {});
    REQUIRE(got);
    delivered[piece->ioIndex] += piece->length;
  }
  REQUIRE(frame);
  REQUIRE(frame->header.type == storage::proto::MessageType::batchReadResponse);
  REQUIRE(frame->header.requestId == id);
  const Result<storage::proto::BatchReadResponse> response =
      storage::proto::decodeBatchReadResponse(frame->payload, static_cast<std::uint32_t>(ios.size()));
  REQUIRE(response);
  REQUIRE(response->results.size() == ios.size());
  for (std::size_t i = 0; i < ios.size(); ++i) {
    INFO("IO " << i);
    const storage::proto::IoResult& result = response->results[i];
    CHECK(result.status == IoStatus::ok);
    CHECK(result.bytes == ios[i].length);
    CHECK(delivered[i] == ios[i].length);
    CHECK(storage::matchesChunkBytes(ios[i].chunkId, ios[i].offset, data[i]));
    CHECK(storage::crc32c(data[i]) == result.checksum);
  }
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("zero-copy sends: a request's buffers are reused only once the kernel let go of its data",
                        "[storage][e2e][zerocopy]", Setups) {
  // The pool holds one request. Client A asks for 15 pieces and stalls
  // before reading; with a receive buffer of 64 KiB, most of its data sits
  // in the server's socket. Client B's request, made meanwhile, needs 16:
  // it gets them once A's are back. A server that gave A's buffers back at
  // the send's first completion would fill them with the pool's pattern and
  // B's data while A's bytes still wait in the socket: A would read those.
  storage::ServerOptions options = Fixture<TestType>::small();
  options.zeroCopySend = true;
  options.poisonBuffers = true;
  options.poolBytes = 16 * options.pieceSize;
  Fixture<TestType> f(options);
  f.run([](Fixture<TestType>& fx) -> Task<void> {
    using R = typename TestType::R;
    auto& server = *fx.server;
    const bool zeroCopy = coio::detail::sendsZeroCopy(fx.reactor);
    INFO(server.note());
    CHECK((server.note().find("zero-copy sends (TCP)") != std::string::npos) == zeroCopy);
    CHECK(server.note().find("poisoned") != std::string::npos);
    // Three whole chunks (12 pieces) and an unaligned part of a fourth (3).
    const std::vector<storage::proto::ReadIo> ios = {
        {0, 0, kChunkSize, {}}, {1, 0, kChunkSize, {}}, {2, 0, kChunkSize, {}}, {3, 100, 40000, {}}};
    bool aAsked = false, bDone = false;
    auto clientA = [&]() -> Task<void> {
      std::unique_ptr<storage::TcpChannel<R>> a = co_await connectNarrow(fx.reactor, fx.address);
      co_await sendRaw(*a, requestFrame(1, ios, true));
      if (zeroCopy) {  // a copying server may be done with them before a check sees it
        const bool holding = co_await eventually(fx.reactor, [&server] { return server.buffersInUse() == 15; });
        CHECK(holding);
      }
      aAsked = true;
      co_await fx.reactor.sleepFor(300ms);  // the sends sit in the server's socket
      if (zeroCopy) {
        CHECK(server.buffersInUse() == 15);  // still referenced by the kernel
        CHECK_FALSE(bDone);
      }
      co_await readVerified(*a, 1, ios);
      co_await a->close();
    };
    auto clientB = [&]() -> Task<void> {
      auto b = co_await fx.client();
      co_await eventually(fx.reactor, [&aAsked] { return aAsked; });
      const std::vector<ReadOp> reads = {{4, 0, kChunkSize, {}}, {5, 0, kChunkSize, {}},
                                         {6, 0, kChunkSize, {}}, {7, 0, kChunkSize, {}}};
      const std::vector<ReadOutcome> outcomes = co_await readAndCheck(fx, *b, reads);
      for (const ReadOutcome& o : outcomes) CHECK(o.status == IoStatus::ok);
      bDone = true;
      co_await b->close();
    };
    co_await coio::collectAll(clientA(), clientB());
    CHECK(bDone);
    const bool released = co_await eventually(fx.reactor, [&server] { return server.buffersInUse() == 0; });
    CHECK(released);
  });
}
#endif
