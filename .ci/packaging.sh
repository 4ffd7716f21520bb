#!/usr/bin/env bash
# CI for the ways users take coio in: the installed CMake package
# (find_package, and pkg-config), add_subdirectory, the single header (plus
# the core test suite built against it alone), a Conan package created
# offline, and the vcpkg port installed by a real vcpkg built offline
# (vcpkg-offline.sh from shared/tools/vcpkg beside the repository). Each
# package route is also asked for a component it was built without, which
# must fail at find_package. Runs every check, then fails if any failed.
# Needs what scripts/install-deps.sh installs; fetches Conan from PyPI into a
# virtualenv.
#   .ci/packaging.sh [work dir, relative to the repository; default build-packaging]
# Without vcpkg-offline.sh the vcpkg check is reported SKIPPED (not passed);
# COIO_REQUIRE_VCPKG=1 makes that a failure. COIO_VCPKG_OFFLINE=<path> names
# the script when it is elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(realpath -m "${1:-build-packaging}")
jobs=$(nproc)
conan_version=2.34.0
# Every component the CI machine has the libraries for (scripts/install-deps.sh).
components="uring;rdma"

start=$SECONDS
section() { echo; echo "=== packaging: $* ($((SECONDS - start)) s)"; }

# A stale tree must not hide a broken step.
rm -rf "$work/coio"* "$work/prefix"* "$work/consumer-"* "$work/single-include-"* "$work/conan-"* "$work/vcpkg-"*
mkdir -p "$work"

section "tools"
venv=$work/venv
if [[ "$("$venv/bin/conan" --version 2>/dev/null)" != "Conan version $conan_version" ]]; then
  python3 -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "conan==$conan_version"
fi
"$venv/bin/conan" --version

# configure_and_run <build dir> <cmake args...>: builds tests/consumer and runs it.
configure_and_run() {
  local build=$1
  shift
  cmake -S tests/consumer -B "$build" "-DCOIO_CONSUMER_COMPONENTS=$components" "$@" >"$build.log" ||
    { cat "$build.log"; return 1; }
  grep "coio" "$build.log" || true
  cmake --build "$build" -j "$jobs"
  "$build/coio_consumer"
}

# expect_missing_component <build dir> <cmake args...>: configuring
# tests/consumer with COIO_CONSUMER_COMPONENTS=uring against a coio built
# without uring must fail at find_package, saying why.
expect_missing_component() {
  local build=$1 message="coio was installed without component 'uring'"
  shift
  if cmake -S tests/consumer -B "$build" -DCOIO_CONSUMER_COMPONENTS=uring "$@" >"$build.log" 2>&1; then
    cat "$build.log"
    echo "find_package(coio COMPONENTS uring) succeeded against a coio without uring"
    return 1
  fi
  grep -F "$message" "$build.log" || { cat "$build.log"; echo "no \"$message\" in the error"; return 1; }
}

check_versions() {
  python3 .ci/check_version.py "$venv/bin/conan"
}

check_single_include_fresh() {
  python3 scripts/amalgamate.py --output "$work/single-include-fresh"
  diff -ru single_include "$work/single-include-fresh" ||
    { echo "single_include/ is out of date: run scripts/amalgamate.py"; return 1; }
}

check_installed_package() {
  cmake -S . -B "$work/coio" -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF -DCOIO_BUILD_EXAMPLES=OFF \
    -DCOIO_WITH_URING=ON -DCOIO_WITH_RDMA=ON >/dev/null
  cmake --install "$work/coio" --prefix "$work/prefix" >/dev/null
  test -f "$work/prefix/share/doc/coio/LICENSE" || { echo "LICENSE not installed"; return 1; }
  configure_and_run "$work/consumer-package" -DCOIO_CONSUMER_MODE=package "-DCMAKE_PREFIX_PATH=$work/prefix"

  cmake -S . -B "$work/coio-no-uring" -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF -DCOIO_BUILD_EXAMPLES=OFF \
    -DCOIO_WITH_URING=OFF >/dev/null
  cmake --install "$work/coio-no-uring" --prefix "$work/prefix-no-uring" >/dev/null
  expect_missing_component "$work/consumer-package-no-uring" "-DCMAKE_PREFIX_PATH=$work/prefix-no-uring"
}

