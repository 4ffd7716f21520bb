#include <coio/core/generator.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <iterator>
#include <memory>
#include <ranges>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "test_helpers.hpp"

using coio::Generator;
using coio::test::CopyCounter;
using coio::test::LifeTracker;

namespace {

// 0, 1, 2, ... for ever; `steps` counts the values the body reached.
Generator<int> naturals(int& steps) {
  LifeTracker local;
  for (int i = 0;; ++i) {
    ++steps;
    co_yield i;
  }
}

Generator<int> upTo(int n) {
  for (int i = 0; i < n; ++i) co_yield i;
}

// Yields `n` values, then throws.
Generator<int> failingAfter(int n) {
  for (int i = 0; i < n; ++i) co_yield i;
  throw std::runtime_error("generator failed");
}

// Sets `destroyed` when the frame holding it goes.
struct OnDestroy {
  bool& destroyed;
  ~OnDestroy() { destroyed = true; }
};

}  // namespace

static_assert(std::ranges::input_range<Generator<int>>);
static_assert(std::ranges::view<Generator<int>>);
static_assert(!std::ranges::forward_range<Generator<int>>);
static_assert(std::input_iterator<Generator<int>::Iterator>);
static_assert(std::same_as<std::ranges::range_reference_t<Generator<int>>, int&>);
static_assert(std::same_as<std::ranges::range_value_t<Generator<const std::string&>>, std::string>);
static_assert(std::same_as<std::ranges::range_reference_t<Generator<const std::string&>>, const std::string&>);
static_assert(std::ranges::input_range<Generator<std::unique_ptr<int>>>);

TEST_CASE("Generator: lazy, values in order, one step of the body per increment", "[generator]") {
  int steps = 0;
  auto gen = naturals(steps);
  CHECK(steps == 0);  // nothing runs before begin()
  auto it = gen.begin();
  CHECK(steps == 1);
  CHECK(*it == 0);
  ++it;
  CHECK(steps == 2);
  CHECK(*it == 1);
  it++;
  CHECK(*it == 2);
  CHECK(steps == 3);

  std::vector<int> seen;
  for (int& x : upTo(4)) seen.push_back(x);
  CHECK(seen == std::vector<int>{0, 1, 2, 3});

  int count = 0;
  for (int x : upTo(0)) count += x + 1;  // an empty body: begin() == end()
  CHECK(count == 0);
}

TEST_CASE("Generator: breaking out of a range-for destroys the frame and its locals", "[generator]") {
  REQUIRE(LifeTracker::alive == 0);
  int steps = 0;
  for (int x : naturals(steps)) {
    CHECK(LifeTracker::alive == 1);  // the body's local
    if (x == 2) break;
  }
  CHECK(LifeTracker::alive == 0);
  CHECK(steps == 3);

  // Not started, and suspended at a co_yield.
  bool destroyed = false;
  auto guarded = [](bool& destroyed) -> Generator<int> {
    OnDestroy guard{destroyed};
    co_yield 1;
    co_yield 2;
  };
  { auto gen = guarded(destroyed); }
  CHECK_FALSE(destroyed);  // the body never ran: no guard to destroy
  {
    auto gen = guarded(destroyed);
    CHECK(*gen.begin() == 1);
    CHECK_FALSE(destroyed);
  }
  CHECK(destroyed);
}

TEST_CASE("Generator: co_yield passes lvalues and temporaries by reference; a const lvalue is copied once",
          "[generator]") {
  CopyCounter::resetCounts();
  const CopyCounter* localAddress = nullptr;
  auto gen = [](const CopyCounter*& localAddress) -> Generator<CopyCounter> {
    CopyCounter local(1);
    localAddress = &local;
    co_yield local;  // by reference: the consumer sees the body's own object
    co_yield CopyCounter(2);  // the temporary lives while the body is suspended
    const CopyCounter constant(3);
    co_yield constant;  // the consumer gets a CopyCounter&: a copy
    co_yield local;  // what the consumer did to it shows here
  }(localAddress);
  std::vector<int> seen;
  auto it = gen.begin();
  CHECK(&*it == localAddress);
  (*it).value = 10;  // a mutable reference to the body's local
  for (; it != gen.end(); ++it) seen.push_back((*it).value);
  CHECK(seen == std::vector<int>{10, 2, 3, 10});
  CHECK(CopyCounter::copies == 1);
  CHECK(CopyCounter::moves == 0);
}

TEST_CASE("Generator: move-only values, moved out by the consumer", "[generator]") {
  auto gen = []() -> Generator<std::unique_ptr<int>> {
    co_yield std::make_unique<int>(1);
    auto kept = std::make_unique<int>(2);
    co_yield kept;
    CHECK(kept == nullptr);  // the consumer took it
    co_yield std::make_unique<int>(3);
  };
  std::vector<std::unique_ptr<int>> taken;
  for (auto& p : gen()) taken.push_back(std::move(p));
  REQUIRE(taken.size() == 3);
  CHECK(*taken[0] == 1);
  CHECK(*taken[1] == 2);
  CHECK(*taken[2] == 3);
}

