#pragma once
// SimEtcdStore: the state of a simulated etcd (sim_etcd.hpp serves it over
// etcd's JSON gateway): a multi-version key space with revisions, leases
// whose expiry the server times in virtual time, the history watches read,
// and the faults a test drives (compact, loseLease). Plain data, no I/O:
// each call applies at once, so the calls are linearizable by construction.
#include "etcd/etcd_messages.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace storage::etcd {

/// What the simulated etcd refused: the gRPC status code its gateway
/// relays, and etcd's own message (the client tells errors apart by both).
struct Refusal {
  int code = 0;
  std::string message;
};

/// A store call's answer, or why etcd refused it.
template <typename T>
using Outcome = std::variant<T, Refusal>;

/// The changes of one revision, in the order they were made.
struct RevisionChanges {
  std::int64_t revision = 0;
  std::vector<Event> events;  ///< every event with its prevKv (a watch drops it unless asked)
};

/// The state of a simulated single-member etcd cluster (etcd's data dir):
/// it outlives the node that serves it (sim_etcd.hpp), so a restarted
/// node finds it as etcd finds its disk.
///
/// Guarantees (etcd v3's semantics, as the storage cluster relies on them):
/// - Revisions: the store starts at revision 1; every put, every delete
///   that deletes something and every transaction that writes makes one new
///   revision (a transaction's writes share it). A key keeps its create
///   revision while it exists, its mod revision is its last write's, its
///   version counts its writes since creation.
/// - Reads at a past revision see the keys as they were then, back to the
///   compaction revision: older ones are refused as compacted, later than
///   the current one as a future revision (etcd's words and codes).
/// - Transactions compare against the state before them (a range compare
///   holds if it holds for every key in the range; with no key there, the
///   absent key's zeros, and a value compare fails) and run their branch's
///   operations in order, a read seeing the writes before it. A branch
///   that puts a key twice, or puts one it deletes, is refused (etcd's
///   "duplicate key given in txn request").
/// - Leases: granted with a TTL in seconds (at least 1) and an id (drawn
///   here unless given); a key put with a lease is deleted when the lease
///   is revoked, expires (expireDue) or is lost (loseLease): all its keys
///   in one revision, with delete events. Expiry is exact: a lease is gone
///   at grant (or last keep-alive) + TTL. restartLeases() gives every lease
///   a full TTL again, as etcd's new leader does when it takes over.
/// - History: every revision's changes since the compaction revision, for
///   watches (changesFrom); compact(rev) drops what precedes `rev`.
/// - onChange (one listener: the serving node) is called after every new
///   revision, every compaction and every change of leader, from whatever
///   made it.
/// - One thread; the calls never block and never throw for bad requests
///   (a Refusal); the test API throws std::invalid_argument for a misuse.
class SimEtcdStore {
 public:
  using Clock = std::chrono::steady_clock;

  /// The cluster id and member id the headers carry.
  static constexpr std::uint64_t kClusterId = 0x5e7cd000c1u;
  static constexpr std::uint64_t kMemberId = 0x5e7cd000a1u;

  // ---- the KV API ---------------------------------------------------------

  /// etcd's Range.
  Outcome<RangeResponse> range(const RangeRequest& r) const {
    if (r.key.empty()) return keyMissing();
    if (r.revision > revision_) return futureRefusal();
    if (r.revision > 0 && r.revision < compacted_) return compactedRefusal();
    return read(r);
  }

  /// etcd's Put.
  Outcome<PutResponse> put(const PutRequest& r) {
    if (std::optional<Refusal> refused = checkPut(r)) return *refused;
    Writer w(*this);
    PutResponse response{.header = {}, .prevKv = w.put(r)};
    if (!r.prevKv) response.prevKv.reset();
    w.commit();
    response.header = header();
    return response;
  }

  /// etcd's DeleteRange.
  Outcome<DeleteResponse> deleteRange(const DeleteRequest& r) {
    if (r.key.empty()) return keyMissing();
    Writer w(*this);
    DeleteResponse response = w.erase(r);
    w.commit();
    response.header = header();
    return response;
  }

