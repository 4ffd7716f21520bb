// EtcdClient against a fake etcd (a coio TCP server in the test, fake_etcd.hpp) that
// answers with scripted replies: truncated, oversized and malformed HTTP,
// invalid JSON, JSON of the wrong shape, error replies. Each gives a clear
// error, at once, and the client stays usable: the next call, answered
// properly, succeeds. A real etcd cannot be made to misbehave like this.
#include "etcd/etcd_client.hpp"
#include "fake_etcd.hpp"

#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

using namespace std::chrono_literals;
using namespace storage::etcd;
using namespace storage::etcd::fake;
using storage::http1::HttpErrc;
using coio::Result;
using coio::Task;

namespace {

using Reactors = std::tuple<coio::EpollReactor, coio::UringReactor>;

constexpr auto kReplyTimeout = 2s;
constexpr auto kPrompt = 1s;  // a clear error comes at once, not at the deadline

const std::string kGoodRange =
    R"({"header":{"cluster_id":"1","member_id":"2","revision":"7","raft_term":"3"},)"
    R"("kvs":[{"key":"YQ==","value":"Yg==","create_revision":"5","mod_revision":"7","version":"2"}],"count":"1"})";

template <typename R>
std::unique_ptr<EtcdClient<R>> clientOf(R& reactor, const std::string& endpoint, std::vector<std::string>& log,
                                        std::size_t maxBody = 1u << 20) {
  EtcdOptions o;
  o.endpoints = {endpoint};
  o.backoffMin = 5ms;
  o.limits.maxBodyBytes = maxBody;
  o.log = [&log](const std::string& line) { log.push_back(line); };
  auto made = EtcdClient<R>::create(reactor, std::move(o));
  REQUIRE(made);
  return std::move(*made);
}

struct BadReply {
  const char* what;
  Reply reply;
  std::error_code expected;
};

std::vector<BadReply> badReplies() {
  const std::string longHeader = "HTTP/1.1 200 OK\r\nX-Filler: " + std::string(20000, 'a') + "\r\n\r\n";
  return {
      {"a malformed status line", {"HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"}, HttpErrc::malformedStatusLine},
      {"a status line without a code", {"HTTP/1.1 OK\r\n\r\n"}, HttpErrc::malformedStatusLine},
      {"a bare LF", {"HTTP/1.1 200 OK\n\n"}, HttpErrc::malformedStatusLine},
      {"an interim 100", {"HTTP/1.1 100 Continue\r\n\r\n"}, HttpErrc::unsupported},
      {"a header without a colon", {"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n"}, HttpErrc::malformedHeader},
      {"a folded header", {"HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n"}, HttpErrc::malformedHeader},
      {"an oversized head", {longHeader}, HttpErrc::headTooLarge},
      {"an oversized Content-Length", {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"},
       HttpErrc::bodyTooLarge},
      {"a Content-Length beyond 64 bits", {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n"},
       HttpErrc::bodyTooLarge},
      {"a negative Content-Length", {"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"}, HttpErrc::badContentLength},
      {"two Content-Lengths", {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"},
       HttpErrc::badContentLength},
      {"no length at all", {"HTTP/1.1 200 OK\r\n\r\n{}"}, HttpErrc::unsupported},
      {"a gzip transfer coding", {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"}, HttpErrc::unsupported},
      {"a chunk size that is no number", {kChunkedHead + "zz\r\n"}, HttpErrc::badChunk},
      {"an oversized chunk", {kChunkedHead + "fffffffff\r\n"}, HttpErrc::bodyTooLarge},
      {"a chunk size beyond 64 bits", {kChunkedHead + "fffffffffffffffffffff\r\n"}, HttpErrc::bodyTooLarge},
      {"a chunk without its CRLF", {kChunkedHead + "2\r\n{}XX\r\n"}, HttpErrc::badChunk},
      {"invalid JSON", {ok("{\"header\": {")}, EtcdErrc::badResponse},
      {"JSON nested too deep", {ok(std::string(100, '[') + std::string(100, ']'))}, EtcdErrc::badResponse},
      {"a JSON array", {ok("[1,2]")}, EtcdErrc::badResponse},
      {"kvs that is no array", {ok(R"({"kvs":"nope"})")}, EtcdErrc::badResponse},
      {"a revision that is no integer", {ok(R"({"header":{"revision":"abc"}})")}, EtcdErrc::badResponse},
      {"a revision beyond 64 bits", {ok(R"({"header":{"revision":"99999999999999999999"}})")},
       EtcdErrc::badResponse},
      {"a key that is no base64", {ok(R"({"kvs":[{"key":"!!"}]})")}, EtcdErrc::badResponse},
      {"an etcd error reply", {withLength("HTTP/1.1 400 Bad Request", R"({"error":"bad","message":"bad","code":3})")},
       EtcdErrc::invalidArgument},
      {"an HTTP error without JSON", {withLength("HTTP/1.1 502 Bad Gateway", "upstream gone")}, EtcdErrc::httpStatus},
  };
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("etcd client: a bad reply gives a clear error and the client stays usable",
                        "[etcd][bad-input]", Reactors) {
  TestType reactor;
  FakeEtcd<TestType> fake(reactor);
  std::vector<std::string> log;
  auto client = clientOf(reactor, fake.endpoint(), log);
  reactor.runUntil(guarded(fake, [&]() -> Task<void> {
    for (const BadReply& bad : badReplies()) {
      INFO(bad.what);
      fake.replies.push_back(bad.reply);
      const auto started = Clock::now();
      Result<RangeResponse> refused = co_await client->range({"a"}, kReplyTimeout);
      CHECK(Clock::now() - started < kPrompt);
      REQUIRE(!refused);
      INFO("got: " << refused.error().message() << "; last: " << client->lastError());
      CHECK(refused.error() == bad.expected);
      CHECK(!client->lastError().empty());
      fake.replies.push_back({ok(kGoodRange)});
      Result<RangeResponse> fine = co_await client->range({"a"}, kReplyTimeout);
      REQUIRE(fine);
      REQUIRE(fine->kvs.size() == 1);
      CHECK(fine->kvs[0].key == "a");
      CHECK(fine->kvs[0].value == "b");
      CHECK(fine->header.revision == 7);
    }
  }()));
}

TEMPLATE_LIST_TEST_CASE("etcd client: a reply cut short fails a write and is retried for a read",
                        "[etcd][bad-input]", Reactors) {
  TestType reactor;
  FakeEtcd<TestType> fake(reactor);
  std::vector<std::string> log;
  auto client = clientOf(reactor, fake.endpoint(), log);
  reactor.runUntil(guarded(fake, [&]() -> Task<void> {
    for (std::string cut : {std::string("HTTP/1.1 20"), ok(R"({"header":{}})").substr(0, 60),
                            kChunkedHead + "10\r\n{\"header\"", kChunkedHead + chunk("{}")}) {
      INFO(cut);
      // A write: etcd may have applied it, so no retry; the error says why.
      fake.replies.push_back({cut, true});
      Result<PutResponse> put = co_await client->put({"a", "b"}, kReplyTimeout);
      REQUIRE(!put);
      CHECK(put.error() == HttpErrc::truncated);
      // A read: retried on a new connection, which answers.
      fake.replies.push_back({cut, true});
      fake.replies.push_back({ok(kGoodRange)});
      Result<RangeResponse> range = co_await client->range({"a"}, kReplyTimeout);
      CHECK(range);
      CHECK(client->lastError().find("truncated") != std::string::npos);
    }
    // A keep-alive connection the server closed while idle: any call, a
    // write too, is sent again on a new one (the request was never read).
    fake.replies.push_back({ok(R"({"header":{"revision":"8"}})"), true});
    Result<PutResponse> first = co_await client->put({"a", "b"}, kReplyTimeout);
    REQUIRE(first);
    fake.replies.push_back({ok(R"({"header":{"revision":"9"}})")});
    Result<PutResponse> second = co_await client->put({"a", "c"}, kReplyTimeout);
    REQUIRE(second);
    CHECK(second->header.revision == 9);
  }()));
}

TEMPLATE_LIST_TEST_CASE("etcd client: a watch stream with a bad message reports it and reconnects",
                        "[etcd][bad-input]", Reactors) {
  TestType reactor;
  FakeEtcd<TestType> fake(reactor);
  std::vector<std::string> log;
  auto client = clientOf(reactor, fake.endpoint(), log, 4096);
  const std::string created = R"({"result":{"header":{"revision":"10"},"created":true}})" "\n";
  const auto event = [](int revision) {
    return R"({"result":{"header":{"revision":")" + std::to_string(revision) +
           R"("},"events":[{"kv":{"key":"YQ==","value":"Yg==","mod_revision":")" + std::to_string(revision) +
           R"("}}]}})" "\n";
  };
  reactor.runUntil(guarded(fake, [&]() -> Task<void> {
    // The stream: created, an event, then garbage.
    fake.replies.push_back({kChunkedHead + chunk(created) + chunk(event(11)) + chunk("{garbage\n")});
    Result<std::unique_ptr<EtcdWatch<TestType>>> watch = co_await client->watch({"a"}, kReplyTimeout);
    REQUIRE(watch);
    EtcdWatch<TestType>& w = **watch;
    Result<WatchBatch> first = co_await w.next(kReplyTimeout);
    REQUIRE(first);
    CHECK(first->events.at(0).kv.modRevision == 11);
    Result<WatchBatch> bad = co_await w.next(kReplyTimeout);
    CHECK(bad.error() == EtcdErrc::badResponse);
    // Reconnects from revision 12; a message split across chunks, then one
    // over the size bound.
    const std::string split = event(12);
    fake.replies.push_back({kChunkedHead + chunk(created) + chunk(split.substr(0, 20)) + chunk(split.substr(20)) +
                            chunk(std::string(5000, ' '))});
    Result<WatchBatch> again = co_await w.next(kReplyTimeout);
    REQUIRE(again);
    CHECK(again->events.at(0).kv.modRevision == 12);
    Result<WatchBatch> huge = co_await w.next(kReplyTimeout);
    CHECK(huge.error() == HttpErrc::bodyTooLarge);
    // A stream that ends is reopened; the request asked from revision 13.
    fake.replies.push_back({kChunkedHead + chunk(created) + "0\r\n\r\n"});
    fake.replies.push_back({kChunkedHead + chunk(created) + chunk(event(13))});
    Result<WatchBatch> last = co_await w.next(kReplyTimeout);
    REQUIRE(last);
    CHECK(last->events.at(0).kv.modRevision == 13);
    CHECK(w.nextRevision() == 14);
    REQUIRE(fake.targets.size() == 4);
    for (const std::string& target : fake.targets) CHECK(target == "/v3/watch");
    CHECK(fake.bodies[0].find("start_revision") == std::string::npos);  // from now
    CHECK(fake.bodies[1].find(R"("start_revision":"12")") != std::string::npos);
    CHECK(fake.bodies[2].find(R"("start_revision":"13")") != std::string::npos);
    CHECK(fake.bodies[3].find(R"("start_revision":"13")") != std::string::npos);
  }()));
}
