# Stands in for the registry's liburing, which would download and build its
# source: coio's components find their libraries with pkg-config, so the
# system's liburing is what a consumer links. Fails here if it is missing.
include("${CMAKE_CURRENT_LIST_DIR}/../system_library.cmake")
coio_require_system_pkgconfig(liburing liburing-dev)