  /// etcd's Txn.
  Outcome<TxnResponse> txn(const TxnRequest& t) {
    for (const std::vector<TxnOp>* branch : {&t.success, &t.failure}) {
      if (std::optional<Refusal> refused = checkBranch(*branch)) return *refused;
    }
    TxnResponse response;
    response.succeeded = std::all_of(t.compare.begin(), t.compare.end(), [this](const Compare& c) { return holds(c); });
    const std::vector<TxnOp>& ops = response.succeeded ? t.success : t.failure;
    Writer w(*this);
    for (const TxnOp& op : ops) {
      if (const auto* get = std::get_if<RangeRequest>(&op)) {
        response.responses.emplace_back(read(*get));
      } else if (const auto* set = std::get_if<PutRequest>(&op)) {
        PutResponse put{.header = {}, .prevKv = w.put(*set)};
        if (!set->prevKv) put.prevKv.reset();
        response.responses.emplace_back(std::move(put));
      } else {
        response.responses.emplace_back(w.erase(std::get<DeleteRequest>(op)));
      }
    }
    w.commit();
    response.header = header();
    for (TxnOpResponse& each : response.responses) {
      std::visit([this](auto& r) { r.header = header(); }, each);
    }
    return response;
  }

  // ---- leases ---------------------------------------------------------------

  /// etcd's LeaseGrant at `now`: a lease of `ttlSeconds` (1 at least), of
  /// id `id` if not 0.
  Outcome<Lease> grant(std::int64_t ttlSeconds, std::int64_t id, Clock::time_point now) {
    if (id != 0 && leases_.contains(id)) return Refusal{9, "etcdserver: lease already exists"};
    if (ttlSeconds > kMaxTtl) return Refusal{11, "etcdserver: too large lease TTL"};
    while (id == 0 || leases_.contains(id)) id = kFirstLeaseId + nextLease_++;
    const std::int64_t ttl = std::max<std::int64_t>(ttlSeconds, 1);
    leases_[id] = LeaseState{ttl, now + std::chrono::seconds(ttl), {}};
    return Lease{id, ttl};
  }

  /// etcd's LeaseKeepAlive at `now`: the lease's TTL, counted again from
  /// now; TTL 0 if there is no such lease (as etcd answers).
  Lease keepAlive(std::int64_t id, Clock::time_point now) {
    const auto it = leases_.find(id);
    if (it == leases_.end()) return Lease{id, 0};
    it->second.deadline = now + std::chrono::seconds(it->second.ttl);
    return Lease{id, it->second.ttl};
  }

  /// etcd's LeaseRevoke: the lease and its keys are gone.
  Outcome<ResponseHeader> revoke(std::int64_t id) {
    if (!leases_.contains(id)) return leaseMissing();
    drop(id);
    return header();
  }

  /// etcd's LeaseTimeToLive at `now`: whole seconds left; TTL -1 if there
  /// is no such lease.
  LeaseStatus timeToLive(std::int64_t id, Clock::time_point now) const {
    const auto it = leases_.find(id);
    if (it == leases_.end()) return LeaseStatus{id, -1, 0};
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(it->second.deadline - now);
    return LeaseStatus{id, std::max<std::int64_t>(left.count(), 0), it->second.ttl};
  }

  /// Expires every lease due at `now` (its deadline reached), each in its
  /// own revision if it holds keys; how many expired. None while the
  /// member has no leader (only a leader expires leases).
  std::size_t expireDue(Clock::time_point now) {
    if (noLeader_) return 0;
    std::vector<std::int64_t> due;
    for (const auto& [id, lease] : leases_) {
      if (lease.deadline <= now) due.push_back(id);
    }
    for (std::int64_t id : due) drop(id);
    return due.size();
  }

  /// When lease `id` expires unless kept alive (none if there is no such lease).
  std::optional<Clock::time_point> deadline(std::int64_t id) const {
    const auto it = leases_.find(id);
    if (it == leases_.end()) return std::nullopt;
    return it->second.deadline;
  }

  /// The leases there are, in id order.
  std::vector<std::int64_t> leases() const {
    std::vector<std::int64_t> ids;
    for (const auto& entry : leases_) ids.push_back(entry.first);
    return ids;
  }

  /// Every lease gets its full TTL from `now` (etcd's new leader after a
  /// restart: the time the cluster was down costs no lease), and the raft
  /// term moves on.
  void restartLeases(Clock::time_point now) {
    for (auto& [id, lease] : leases_) lease.deadline = now + std::chrono::seconds(lease.ttl);
    ++raftTerm_;
  }

  // ---- watches ------------------------------------------------------------

