#pragma once
// A simulated etcd: a coio TCP server that serves a SimEtcdStore as etcd
// v3's JSON gateway does (the subset EtcdClient speaks: /v3/kv/range, put,
// deleterange, txn; /v3/lease/grant, keepalive, revoke, timetolive;
// /v3/watch as a chunked stream), with leases that expire on the reactor's
// clock. Run it as a node of a simulation (simEtcd), so that the fault API
// of coio::sim applies to it: kill / restart (its store, like etcd's data
// dir, stays), pause (SIGSTOP), setLink (a slow etcd); the store's own
// faults are compact() and loseLease(). docs/simulation.md, "etcd in the
// simulation", says what it models and what not.
#include "etcd/etcd_messages.hpp"
#include "etcd/http1.hpp"
#include "sim_etcd_store.hpp"

#include <coio/core/async_scope.hpp>
#include <coio/core/cancellation.hpp>
#include <coio/core/collect_any.hpp>
#include <coio/core/event.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/net/tcp_listener.hpp>
#include <coio/net/tcp_stream.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/testing/sim_reactor.hpp>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace storage::etcd {

namespace simetcd {

// ---- HTTP/1.1 requests ------------------------------------------------------

struct Request {
  std::string method;
  std::string target;
  std::string body;
};

// etcd's default bound on a request (--max-request-bytes), and a head's.
constexpr std::size_t kMaxBody = 1536 * 1024;
constexpr std::size_t kMaxHead = 16 * 1024;

// Reads one request from `stream` into `out`; `buffer` keeps the bytes
// read past it. Errors: the transport's (Errc::eof between requests),
// std::errc::bad_message for what is not an HTTP/1.1 POST with a
// Content-Length, std::errc::message_size beyond the bounds.
template <coio::Reactor R>
coio::Task<coio::Result<void>> readRequest(coio::TcpStream<R>& stream, std::string& buffer, Request& out) {
  const auto more = [&]() -> coio::Task<coio::Result<void>> {
    char chunk[4096];
    coio::Result<std::size_t> n = co_await stream.read(std::as_writable_bytes(std::span(chunk)));
    if (!n) co_return n.error();
    buffer.append(chunk, *n);
    co_return coio::Result<void>{};
  };
  std::size_t headEnd;
  while ((headEnd = buffer.find("\r\n\r\n")) == std::string::npos) {
    if (buffer.size() > kMaxHead) co_return std::make_error_code(std::errc::message_size);
    coio::Result<void> read = co_await more();
    if (!read) co_return read.error();
  }
  const std::string_view head = std::string_view(buffer).substr(0, headEnd);
  const std::size_t lineEnd = head.find("\r\n");
  const std::string_view line = head.substr(0, lineEnd);
  const std::size_t space = line.find(' ');
  const std::size_t second = line.find(' ', space + 1);
  if (space == std::string_view::npos || second == std::string_view::npos || line.substr(second + 1, 7) != "HTTP/1.") {
    co_return std::make_error_code(std::errc::bad_message);
  }
  out.method = std::string(line.substr(0, space));
  out.target = std::string(line.substr(space + 1, second - space - 1));
  std::optional<std::size_t> length;
  for (std::size_t at = lineEnd; at != std::string_view::npos && at < head.size();) {
    const std::size_t next = head.find("\r\n", at + 2);
    const std::string_view header = head.substr(at + 2, next == std::string_view::npos ? head.npos : next - at - 2);
    at = next;
    const std::size_t colon = header.find(':');
    if (colon == std::string_view::npos) co_return std::make_error_code(std::errc::bad_message);
    const std::string_view name = header.substr(0, colon);
    const std::string_view value = http1::detail::trim(header.substr(colon + 1));
    if (http1::detail::equalsIgnoringCase(name, "transfer-encoding")) {
      co_return std::make_error_code(std::errc::bad_message);  // the client sends a length
    }
    if (http1::detail::equalsIgnoringCase(name, "content-length")) {
      std::size_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc{} || end != value.data() + value.size()) co_return std::make_error_code(std::errc::bad_message);
      length = n;
    }
  }
  if (!length) co_return std::make_error_code(std::errc::bad_message);
  if (*length > kMaxBody) co_return std::make_error_code(std::errc::message_size);
  while (buffer.size() < headEnd + 4 + *length) {
    coio::Result<void> read = co_await more();
    if (!read) co_return read.error();
  }
  out.body = buffer.substr(headEnd + 4, *length);
  buffer.erase(0, headEnd + 4 + *length);
  co_return coio::Result<void>{};
}

