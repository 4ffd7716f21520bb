#pragma once
// The etcd v3 API subset the client speaks, as plain structs, and their
// JSON as etcd's gateway reads and writes it (protobuf's JSON mapping:
// snake_case names, bytes in base64, 64-bit integers as strings, fields at
// their default left out). Decoding never throws: any text yields a value
// or EtcdErrc::badResponse with a reason. One file (about 600 lines): one
// struct and its two JSON functions per call, read side by side.
#include "base64.hpp"
#include "etcd_error.hpp"

#include <coio/core/result.hpp>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace storage::etcd {

using Json = nlohmann::json;

/// Every reply's header: which cluster and member answered, at which revision.
struct ResponseHeader {
  std::uint64_t clusterId = 0;
  std::uint64_t memberId = 0;
  std::int64_t revision = 0;  ///< the store's revision when the reply was made
  std::uint64_t raftTerm = 0;
};

/// A key and its value, with etcd's bookkeeping.
struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t createRevision = 0;  ///< when the key was created (0: it does not exist)
  std::int64_t modRevision = 0;     ///< when it was last written
  std::int64_t version = 0;         ///< writes since it was created
  std::int64_t lease = 0;           ///< the lease it is bound to (0: none)
};

/// The end of a range that holds every key starting with `prefix`.
inline std::string prefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key: etcd's "\0" range end
}

// The requests have constructors, not aggregate initialisation: g++ 12
// miscompiles an aggregate temporary in a co_await expression (it frees
// its strings twice), and `co_await client.put({"k", "v"}, timeout)` is
// how they are meant to be written.

/// Reads `key`, or the keys in [key, rangeEnd) when rangeEnd is set.
struct RangeRequest {
  RangeRequest() = default;
  RangeRequest(std::string key, std::string rangeEnd = {}, std::int64_t revision = 0)
      : key(std::move(key)), rangeEnd(std::move(rangeEnd)), revision(revision) {}
  std::string key;
  std::string rangeEnd;
  std::int64_t revision = 0;  ///< read as of this revision (0: the latest)
  std::int64_t limit = 0;     ///< at most this many keys (0: all)
  bool keysOnly = false;
  bool countOnly = false;
  /// Every key starting with `prefix`.
  static RangeRequest prefix(std::string_view prefix) { return RangeRequest(std::string(prefix), prefixEnd(prefix)); }
};

/// range's reply: the pairs (in key order) at header.revision.
struct RangeResponse {
  ResponseHeader header;
  std::vector<KeyValue> kvs;
  bool more = false;       ///< more keys matched than `limit` let through
  std::int64_t count = 0;  ///< keys that matched
};

/// Writes `value` at `key`, bound to `lease` if not 0.
struct PutRequest {
  PutRequest() = default;
  PutRequest(std::string key, std::string value, std::int64_t lease = 0, bool prevKv = false)
      : key(std::move(key)), value(std::move(value)), lease(lease), prevKv(prevKv) {}
  std::string key;
  std::string value;
  std::int64_t lease = 0;
  bool prevKv = false;  ///< return the pair it replaced
};

/// put's reply: header.revision is the write's.
struct PutResponse {
  ResponseHeader header;
  std::optional<KeyValue> prevKv;
};

/// Deletes `key`, or the keys in [key, rangeEnd) when rangeEnd is set.
struct DeleteRequest {
  DeleteRequest() = default;
  DeleteRequest(std::string key, std::string rangeEnd = {}, bool prevKv = false)
      : key(std::move(key)), rangeEnd(std::move(rangeEnd)), prevKv(prevKv) {}
  std::string key;
  std::string rangeEnd;
  bool prevKv = false;  ///< return the pairs it deleted
  /// Every key starting with `prefix`.
  static DeleteRequest prefix(std::string_view prefix) { return DeleteRequest(std::string(prefix), prefixEnd(prefix)); }
};

/// deleteRange's reply: how many keys it deleted (0 is no error).
struct DeleteResponse {
  ResponseHeader header;
  std::int64_t deleted = 0;
  std::vector<KeyValue> prevKvs;
};

/// One condition of a transaction: a key's version, create or mod
/// revision, value or lease compared with an operand. A key that does not
/// exist has version, revisions and lease 0 (and fails every value compare).
struct Compare {
  enum class Target { version, createRevision, modRevision, value, lease };
  enum class Op { equal, greater, less, notEqual };

