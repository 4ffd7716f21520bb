# install() rules: headers, the coio::coio target, one export set per
# component (so a consumer without liburing can still load the core), a
# package config that finds each component's pkg-config modules again on the
# consumer's machine, an arch-independent version file, coio.pc and the
# license (share/doc/coio/LICENSE).
# Included by the top-level CMakeLists.txt after cmake/CoioComponents.cmake.
option(COIO_INSTALL "Generate coio's install rules" ${COIO_TOP_LEVEL})
if(NOT COIO_INSTALL)
  return()
endif()

include(CMakePackageConfigHelpers)

# Header-only: nothing depends on the architecture, so all of it goes under
# the data dir (share/), where pkg-config and find_package look as well.
set(coio_cmakedir "${CMAKE_INSTALL_DATADIR}/cmake/coio")
# coio.pc's Libs: line (-pthread) makes vcpkg want it under lib/pkgconfig.
set(COIO_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig" CACHE STRING
  "Where coio.pc is installed, relative to the prefix")

install(DIRECTORY include/ DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(FILES LICENSE DESTINATION "${CMAKE_INSTALL_DOCDIR}")

install(TARGETS coio EXPORT coioTargets)
install(EXPORT coioTargets NAMESPACE coio:: DESTINATION "${coio_cmakedir}")

# The components are the coio_<name> targets cmake/CoioComponents.cmake
# defined. Each links PkgConfig::<prefix> targets; the config recreates them
# under the same names from the module recorded in <prefix>_MODULE_NAME.
get_property(coio_targets DIRECTORY "${PROJECT_SOURCE_DIR}" PROPERTY BUILDSYSTEM_TARGETS)
list(FILTER coio_targets INCLUDE REGEX "^coio_")
set(COIO_CONFIG_COMPONENTS "")
set(installed_components "")
foreach(target IN LISTS coio_targets)
  string(REGEX REPLACE "^coio_" "" component "${target}")
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${component})
  install(TARGETS ${target} EXPORT ${target}Targets)
  install(EXPORT ${target}Targets NAMESPACE coio:: DESTINATION "${coio_cmakedir}")

  set(pkg_deps "")
  get_target_property(links ${target} INTERFACE_LINK_LIBRARIES)
  foreach(link IN LISTS links)
    if(link MATCHES "^PkgConfig::(.+)$")
      set(prefix ${CMAKE_MATCH_1})
      if(NOT ${prefix}_MODULE_NAME)
        message(FATAL_ERROR "coio: cannot export ${target}: ${link} is not one pkg-config module")
      endif()
      list(APPEND pkg_deps ${prefix} ${${prefix}_MODULE_NAME})
    endif()
  endforeach()
  string(APPEND COIO_CONFIG_COMPONENTS "set(_coio_${component}_pkg_deps ${pkg_deps})\n")
  list(APPEND installed_components ${component})
endforeach()
string(APPEND COIO_CONFIG_COMPONENTS "set(_coio_installed_components ${installed_components})")

configure_package_config_file(cmake/coioConfig.cmake.in
  "${PROJECT_BINARY_DIR}/coioConfig.cmake"
  INSTALL_DESTINATION "${coio_cmakedir}")
# 0.x releases may break the API in a minor version.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(coio_compatibility SameMinorVersion)
else()
  set(coio_compatibility SameMajorVersion)
endif()
write_basic_package_version_file("${PROJECT_BINARY_DIR}/coioConfigVersion.cmake"
  COMPATIBILITY ${coio_compatibility} ARCH_INDEPENDENT)
install(FILES "${PROJECT_BINARY_DIR}/coioConfig.cmake" "${PROJECT_BINARY_DIR}/coioConfigVersion.cmake"
  DESTINATION "${coio_cmakedir}")

# coio.pc finds its prefix relative to itself, so the tree can be moved.
file(RELATIVE_PATH COIO_PC_PREFIX "${CMAKE_INSTALL_PREFIX}/${COIO_INSTALL_PKGCONFIGDIR}" "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" COIO_PC_PREFIX "${COIO_PC_PREFIX}")
file(RELATIVE_PATH COIO_PC_INCLUDEDIR "${CMAKE_INSTALL_PREFIX}" "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
configure_file(cmake/coio.pc.in "${PROJECT_BINARY_DIR}/coio.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/coio.pc" DESTINATION "${COIO_INSTALL_PKGCONFIGDIR}")