inline std::string reply(int status, std::string_view reason, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}
inline const std::string kStreamHead =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
// One message of a stream: a chunk of its JSON and a newline (as the gateway sends them).
inline std::string chunk(const std::string& json) {
  char size[16];
  const auto end = std::to_chars(size, size + sizeof size, json.size() + 1, 16).ptr;
  return std::string(size, end) + "\r\n" + json + "\n\r\n";
}
inline const std::string kStreamEnd = "0\r\n\r\n";

// A refusal as the gateway relays it: the HTTP status of its gRPC code,
// and {"error", "code", "message"}.
inline std::string refusalReply(const Refusal& r) {
  int status = 500;
  switch (r.code) {
    case 3:
    case 9:
    case 11: status = 400; break;
    case 5: status = 404; break;
    case 14: status = 503; break;
    default: break;
  }
  const Json body{{"error", r.message}, {"code", r.code}, {"message", r.message}};
  return reply(status, status == 400 ? "Bad Request" : (status == 404 ? "Not Found" : "Error"), body.dump());
}

// ---- the requests' JSON -------------------------------------------------------

inline RangeRequest rangeOf(const Json* j, std::string& why, bool& ok) {
  etcd::detail::Fields f(j, "range", why);
  RangeRequest r(f.bytes("key"), f.bytes("range_end"), f.int64("revision"));
  r.limit = f.int64("limit");
  r.keysOnly = f.boolean("keys_only");
  r.countOnly = f.boolean("count_only");
  ok = ok && f.ok();
  return r;
}

inline PutRequest putOf(const Json* j, std::string& why, bool& ok) {
  etcd::detail::Fields f(j, "put", why);
  PutRequest r(f.bytes("key"), f.bytes("value"), f.int64("lease"), f.boolean("prev_kv"));
  ok = ok && f.ok();
  return r;
}

inline DeleteRequest deleteOf(const Json* j, std::string& why, bool& ok) {
  etcd::detail::Fields f(j, "delete", why);
  DeleteRequest r(f.bytes("key"), f.bytes("range_end"), f.boolean("prev_kv"));
  ok = ok && f.ok();
  return r;
}

// An enum's JSON name (protobuf leaves out the default, the first).
template <typename E, std::size_t N>
E enumOf(etcd::detail::Fields& f, const char* field, const char* const (&names)[N]) {
  const std::string name = f.text(field);
  if (name.empty()) return E{};
  for (std::size_t i = 0; i < N; ++i) {
    if (name == names[i]) return static_cast<E>(i);
  }
  f.fail(field, "is not one of its names");
  return E{};
}

