#pragma once
// Behaviours of EtcdClient that hold against any etcd: run against a real
// one (etcd_client_test.cpp) and against the simulated one
// (sim_etcd_test.cpp), so the model answers as etcd does. Each case is a
// coroutine over a client on a fresh etcd (nothing written yet); `ok(result)`
// is the test's: the value, or a failure that shows the client's log.
#include "etcd/etcd_client.hpp"

#include <coio/core/result.hpp>
#include <coio/core/task.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

namespace storage::etcd::cases {

/// Put, range (a key, a prefix, a limit, at a past and a future revision),
/// delete; revisions and versions as etcd counts them; its refusals.
template <coio::Reactor R, typename Ok>
coio::Task<void> putRangeDelete(EtcdClient<R>& c, Ok ok, Clock::duration timeout) {
    auto first = ok(co_await c.put({"/t/a", "1"}, timeout));
    CHECK(first.header.revision == 2);  // etcd starts at revision 1
    auto second = ok(co_await c.put({"/t/b", std::string("two\0bytes", 9)}, timeout));
    auto other = ok(co_await c.put({"/u", "elsewhere"}, timeout));
    CHECK(second.header.revision == first.header.revision + 1);
    CHECK(other.header.revision == second.header.revision + 1);

    auto one = ok(co_await c.range({"/t/a"}, timeout));
    REQUIRE(one.kvs.size() == 1);
    CHECK(one.kvs[0].value == "1");
    CHECK(one.kvs[0].createRevision == first.header.revision);
    CHECK(one.kvs[0].modRevision == first.header.revision);
    CHECK(one.kvs[0].version == 1);
    CHECK(one.header.revision == other.header.revision);

    auto prefix = ok(co_await c.range(RangeRequest::prefix("/t/"), timeout));
    REQUIRE(prefix.kvs.size() == 2);
    CHECK(prefix.count == 2);
    CHECK(prefix.kvs[1].key == "/t/b");
    CHECK(prefix.kvs[1].value == std::string("two\0bytes", 9));
    RangeRequest limited = RangeRequest::prefix("/");
    limited.limit = 2;
    limited.keysOnly = true;
    auto some = ok(co_await c.range(limited, timeout));
    CHECK(some.kvs.size() == 2);
    CHECK(some.more);
    CHECK(some.count == 3);
    CHECK(some.kvs[0].value.empty());

    // A rewrite: the old pair back, the version counted, the old value at its revision.
    auto rewrite = ok(co_await c.put({"/t/a", "3", 0, true}, timeout));
    REQUIRE(rewrite.prevKv);
    CHECK(rewrite.prevKv->value == "1");
    auto now = ok(co_await c.range({"/t/a"}, timeout));
    REQUIRE(now.kvs.size() == 1);
    CHECK(now.kvs[0].version == 2);
    CHECK(now.kvs[0].createRevision == first.header.revision);
    CHECK(now.kvs[0].modRevision == rewrite.header.revision);
    auto old = ok(co_await c.range(RangeRequest("/t/a", "", first.header.revision), timeout));
    REQUIRE(old.kvs.size() == 1);
    CHECK(old.kvs[0].value == "1");
    coio::Result<RangeResponse> future = co_await c.range(RangeRequest("/t/a", "", rewrite.header.revision + 5), timeout);
    CHECK(future.error() == EtcdErrc::futureRevision);

    auto deleted = ok(co_await c.deleteRange(DeleteRequest("/t/", prefixEnd("/t/"), true), timeout));
    CHECK(deleted.deleted == 2);
    CHECK(deleted.prevKvs.size() == 2);
    CHECK(deleted.header.revision == rewrite.header.revision + 1);  // one revision for both
    auto nothing = ok(co_await c.deleteRange({"/t/a"}, timeout));
    CHECK(nothing.deleted == 0);
    CHECK(nothing.header.revision == deleted.header.revision);  // no revision for a delete of nothing
    auto none = ok(co_await c.range(RangeRequest::prefix("/t/"), timeout));
    CHECK(none.kvs.empty());
    CHECK(none.count == 0);
    auto recreated = ok(co_await c.put({"/t/a", "again"}, timeout));
    auto fresh = ok(co_await c.range({"/t/a"}, timeout));
    REQUIRE(fresh.kvs.size() == 1);
    CHECK(fresh.kvs[0].version == 1);
    CHECK(fresh.kvs[0].createRevision == recreated.header.revision);

    // etcd's refusals come back as such, with its words.
    coio::Result<PutResponse> empty = co_await c.put({"", "no key"}, timeout);
    CHECK(empty.error() == EtcdErrc::invalidArgument);
    CHECK(c.lastError().find("key is not provided") != std::string::npos);
    coio::Result<PutResponse> unleased = co_await c.put({"/k", "v", 12345}, timeout);
    CHECK(unleased.error() == EtcdErrc::leaseNotFound);
}

/// Transactions: the branch the compares choose, at one revision.
template <coio::Reactor R, typename Ok>
coio::Task<void> transactions(EtcdClient<R>& c, Ok ok, Clock::duration timeout) {
    using Op = Compare::Op;
    const auto createIfAbsent = [](std::string value) {
      return TxnRequest{{Compare::createRevision("/lock", Op::equal, 0)},
                        {PutRequest{"/lock", std::move(value)}},
                        {RangeRequest{"/lock"}}};
    };
    auto won = ok(co_await c.txn(createIfAbsent("me"), timeout));
    CHECK(won.succeeded);
    REQUIRE(won.responses.size() == 1);
    CHECK(std::holds_alternative<PutResponse>(won.responses[0]));
    auto lost = ok(co_await c.txn(createIfAbsent("you"), timeout));
    CHECK(!lost.succeeded);
    CHECK(lost.header.revision == won.header.revision);  // nothing written
    REQUIRE(lost.responses.size() == 1);
    const auto* read = std::get_if<RangeResponse>(&lost.responses[0]);
    REQUIRE(read);
    REQUIRE(read->kvs.size() == 1);
    CHECK(read->kvs[0].value == "me");
    const std::int64_t created = read->kvs[0].modRevision;

    // Compare-and-swap on mod_revision: a stale revision loses.
    TxnRequest swap{{Compare::modRevision("/lock", Op::equal, created)}, {PutRequest{"/lock", "next"}}, {}};
    auto swapped = ok(co_await c.txn(swap, timeout));
    CHECK(swapped.succeeded);
    auto stale = ok(co_await c.txn(swap, timeout));
    CHECK(!stale.succeeded);
    CHECK(stale.responses.empty());

    // Value, version and lease compares; several operations at one revision, reads seeing the writes before them.
    TxnRequest multi{{Compare::valueOf("/lock", Op::equal, "next"), Compare::version("/lock", Op::greater, 1),
                      Compare::lease("/lock", Op::equal, 0)},
                     {PutRequest{"/a", "1"}, PutRequest{"/b", "2"}, DeleteRequest{"/lock"}, RangeRequest::prefix("/")},
                     {}};
    auto all = ok(co_await c.txn(multi, timeout));
    CHECK(all.succeeded);
    CHECK(all.header.revision == swapped.header.revision + 1);
    REQUIRE(all.responses.size() == 4);
    const auto* del = std::get_if<DeleteResponse>(&all.responses[2]);
    REQUIRE(del);
    CHECK(del->deleted == 1);
    const auto* after = std::get_if<RangeResponse>(&all.responses[3]);
    REQUIRE(after);
    REQUIRE(after->kvs.size() == 2);
    CHECK(after->kvs[0].key == "/a");
    CHECK(after->kvs[1].modRevision == all.header.revision);
    TxnRequest notEqual{{Compare::valueOf("/a", Op::notEqual, "1")}, {PutRequest{"/a", "2"}}, {}};
    auto unchanged = ok(co_await c.txn(notEqual, timeout));
    CHECK(!unchanged.succeeded);
    // A range compare holds for every key in it; a value compare on no key fails.
    Compare allOne = Compare::version("/", Op::equal, 1);
    allOne.rangeEnd = prefixEnd("/");
    TxnRequest rangedCompare({allOne}, {});
    auto ranged = ok(co_await c.txn(rangedCompare, timeout));
    CHECK(ranged.succeeded);
    TxnRequest absentCompare({Compare::valueOf("/none", Op::notEqual, "x")}, {});
    auto absent = ok(co_await c.txn(absentCompare, timeout));
    CHECK(!absent.succeeded);
    // etcd refuses a branch that writes a key twice.
    TxnRequest putAndDelete({}, {PutRequest{"/a", "x"}, DeleteRequest::prefix("/")});
    coio::Result<TxnResponse> twice = co_await c.txn(putAndDelete, timeout);
    CHECK(twice.error() == EtcdErrc::invalidArgument);
    CHECK(c.lastError().find("duplicate key") != std::string::npos);
}

/// Reads batches of `watch` until `count` events came (each within `timeout`).
template <coio::Reactor R, typename Ok>
coio::Task<std::vector<Event>> collectEvents(EtcdWatch<R>& watch, std::size_t count, Ok ok, Clock::duration timeout) {
  std::vector<Event> events;
  while (events.size() < count) {
    coio::Result<WatchBatch> batch = co_await watch.next(timeout);
    INFO("after " << events.size() << " events");
    for (Event& e : ok(std::move(batch)).events) events.push_back(std::move(e));
  }
  co_return events;
}

/// A watch sees puts and deletes in its range, in order; a quiet one
/// times out after its deadline (`now` the test's clock: the reactor's,
/// within `slack`) and goes on; one from a past revision replays from there.
template <coio::Reactor R, typename Ok, typename Now>
coio::Task<void> watchInOrder(EtcdClient<R>& c, Ok ok, Clock::duration timeout, Now now, Clock::duration slack) {
    (void)ok(co_await c.put({"/w/before", "old"}, timeout));
    auto watch = ok(co_await c.watch(WatchRequest::prefix("/w/"), timeout));
    auto a = ok(co_await c.put({"/w/a", "1"}, timeout));
    (void)ok(co_await c.put({"/elsewhere", "-"}, timeout));
    auto b = ok(co_await c.put({"/w/b", "2"}, timeout));
    auto d = ok(co_await c.deleteRange({"/w/a"}, timeout));
    std::vector<Event> events = co_await collectEvents(*watch, 3, ok, timeout);
    REQUIRE(events.size() == 3);
    CHECK(events[0].type == Event::Type::put);
    CHECK(events[0].kv.key == "/w/a");
    CHECK(events[0].kv.value == "1");
    CHECK(events[0].kv.modRevision == a.header.revision);
    CHECK(events[1].kv.key == "/w/b");
    CHECK(events[1].kv.modRevision == b.header.revision);
    CHECK(events[2].type == Event::Type::del);
    CHECK(events[2].kv.key == "/w/a");
    CHECK(events[2].kv.modRevision == d.header.revision);
    CHECK(watch->nextRevision() == d.header.revision + 1);

    // Nothing more: the deadline (within `slack`), and the watch goes on.
    const Clock::time_point started = now();
    coio::Result<WatchBatch> quiet = co_await watch->next(std::chrono::milliseconds(200));
    const Clock::duration took = now() - started;
    CHECK(quiet.error() == std::errc::timed_out);
    CHECK(took >= std::chrono::milliseconds(200));
    CHECK(took < std::chrono::milliseconds(200) + slack);
    auto e = ok(co_await c.put({"/w/c", "3"}, timeout));
    std::vector<Event> later = co_await collectEvents(*watch, 1, ok, timeout);
    CHECK(later[0].kv.modRevision == e.header.revision);

    // From a past revision: the history again, from there, with the pairs before.
    auto replay = ok(co_await c.watch(WatchRequest("/w/", prefixEnd("/w/"), a.header.revision, true), timeout));
    std::vector<Event> history = co_await collectEvents(*replay, 4, ok, timeout);
    CHECK(history[0].kv.modRevision == a.header.revision);
    CHECK(!history[0].prevKv);
    REQUIRE(history[2].prevKv);  // the delete's
    CHECK(history[2].prevKv->value == "1");
    CHECK(history[3].kv.modRevision == e.header.revision);
}

/// A watch from a compacted revision fails as such, for good (etcd
/// creates it, then cancels it: the error comes from watch() or from the
/// first next()); a read there too; both work from the compaction revision
/// on. `compact(rev)` compacts etcd (the test's means: etcdctl, or the
/// model's store).
template <coio::Reactor R, typename Ok, typename Compact>
coio::Task<void> compactedWatch(EtcdClient<R>& c, Ok ok, Clock::duration timeout, Compact compact) {
  auto first = ok(co_await c.put({"/k", "1"}, timeout));
  (void)ok(co_await c.put({"/k", "2"}, timeout));
  auto third = ok(co_await c.put({"/k", "3"}, timeout));
  compact(third.header.revision);
  coio::Result<std::unique_ptr<EtcdWatch<R>>> late = co_await c.watch(WatchRequest{"/k", "", first.header.revision}, timeout);
  std::error_code error = late.error();
  if (late) {
    coio::Result<WatchBatch> batch = co_await (*late)->next(timeout);
    error = batch.error();
    CHECK((*late)->compactRevision() == third.header.revision);
    coio::Result<WatchBatch> still = co_await (*late)->next(timeout);
    CHECK(still.error() == EtcdErrc::compacted);  // for good
  }
  CHECK(error == EtcdErrc::compacted);
  CHECK(c.lastError().find("compacted") != std::string::npos);
  coio::Result<RangeResponse> old = co_await c.range(RangeRequest("/k", "", first.header.revision), timeout);
  CHECK(old.error() == EtcdErrc::compacted);
  auto kept = ok(co_await c.range(RangeRequest("/k", "", third.header.revision), timeout));
  REQUIRE(kept.kvs.size() == 1);
  CHECK(kept.kvs[0].value == "3");
  auto fromThere = ok(co_await c.watch(WatchRequest{"/k", "", third.header.revision}, timeout));
  std::vector<Event> events = co_await collectEvents(*fromThere, 1, ok, timeout);
  CHECK(events[0].kv.value == "3");
}

}  // namespace storage::etcd::cases
