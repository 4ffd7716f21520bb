# Defines coio::uring and coio::rdma when their system libraries are
# available (or fails when a component was requested with ON).
find_package(PkgConfig QUIET)

# coio_component(<name> <pkg-config module> <switch variable>)
function(coio_component name module switch)
  if(${switch} STREQUAL "OFF")
    return()
  endif()
  set(found FALSE)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(COIO_DEP_${name} QUIET IMPORTED_TARGET GLOBAL ${module})
    set(found ${COIO_DEP_${name}_FOUND})
  endif()
  if(NOT found)
    if(${switch} STREQUAL "ON")
      message(FATAL_ERROR "coio: component '${name}' requested but pkg-config module '${module}' was not found")
    endif()
    message(STATUS "coio: component '${name}' disabled (${module} not found)")
    return()
  endif()
  add_library(coio_${name} INTERFACE)
  add_library(coio::${name} ALIAS coio_${name})
  target_link_libraries(coio_${name} INTERFACE coio PkgConfig::COIO_DEP_${name})
  set(COIO_HAS_${name} ON PARENT_SCOPE)
  message(STATUS "coio: component '${name}' enabled (${module} ${COIO_DEP_${name}_VERSION})")
endfunction()

coio_component(uring liburing COIO_WITH_URING)
coio_component(rdma libibverbs COIO_WITH_RDMA)