inline Compare compareOf(const Json& j, std::string& why, bool& ok) {
  static constexpr const char* kOps[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  static constexpr const char* kTargets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
  static constexpr const char* kFields[] = {"version", "create_revision", "mod_revision", "value", "lease"};
  etcd::detail::Fields f(&j, "compare", why);
  Compare c;
  c.op = enumOf<Compare::Op>(f, "result", kOps);
  c.target = enumOf<Compare::Target>(f, "target", kTargets);
  c.key = f.bytes("key");
  c.rangeEnd = f.bytes("range_end");
  const char* operand = kFields[static_cast<std::size_t>(c.target)];
  if (c.target == Compare::Target::value) {
    c.value = f.bytes(operand);
  } else {
    c.number = f.int64(operand);
  }
  ok = ok && f.ok();
  return c;
}

inline std::vector<TxnOp> opsOf(const Json* array, std::string& why, bool& ok) {
  std::vector<TxnOp> ops;
  if (array == nullptr) return ops;
  for (const Json& item : *array) {
    etcd::detail::Fields f(&item, "txn op", why);
    const Json* range = f.object("request_range");
    const Json* put = f.object("request_put");
    const Json* del = f.object("request_delete_range");
    if (f.ok() && (range != nullptr) + (put != nullptr) + (del != nullptr) != 1) f.fail("", "holds no single request");
    ok = ok && f.ok();
    if (!ok) return ops;
    if (range) ops.emplace_back(rangeOf(range, why, ok));
    if (put) ops.emplace_back(putOf(put, why, ok));
    if (del) ops.emplace_back(deleteOf(del, why, ok));
  }
  return ops;
}

inline TxnRequest txnOf(const Json* j, std::string& why, bool& ok) {
  etcd::detail::Fields f(j, "txn", why);
  const Json* compares = f.array("compare");
  const Json* success = f.array("success");
  const Json* failure = f.array("failure");
  ok = ok && f.ok();
  TxnRequest t;
  if (!ok) return t;
  if (compares != nullptr) {
    for (const Json& c : *compares) t.compare.push_back(compareOf(c, why, ok));
  }
  t.success = opsOf(success, why, ok);
  t.failure = opsOf(failure, why, ok);
  return t;
}

// ---- the replies' JSON ------------------------------------------------------

inline Json headerJson(const ResponseHeader& h) {
  return {{"cluster_id", std::to_string(h.clusterId)},
          {"member_id", std::to_string(h.memberId)},
          {"revision", std::to_string(h.revision)},
          {"raft_term", std::to_string(h.raftTerm)}};
}

// Protobuf's JSON: 64-bit integers as strings, a field at its default left out.
inline void setNumber(Json& j, const char* name, std::int64_t n) {
  if (n != 0) j[name] = std::to_string(n);
}

inline Json kvJson(const KeyValue& kv) {
  Json j{{"key", base64Encode(kv.key)}};
  setNumber(j, "create_revision", kv.createRevision);
  setNumber(j, "mod_revision", kv.modRevision);
  setNumber(j, "version", kv.version);
  if (!kv.value.empty()) j["value"] = base64Encode(kv.value);
  setNumber(j, "lease", kv.lease);
  return j;
}

inline Json kvsJson(const std::vector<KeyValue>& kvs) {
  Json array = Json::array();
  for (const KeyValue& kv : kvs) array.push_back(kvJson(kv));
  return array;
}

inline Json toJson(const RangeResponse& r) {
  Json j{{"header", headerJson(r.header)}};
  if (!r.kvs.empty()) j["kvs"] = kvsJson(r.kvs);
  if (r.more) j["more"] = true;
  setNumber(j, "count", r.count);
  return j;
}

inline Json toJson(const PutResponse& r) {
  Json j{{"header", headerJson(r.header)}};
  if (r.prevKv) j["prev_kv"] = kvJson(*r.prevKv);
  return j;
}

inline Json toJson(const DeleteResponse& r) {
  Json j{{"header", headerJson(r.header)}};
  setNumber(j, "deleted", r.deleted);
  if (!r.prevKvs.empty()) j["prev_kvs"] = kvsJson(r.prevKvs);
  return j;
}

inline Json toJson(const TxnResponse& t) {
  Json j{{"header", headerJson(t.header)}};
  if (t.succeeded) j["succeeded"] = true;
  if (t.responses.empty()) return j;
  Json responses = Json::array();
  for (const TxnOpResponse& each : t.responses) {
    static constexpr const char* kNames[] = {"response_range", "response_put", "response_delete_range"};
    responses.push_back({{kNames[each.index()], std::visit([](const auto& r) { return toJson(r); }, each)}});
  }
  j["responses"] = std::move(responses);
  return j;
}

inline Json toJson(const ResponseHeader& h) { return {{"header", headerJson(h)}}; }

inline Json leaseJson(const ResponseHeader& h, const Lease& l) {
  Json j{{"header", headerJson(h)}};
  setNumber(j, "ID", l.id);
  setNumber(j, "TTL", l.ttl);
  return j;
}

inline Json toJson(const Event& e, bool prevKv) {
  Json j{{"kv", kvJson(e.kv)}};
  if (e.type == Event::Type::del) j["type"] = "DELETE";
  if (prevKv && e.prevKv) j["prev_kv"] = kvJson(*e.prevKv);
  return j;
}

}  // namespace simetcd