  Compare() = default;
  Compare(Target target, Op op, std::string key, std::int64_t number, std::string value = {})
      : target(target), op(op), key(std::move(key)), number(number), value(std::move(value)) {}
  static Compare version(std::string key, Op op, std::int64_t n) { return {Target::version, op, std::move(key), n}; }
  static Compare createRevision(std::string key, Op op, std::int64_t n) {
    return {Target::createRevision, op, std::move(key), n};
  }
  static Compare modRevision(std::string key, Op op, std::int64_t n) {
    return {Target::modRevision, op, std::move(key), n};
  }
  static Compare lease(std::string key, Op op, std::int64_t id) { return {Target::lease, op, std::move(key), id}; }
  static Compare valueOf(std::string key, Op op, std::string value) {
    return {Target::value, op, std::move(key), 0, std::move(value)};
  }

  Target target = Target::version;
  Op op = Op::equal;
  std::string key;
  std::string rangeEnd;     ///< compare every key in [key, rangeEnd) if set
  std::int64_t number = 0;  ///< the operand of a version, revision or lease compare
  std::string value;        ///< the operand of a value compare
};

/// An operation of a transaction branch, and its outcome.
using TxnOp = std::variant<RangeRequest, PutRequest, DeleteRequest>;
using TxnOpResponse = std::variant<RangeResponse, PutResponse, DeleteResponse>;

/// If every compare holds, runs `success`, else `failure`: atomically, at one revision.
struct TxnRequest {
  TxnRequest() = default;
  TxnRequest(std::vector<Compare> compare, std::vector<TxnOp> success, std::vector<TxnOp> failure = {})
      : compare(std::move(compare)), success(std::move(success)), failure(std::move(failure)) {}
  std::vector<Compare> compare;
  std::vector<TxnOp> success;
  std::vector<TxnOp> failure;
};

/// txn's reply.
struct TxnResponse {
  ResponseHeader header;  ///< its revision is the transaction's (the new one if it wrote)
  bool succeeded = false;
  std::vector<TxnOpResponse> responses;  ///< one per operation of the branch that ran, in order
};

/// A lease: its id and its time to live in seconds.
struct Lease {
  std::int64_t id = 0;
  std::int64_t ttl = 0;
};

/// leaseTimeToLive's answer: `ttl` is the seconds left, -1 once expired.
struct LeaseStatus {
  std::int64_t id = 0;
  std::int64_t ttl = 0;
  std::int64_t grantedTtl = 0;
};

/// A change a watch saw: `kv` after a put; after a delete, the key and the
/// deletion's revision (kv.modRevision).
struct Event {
  enum class Type { put, del };
  Type type = Type::put;
  KeyValue kv;
  std::optional<KeyValue> prevKv;  ///< the pair before, if the watch asked for it
};

/// Watches `key`, or [key, rangeEnd), from `startRevision` (0: from now).
struct WatchRequest {
  WatchRequest() = default;
  WatchRequest(std::string key, std::string rangeEnd = {}, std::int64_t startRevision = 0, bool prevKv = false)
      : key(std::move(key)), rangeEnd(std::move(rangeEnd)), startRevision(startRevision), prevKv(prevKv) {}
  std::string key;
  std::string rangeEnd;
  std::int64_t startRevision = 0;
  bool prevKv = false;
  /// Every key starting with `prefix`.
  static WatchRequest prefix(std::string_view prefix, std::int64_t from = 0) {
    return WatchRequest(std::string(prefix), prefixEnd(prefix), from);
  }
};

/// One message of a watch stream (EtcdWatch hands out the events as WatchBatch).
struct WatchMessage {
  ResponseHeader header;
  bool created = false;
  bool canceled = false;
  std::int64_t compactRevision = 0;  ///< set when canceled because the start was compacted
  std::string cancelReason;
  std::vector<Event> events;
};

/// An error etcd reported: what the client makes of it, and etcd's words.
struct EtcdFailure {
  EtcdErrc code = EtcdErrc::server;
  std::string message;
};

// ---- encoding -------------------------------------------------------------

