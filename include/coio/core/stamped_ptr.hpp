#pragma once
#include <coio/core/detail/assert.hpp>

#include <cstdint>

namespace coio {

/// A pointer and a 16-bit stamp packed into one 64-bit word, e.g. an RDMA
/// work-request id that carries both the operation context and its type.
///
/// Layout (as folly::StampedPtr, which 3FS's work-request ids use): the
/// pointer in the high 48 bits, the stamp in the low 16. `ptr()` shifts
/// back arithmetically, so bit 47 is sign-extended and canonical
/// upper-half addresses round-trip. `raw() == 0` exactly when the pointer is
/// null and the stamp 0.
///
/// Precondition (asserted): the pointer fits in 48 bits, i.e. bits 47..63
/// are all equal (x86-64 4-level and AArch64 48-bit VAs; not LA57 5-level
/// paging or tagged pointers). `fits()` tells. Small integers up to 2^47-1
/// may ride in the pointer field (3FS stores buffer indexes there):
/// use `fromValue()` / `value()`.
///
/// A trivial aggregate: a default-initialised StampedPtr holds garbage, as
/// in folly; value-initialise it (`StampedPtr<T>{}`) for (nullptr, 0).
template <typename T>
struct StampedPtr {
  static_assert(sizeof(void*) == 8, "StampedPtr needs 64-bit pointers");
  /// Bits of the stamp (the low bits of the word).
  static constexpr int kStampBits = 16;

  /// The packed word: pointer in the high 48 bits, stamp in the low 16.
  std::uint64_t word;

  /// Whether `p` survives the shift: its top 16 bits are a sign extension of bit 47.
  static bool fits(const volatile void* p) noexcept {
    const auto v = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
    return ((v << kStampBits) >> kStampBits) == v;
  }

  /// Packs `p` and `stamp` into a word (asserts that `p` fits).
  static std::uint64_t pack(T* p, std::uint16_t stamp) noexcept {
    COIO_ASSERT(fits(p), "StampedPtr: pointer does not fit in 48 bits");
    return (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)) << kStampBits) | stamp;
  }
  /// The pointer part of a packed word.
  static T* unpackPtr(std::uint64_t raw) noexcept {
    return reinterpret_cast<T*>(static_cast<std::intptr_t>(static_cast<std::int64_t>(raw) >> kStampBits));
  }
  /// The stamp part of a packed word.
  static std::uint16_t unpackStamp(std::uint64_t raw) noexcept { return static_cast<std::uint16_t>(raw); }

  /// A StampedPtr holding `p` and `stamp`.
  static StampedPtr make(T* p, std::uint16_t stamp) noexcept { return {pack(p, stamp)}; }
  /// A StampedPtr from a word made by raw() (e.g. a work-request id).
  static StampedPtr fromRaw(std::uint64_t raw) noexcept { return {raw}; }
  /// An integer in the pointer field; `value` < 2^47.
  static StampedPtr fromValue(std::uint64_t value, std::uint16_t stamp) noexcept {
    COIO_ASSERT(value < (std::uint64_t{1} << 47), "StampedPtr: value does not fit in 47 bits");
    return {(value << kStampBits) | stamp};
  }

  /// The pointer.
  T* ptr() const noexcept { return unpackPtr(word); }
  /// The stamp.
  std::uint16_t stamp() const noexcept { return unpackStamp(word); }
  /// The packed word (e.g. to use as a work-request id).
  std::uint64_t raw() const noexcept { return word; }
  /// The pointer field as the integer given to fromValue().
  std::uint64_t value() const noexcept { return static_cast<std::uint64_t>(static_cast<std::int64_t>(word) >> kStampBits); }

  /// Replaces pointer and stamp.
  void set(T* p, std::uint16_t stamp) noexcept { word = pack(p, stamp); }
  /// Replaces the pointer, keeping the stamp.
  void setPtr(T* p) noexcept { word = pack(p, stamp()); }
  /// Replaces the stamp, keeping the pointer.
  void setStamp(std::uint16_t stamp) noexcept { word = (word & ~std::uint64_t{0xFFFF}) | stamp; }

  /// Equal when pointer and stamp are.
  friend bool operator==(StampedPtr a, StampedPtr b) noexcept { return a.word == b.word; }
};

}  // namespace coio
