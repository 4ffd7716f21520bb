// The server and client end to end: a batchRead times out wherever a server stalls, and its
// buffer is never written after.
#include "storage_e2e_fixture.hpp"

#if !COIO_E2E_RDMA
namespace {

// Where a scripted server stops answering a batchRead: before any data of
// a request granted with it, after its TransmitRequest (a request the
// client could not grant: the test holds the only slot), between two
// pieces of the data, or half-way through a piece.
enum class Stall { beforeData, afterTransmitRequest, betweenPieces, midPiece };

const char* toString(Stall stall) {
  switch (stall) {
    case Stall::beforeData: return "before any data";
    case Stall::afterTransmitRequest: return "after TransmitRequest";
    case Stall::betweenPieces: return "between pieces";
    case Stall::midPiece: return "mid-piece";
  }
  return "?";
}

// Where the client keeps the connection: it was not reading a piece when
// it gave up.
bool keepsConnection(Stall stall) { return stall != Stall::midPiece; }

constexpr auto kClientTimeout = 200ms;
// Larger than the TCP channel's 32 KiB read-ahead: the client reads this
// IO's data straight into the caller's buffer.
constexpr std::uint32_t kStalledIoSize = 64 * 1024;
// How long the scripted server waits for the client at any point before
// it gives up and closes (so that a client that never times out fails the
// test instead of hanging it).
constexpr auto kPeerPatience = 3s;
constexpr std::byte kPoison{0xA5};

std::vector<std::byte> peerData() {
  std::vector<std::byte> data(kStalledIoSize);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 + 1);
  return data;
}

// What the scripted server saw, checked once it is done.
struct PeerLog {
  bool servedFirst = false;   // got the first request and stalled where told
  bool servedSecond = false;  // served a second request in full (the connection stayed usable)
  bool sawEnd = false;        // the client closed the connection
};

// Sends `parts` in order (frames and raw data); false once one fails.
template <typename R>
Task<bool> sendAll(storage::TcpChannel<R>& channel, std::vector<std::span<const std::byte>> parts) {
  for (std::span<const std::byte> part : parts) {
    const Result<void> sent = co_await channel.send(part, {});
    if (!sent) co_return false;
  }
  co_return true;
}

std::vector<std::byte> emptyFrame(storage::proto::MessageType type, std::uint64_t id) {
  std::vector<std::byte> frame;
  storage::proto::encodeEmpty(frame, type, id);
  return frame;
}

// An IoData frame for `bytes` of IO 0 at `offset`.
std::vector<std::byte> pieceFrame(std::uint64_t id, std::size_t offset, std::span<const std::byte> bytes) {
  std::vector<std::byte> frame;
  storage::proto::encode(frame, id,
                         storage::proto::IoData{0, static_cast<std::uint32_t>(offset),
                                                static_cast<std::uint32_t>(bytes.size())});
  return frame;
}

std::vector<std::byte> responseFrame(std::uint64_t id, IoStatus status, std::span<const std::byte> data) {
  const storage::proto::IoResult result{status, static_cast<std::uint32_t>(data.size()),
                                        status == IoStatus::ok ? storage::crc32c(data) : 0};
  std::vector<std::byte> frame;
  storage::proto::encode(frame, id, storage::proto::BatchReadResponse{{result}});
  return frame;
}

