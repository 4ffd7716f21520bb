#pragma once
// COIO_ASSERT: checks a documented precondition. Violations are programming
// errors, so they abort with a message rather than throw. Enabled unless
// NDEBUG is defined; COIO_ENABLE_ASSERTS=1 forces them on in release builds
// (our test suite does, so that precondition checks are themselves tested).
#include <cstdio>
#include <cstdlib>

#if !defined(COIO_ENABLE_ASSERTS)
#if defined(NDEBUG)
#define COIO_ENABLE_ASSERTS 0
#else
#define COIO_ENABLE_ASSERTS 1
#endif
#endif

namespace coio::detail {
[[noreturn]] inline void assertFailed(const char* expr, const char* msg, const char* file, int line) noexcept {
  std::fprintf(stderr, "coio: assertion failed: %s (%s) at %s:%d\n", expr, msg, file, line);
  std::abort();
}
}  // namespace coio::detail

#if COIO_ENABLE_ASSERTS
#define COIO_ASSERT(expr, msg) \
  ((expr) ? void(0) : ::coio::detail::assertFailed(#expr, msg, __FILE__, __LINE__))
#else
#define COIO_ASSERT(expr, msg) void(0)
#endif