namespace detail {

inline std::string int64Text(std::int64_t n) { return std::to_string(n); }

inline Json toJson(const RangeRequest& r) {
  Json j{{"key", base64Encode(r.key)}};
  if (!r.rangeEnd.empty()) j["range_end"] = base64Encode(r.rangeEnd);
  if (r.revision) j["revision"] = int64Text(r.revision);
  if (r.limit) j["limit"] = int64Text(r.limit);
  if (r.keysOnly) j["keys_only"] = true;
  if (r.countOnly) j["count_only"] = true;
  return j;
}

inline Json toJson(const PutRequest& r) {
  Json j{{"key", base64Encode(r.key)}, {"value", base64Encode(r.value)}};
  if (r.lease) j["lease"] = int64Text(r.lease);
  if (r.prevKv) j["prev_kv"] = true;
  return j;
}

inline Json toJson(const DeleteRequest& r) {
  Json j{{"key", base64Encode(r.key)}};
  if (!r.rangeEnd.empty()) j["range_end"] = base64Encode(r.rangeEnd);
  if (r.prevKv) j["prev_kv"] = true;
  return j;
}

inline Json toJson(const Compare& c) {
  static constexpr const char* kOps[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
  static constexpr const char* kTargets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
  static constexpr const char* kFields[] = {"version", "create_revision", "mod_revision", "value", "lease"};
  const auto t = static_cast<std::size_t>(c.target);
  Json j{{"result", kOps[static_cast<std::size_t>(c.op)]}, {"target", kTargets[t]}, {"key", base64Encode(c.key)}};
  if (!c.rangeEnd.empty()) j["range_end"] = base64Encode(c.rangeEnd);
  if (c.target == Compare::Target::value) {
    j[kFields[t]] = base64Encode(c.value);
  } else {
    j[kFields[t]] = int64Text(c.number);
  }
  return j;
}

inline Json toJson(const TxnOp& op) {
  struct Visit {
    Json operator()(const RangeRequest& r) const { return {{"request_range", toJson(r)}}; }
    Json operator()(const PutRequest& r) const { return {{"request_put", toJson(r)}}; }
    Json operator()(const DeleteRequest& r) const { return {{"request_delete_range", toJson(r)}}; }
  };
  return std::visit(Visit{}, op);
}

inline Json toJson(const TxnRequest& t) {
  Json compare = Json::array(), success = Json::array(), failure = Json::array();
  for (const Compare& c : t.compare) compare.push_back(toJson(c));
  for (const TxnOp& op : t.success) success.push_back(toJson(op));
  for (const TxnOp& op : t.failure) failure.push_back(toJson(op));
  return {{"compare", std::move(compare)}, {"success", std::move(success)}, {"failure", std::move(failure)}};
}

inline Json toJson(const WatchRequest& w) {
  Json create{{"key", base64Encode(w.key)}};
  if (!w.rangeEnd.empty()) create["range_end"] = base64Encode(w.rangeEnd);
  if (w.startRevision) create["start_revision"] = int64Text(w.startRevision);
  if (w.prevKv) create["prev_kv"] = true;
  return {{"create_request", std::move(create)}};
}

}  // namespace detail

/// The request body of each call, as the gateway reads it.
template <typename Request>
std::string encode(const Request& request) {
  return detail::toJson(request).dump();
}
inline std::string encodeLeaseGrant(std::int64_t ttlSeconds, std::int64_t id) {
  Json j{{"TTL", detail::int64Text(ttlSeconds)}};
  if (id) j["ID"] = detail::int64Text(id);
  return j.dump();
}
inline std::string encodeLeaseId(std::int64_t id) { return Json{{"ID", detail::int64Text(id)}}.dump(); }

// ---- decoding -------------------------------------------------------------

namespace detail {

// Deeper nesting than any etcd reply is refused before parsing: the
// parser's stack and the tree it builds stay small.
constexpr std::size_t kMaxJsonDepth = 16;

inline bool nestingWithin(std::string_view text, std::size_t limit) noexcept {
  std::size_t depth = 0;
  bool inString = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        inString = false;
      }
    } else if (c == '"') {
      inString = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return false;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return true;
}

// Reads the fields of one JSON object; the first problem is kept in `why`
// and every later read yields a default.
class Fields {
 public:
  Fields(const Json* object, std::string_view what, std::string& why) : object_(object), what_(what), why_(why) {
    if (object_ && !object_->is_object()) fail("", "is not an object");
  }
  bool ok() const noexcept { return ok_; }

