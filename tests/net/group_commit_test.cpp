// GroupCommit: items submitted concurrently are carried out in batches, in
// submit order, within maxWeight, at most maxBatches at once; a queued item
// can be cancelled; a failed batch breaks the commit. On every reactor.
#include "../reactor/test_reactors.hpp"

#include <coio/core/collect_all.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/group_commit.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stop_token>
#include <system_error>
#include <vector>

namespace {

// Records each batch's items; yields to the loop once (as a write would
// suspend), then `result`.
template <typename R>
struct RecordingBatch {
  R* reactor;
  std::vector<std::vector<int>>* batches;
  coio::Result<void>* result;
  coio::Task<coio::Result<void>> operator()(std::span<const int> items, std::stop_token) const {
    batches->emplace_back(items.begin(), items.end());
    co_await reactor->schedule();
    co_return *result;
  }
};

template <typename R>
using Commit = coio::GroupCommit<R, int, RecordingBatch<R>>;

// Records each batch's items when it starts, and how many batches are under
// way at most; each lasts `turns` turns of the loop (a chain of RDMA WRITEs
// waiting for the peer's acknowledgement).
template <typename R>
struct SlowBatch {
  R* reactor;
  int turns;
  std::vector<std::vector<int>>* started;
  int* underWay;
  int* mostUnderWay;
  coio::Task<coio::Result<void>> operator()(std::span<const int> items, std::stop_token) const {
    started->emplace_back(items.begin(), items.end());
    *mostUnderWay = std::max(*mostUnderWay, ++*underWay);
    for (int i = 0; i < turns; ++i) co_await reactor->schedule();
    --*underWay;
    co_return coio::Result<void>{};
  }
};

// Submits `item` and stores what it yields.
template <typename R>
coio::Task<void> submitInto(Commit<R>& commit, int item, std::size_t weight, std::stop_token stop,
                            coio::Result<void>& out) {
  out = co_await commit.submit(item, weight, std::move(stop));
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("GroupCommit: submits of one turn go in one batch, in order; each gets its result",
                        "[net][group_commit]", coio::testing::TestReactors) {
  TestType reactor;
  std::vector<std::vector<int>> batches;
  coio::Result<void> ok{};
  Commit<TestType> commit(reactor, 100, RecordingBatch<TestType>{&reactor, &batches, &ok});
  std::vector<coio::Result<void>> results(8, coio::Errc::closed);
  reactor.runUntil([](Commit<TestType>& c, std::vector<coio::Result<void>>& out) -> coio::Task<void> {
    std::vector<coio::Task<void>> submits;
    for (int i = 0; i < 8; ++i) submits.push_back(submitInto(c, i, 1, {}, out[static_cast<std::size_t>(i)]));
    co_await coio::collectAllRange(std::move(submits));
  }(commit, results));
  REQUIRE(batches.size() == 1);
  CHECK(batches[0] == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  for (const coio::Result<void>& r : results) CHECK(r.hasValue());
  CHECK_FALSE(commit.broken());
}

TEMPLATE_LIST_TEST_CASE("GroupCommit: a batch holds what fits in maxWeight; a heavier item goes alone",
                        "[net][group_commit]", coio::testing::TestReactors) {
  TestType reactor;
  std::vector<std::vector<int>> batches;
  coio::Result<void> ok{};
  Commit<TestType> commit(reactor, 3, RecordingBatch<TestType>{&reactor, &batches, &ok});
  const std::vector<std::size_t> weights{1, 1, 1, 1, 10, 1};
  std::vector<coio::Result<void>> results(weights.size(), coio::Errc::closed);
  reactor.runUntil([](Commit<TestType>& c, const std::vector<std::size_t>& w,
                      std::vector<coio::Result<void>>& out) -> coio::Task<void> {
    std::vector<coio::Task<void>> submits;
    for (std::size_t i = 0; i < w.size(); ++i) submits.push_back(submitInto(c, static_cast<int>(i), w[i], {}, out[i]));
    co_await coio::collectAllRange(std::move(submits));
  }(commit, weights, results));
  CHECK(batches == std::vector<std::vector<int>>{{0, 1, 2}, {3}, {4}, {5}});
  for (const coio::Result<void>& r : results) CHECK(r.hasValue());
}

TEMPLATE_LIST_TEST_CASE("GroupCommit: an item cancelled while queued is not carried out",
                        "[net][group_commit]", coio::testing::TestReactors) {
  TestType reactor;
  std::vector<std::vector<int>> batches;
  coio::Result<void> ok{};
  Commit<TestType> commit(reactor, 100, RecordingBatch<TestType>{&reactor, &batches, &ok});
  std::stop_source stopSecond;
  coio::Result<void> first = coio::Errc::closed, second = coio::Errc::closed, third = coio::Errc::closed;
  reactor.runUntil([](Commit<TestType>& c, std::stop_source& stop, coio::Result<void>& a, coio::Result<void>& b,
                      coio::Result<void>& d) -> coio::Task<void> {
    // The first leads and yields; the second queues; then its stop comes,
    // before the leader takes the queue.
    auto cancelSecond = [](std::stop_source& s) -> coio::Task<void> {
      s.request_stop();
      co_return;
    };
    co_await coio::collectAll(submitInto(c, 1, 1, {}, a), submitInto(c, 2, 1, stop.get_token(), b),
                              cancelSecond(stop), submitInto(c, 3, 1, {}, d));
  }(commit, stopSecond, first, second, third));
  CHECK(first.hasValue());
  REQUIRE(!second);
  CHECK(second.error() == std::errc::operation_canceled);
  CHECK(third.hasValue());
  CHECK(batches == std::vector<std::vector<int>>{{1, 3}});
}

TEMPLATE_LIST_TEST_CASE("GroupCommit: a failed batch fails its items and breaks the commit",
                        "[net][group_commit]", coio::testing::TestReactors) {
  TestType reactor;
  std::vector<std::vector<int>> batches;
  coio::Result<void> failing = coio::Errc::eof;
  Commit<TestType> commit(reactor, 100, RecordingBatch<TestType>{&reactor, &batches, &failing});
  coio::Result<void> a{}, b{}, later{};
  reactor.runUntil([](Commit<TestType>& c, coio::Result<void>& x, coio::Result<void>& y,
                      coio::Result<void>& z) -> coio::Task<void> {
    co_await coio::collectAll(submitInto(c, 1, 1, {}, x), submitInto(c, 2, 1, {}, y));
    z = co_await c.submit(3, 1, {});
  }(commit, a, b, later));
  REQUIRE(!a);
  CHECK(a.error() == coio::Errc::eof);
  REQUIRE(!b);
  CHECK(b.error() == coio::Errc::eof);
  CHECK(commit.broken());
  REQUIRE(!later);
  CHECK(later.error() == coio::Errc::closed);
  CHECK(batches.size() == 1);  // nothing more was handed to the batch
}

TEMPLATE_LIST_TEST_CASE("GroupCommit: with maxBatches, batches overlap up to it and start in submit order",
                        "[net][group_commit]", coio::testing::TestReactors) {
  // One item per turn of the loop, each batch lasting 5 turns: one batch at a
  // time (the default) takes what queued while the one before ran; with 2,
  // a second starts beside the first and a third waits for one to end.
  for (const std::size_t maxBatches : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(maxBatches);
    TestType reactor;
    std::vector<std::vector<int>> started;
    int underWay = 0, mostUnderWay = 0;
    coio::GroupCommit<TestType, int, SlowBatch<TestType>> commit(
        reactor, 100, SlowBatch<TestType>{&reactor, 5, &started, &underWay, &mostUnderWay}, maxBatches);
    std::vector<coio::Result<void>> results(12, coio::Errc::closed);
    reactor.runUntil([](TestType& r, coio::GroupCommit<TestType, int, SlowBatch<TestType>>& c,
                        std::vector<coio::Result<void>>& out) -> coio::Task<void> {
      auto submitLater = [](TestType& r, coio::GroupCommit<TestType, int, SlowBatch<TestType>>& c, int item,
                            coio::Result<void>& into) -> coio::Task<void> {
        for (int i = 0; i < item; ++i) co_await r.schedule();
        into = co_await c.submit(item, 1, {});
      };
      std::vector<coio::Task<void>> submits;
      for (int i = 0; i < 12; ++i) submits.push_back(submitLater(r, c, i, out[static_cast<std::size_t>(i)]));
      co_await coio::collectAllRange(std::move(submits));
    }(reactor, commit, results));
    for (const coio::Result<void>& r : results) CHECK(r.hasValue());
    CHECK(mostUnderWay == static_cast<int>(maxBatches));
    CHECK(underWay == 0);
    std::vector<int> order;  // every item once, in submit order
    for (const std::vector<int>& b : started) order.insert(order.end(), b.begin(), b.end());
    CHECK(order == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  }
}