/// Serves a SimEtcdStore as etcd's JSON gateway on `reactor` (any
/// reactor: a simulated node's, see simEtcd(), or a real one).
///
/// Guarantees:
/// - On `reactor`'s loop thread; run() returns once its awaiting task's
///   stop token is stopped and every connection it served has ended.
/// - Each request is applied to the store at once when it has arrived
///   whole, before a reply byte goes out (a reply lost on the way leaves
///   the write applied, as with etcd); requests on one connection are
///   answered in order; connections are served side by side.
/// - Leases expire on the reactor's clock, exactly at their deadline (a
///   timer per lease, and every request first expires the leases due). A
///   start (or a restart: a new SimEtcdServer on the same store) gives
///   every lease its full TTL again, as etcd's new leader does.
/// - Watches stream the store's changes from their start revision, one
///   message per revision, in order; a watch whose next revision was
///   compacted (at its creation, or while its stream lagged behind) gets
///   etcd's cancel with compact_revision. A watch's stream ends when its
///   client closes it.
/// - Bad input (not HTTP, an unknown path, JSON not of the call's shape)
///   gets the gateway's error reply; the server goes on. While the store
///   has no leader (SimEtcdStore::setNoLeader) every call but a watch is
///   answered Unavailable.
template <coio::Reactor R>
class SimEtcdServer {
 public:
  SimEtcdServer(R& reactor, SimEtcdStore& store) : reactor_(reactor), store_(store) {}
  SimEtcdServer(const SimEtcdServer&) = delete;
  SimEtcdServer& operator=(const SimEtcdServer&) = delete;

  /// Serves `store` on `address` until stopped. std::runtime_error if it
  /// cannot listen there (a test's setup error).
  coio::Task<void> run(coio::SocketAddress address) {
    coio::Result<coio::TcpListener<R>> listener = coio::TcpListener<R>::bind(reactor_, address);
    if (!listener) {
      throw std::runtime_error("simulated etcd: cannot listen on " + address.toString() + ": " +
                               listener.error().message());
    }
    store_.restartLeases(reactor_.now());
    store_.onChange([this] { onChange(); });
    for (std::int64_t id : store_.leases()) scope_.spawn(expire(id));
    const std::stop_token stop = co_await coio::currentStopToken();
    for (;;) {
      coio::Result<coio::TcpStream<R>> stream = co_await listener->accept(stop);
      if (!stream) break;
      scope_.spawn(serve(std::move(*stream)));
    }
    stopping_ = true;
    store_.onChange({});
    scope_.requestStop();
    co_await scope_.join();
  }

  ~SimEtcdServer() {
    if (!stopping_) store_.onChange({});
  }

 private:
  using Stream = coio::TcpStream<R>;

  // The store changed (maybe from outside this reactor: a test's fault):
  // the watch streams are woken from this reactor's loop.
  void onChange() {
    if (stopping_) return;
    scope_.spawn(wakeWatches());
  }
  coio::Task<void> wakeWatches() {
    co_await reactor_.schedule();
    std::exchange(changed_, std::make_shared<coio::Event>())->set();
  }

  // Expires lease `id` at its deadline, as long as it lives (while the
  // member has no leader, at the deadline the leader's return gives it).
  coio::Task<void> expire(std::int64_t id) {
    const std::stop_token stop = co_await coio::currentStopToken();
    for (std::optional<SimEtcdStore::Clock::time_point> due; (due = store_.deadline(id));) {
      if (*due > reactor_.now()) {
        if (!co_await reactor_.sleepUntil(*due, stop)) co_return;
      } else if (store_.expireDue(reactor_.now()) == 0) {
        const std::shared_ptr<coio::Event> changed = changed_;  // no leader: until there is one
        if (!co_await changed->wait(stop)) co_return;
      }
    }
  }