// A server written from PROTOCOL.md, for one client on its connection: it
// stalls the first request at `stall` (the connection up, silent) until
// `resume` (the client timed out), then goes on as a late server would.
// Where the client keeps the connection it then serves a second request in
// full. Last it reads until the client closes. The IO's data goes in two
// pieces.
template <typename R>
Task<void> playScript(R& reactor, storage::TcpChannel<R>& channel, Stall stall, std::stop_token resume,
                      PeerLog& log) {
  using storage::proto::MessageType;
  const std::vector<std::byte> data = peerData();
  const std::span<const std::byte> all(data), first = all.first(all.size() / 2), second = all.subspan(all.size() / 2);
  // Reads a BatchReadRequest: its id, and whether it came granted.
  const auto request = [&](std::uint64_t& id, bool& granted) -> Task<bool> {
    storage::ReadFailure failure;
    auto read = [&](std::stop_token stop) { return channel.readFrame(failure, std::move(stop)); };
    const Result<storage::IncomingFrame> frame = co_await coio::withTimeout(reactor, read, kPeerPatience);
    if (!frame || frame->header.type != MessageType::batchReadRequest) co_return false;
    const Result<storage::proto::BatchReadRequest> decoded = storage::proto::decodeBatchReadRequest(frame->payload, 1);
    if (!decoded) co_return false;
    id = frame->header.requestId;
    granted = decoded->granted;
    co_return true;
  };
  std::uint64_t id = 0;
  bool granted = false;
  if (!co_await request(id, granted)) co_return;
  if (granted != (stall != Stall::afterTransmitRequest)) co_return;  // the client granted as it should have
  const std::vector<std::byte> firstPiece = pieceFrame(id, 0, first), secondPiece = pieceFrame(id, first.size(), second);
  const std::vector<std::byte> ok = responseFrame(id, IoStatus::ok, data);
  const std::vector<std::byte> ask = emptyFrame(MessageType::transmitRequest, id);
  const std::vector<std::byte> timedOut = responseFrame(id, IoStatus::timedOut, {});
  // What goes before the stall, and (late) after it.
  std::vector<std::span<const std::byte>> before, after;
  switch (stall) {
    case Stall::beforeData: after = {firstPiece, first, secondPiece, second, ok}; break;
    case Stall::afterTransmitRequest:  // never granted (the client gave up first): answered without data
      before = {ask};
      after = {timedOut};
      break;
    case Stall::betweenPieces:
      before = {firstPiece, first};
      after = {secondPiece, second, ok};
      break;
    case Stall::midPiece:
      before = {firstPiece, first.first(first.size() / 2)};
      after = {first.subspan(first.size() / 2), secondPiece, second, ok};
      break;
  }
  if (!co_await sendAll(channel, std::move(before))) co_return;
  log.servedFirst = true;
  const bool clientGaveUp = !co_await reactor.sleepFor(kPeerPatience, resume);
  if (!clientGaveUp) co_return;  // closes: the client then fails with EOF, not timed_out
  // The rest of the exchange, late; writes may fail where the client cut
  // the connection, and what arrives must not land in the caller's buffer.
  (void)co_await sendAll(channel, std::move(after));
  if (keepsConnection(stall)) {
    // The next request comes granted (the timeout freed the slot); a grant
    // for the given-up request would arrive here instead.
    std::uint64_t next = 0;
    bool nextGranted = false;
    if (!co_await request(next, nextGranted) || !nextGranted) co_return;
    const std::vector<std::byte> one = pieceFrame(next, 0, first), two = pieceFrame(next, first.size(), second);
    const std::vector<std::byte> nextOk = responseFrame(next, IoStatus::ok, data);
    std::vector<std::span<const std::byte>> nextParts = {one, first, two, second, nextOk};
    log.servedSecond = co_await sendAll(channel, std::move(nextParts));
  }
  storage::ReadFailure failure;
  auto read = [&](std::stop_token stop) { return channel.readFrame(failure, std::move(stop)); };
  for (;;) {
    const Result<storage::IncomingFrame> frame = co_await coio::withTimeout(reactor, read, kPeerPatience);
    if (frame) continue;
    log.sawEnd = frame.error() != std::errc::timed_out;  // EOF or a reset
    break;
  }
}

template <typename R>
Task<void> scriptedPeer(R& reactor, coio::TcpListener<R>& listener, Stall stall, std::stop_token resume,
                        PeerLog& log) {
  Result<coio::TcpStream<R>> accepted = co_await listener.accept();
  if (!accepted) co_return;
  storage::TcpChannel<R> channel(std::move(*accepted));
  co_await playScript(reactor, channel, stall, std::move(resume), log);
  co_await channel.close();
}