  template <typename Int>
  Int integer(const char* name) {
    const Json* v = find(name);
    if (!v) return 0;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned()) {
        const auto u = v->get<std::uint64_t>();
        if (u <= static_cast<std::uint64_t>(std::numeric_limits<Int>::max())) return static_cast<Int>(u);
      } else {
        const auto s = v->get<std::int64_t>();
        if (std::is_signed_v<Int> || s >= 0) return static_cast<Int>(s);
      }
      return fail(name, "is out of range"), Int{};
    }
    if (!v->is_string()) return fail(name, "is not an integer"), Int{};
    const std::string& text = v->get_ref<const std::string&>();
    Int n = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
      return fail(name, "is not an integer"), Int{};
    }
    return n;
  }
  std::int64_t int64(const char* name) { return integer<std::int64_t>(name); }
  std::uint64_t uint64(const char* name) { return integer<std::uint64_t>(name); }

  bool boolean(const char* name) {
    const Json* v = find(name);
    if (!v) return false;
    if (!v->is_boolean()) return fail(name, "is not a boolean"), false;
    return v->get<bool>();
  }
  std::string text(const char* name) {
    const Json* v = find(name);
    if (!v) return {};
    if (!v->is_string()) return fail(name, "is not a string"), std::string{};
    return v->get<std::string>();
  }
  std::string bytes(const char* name) {
    const Json* v = find(name);
    if (!v) return {};
    if (v->is_string()) {
      if (auto decoded = base64Decode(v->get_ref<const std::string&>())) return std::move(*decoded);
    }
    return fail(name, "is not base64"), std::string{};
  }
  /// The member object, or null if absent (or not an object: then failed).
  const Json* object(const char* name) {
    const Json* v = find(name);
    if (v && !v->is_object()) return fail(name, "is not an object"), nullptr;
    return v;
  }
  /// The member array, or null if absent (or not an array: then failed).
  const Json* array(const char* name) {
    const Json* v = find(name);
    if (v && !v->is_array()) return fail(name, "is not an array"), nullptr;
    return v;
  }
  void fail(std::string_view name, std::string_view problem) {
    if (!ok_) return;
    ok_ = false;
    why_ = std::string(what_);
    if (!name.empty()) why_.append(".").append(name);
    why_.append(" ").append(problem);
  }

 private:
  const Json* find(const char* name) const {
    if (!ok_ || !object_) return nullptr;
    const auto it = object_->find(name);
    return it == object_->end() || it->is_null() ? nullptr : &*it;
  }

  const Json* object_;  // null: absent, every field at its default
  std::string_view what_;
  std::string& why_;
  bool ok_ = true;
};

inline ResponseHeader readHeader(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "header", why);
  ResponseHeader h{f.uint64("cluster_id"), f.uint64("member_id"), f.int64("revision"), f.uint64("raft_term")};
  ok = ok && f.ok();
  return h;
}

inline KeyValue readKeyValue(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "kv", why);
  KeyValue kv{f.bytes("key"),         f.bytes("value"),   f.int64("create_revision"),
              f.int64("mod_revision"), f.int64("version"), f.int64("lease")};
  ok = ok && f.ok();
  return kv;
}

inline std::vector<KeyValue> readKeyValues(const Json* array, std::string& why, bool& ok) {
  std::vector<KeyValue> kvs;
  if (!array || !ok) return kvs;
  kvs.reserve(array->size());
  for (const Json& item : *array) kvs.push_back(readKeyValue(&item, why, ok));
  return kvs;
}

inline RangeResponse readRange(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "range", why);
  RangeResponse r;
  r.header = readHeader(f.object("header"), why, ok);
  const Json* kvs = f.array("kvs");
  r.more = f.boolean("more");
  r.count = f.int64("count");
  ok = ok && f.ok();
  r.kvs = readKeyValues(kvs, why, ok);
  return r;
}

inline PutResponse readPut(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "put", why);
  PutResponse r;
  r.header = readHeader(f.object("header"), why, ok);
  const Json* prev = f.object("prev_kv");
  ok = ok && f.ok();
  if (prev && ok) r.prevKv = readKeyValue(prev, why, ok);
  return r;
}

inline DeleteResponse readDelete(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "delete", why);
  DeleteResponse r;
  r.header = readHeader(f.object("header"), why, ok);
  r.deleted = f.int64("deleted");
  const Json* prev = f.array("prev_kvs");
  ok = ok && f.ok();
  r.prevKvs = readKeyValues(prev, why, ok);
  return r;
}

inline TxnResponse readTxn(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "txn", why);
  TxnResponse r;
  r.header = readHeader(f.object("header"), why, ok);
  r.succeeded = f.boolean("succeeded");
  const Json* responses = f.array("responses");
  ok = ok && f.ok();
  if (!responses || !ok) return r;
  for (const Json& item : *responses) {
    Fields op(&item, "txn.responses[]", why);
    const Json* range = op.object("response_range");
    const Json* put = op.object("response_put");
    const Json* del = op.object("response_delete_range");
    if (op.ok() && (range != nullptr) + (put != nullptr) + (del != nullptr) != 1) {
      op.fail("", "holds no single response");
    }
    ok = ok && op.ok();
    if (!ok) return r;
    if (range) {
      r.responses.emplace_back(readRange(range, why, ok));
    } else if (put) {
      r.responses.emplace_back(readPut(put, why, ok));
    } else {
      r.responses.emplace_back(readDelete(del, why, ok));
    }
  }
  return r;
}