  // Requests on one connection, answered in order, until it ends (or a
  // request that is none: refused, then the connection closed).
  // (Replies are named before they are sent: g++ 12 frees an aggregate
  // temporary in a co_await expression twice.)
  coio::Task<void> serve(Stream stream) {
    std::string buffer;
    for (;;) {
      simetcd::Request request;
      coio::Result<void> read = co_await simetcd::readRequest(stream, buffer, request);
      const bool malformed = !read && (read.error() == std::errc::bad_message || read.error() == std::errc::message_size);
      if (!read && !malformed) co_return;  // the client's end
      store_.expireDue(reactor_.now());
      std::string why;
      coio::Result<Json> json = malformed ? coio::Result<Json>(EtcdErrc::badResponse) : parseJson(request.body, why);
      if (json && request.method == "POST" && request.target == "/v3/watch") {  // (no leader needed)
        co_await watch(stream, *json);
        co_return;
      }
      std::string answer;
      if (store_.noLeader()) {
        answer = simetcd::refusalReply(Refusal{14, "etcdserver: no leader"});
      } else if (malformed) {
        answer = simetcd::refusalReply(Refusal{3, "bad request: " + read.error().message()});
      } else if (request.method != "POST") {
        answer = simetcd::reply(405, "Method Not Allowed",
                                R"({"error":"Method Not Allowed","code":12,"message":"Method Not Allowed"})");
      } else if (!json) {
        answer = simetcd::refusalReply(Refusal{3, why});
      } else {
        answer = call(request.target, *json);
      }
      coio::Result<void> sent = co_await send(stream, answer);
      if (!sent || malformed || request.method != "POST" || request.target == "/v3/lease/keepalive") co_return;
    }
  }

  static coio::Task<coio::Result<void>> send(Stream& stream, const std::string& bytes) {
    return stream.writeAll(std::as_bytes(std::span(bytes)));
  }

  // A unary call's (or the keep-alive's one-message stream's) whole reply.
  std::string call(const std::string& target, const Json& json) {
    std::string why;
    bool ok = true;
    Outcome<Json> outcome = Refusal{5, "Not Found"};
    if (target == "/v3/kv/range") {
      RangeRequest r = simetcd::rangeOf(&json, why, ok);
      if (ok) outcome = jsonOf(store_.range(r));
    } else if (target == "/v3/kv/put") {
      PutRequest r = simetcd::putOf(&json, why, ok);
      if (ok) outcome = jsonOf(store_.put(r));
    } else if (target == "/v3/kv/deleterange") {
      DeleteRequest r = simetcd::deleteOf(&json, why, ok);
      if (ok) outcome = jsonOf(store_.deleteRange(r));
    } else if (target == "/v3/kv/txn") {
      TxnRequest r = simetcd::txnOf(&json, why, ok);
      if (ok) outcome = jsonOf(store_.txn(r));
    } else if (target == "/v3/lease/grant") {
      etcd::detail::Fields f(&json, "grant", why);
      const std::int64_t ttl = f.int64("TTL");
      const std::int64_t id = f.int64("ID");
      ok = f.ok();
      if (ok) {
        Outcome<Lease> granted = store_.grant(ttl, id, reactor_.now());
        if (const Lease* lease = std::get_if<Lease>(&granted)) {
          scope_.spawn(expire(lease->id));
          outcome = simetcd::leaseJson(store_.header(), *lease);
        } else {
          outcome = std::get<Refusal>(granted);
        }
      }
    } else if (target.starts_with("/v3/lease/")) {
      etcd::detail::Fields f(&json, "lease", why);
      const std::int64_t id = f.int64("ID");
      ok = f.ok();
      if (ok && target == "/v3/lease/keepalive") {
        const Lease renewed = store_.keepAlive(id, reactor_.now());
        return simetcd::kStreamHead +
               simetcd::chunk(Json{{"result", simetcd::leaseJson(store_.header(), renewed)}}.dump()) +
               simetcd::kStreamEnd;
      }
      if (ok && target == "/v3/lease/revoke") outcome = jsonOf(store_.revoke(id));
      if (ok && target == "/v3/lease/timetolive") {
        const LeaseStatus status = store_.timeToLive(id, reactor_.now());
        Json j = simetcd::leaseJson(store_.header(), Lease{status.id, status.ttl});
        simetcd::setNumber(j, "grantedTTL", status.grantedTtl);
        outcome = std::move(j);
      }
    }
    if (!ok) outcome = Refusal{3, why};
    if (const Refusal* refused = std::get_if<Refusal>(&outcome)) return simetcd::refusalReply(*refused);
    return simetcd::reply(200, "OK", std::get<Json>(outcome).dump());
  }

  template <typename T>
  static Outcome<Json> jsonOf(const Outcome<T>& outcome) {
    if (const Refusal* refused = std::get_if<Refusal>(&outcome)) return *refused;
    return simetcd::toJson(std::get<T>(outcome));
  }

