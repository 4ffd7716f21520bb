#!/usr/bin/env bash
# The main job: builds coio's examples and runs the flagship one.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-demo}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target coio-primitives-tour
"$build_dir/examples/primitives_tour/coio-primitives-tour"
