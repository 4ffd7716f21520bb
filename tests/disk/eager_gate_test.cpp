// EagerGate: when a single disk operation goes to the kernel at once.
#include <coio/disk/detail/disk_ring.hpp>

#include <catch2/catch.hpp>

using coio::detail::EagerGate;

namespace {

// Submits `n` operations through the gate, each completing inline or not
// as `inlineCompletion` says; how many of them went in at once.
template <typename F>
unsigned submitMany(EagerGate& gate, unsigned n, F inlineCompletion) {
  unsigned eager = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (!gate.open(1)) continue;
    ++eager;
    gate.submitted(inlineCompletion(i));
  }
  return eager;
}

}  // namespace

TEST_CASE("the eager gate stays open for a disk-bound stream with occasional quick completions",
          "[disk][gate]") {
  EagerGate gate(64);
  // Every 4th read finishes before its enter returns (a fast device): never
  // kInlineStreak in a row, so every read goes in at once.
  const unsigned eager = submitMany(gate, 10'000, [](unsigned i) { return i % 4 == 0; });
  CHECK(eager == 10'000);
  // Streaks just short of the limit do not close it either.
  const unsigned almost =
      submitMany(gate, 1'000, [](unsigned i) { return i % EagerGate::kInlineStreak != 0; });
  CHECK(almost == 1'000);
}

TEST_CASE("the eager gate closes after a streak of inline completions, then reopens", "[disk][gate]") {
  EagerGate gate(64);
  // Page-cache hits: every read completes inline. After kInlineStreak of
  // them the gate batches for kBatchFor submissions, then tries again.
  const unsigned total = EagerGate::kInlineStreak + EagerGate::kBatchFor + EagerGate::kInlineStreak;
  const unsigned eager = submitMany(gate, total, [](unsigned) { return true; });
  CHECK(eager == 2 * EagerGate::kInlineStreak);
  CHECK_FALSE(gate.open(1));  // closed again by the second streak
}

TEST_CASE("the eager gate is shut above its depth", "[disk][gate]") {
  EagerGate gate(64);
  CHECK(gate.open(64));
  CHECK_FALSE(gate.open(65));
  EagerGate never(0);
  CHECK_FALSE(never.open(1));
}