inline Lease readLease(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "lease", why);
  Lease l{f.int64("ID"), f.int64("TTL")};
  if (const std::string error = f.text("error"); !error.empty()) f.fail("error", "is set: " + error);
  ok = ok && f.ok();
  return l;
}

inline LeaseStatus readLeaseStatus(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "lease", why);
  LeaseStatus s{f.int64("ID"), f.int64("TTL"), f.int64("grantedTTL")};
  ok = ok && f.ok();
  return s;
}

inline WatchMessage readWatch(const Json* j, std::string& why, bool& ok) {
  Fields f(j, "watch", why);
  WatchMessage m;
  m.header = readHeader(f.object("header"), why, ok);
  m.created = f.boolean("created");
  m.canceled = f.boolean("canceled");
  m.compactRevision = f.int64("compact_revision");
  m.cancelReason = f.text("cancel_reason");
  const Json* events = f.array("events");
  ok = ok && f.ok();
  if (!events || !ok) return m;
  for (const Json& item : *events) {
    Fields e(&item, "watch.events[]", why);
    Event event;
    const std::string type = e.text("type");
    if (type == "DELETE") {
      event.type = Event::Type::del;
    } else if (!type.empty() && type != "PUT") {
      e.fail("type", "is neither PUT nor DELETE");
    }
    const Json* kv = e.object("kv");
    const Json* prev = e.object("prev_kv");
    if (e.ok() && !kv) e.fail("kv", "is missing");
    ok = ok && e.ok();
    if (!ok) return m;
    event.kv = readKeyValue(kv, why, ok);
    if (prev) event.prevKv = readKeyValue(prev, why, ok);
    m.events.push_back(std::move(event));
  }
  return m;
}

}  // namespace detail

/// Parses `text` as JSON (refusing nesting deeper than etcd's replies).
inline coio::Result<Json> parseJson(std::string_view text, std::string& why) {
  if (!detail::nestingWithin(text, detail::kMaxJsonDepth)) {
    why = "JSON nested too deep";
    return EtcdErrc::badResponse;
  }
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    why = "not valid JSON";
    return EtcdErrc::badResponse;
  }
  return j;
}

/// Decodes a reply's JSON as `T` (RangeResponse, PutResponse,
/// DeleteResponse, TxnResponse, Lease, LeaseStatus, WatchMessage or
/// ResponseHeader, for replies that hold just one); badResponse with the
/// reason in `why` if the shape is not T's.
template <typename T>
coio::Result<T> decode(const Json& j, std::string& why) {
  bool ok = true;
  T value = [&] {
    if constexpr (std::is_same_v<T, RangeResponse>) return detail::readRange(&j, why, ok);
    if constexpr (std::is_same_v<T, PutResponse>) return detail::readPut(&j, why, ok);
    if constexpr (std::is_same_v<T, DeleteResponse>) return detail::readDelete(&j, why, ok);
    if constexpr (std::is_same_v<T, TxnResponse>) return detail::readTxn(&j, why, ok);
    if constexpr (std::is_same_v<T, Lease>) return detail::readLease(&j, why, ok);
    if constexpr (std::is_same_v<T, LeaseStatus>) return detail::readLeaseStatus(&j, why, ok);
    if constexpr (std::is_same_v<T, WatchMessage>) return detail::readWatch(&j, why, ok);
    if constexpr (std::is_same_v<T, ResponseHeader>) {
      detail::Fields f(&j, "reply", why);
      ResponseHeader h = detail::readHeader(f.object("header"), why, ok);
      ok = ok && f.ok();
      return h;
    }
  }();
  if (!ok) return EtcdErrc::badResponse;
  return value;
}

/// The error in a gateway's error reply, `{"error":..., "message":..., "code":N}`
/// (a unary call's) or `{"error":{"grpc_code":N, "message":...}}` (a
/// stream's); nullopt if `j` is none.
inline std::optional<EtcdFailure> decodeFailure(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto error = j.find("error");
  if (error == j.end()) return std::nullopt;
  std::string why;
  const bool nested = error->is_object();
  detail::Fields f(nested ? &*error : &j, "error", why);
  const std::int64_t code = f.int64(nested ? "grpc_code" : "code");
  std::string message = f.text("message");
  if (message.empty() && error->is_string()) message = error->get<std::string>();
  if (!f.ok()) return EtcdFailure{EtcdErrc::badResponse, "error reply not understood: " + why};
  return EtcdFailure{errorOfGrpc(code, message), std::move(message)};
}

}  // namespace storage::etcd
