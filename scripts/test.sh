#!/usr/bin/env bash
# Builds coio and runs its test suite with CTest.
#   scripts/test.sh [--compiler g++|clang++] [--sanitize address,undefined|thread]
#                   [--build-type T] [--build-dir DIR]
# With no options: g++, RelWithDebInfo, no sanitizer, build dir ./build.
set -euo pipefail
cd "$(dirname "$0")/.."

compiler=g++ sanitize="" build_type=RelWithDebInfo build_dir=""
while (($#)); do
  case "$1" in
    --compiler) compiler=$2; shift 2 ;;
    --sanitize) sanitize=$2; shift 2 ;;
    --build-type) build_type=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    *) echo "test.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ -z $build_dir ]]; then
  build_dir=build
  [[ $compiler != g++ || -n $sanitize || $build_type != RelWithDebInfo ]] &&
    build_dir="build-${compiler}-${sanitize:-nosan}-${build_type}"
  build_dir=${build_dir//,/-}
fi

# Debug information is line tables only (-g1): a failure's stack trace keeps
# file:line, and the compile takes 40 % less than with -g (most of the time
# of this command on a fresh machine was compiling). Sanitized builds also
# compile at -O1, as the sanitizers' docs advise (half the time of -O2), and
# build no benchmark.
flags=()
if [[ -n $sanitize ]]; then
  flags=(-DCOIO_BUILD_BENCHMARKS=OFF)
  [[ $build_type == RelWithDebInfo ]] && flags+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
elif [[ $build_type == RelWithDebInfo ]]; then
  flags+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
fi

jobs=$(nproc)
cmake -S . -B "$build_dir" -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_BUILD_TYPE="$build_type" \
  -DCOIO_SANITIZE="$sanitize" "${flags[@]}" >/dev/null
cmake --build "$build_dir" -j "$jobs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
# RDMA device tests need a verbs device: .ci/rdma.sh runs them in a Soft-RoCE guest.
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" -LE rdma