// The client's side: a batchRead that the peer stalls, then what the
// client does next. Sets `resume` when its batchRead has returned.
template <typename S>
Task<void> stalledClient(Fixture<S>& fx, coio::SocketAddress peer, Stall stall, std::stop_source& resume,
                         const PeerLog& log, storage::StorageClient<typename S::R>& good) {
  using R = typename S::R;
  using Clock = std::chrono::steady_clock;
  Result<coio::TcpStream<R>> stream = co_await coio::TcpStream<R>::connect(fx.reactor, peer);
  REQUIRE(stream);
  auto client = storage::StorageClient<R>::open(std::make_unique<storage::TcpChannel<R>>(std::move(*stream)),
                                                fx.limiter, {.timeout = kClientTimeout});
  std::vector<std::byte> into(kStalledIoSize, kPoison);
  const ReadOp op{1, 0, kStalledIoSize, into};
  // Holding the only slot makes the client send the request ungranted.
  const bool held = stall == Stall::afterTransmitRequest && fx.limiter.tryAcquire();
  const Clock::time_point start = Clock::now();
  const Result<std::vector<ReadOutcome>> stalled = co_await client->batchRead(std::span(&op, 1));
  const Clock::duration took = Clock::now() - start;
  const std::vector<std::byte> atReturn = into;
  if (held) fx.limiter.release();
  // The timeout freed the request's limiter slot, the peer still stalled:
  // another client sharing the one-slot limiter gets a grant (else the
  // server times that request out).
  const std::vector<ReadOp> probe = {{5, 100, 20000, {}}};
  const std::vector<ReadOutcome> probed = co_await readAndCheck(fx, good, probe);
  CHECK(probed[0].status == IoStatus::ok);
  resume.request_stop();
  CHECK(log.servedFirst);
  CHECK(stalled.error() == std::errc::timed_out);
  CHECK(took >= kClientTimeout);
  CHECK(took < 2s);

  if (keepsConnection(stall)) {
    // The late pieces are read into scratch; the next request works.
    std::vector<std::byte> next(kStalledIoSize, kPoison);
    const ReadOp nextOp{2, 0, kStalledIoSize, next};
    const Result<std::vector<ReadOutcome>> served = co_await client->batchRead(std::span(&nextOp, 1));
    INFO(served.error().message());
    CHECK(served);
    CHECK(log.servedSecond);
    CHECK(next == peerData());
    CHECK_FALSE(client->failure());
  } else {
    // The connection is cut: the peer sees it end; later calls fail at once.
    const bool ended = co_await eventually(fx.reactor, [&log] { return log.sawEnd; });
    CHECK(ended);
    co_await fx.reactor.sleepFor(20ms);  // time for a (wrong) late read to land
    CHECK(client->failure() == std::errc::timed_out);
    const Clock::time_point again = Clock::now();
    const Result<std::vector<ReadOutcome>> after = co_await client->batchRead(std::span(&op, 1));
    CHECK(after.error() == std::errc::timed_out);
    CHECK(Clock::now() - again < kClientTimeout);
  }
  CHECK(into == atReturn);  // nothing landed in the caller's buffer after batchRead returned
  co_await client->close();
}

template <typename S>
Task<void> runStalled(Fixture<S>& fx, coio::TcpListener<typename S::R>& listener, Stall stall, PeerLog& log,
                      storage::StorageClient<typename S::R>& good) {
  std::stop_source resume;
  co_await coio::collectAll(scriptedPeer(fx.reactor, listener, stall, resume.get_token(), log),
                            stalledClient(fx, *listener.localAddress(), stall, resume, log, good));
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("batchRead times out wherever the server stalls; its buffer is never written after",
                        "[storage][e2e][timeout]", Setups) {
  using R = typename TestType::R;
  for (const Stall stall :
       {Stall::beforeData, Stall::afterTransmitRequest, Stall::betweenPieces, Stall::midPiece}) {
    INFO("the server stalls " << toString(stall));
    Fixture<TestType> f(Fixture<TestType>::small(), 1);  // one transmission slot, shared by both clients
    PeerLog log;
    f.run([stall, &log](Fixture<TestType>& fx) -> Task<void> {
      auto listener = coio::TcpListener<R>::bind(fx.reactor, coio::SocketAddress::loopbackV4());
      REQUIRE(listener);
      auto good = co_await fx.client();
      co_await runStalled(fx, *listener, stall, log, *good);
      co_await good->close();
    });
    CHECK(log.sawEnd);
  }
}
#endif