  /// The changes of revisions `from` on (from >= compactRevision()), oldest
  /// first; a span of the history, valid until the next write or compaction.
  std::pair<std::deque<RevisionChanges>::const_iterator, std::deque<RevisionChanges>::const_iterator> changesFrom(
      std::int64_t from) const {
    const auto first = std::lower_bound(history_.begin(), history_.end(), from,
                                        [](const RevisionChanges& c, std::int64_t r) { return c.revision < r; });
    return {first, history_.end()};
  }

  /// Calls `listener` after every new revision and every compaction (one
  /// listener; an empty one removes it).
  void onChange(std::function<void()> listener) { listener_ = std::move(listener); }

  /// Whether `key` is in the range [begin, end) as etcd reads one: `begin`
  /// alone if `end` is empty, every key from `begin` on if it is "\0".
  static bool inRange(const std::string& key, const std::string& begin, const std::string& end) {
    if (end.empty()) return key == begin;
    return key >= begin && (end == std::string(1, '\0') || key < end);
  }

  // ---- state and the test's faults -------------------------------------------

  std::int64_t revision() const noexcept { return revision_; }
  /// The oldest revision still readable and watchable (1 until a compaction).
  std::int64_t compactRevision() const noexcept { return compacted_; }
  /// Every reply's header.
  ResponseHeader header() const noexcept { return ResponseHeader{kClusterId, kMemberId, revision_, raftTerm_}; }

  /// A fault (etcd's compaction, as `etcdctl compact`): revisions before
  /// `revision` are forgotten: reads at them and watches from them fail as
  /// compacted. Compacting to no later revision than before does nothing
  /// (false). std::invalid_argument for a revision not reached yet.
  bool compact(std::int64_t revision) {
    if (revision > revision_) {
      throw std::invalid_argument("SimEtcdStore::compact(" + std::to_string(revision) + "): the store is at revision " +
                                  std::to_string(revision_));
    }
    if (revision <= compacted_) return false;
    compacted_ = revision;
    for (auto it = keys_.begin(); it != keys_.end();) {
      std::vector<Version>& versions = it->second;
      // The last version at or before the compaction stays (unless it is a deletion): what a read there sees.
      auto keep = std::find_if(versions.rbegin(), versions.rend(),
                               [&](const Version& v) { return v.kv.modRevision <= revision; });
      if (keep != versions.rend()) {
        const auto from = keep.base() - 1;
        versions.erase(versions.begin(), from->deleted ? from + 1 : from);
      }
      it = versions.empty() ? keys_.erase(it) : std::next(it);
    }
    while (!history_.empty() && history_.front().revision < revision) history_.pop_front();
    changed();
    return true;
  }

  /// A fault: the member has lost its leader (an election under way):
  /// every call is answered Unavailable ("etcdserver: no leader", gRPC 14,
  /// HTTP 503), no lease expires; open watches stay open (and quiet: no
  /// write happens). setNoLeader(false, now): a leader again, which gives
  /// every lease its full TTL from `now` (restartLeases).
  void setNoLeader(bool lost, Clock::time_point now) {
    if (lost == noLeader_) return;
    noLeader_ = lost;
    if (!lost) restartLeases(now);
    changed();
  }
  /// Whether the member has no leader (setNoLeader).
  bool noLeader() const noexcept { return noLeader_; }

  /// A fault: lease `id` is gone as if it expired now (its keys deleted,
  /// with events): a keep-alive that was on its way finds it gone. False
  /// if there is no such lease.
  bool loseLease(std::int64_t id) {
    if (!leases_.contains(id)) return false;
    drop(id);
    return true;
  }

  /// The current value of `key`, if it exists (the test's own look, no revision made).
  std::optional<KeyValue> get(const std::string& key) const {
    const Version* v = latest(key, 0);
    if (v == nullptr) return std::nullopt;
    return v->kv;
  }

 private:
  static constexpr std::int64_t kMaxTtl = 9'000'000'000;         // etcd's MaxLeaseTTL
  static constexpr std::int64_t kFirstLeaseId = 0x694d7a0000000000;  // ids as large as etcd's

  struct Version {
    KeyValue kv;  // a deletion: the key and its revision (modRevision) only
    bool deleted = false;
  };
  struct LeaseState {
    std::int64_t ttl = 0;
    Clock::time_point deadline{};
    std::set<std::string> keys;
  };

