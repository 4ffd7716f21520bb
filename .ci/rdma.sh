#!/usr/bin/env bash
# CI for the RDMA layer: builds the RDMA tests and rdma_bench on the host,
# then boots ONE Soft-RoCE guest (tests/rdma/vm/run.sh) that runs the
# `rdma`-labelled tests (verbs layer, the storage server end to end over
# RDMA, the RDMA guide's example, the API reference's QueuePair example)
# and the benchmarks beside perftest. A guest that fails to boot fails this
# script (run.sh exits 125); it is never a skip.
# The device-free RDMA unit tests run in the normal host suite.
#   .ci/rdma.sh [BUILD_DIR]   (default build-rdma-ci)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-rdma-ci}
start=$SECONDS

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_WITH_RDMA=ON -DCOIO_WITH_URING=ON \
  -DCOIO_BUILD_DEVICE_TESTS=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target coio_rdma_unit_tests coio_rdma_verbs_tests coio_storage_rdma_tests coio_storage_cluster_rdma_tests \
  rdma_bench coio-storage-server coio-storage-bench docs_rdma_0 coio_api_examples
echo "rdma: host build done ($((SECONDS - start)) s)"

# In the guest: the tests first; the benchmark only if they pass.
COIO_VM_TIMEOUT=${COIO_VM_TIMEOUT:-1800} COIO_VM_CWD="$PWD" tests/rdma/vm/run.sh -- bash -c '
  set -euo pipefail
  ctest --test-dir "$1" -L rdma --output-on-failure
  echo "=== rdma_bench beside perftest"
  tests/bench/rdma/run_rdma_bench.sh "$1"
  echo "=== the storage server over RDMA beside ib_write_bw"
  tests/bench/storage/run_storage_rdma_bench.sh "$1"
' rdma-ci "$build"
echo "rdma: done ($((SECONDS - start)) s)"
