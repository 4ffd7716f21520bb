#!/usr/bin/env bash
# The storage cluster's chaos soak: 3 coio-storage-servers (2 targets each,
# 3 chains of 2 replicas) on loopback under verified load from 3
# coio-storage-bench --cluster clients, with a kill -9 and restart, a
# SIGSTOP/SIGCONT, a corrupted replica, a client killed mid-request, a client
# that stops reading and a SIGTERM drain on a schedule (chaos_soak.py says
# which and why no IO may fail). Prints the figures; exits 1 if one is off.
#
#   tests/chaos/run_chaos_soak.sh [SECONDS, default 60] [BUILD_DIR, default build-chaos]
#
# Builds only the two programs (RelWithDebInfo) in BUILD_DIR, unless BIN=DIR
# names a directory that holds them already (CI: its -O2 build's). Environment:
# REACTOR [uring] (or epoll), TMPDIR [/var/tmp] for the datasets (48 MiB),
# KEEP=1 keeps the work directory (logs, latency samples), ETCD=1 runs the
# etcd mode (at least 60 s; needs etcd, Debian's etcd-server): the cluster's
# state in a three-member etcd with two mgmtds, servers and clients --etcd,
# plus kills of the leading mgmtd and of an etcd member, and the figures of
# the routing changes (chaos_soak.py --etcd says which).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
build=${2:-build-chaos}
bin=${BIN:-}
if [[ -z $bin ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF \
    -DCOIO_BUILD_EXAMPLES=ON >/dev/null
  cmake --build "$build" -j "$(nproc)" --target coio-storage-server coio-storage-bench >/dev/null
  bin=$build/examples/storage_server
fi
exec python3 tests/chaos/chaos_soak.py --bin "$bin" --duration "$seconds" \
  --reactor "${REACTOR:-uring}" --tmpdir "${TMPDIR:-/var/tmp}" ${KEEP:+--keep} ${ETCD:+--etcd}