  // The writes of one revision: applied as they come (later reads of the
  // same transaction see them), recorded, and committed as one revision if
  // any changed something.
  class Writer {
   public:
    explicit Writer(SimEtcdStore& store) : store_(store), at_(store.revision_ + 1) {}

    // The pair it replaced, if any.
    std::optional<KeyValue> put(const PutRequest& r) {
      std::vector<Version>& versions = store_.keys_[r.key];
      std::optional<KeyValue> before;
      if (!versions.empty() && !versions.back().deleted) before = versions.back().kv;
      KeyValue kv{r.key, r.value, before ? before->createRevision : at_, at_, before ? before->version + 1 : 1, r.lease};
      if (before && before->lease != r.lease) store_.detach(before->lease, r.key);
      if (r.lease != 0) store_.leases_.at(r.lease).keys.insert(r.key);
      versions.push_back(Version{kv, false});
      changes_.events.push_back(Event{Event::Type::put, std::move(kv), before});
      return before;
    }

    DeleteResponse erase(const DeleteRequest& r) {
      DeleteResponse response;
      store_.forEach(r.key, r.rangeEnd, [&](const std::string& key, std::vector<Version>& versions) {
        if (versions.empty() || versions.back().deleted) return;
        KeyValue before = versions.back().kv;
        store_.detach(before.lease, key);
        KeyValue tombstone;
        tombstone.key = key;
        tombstone.modRevision = at_;
        versions.push_back(Version{tombstone, true});
        changes_.events.push_back(Event{Event::Type::del, std::move(tombstone), before});
        ++response.deleted;
        if (r.prevKv) response.prevKvs.push_back(std::move(before));
      });
      return response;
    }

    void commit() {
      if (changes_.events.empty()) return;
      store_.revision_ = at_;
      changes_.revision = at_;
      store_.history_.push_back(std::move(changes_));
      store_.changed();
    }

   private:
    SimEtcdStore& store_;
    std::int64_t at_;
    RevisionChanges changes_;
  };

  static Refusal keyMissing() { return Refusal{3, "etcdserver: key is not provided"}; }
  static Refusal leaseMissing() { return Refusal{5, "etcdserver: requested lease not found"}; }
  static Refusal futureRefusal() { return Refusal{11, "etcdserver: mvcc: required revision is a future revision"}; }
  static Refusal compactedRefusal() { return Refusal{11, "etcdserver: mvcc: required revision has been compacted"}; }

  std::optional<Refusal> checkPut(const PutRequest& r) const {
    if (r.key.empty()) return keyMissing();
    if (r.lease != 0 && !leases_.contains(r.lease)) return leaseMissing();
    return std::nullopt;
  }

  // A branch's own errors, whichever branch runs (etcd checks both first).
  std::optional<Refusal> checkBranch(const std::vector<TxnOp>& ops) const {
    std::set<std::string> puts;
    for (const TxnOp& op : ops) {
      if (const auto* get = std::get_if<RangeRequest>(&op)) {
        if (get->key.empty()) return keyMissing();
        if (get->revision > revision_) return futureRefusal();
        if (get->revision > 0 && get->revision < compacted_) return compactedRefusal();
      } else if (const auto* set = std::get_if<PutRequest>(&op)) {
        if (std::optional<Refusal> refused = checkPut(*set)) return refused;
        if (!puts.insert(set->key).second) return duplicate();
      } else if (std::get<DeleteRequest>(op).key.empty()) {
        return keyMissing();
      }
    }
    for (const TxnOp& op : ops) {
      const auto* del = std::get_if<DeleteRequest>(&op);
      if (del == nullptr) continue;
      for (const std::string& key : puts) {
        if (inRange(key, del->key, del->rangeEnd)) return duplicate();
      }
    }
    return std::nullopt;
  }
  static Refusal duplicate() { return Refusal{3, "etcdserver: duplicate key given in txn request"}; }

