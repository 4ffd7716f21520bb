#pragma once
#include <type_traits>

namespace coio {

/// The value of an operation that produces nothing. `collectAll` maps a
/// `Task<void>` child to `Unit` so that every child has a slot in the tuple.
struct Unit {
  /// All Units are equal.
  friend constexpr bool operator==(Unit, Unit) noexcept { return true; }
};

/// T, or Unit for void: what collectAll and collectAny yield for a
/// `Task<T>` child.
template <typename T>
using UnitIfVoid = std::conditional_t<std::is_void_v<T>, Unit, T>;

}  // namespace coio
