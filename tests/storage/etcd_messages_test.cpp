// The etcd client's pure parts: the HTTP/1.1 response parser fed in pieces
// of every size, base64, range ends, and the JSON the gateway reads.
#include "etcd/etcd_messages.hpp"
#include "etcd/http1.hpp"

#include <catch2/catch.hpp>

#include <string>

using namespace storage::etcd;
using namespace storage::http1;

namespace {

// Feeds `bytes` in pieces of `step`: the body, or the first error.
coio::Result<std::string> parseInPieces(const std::string& bytes, std::size_t step, ResponseParser& parser) {
  std::string body;
  std::size_t at = 0;
  while (at < bytes.size() && !parser.complete()) {
    coio::Result<std::size_t> used = parser.feed(std::string_view(bytes).substr(at, step), body);
    if (!used) return used.error();
    at += *used;
  }
  if (coio::Result<void> end = parser.finish(); !end) return end.error();
  return body;
}

}  // namespace

TEST_CASE("http1: a response parses the same in pieces of any size", "[etcd]") {
  const std::string chunked =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nX-Other: a:b\r\n\r\n"
      "5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: t\r\n\r\n";
  const std::string sized = "HTTP/1.1 404 Not Found\r\ncontent-length:  3 \r\nConnection: keep-alive, Close\r\n\r\nabc";
  for (std::size_t step : {1, 2, 3, 7, 64, 4096}) {
    INFO("step " << step);
    ResponseParser a;
    coio::Result<std::string> body = parseInPieces(chunked, step, a);
    REQUIRE(body);
    CHECK(*body == "hello world");
    CHECK(a.status() == 200);
    CHECK(a.keepAlive());
    ResponseParser b;
    coio::Result<std::string> text = parseInPieces(sized, step, b);
    REQUIRE(text);
    CHECK(*text == "abc");
    CHECK(b.status() == 404);
    CHECK(!b.keepAlive());
  }
  // What follows a complete response is not consumed.
  ResponseParser p;
  std::string body;
  const std::string twice = "HTTP/1.0 204 No Content\r\n\r\nHTTP/1.1";
  coio::Result<std::size_t> used = p.feed(twice, body);
  REQUIRE(used);
  CHECK(*used == twice.size() - 8);
  CHECK(p.complete());
  CHECK(!p.keepAlive());  // HTTP/1.0
}

TEST_CASE("http1: a long chunked stream ends with its trailers", "[etcd]") {
  // A watch stream: thousands of chunk lines, more bytes than a head may
  // hold, then the last chunk and a trailer.
  std::string stream = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 5000; ++i) stream += "1\r\nx\r\n";
  stream += "0\r\nX-Trailer: t\r\n\r\n";
  ResponseParser parser(Limits{1024, 1u << 20});
  coio::Result<std::string> body = parseInPieces(stream, 4096, parser);
  REQUIRE(body);
  CHECK(body->size() == 5000);
}

TEST_CASE("http1: limits hold and errors stay", "[etcd]") {
  ResponseParser p(Limits{64, 10});
  std::string body;
  CHECK(p.feed("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", body).error() == HttpErrc::bodyTooLarge);
  CHECK(p.feed("anything", body).error() == HttpErrc::bodyTooLarge);
  ResponseParser head(Limits{64, 10});
  CHECK(head.feed("HTTP/1.1 200 OK\r\nX: " + std::string(60, 'x'), body).error() == HttpErrc::headTooLarge);
  ResponseParser chunks(Limits{64, 10});
  const std::string two = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n123456\r\n6\r\n";
  CHECK(chunks.feed(two, body).error() == HttpErrc::bodyTooLarge);  // the total, not each chunk
  ResponseParser cut;
  REQUIRE(cut.feed("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", body));
  CHECK(cut.finish().error() == HttpErrc::truncated);
}

TEST_CASE("etcd messages: base64 and range ends", "[etcd]") {
  const std::string samples[] = {"", "f", "fo", "foo", "foob", std::string("\0\xff\x10", 3)};
  for (const std::string& s : samples) {
    CHECK(base64Decode(base64Encode(s)) == s);
  }
  CHECK(base64Encode("foob") == "Zm9vYg==");
  CHECK(!base64Decode("Zm9"));
  CHECK(!base64Decode("Zm=v"));
  CHECK(!base64Decode("Zm9v!A=="));
  CHECK(prefixEnd("/a/") == "/a0");
  CHECK(prefixEnd("a\xff") == "b");
  CHECK(prefixEnd("\xff") == std::string(1, '\0'));
}

TEST_CASE("etcd messages: requests in the gateway's JSON, replies decoded", "[etcd]") {
  TxnRequest t{{Compare::modRevision("k", Compare::Op::less, 5)}, {PutRequest{"k", "v", 7}}, {DeleteRequest{"k"}}};
  const Json j = Json::parse(encode(t));
  CHECK(j["compare"][0]["target"] == "MOD");
  CHECK(j["compare"][0]["result"] == "LESS");
  CHECK(j["compare"][0]["mod_revision"] == "5");
  CHECK(j["success"][0]["request_put"]["lease"] == "7");
  CHECK(j["success"][0]["request_put"]["value"] == "dg==");
  CHECK(j["failure"][0]["request_delete_range"]["key"] == "aw==");

  std::string why;
  const Json reply = Json::parse(
      R"({"header":{"revision":"12"},"succeeded":true,"responses":[{"response_put":{"header":{}}},)"
      R"({"response_range":{"kvs":[{"key":"aw==","lease":"9"}],"count":"1"}}]})");
  coio::Result<TxnResponse> txn = decode<TxnResponse>(reply, why);
  REQUIRE(txn);
  CHECK(txn->header.revision == 12);
  CHECK(txn->succeeded);
  REQUIRE(txn->responses.size() == 2);
  CHECK(std::get<RangeResponse>(txn->responses[1]).kvs.at(0).lease == 9);
  const Json noOp = Json::parse(R"({"responses":[{}]})");
  CHECK(decode<TxnResponse>(noOp, why).error() == EtcdErrc::badResponse);
  CHECK(why.find("no single response") != std::string::npos);

  std::optional<EtcdFailure> f = decodeFailure(Json::parse(R"({"error":{"grpc_code":14,"message":"no leader"}})"));
  REQUIRE(f);
  CHECK(f->code == EtcdErrc::unavailable);
  CHECK(f->message == "no leader");
}