  // Calls fn(key, versions) for each key of [begin, end) (just `begin`
  // when end is empty; every key from begin when end is "\0").
  template <typename Map, typename Fn>
  static void forEachIn(Map& keys, const std::string& begin, const std::string& end, Fn&& fn) {
    if (end.empty()) {
      const auto it = keys.find(begin);
      if (it != keys.end()) fn(it->first, it->second);
      return;
    }
    const bool toEnd = end == std::string(1, '\0');
    for (auto it = keys.lower_bound(begin); it != keys.end() && (toEnd || it->first < end); ++it) fn(it->first, it->second);
  }
  template <typename Fn>
  void forEach(const std::string& begin, const std::string& end, Fn&& fn) {
    forEachIn(keys_, begin, end, std::forward<Fn>(fn));
  }
  template <typename Fn>
  void forEach(const std::string& begin, const std::string& end, Fn&& fn) const {
    forEachIn(keys_, begin, end, std::forward<Fn>(fn));
  }

  // The version of `versions` a read at `at` sees (0: the latest), or null.
  static const Version* visible(const std::vector<Version>& versions, std::int64_t at) {
    auto it = versions.rbegin();
    if (at > 0) it = std::find_if(it, versions.rend(), [&](const Version& v) { return v.kv.modRevision <= at; });
    return it == versions.rend() || it->deleted ? nullptr : &*it;
  }
  const Version* latest(const std::string& key, std::int64_t at) const {
    const auto it = keys_.find(key);
    return it == keys_.end() ? nullptr : visible(it->second, at);
  }

  RangeResponse read(const RangeRequest& r) const {
    RangeResponse response;
    response.header = header();
    forEach(r.key, r.rangeEnd, [&](const std::string&, const std::vector<Version>& versions) {
      const Version* v = visible(versions, r.revision);
      if (v == nullptr) return;
      ++response.count;
      if (r.countOnly || (r.limit > 0 && static_cast<std::int64_t>(response.kvs.size()) >= r.limit)) return;
      response.kvs.push_back(v->kv);
      if (r.keysOnly) response.kvs.back().value.clear();
    });
    response.more = static_cast<std::int64_t>(response.kvs.size()) < response.count && !r.countOnly;
    return response;
  }

  // Whether compare `c` holds now (see the class comment).
  bool holds(const Compare& c) const {
    bool any = false;
    bool all = true;
    forEach(c.key, c.rangeEnd, [&](const std::string&, const std::vector<Version>& versions) {
      const Version* v = visible(versions, 0);
      if (v == nullptr) return;
      any = true;
      all = all && compare(c, v->kv);
    });
    if (any) return all;
    return c.target != Compare::Target::value && compare(c, KeyValue{});
  }

  static bool compare(const Compare& c, const KeyValue& kv) {
    int order = 0;  // kv's field against the operand: <0, 0, >0
    const auto three = [](auto a, auto b) { return a < b ? -1 : (a > b ? 1 : 0); };
    switch (c.target) {
      case Compare::Target::version: order = three(kv.version, c.number); break;
      case Compare::Target::createRevision: order = three(kv.createRevision, c.number); break;
      case Compare::Target::modRevision: order = three(kv.modRevision, c.number); break;
      case Compare::Target::lease: order = three(kv.lease, c.number); break;
      case Compare::Target::value: order = kv.value.compare(c.value); break;
    }
    switch (c.op) {
      case Compare::Op::equal: return order == 0;
      case Compare::Op::greater: return order > 0;
      case Compare::Op::less: return order < 0;
      case Compare::Op::notEqual: return order != 0;
    }
    return false;
  }

  // Lease `id` and its keys go, in one revision.
  void drop(std::int64_t id) {
    const auto it = leases_.find(id);
    const std::set<std::string> keys = std::move(it->second.keys);
    leases_.erase(it);
    Writer w(*this);
    for (const std::string& key : keys) (void)w.erase(DeleteRequest(key));
    w.commit();
  }

  // Key `key` is no longer bound to lease `id` (which may be gone already).
  void detach(std::int64_t id, const std::string& key) {
    if (const auto it = leases_.find(id); it != leases_.end()) it->second.keys.erase(key);
  }

  void changed() {
    if (listener_) listener_();
  }

  std::map<std::string, std::vector<Version>> keys_;  // each key's versions since the compaction, oldest first
  std::map<std::int64_t, LeaseState> leases_;
  std::deque<RevisionChanges> history_;  // from the compaction revision on
  std::int64_t revision_ = 1;
  std::int64_t compacted_ = 1;
  std::uint64_t raftTerm_ = 1;
  std::int64_t nextLease_ = 1;
  bool noLeader_ = false;
  std::function<void()> listener_;
};

}  // namespace storage::etcd
