#!/usr/bin/env bash
# The main job: builds the storage server example, creates a small dataset
# in a temporary directory, serves it on 127.0.0.1 (over RDMA when an RDMA
# device exists, else TCP), runs the load generator with verification for
# ~10 s, prints its report and stops the server.
#   DURATION=10 BUILD_DIR=build-demo TRANSPORT=auto|tcp|rdma scripts/demo.sh
set -euo pipefail
source "$(dirname "$0")/lib/storage_server.sh"
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-demo}
duration=${DURATION:-10}
transport=${TRANSPORT:-auto}

echo "== building coio-storage-server and coio-storage-bench in $build_dir"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target coio-storage-server coio-storage-bench
bin="$build_dir/examples/storage_server"
if [[ ! -x $bin/coio-storage-server ]]; then
  echo "demo: the storage example was not built (it needs liburing: run scripts/install-deps.sh)" >&2
  exit 1
fi

if [[ $transport == auto ]]; then
  transport=tcp
  if compgen -G "/sys/class/infiniband/*" >/dev/null; then
    transport=rdma
  else
    echo "== no RDMA device here (/sys/class/infiniband is empty): using TCP"
  fi
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/coio-demo-XXXXXX")
server_pid=""
cleanup() {
  stop_storage_server
  rm -rf "$work"
}
trap cleanup EXIT

echo "== creating a dataset: 256 chunks of 1 MiB in $work/data"
"$bin/coio-storage-server" init --dir "$work/data" --chunks 256 --chunk-size 1M --chunks-per-file 64

echo "== starting the server on 127.0.0.1 ($transport, a free port)"
start_storage_server "$bin/coio-storage-server" "$work/server.log" 100 serve --dir "$work/data" \
  --listen 127.0.0.1:0 --transport "$transport" --pool 64M
cat "$work/server.log"
if [[ -z $address ]]; then
  echo "demo: the server did not start" >&2
  exit 1
fi

echo "== running coio-storage-bench --verify for ${duration} s"
status=0
"$bin/coio-storage-bench" --address "$address" --dir "$work/data" --transport "$transport" --io-size 64K --batch 16 \
  --depth 8 --connections 4 --duration "$duration" --verify || status=$?

echo "== stopping the server"
kill -TERM "$server_pid"
wait "$server_pid" || status=$?
server_pid=""
sed -n '/stopping/,$p' "$work/server.log"
exit "$status"
