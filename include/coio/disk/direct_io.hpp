#pragma once
// O_DIRECT alignment: the error reported for a misaligned request, and the
// helper that widens a range to aligned bounds. No OS dependency.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>

namespace coio {

/// Errors of the disk layer that have no errno of their own. Both compare
/// equal to std::errc::invalid_argument, the errno the kernel would give
/// without saying why.
enum class DiskErrc {
  misalignedDirectIo = 1,  ///< O_DIRECT offset, length or buffer address not a multiple of the file's alignment
  requestTooLarge,         ///< one operation of 4 GiB or more (an SQE carries a 32-bit length)
};

}  // namespace coio

/// @cond INTERNAL
template <>
struct std::is_error_code_enum<coio::DiskErrc> : std::true_type {};
/// @endcond

namespace coio {

namespace detail {
class DiskCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "coio.disk"; }
  std::string message(int ev) const override {
    switch (static_cast<DiskErrc>(ev)) {
      case DiskErrc::misalignedDirectIo:
        return "O_DIRECT request misaligned: offset, length and buffer address must be multiples of the "
               "file's direct-I/O alignment (File::alignment(); widen the range with alignRange())";
      case DiskErrc::requestTooLarge: return "disk request of 4 GiB or more: split it";
    }
    return "unknown coio.disk error";
  }
  std::error_condition default_error_condition(int) const noexcept override {
    return std::make_error_condition(std::errc::invalid_argument);
  }
};
}  // namespace detail

/// The error category of coio::DiskErrc ("coio.disk").
inline const std::error_category& diskCategory() noexcept {
  static const detail::DiskCategory category;
  return category;
}

/// Makes coio::DiskErrc usable as a std::error_code (found by ADL).
inline std::error_code make_error_code(DiskErrc e) noexcept {  // NOLINT: found by ADL, name fixed by the standard
  return {static_cast<int>(e), diskCategory()};
}

/// Whether a request satisfies O_DIRECT's rules for `alignment` (a power of two).
inline bool isAligned(std::uint64_t offset, std::size_t length, const void* address, std::size_t alignment) noexcept {
  const std::uint64_t mask = alignment - 1;
  return ((offset | length | reinterpret_cast<std::uintptr_t>(address)) & mask) == 0;
}

/// A byte range widened to aligned bounds, as O_DIRECT needs: read
/// [offset, offset + length) into an aligned buffer, then take the caller's
/// part with `requestedPart` (what 3FS does for chunk reads).
struct AlignedRange {
  std::uint64_t offset = 0;    ///< aligned start (<= the requested offset)
  std::size_t length = 0;      ///< aligned length (covers the requested range)
  std::size_t head = 0;        ///< bytes before the requested range
  std::size_t requested = 0;   ///< the requested length

  /// How many requested bytes a read of the aligned range returned, given
  /// that it read `bytesRead` (short at end of file).
  std::size_t requestedLength(std::size_t bytesRead) const noexcept {
    return bytesRead > head ? std::min(bytesRead - head, requested) : 0;
  }
  /// The requested bytes within `buffer`, which holds the aligned read.
  template <typename Byte>
  std::span<Byte> requestedPart(std::span<Byte> buffer, std::size_t bytesRead) const noexcept {
    return buffer.subspan(head, requestedLength(bytesRead));
  }
};

/// Widens [offset, offset + length) to multiples of `alignment` (a power of two).
inline AlignedRange alignRange(std::uint64_t offset, std::size_t length, std::size_t alignment = 4096) noexcept {
  const std::uint64_t mask = alignment - 1;
  const std::uint64_t begin = offset & ~mask;
  const std::uint64_t end = length == 0 ? begin : (offset + length + mask) & ~mask;
  return {begin, static_cast<std::size_t>(end - begin), static_cast<std::size_t>(offset - begin), length};
}

}  // namespace coio