check_pkg_config() {
  local flags
  flags=$(PKG_CONFIG_PATH="$work/prefix/share/pkgconfig" pkg-config --cflags --libs coio)
  echo "pkg-config --cflags --libs coio: $flags"
  # shellcheck disable=SC2086 # word splitting of the flags is intended
  g++ -std=c++20 tests/consumer/main.cpp $flags -o "$work/consumer-pkg-config"
  "$work/consumer-pkg-config"
}

check_add_subdirectory() {
  configure_and_run "$work/consumer-subdirectory" -DCOIO_CONSUMER_MODE=subdirectory "-DCOIO_SOURCE_DIR=$root"
}

check_single_header_consumer() {
  local cxx
  # The core alone, then with the uring component (single_include/coio/uring.hpp + -luring).
  for cxx in g++ clang++; do
    echo "$cxx -std=c++20 -I single_include tests/consumer/main.cpp -pthread"
    "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror -I single_include tests/consumer/main.cpp -pthread \
      -o "$work/single-include-consumer-$cxx"
    "$work/single-include-consumer-$cxx"
    echo "$cxx -std=c++20 -DCOIO_CONSUMER_URING -I single_include tests/consumer/main.cpp -pthread -luring"
    "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Werror -DCOIO_CONSUMER_URING -I single_include \
      tests/consumer/main.cpp -pthread -luring -o "$work/single-include-consumer-uring-$cxx"
    "$work/single-include-consumer-uring-$cxx"
  done
}

# The core suite against single_include/ alone: a tree of links to coio's
# CMake code and core tests whose include/ holds only the single headers and
# one-line forwards to them for every header the tests name
# (scripts/amalgamate.py --stubs).
check_core_tests_on_single_header() {
  local tree=$work/single-include-tree
  rm -rf "$tree"
  mkdir -p "$tree/tests"
  ln -s "$root/CMakeLists.txt" "$root/cmake" "$tree/"
  ln -s "$root/tests/CMakeLists.txt" "$root/tests/catch_main.cpp" "$root/tests/core" "$tree/tests/"
  python3 scripts/amalgamate.py --output "$tree/include" --stubs
  cmake -S "$tree" -B "$work/single-include-tests" -DCOIO_BUILD_BENCHMARKS=OFF -DCOIO_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$work/single-include-tests" -j "$jobs" --target coio_core_tests
  ctest --test-dir "$work/single-include-tests" --output-on-failure -R '^coio_core_tests$'
}

