# Settings for coio's own builds (tests, benchmarks, examples): strict
# warnings and optional sanitizers. Never applied to consumers.
include(CheckCXXCompilerFlag)

set(COIO_WARNINGS -Wall -Wextra -Wpedantic -Werror)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC bug 80635: false -Wmaybe-uninitialized on the inactive member of
  # std::variant/std::optional once the object's address escapes (seen on
  # Result<std::string> in a try block at -O2).
  list(APPEND COIO_WARNINGS -Wno-maybe-uninitialized)
endif()

set(COIO_SANITIZER_FLAGS "")
if(COIO_SANITIZE)
  set(COIO_SANITIZER_FLAGS -fsanitize=${COIO_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  if(COIO_SANITIZE MATCHES "undefined" AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # clang 14's -fsanitize=function misfires on coroutine resume functions.
    list(APPEND COIO_SANITIZER_FLAGS -fno-sanitize=function)
  endif()
endif()

# Whether this build can run the tests that need symmetric transfer to be
# real tail calls: optimised and not under a sanitizer.
if(COIO_SANITIZE OR CMAKE_BUILD_TYPE STREQUAL "Debug" OR NOT CMAKE_BUILD_TYPE)
  set(COIO_TAIL_CALLS_GUARANTEED OFF)
else()
  set(COIO_TAIL_CALLS_GUARANTEED ON)
endif()

# coio_target_defaults(<target>): warnings as errors and sanitizer flags.
function(coio_target_defaults target)
  target_compile_options(${target} PRIVATE ${COIO_WARNINGS} ${COIO_SANITIZER_FLAGS})
  target_link_options(${target} PRIVATE ${COIO_SANITIZER_FLAGS})
endfunction()
