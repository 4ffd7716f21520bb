#!/usr/bin/env bash
# Builds coio and runs its test suite with CTest.
#   scripts/test.sh [--compiler g++|clang++] [--sanitize address,undefined|thread]
#                   [--opt g|2] [--build-type T] [--build-dir DIR]
# With no options: g++, -Og, no sanitizer, build dir ./build.
#
# --opt: the optimisation of a RelWithDebInfo build (the default type).
#   g (the default): -Og with sibling-call optimisation, so symmetric
#     transfer is still a tail call and the [deep-stack] tests run; a third
#     less compile time than -O1 and half of -O2's, which is most of this
#     command's time on a fresh machine (docs/benchmarks.md, "The test
#     command"). Sanitized builds use -O1 without sibling calls, as the
#     sanitizers' docs advise (their [deep-stack] tests are left out).
#   2: -O2, as users ship; CI runs the suite this way too (.ci/run).
# Debug information is line tables only (-g1): a failure's stack trace
# keeps file:line, and the compile is faster than with -g. Only --opt 2
# builds (and smoke-runs) the benchmarks: an -Og or sanitized benchmark's
# figures mean nothing, and they are 6 % of the -Og build's compile time.
# CTest runs three times as many tests as CPUs at once (as many under a
# sanitizer): most of the suite's time is spent waiting on leases,
# deadlines and etcd, not computing (at twice as many it took 15 s longer).
set -euo pipefail
cd "$(dirname "$0")/.."

compiler=g++ sanitize="" build_type=RelWithDebInfo build_dir="" opt=g
while (($#)); do
  case "$1" in
    --compiler) compiler=$2; shift 2 ;;
    --sanitize) sanitize=$2; shift 2 ;;
    --opt) opt=$2; shift 2 ;;
    --build-type) build_type=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    *) echo "test.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$opt" in
  g) opt_flags="-Og -foptimize-sibling-calls"
     [[ -n $sanitize ]] && opt_flags="-O1" ;;  # full stack traces in the sanitizers' reports
  2) opt_flags="-O2" ;;
  *) echo "test.sh: --opt takes g or 2, not '$opt'" >&2; exit 2 ;;
esac
if [[ -z $build_dir ]]; then
  build_dir=build
  [[ $compiler != g++ || -n $sanitize || $build_type != RelWithDebInfo || $opt != g ]] &&
    build_dir="build-${compiler}-${sanitize:-nosan}-${build_type}-O${opt}"
  build_dir=${build_dir//,/-}
fi

flags=()
[[ -n $sanitize || $opt != 2 ]] && flags+=(-DCOIO_BUILD_BENCHMARKS=OFF)
[[ $build_type == RelWithDebInfo ]] && flags+=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt_flags -g1 -DNDEBUG")

jobs=$(nproc)
cmake -S . -B "$build_dir" -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_BUILD_TYPE="$build_type" \
  -DCOIO_SANITIZE="$sanitize" "${flags[@]}" >/dev/null
cmake --build "$build_dir" -j "$jobs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
# RDMA device tests need a verbs device: .ci/rdma.sh runs them in a Soft-RoCE guest.
tests_at_once=$((3 * jobs))
[[ -n $sanitize ]] && tests_at_once=$jobs
ctest --test-dir "$build_dir" --output-on-failure -j "$tests_at_once" -LE rdma