# No package server here: liburing and rdma-core come from the system, named
# in the profile's [platform_requires], and no remote is enabled.
check_conan_create() {
  local conan=$venv/bin/conan
  export CONAN_HOME=$work/conan-home
  "$conan" profile detect >/dev/null 2>&1
  "$conan" remote disable "*" >/dev/null
  local rdma_core
  rdma_core=$(pkg-config --modversion libibverbs) # 1.<abi>.<rdma-core version>
  cat >"$work/conan-ci-profile" <<EOF
include(default)
[settings]
compiler.cppstd=20
[options]
coio/*:with_uring=True
coio/*:with_rdma=True
[platform_requires]
liburing/$(pkg-config --modversion liburing)
rdma-core/${rdma_core#*.*.}
[conf]
tools.cmake.cmake_layout:test_folder=\$TMP
EOF
  "$conan" create . --profile:host "$work/conan-ci-profile" --profile:build default
}

# The package conan_create made, installed for a consumer without uring.
check_conan_missing_component() {
  local conan=$venv/bin/conan out=$work/conan-no-uring
  export CONAN_HOME=$work/conan-home
  "$conan" install --requires="coio/$("$conan" inspect . --format=json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')" \
    --profile:host "$work/conan-ci-profile" --profile:build default -o "coio/*:with_uring=False" \
    -g CMakeDeps -g CMakeToolchain --output-folder "$out" >"$out.log" 2>&1 || { cat "$out.log"; return 1; }
  expect_missing_component "$out/consumer" "-DCMAKE_TOOLCHAIN_FILE=$out/conan_toolchain.cmake" -DCMAKE_BUILD_TYPE=Release
}

# vcpkg-offline.sh: CI lays shared/ beside its clone of the repository; a git
# worktree finds it beside the main checkout.
find_vcpkg_offline() {
  local common candidate
  common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
  for candidate in "${COIO_VCPKG_OFFLINE:-}" "$root/../shared/tools/vcpkg/vcpkg-offline.sh" \
    ${common:+"$common/../../shared/tools/vcpkg/vcpkg-offline.sh"}; do
    [[ -n $candidate && -x $candidate ]] && { realpath "$candidate"; return 0; }
  done
  return 1
}

# vcpkg install coio, coio[io-uring] and coio[io-uring,rdma] from ports/ (with
# .ci/vcpkg-system-ports/ standing in for the registry's liburing and
# rdma-core), each into its own install root, failing on any warning (vcpkg
# reports post-build check problems as warnings and installs anyway); then
# tests/consumer through the vcpkg toolchain, and a component missing.
check_vcpkg() {
  local offline
  if ! offline=$(find_vcpkg_offline); then
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! packaging: vcpkg NOT CHECKED: no shared/tools/vcpkg/vcpkg-offline.sh beside"
    echo "!!! the repository ($root/..) or the main checkout, and COIO_VCPKG_OFFLINE unset."
    echo "!!! The vcpkg port was not installed by vcpkg here. Counted as SKIPPED."
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    [[ ${COIO_REQUIRE_VCPKG:-0} == 1 ]] && return 1
    return 77
  fi
  echo "building vcpkg with $offline"
  eval "$("$offline")"
  vcpkg version | sed -n 1p  # all of it: head would make a SIGPIPE fail the pipe
  local features name components dir
  for features in "" io-uring io-uring,rdma; do
    name=${features:-core}
    name=${name//,/-}
    components=${features//io-/}
    components=${components//,/;}
    dir=$work/vcpkg-$name
    vcpkg install "coio${features:+[$features]}" --overlay-ports="$root/ports" \
      --overlay-ports="$root/.ci/vcpkg-system-ports" --x-install-root="$dir/installed" \
      --x-buildtrees-root="$dir/buildtrees" --x-packages-root="$dir/packages" 2>&1 | tee "$dir.log"
    if grep -i "warning" "$dir.log"; then
      echo "vcpkg install coio${features:+[$features]}: warnings (above)"
      return 1
    fi
    local toolchain=(-DCOIO_CONSUMER_MODE=package "-DCMAKE_TOOLCHAIN_FILE=$VCPKG_ROOT/scripts/buildsystems/vcpkg.cmake"
      "-DVCPKG_INSTALLED_DIR=$dir/installed")
    configure_and_run "$work/consumer-vcpkg-$name" "${toolchain[@]}" "-DCOIO_CONSUMER_COMPONENTS=$components"
    if [[ -z $features ]]; then
      expect_missing_component "$work/consumer-vcpkg-core-uring" "${toolchain[@]}"
    fi
  done
}

passed=0
failed=()
skipped=()
for check in versions single_include_fresh installed_package pkg_config add_subdirectory single_header_consumer \
  core_tests_on_single_header conan_create conan_missing_component vcpkg; do
  section "$check"
  set +e
  (set -e; "check_$check")
  rc=$?
  set -e
  if ((rc == 0)); then
    passed=$((passed + 1))
  elif ((rc == 77)); then
    echo "packaging: $check SKIPPED"
    skipped+=("$check")
  else
    echo "packaging: $check FAILED"
    failed+=("$check")
  fi
done

section "done"
((${#failed[@]} == 0)) || echo "packaging: failed: ${failed[*]}"
((${#skipped[@]} == 0)) || echo "packaging: SKIPPED (not checked): ${skipped[*]}"
echo "packaging: ${passed} passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
((${#failed[@]} == 0))
