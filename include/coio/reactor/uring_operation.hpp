#pragma once
// UringOperation: what an io_uring CQE completes. Needs liburing: link coio::uring.
#include <coio/reactor/detail/loop_meter.hpp>

#include <cstdint>

namespace coio {

/// The base of anything whose completion an io_uring CQE delivers: the
/// SQE's user_data points at it, and `complete` is called with the CQE's
/// result and flags, on the loop thread. It must stay alive until its last
/// completion (flags without IORING_CQE_F_MORE) has arrived, cancelled or not.
struct UringOperation {
  /// Called on the loop thread with each CQE's result and flags.
  void (*complete)(UringOperation* self, int result, unsigned flags) noexcept = nullptr;
  /// The ring's: the LoopStats counter its completion counts in, set when
  /// it is submitted (from the SQE's opcode); none before.
  /// \hideinitializer
  std::uint8_t counter = detail::kUncounted;
  /// The ring's: the opcode of its last SQE, set when it is submitted (so
  /// that a completion dropped at a stop releases what it made: see
  /// UringRing::quiesce).
  /// \hideinitializer
  std::uint8_t opcode = 0;
};

}  // namespace coio
