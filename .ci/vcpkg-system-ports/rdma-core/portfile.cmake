# Stands in for the registry's rdma-core (see ../liburing/portfile.cmake).
include("${CMAKE_CURRENT_LIST_DIR}/../system_library.cmake")
coio_require_system_pkgconfig(libibverbs libibverbs-dev)
