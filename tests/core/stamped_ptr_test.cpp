#include <coio/core/stamped_ptr.hpp>

#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <cstdint>

using coio::StampedPtr;

TEST_CASE("StampedPtr round-trips nullptr, and raw 0 means (nullptr, 0)", "[stampedPtr]") {
  auto p = StampedPtr<int>::make(nullptr, 0);
  CHECK(p.raw() == 0);
  CHECK(p.ptr() == nullptr);
  CHECK(p.stamp() == 0);
  CHECK(StampedPtr<int>{}.raw() == 0);
  auto q = StampedPtr<int>::make(nullptr, 0xFFFF);
  CHECK(q.ptr() == nullptr);
  CHECK(q.stamp() == 0xFFFF);
  CHECK(q.raw() != 0);
}

TEST_CASE("StampedPtr uses folly's layout: pointer high, stamp low", "[stampedPtr]") {
  int x = 0;
  auto p = StampedPtr<int>::make(&x, 0xABCD);
  CHECK(p.ptr() == &x);
  CHECK(p.stamp() == 0xABCD);
  CHECK((p.raw() & 0xFFFF) == 0xABCD);
  CHECK((p.raw() >> 16) == (reinterpret_cast<std::uintptr_t>(&x) & ((std::uint64_t{1} << 48) - 1)));
  CHECK(StampedPtr<int>::fromRaw(p.raw()) == p);
}

TEST_CASE("StampedPtr set, setPtr and setStamp change one field", "[stampedPtr]") {
  int a = 0, b = 0;
  StampedPtr<int> p{};
  p.set(&a, 1);
  p.setStamp(0xFFFF);
  CHECK(p.ptr() == &a);
  CHECK(p.stamp() == 0xFFFF);
  p.setPtr(&b);
  CHECK(p.ptr() == &b);
  CHECK(p.stamp() == 0xFFFF);
  p.setStamp(0);
  CHECK(p.ptr() == &b);
  CHECK(p.stamp() == 0);
}

TEST_CASE("StampedPtr sign-extends bit 47: upper-half addresses round-trip", "[stampedPtr]") {
  // A canonical address with bit 47 set (the kernel half on x86-64, and
  // where some AArch64 stacks live).
  auto* upper = reinterpret_cast<int*>(std::uintptr_t{0xFFFF'8000'1234'5670});
  REQUIRE(StampedPtr<int>::fits(upper));
  auto p = StampedPtr<int>::make(upper, 0x1234);
  CHECK(p.ptr() == upper);
  CHECK(p.stamp() == 0x1234);
  auto* top = reinterpret_cast<int*>(std::uintptr_t{0xFFFF'FFFF'FFFF'FFF0});
  CHECK(StampedPtr<int>::make(top, 7).ptr() == top);
  auto* highestLower = reinterpret_cast<int*>(std::uintptr_t{0x0000'7FFF'FFFF'FFF0});
  CHECK(StampedPtr<int>::make(highestLower, 0xFFFF).ptr() == highestLower);
}

TEST_CASE("StampedPtr carries small integers in the pointer field", "[stampedPtr]") {
  for (std::uint64_t v : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4095}, (std::uint64_t{1} << 47) - 1}) {
    auto p = StampedPtr<void>::fromValue(v, 3);
    CHECK(p.value() == v);
    CHECK(p.stamp() == 3);
  }
  // Same word as a pointer cast from the integer, as 3FS does it.
  CHECK(StampedPtr<void>::fromValue(42, 9).raw() ==
        StampedPtr<void>::make(reinterpret_cast<void*>(std::uintptr_t{42}), 9).raw());
}

TEST_CASE("StampedPtr::fits rejects pointers that need more than 48 bits", "[stampedPtr]") {
  CHECK(StampedPtr<int>::fits(nullptr));
  CHECK_FALSE(StampedPtr<int>::fits(reinterpret_cast<int*>(std::uintptr_t{0x0001'0000'0000'0000})));
  CHECK_FALSE(StampedPtr<int>::fits(reinterpret_cast<int*>(std::uintptr_t{0x0000'8000'0000'0000})));
  CHECK_FALSE(StampedPtr<int>::fits(reinterpret_cast<int*>(std::uintptr_t{0xFF00'0000'0000'1000})));
}

TEST_CASE("StampedPtr asserts on a pointer that does not fit", "[stampedPtr]") {
  // The precondition check is on in the test build (COIO_ENABLE_ASSERTS=1):
  // packing a non-canonical pointer must abort, not silently truncate.
  CHECK(coio::test::abortsInChild([] {
    auto p = StampedPtr<int>::make(reinterpret_cast<int*>(std::uintptr_t{0x0001'0000'0000'0000}), 1);
    (void)p;
  }));
}

TEST_CASE("StampedPtr asserts on a value that does not fit in 47 bits", "[stampedPtr]") {
  CHECK(StampedPtr<int>::fromValue((std::uint64_t{1} << 47) - 1, 3).stamp() == 3);
  CHECK(coio::test::abortsInChild([] { (void)StampedPtr<int>::fromValue(std::uint64_t{1} << 47, 3); }));
}