TEST_CASE("Generator: references to the body's objects", "[generator]") {
  std::vector<int> values{1, 2, 3};
  auto each = [](std::vector<int>& v) -> Generator<int&> {
    for (int& x : v) co_yield x;
  };
  for (int& x : each(values)) x *= 10;
  CHECK(values == std::vector<int>{10, 20, 30});

  const std::vector<std::string> names{"a", "b"};
  auto byName = [](const std::vector<std::string>& v) -> Generator<const std::string&> {
    for (const std::string& s : v) co_yield s;
    co_yield "c";  // a temporary std::string, alive while the body is suspended
  };
  std::vector<const std::string*> addresses;
  std::vector<std::string> seen;
  for (const std::string& s : byName(names)) {
    addresses.push_back(&s);
    seen.push_back(s);
  }
  CHECK(seen == std::vector<std::string>{"a", "b", "c"});
  REQUIRE(addresses.size() == 3);
  CHECK(addresses[0] == &names[0]);
  CHECK(addresses[1] == &names[1]);

  // Implicit conversions make a temporary too.
  auto converted = []() -> Generator<std::string> { co_yield "converted"; };
  std::vector<std::string> convertedSeen;
  for (std::string& s : converted()) convertedSeen.push_back(std::move(s));
  CHECK(convertedSeen == std::vector<std::string>{"converted"});
}

TEST_CASE("Generator: an exception is rethrown from the begin() or ++ that resumed the body, and ends it",
          "[generator]") {
  auto none = failingAfter(0);
  CHECK_THROWS_WITH(none.begin(), "generator failed");

  auto two = failingAfter(2);
  auto it = two.begin();
  CHECK(*it == 0);
  ++it;
  CHECK(*it == 1);
  CHECK_THROWS_WITH(++it, "generator failed");
  CHECK(it == two.end());

  std::vector<int> seen;
  try {
    for (int x : failingAfter(3)) seen.push_back(x);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "generator failed");
  }
  CHECK(seen == std::vector<int>{0, 1, 2});
}

TEST_CASE("Generator: ranges algorithms and views", "[generator]") {
  REQUIRE(LifeTracker::alive == 0);
  int steps = 0;
  {
    auto gen = naturals(steps);
    auto found = std::ranges::find_if(gen, [](int x) { return x * x > 50; });
    CHECK(*found == 8);
    CHECK(steps == 9);  // the endless body ran only as far as asked
    ++found;
    CHECK(*found == 9);  // the rest of the same single pass
  }
  CHECK(LifeTracker::alive == 0);

  std::vector<int> copied;
  std::ranges::copy(upTo(4), std::back_inserter(copied));
  CHECK(copied == std::vector<int>{0, 1, 2, 3});
  CHECK(std::ranges::count_if(upTo(10), [](int x) { return x > 6; }) == 3);
  const auto [min, max] = std::ranges::minmax(upTo(5));
  CHECK(min == 0);
  CHECK(max == 4);

  // Clang before 16 rejects every std::views adaptor of libstdc++, whatever
  // the range (llvm-project issue 44178).
#if !defined(__clang__) || __clang_major__ >= 16
  steps = 0;
  {
    auto squaresOfEvens = naturals(steps) | std::views::filter([](int x) { return x % 2 == 0; }) |
                          std::views::transform([](int x) { return x * x; }) | std::views::take(4);
    std::vector<int> out;
    std::ranges::copy(squaresOfEvens, std::back_inserter(out));
    CHECK(out == std::vector<int>{0, 4, 16, 36});
    // 0..8: take's last increment looks for the next even value, 8, before
    // it counts to 4.
    CHECK(steps == 9);
    CHECK(LifeTracker::alive == 1);  // the view owns the generator
  }
  CHECK(LifeTracker::alive == 0);
#endif
}

TEST_CASE("Generator: moves, empty generators, and begin() only once", "[generator]") {
  Generator<int> empty;
  CHECK_FALSE(empty.valid());
  auto a = upTo(3);
  Generator<int> b = std::move(a);
  CHECK_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): documented as empty
  CHECK(b.valid());
  a = upTo(2);
  b = std::move(a);  // destroys b's frame, takes a's
  std::vector<int> seen;
  for (int x : b) seen.push_back(x);
  CHECK(seen == std::vector<int>{0, 1});

  CHECK(coio::test::abortsInChild([] {
    auto gen = upTo(3);
    (void)gen.begin();
    (void)gen.begin();
  }));
  CHECK(coio::test::abortsInChild([] {
    auto gen = upTo(0);
    ++gen.begin();  // past the end
  }));
}

TEST_CASE("Generator asserts on begin() of a moved-from generator and on dereferencing its end", "[generator]") {
  CHECK(coio::test::abortsInChild([] {
    auto gen = upTo(3);
    auto owner = std::move(gen);
    (void)gen.begin();
  }));
  CHECK(coio::test::abortsInChild([] {
    auto gen = upTo(0);
    (void)*gen.begin();  // the end
  }));
}
