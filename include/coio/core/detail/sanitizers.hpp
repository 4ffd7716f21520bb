#pragma once
// What coio does differently under AddressSanitizer: COIO_DETAIL_ASAN is
// defined in such a build, and memory can be marked off-limits.
#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define COIO_DETAIL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COIO_DETAIL_ASAN 1
#endif
#endif

#if defined(COIO_DETAIL_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace coio::detail {

/// Under AddressSanitizer, any access to [data, data + size) is reported
/// until unpoisonMemory(); without it, nothing.
inline void poisonMemory(const void* data, std::size_t size) noexcept {
#if defined(COIO_DETAIL_ASAN)
  __asan_poison_memory_region(data, size);
#else
  (void)data;
  (void)size;
#endif
}

/// Undoes poisonMemory() on [data, data + size).
inline void unpoisonMemory(const void* data, std::size_t size) noexcept {
#if defined(COIO_DETAIL_ASAN)
  __asan_unpoison_memory_region(data, size);
#else
  (void)data;
  (void)size;
#endif
}

}  // namespace coio::detail