  // A watch's stream: created, then its events; until the client closes it.
  coio::Task<void> watch(Stream& stream, const Json& json) {
    std::string why;
    etcd::detail::Fields f(&json, "watch", why);
    const Json* create = f.object("create_request");
    if (f.ok() && create == nullptr) f.fail("create_request", "is missing");
    WatchRequest w;
    if (f.ok()) {
      etcd::detail::Fields c(create, "create_request", why);
      w = WatchRequest(c.bytes("key"), c.bytes("range_end"), c.int64("start_revision"), c.boolean("prev_kv"));
      if (c.ok() && w.key.empty()) c.fail("key", "is empty");
    }
    if (!why.empty()) {
      const std::string refused = simetcd::refusalReply(Refusal{3, why});
      (void)co_await send(stream, refused);
      co_return;
    }
    // Whichever ends first: the client's side (its close), or the stream (a send failed).
    co_await coio::collectAny(untilClosed(stream), streamChanges(stream, w));
  }

  static coio::Task<void> untilClosed(Stream& stream) {
    char sink[512];
    for (;;) {
      coio::Result<std::size_t> n = co_await stream.read(std::as_writable_bytes(std::span(sink)));
      if (!n) co_return;
    }
  }

  coio::Task<void> streamChanges(Stream& stream, WatchRequest w) {
    const std::stop_token stop = co_await coio::currentStopToken();
    std::int64_t next = w.startRevision > 0 ? w.startRevision : store_.revision() + 1;
    const Json created{{"header", simetcd::headerJson(store_.header())}, {"created", true}};
    std::string out = simetcd::kStreamHead + simetcd::chunk(Json{{"result", created}}.dump());
    for (;;) {
      if (next < store_.compactRevision()) {
        const Json canceled{{"header", simetcd::headerJson(store_.header())},
                            {"canceled", true},
                            {"compact_revision", std::to_string(store_.compactRevision())}};
        out += simetcd::chunk(Json{{"result", canceled}}.dump());
        coio::Result<void> sent = co_await send(stream, out);
        // etcd keeps the stream (it may carry other watches): until the client closes it.
        while (sent) {
          const std::shared_ptr<coio::Event> changed = changed_;
          if (!co_await changed->wait(stop)) co_return;
        }
        co_return;
      }
      const auto [first, end] = store_.changesFrom(next);
      for (auto it = first; it != end; ++it) {
        Json events = Json::array();
        for (const Event& e : it->events) {
          if (SimEtcdStore::inRange(e.kv.key, w.key, w.rangeEnd)) events.push_back(simetcd::toJson(e, w.prevKv));
        }
        if (!events.empty()) {
          Json header = simetcd::headerJson(store_.header());
          out += simetcd::chunk(Json{{"result", {{"header", std::move(header)}, {"events", std::move(events)}}}}.dump());
        }
        next = it->revision + 1;
      }
      if (!out.empty()) {
        coio::Result<void> sent = co_await send(stream, std::exchange(out, {}));
        if (!sent) co_return;
        continue;
      }
      const std::shared_ptr<coio::Event> changed = changed_;
      if (!co_await changed->wait(stop)) co_return;
    }
  }

  R& reactor_;
  SimEtcdStore& store_;
  std::shared_ptr<coio::Event> changed_ = std::make_shared<coio::Event>();  // set (and replaced) at each change
  bool stopping_ = false;
  coio::AsyncScope scope_;  // connections, lease timers, wake-ups
};

/// What simEtcd's node runs (a named coroutine: its arguments live in its frame).
inline coio::Task<void> serveEtcd(coio::sim::SimReactor& reactor, SimEtcdStore& store, std::uint16_t port) {
  SimEtcdServer<coio::sim::SimReactor> server(reactor, store);
  co_await server.run(*coio::SocketAddress::parse("0.0.0.0:" + std::to_string(port)));
}

/// A simulation node's main that serves `store` as etcd at port `port` of
/// the node's address: `sim.startNode("10.0.0.100", simEtcd(store))`, then
/// EtcdOptions::endpoints = {"http://10.0.0.100:2379"}. `store` outlives
/// the simulation (it is the node's data dir: a restart keeps it).
inline coio::sim::SimReactor::NodeMain simEtcd(SimEtcdStore& store, std::uint16_t port = 2379) {
  return [&store, port](coio::sim::SimReactor& reactor) { return serveEtcd(reactor, store, port); };
}

}  // namespace storage::etcd
