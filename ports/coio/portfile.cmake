# Overlay port for the coio checkout it lives in: it builds this source tree
# (two levels up) instead of downloading a release, so
# `--overlay-ports=<coio>/ports` installs exactly what is checked out.
set(VCPKG_BUILD_TYPE release) # header-only
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
    FEATURES
        io-uring COIO_WITH_URING
        rdma     COIO_WITH_RDMA
)

# The components find liburing and libibverbs through pkg-config.
vcpkg_find_acquire_program(PKGCONFIG)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        ${FEATURE_OPTIONS}
        "-DPKG_CONFIG_EXECUTABLE=${PKGCONFIG}"
        -DCOIO_BUILD_TESTS=OFF
        -DCOIO_BUILD_BENCHMARKS=OFF
        -DCOIO_BUILD_EXAMPLES=OFF
        # coio.pc has a Libs: line (-pthread), which vcpkg accepts only under lib/.
        -DCOIO_INSTALL_PKGCONFIGDIR=lib/pkgconfig
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/coio)
vcpkg_fixup_pkgconfig()

vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
