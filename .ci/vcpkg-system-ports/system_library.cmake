# Shared by the overlay ports beside this file: an empty package that only
# checks that the system provides the pkg-config module.
#   coio_require_system_pkgconfig(<module> <Debian package that provides it>)
function(coio_require_system_pkgconfig module debian_package)
  vcpkg_find_acquire_program(PKGCONFIG)
  execute_process(COMMAND "${PKGCONFIG}" --modversion ${module}
    OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed)
  if(failed)
    message(FATAL_ERROR "${PORT}: pkg-config module '${module}' not found on this system (Debian: apt install ${debian_package})")
  endif()
  message(STATUS "${PORT}: using the system's ${module} ${version}")
  set(VCPKG_POLICY_EMPTY_PACKAGE enabled PARENT_SCOPE)
endfunction()
