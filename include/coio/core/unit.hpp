#pragma once

namespace coio {

/// The value of an operation that produces nothing. `collectAll` maps a
/// `Task<void>` child to `Unit` so that every child has a slot in the tuple.
struct Unit {
  /// All Units are equal.
  friend constexpr bool operator==(Unit, Unit) noexcept { return true; }
};

}  // namespace coio
