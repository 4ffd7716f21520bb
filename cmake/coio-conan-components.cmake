# Included by the package config that Conan's CMakeDeps generates for coio
# (cmake_build_modules in conanfile.py), after it defined the targets of the
# components this consumer's options enabled. CMakeDeps itself ignores
# find_package(coio COMPONENTS ...): like coio's own installed config, a
# requested component the package lacks makes find_package fail and say why.
foreach(_coio_component IN LISTS coio_FIND_COMPONENTS)
  if(NOT TARGET coio::${_coio_component})
    set(coio_FOUND FALSE)
    string(APPEND coio_NOT_FOUND_MESSAGE "coio was installed without component '${_coio_component}'. ")
  endif()
endforeach()
