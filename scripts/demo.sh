#!/usr/bin/env bash
# The main job: builds the storage server example, creates a small dataset
# in a temporary directory, serves it on 127.0.0.1 (over RDMA when an RDMA
# device exists, else TCP), checks it with a short verified run (every byte
# and checksum), then measures it without verification (the client's checks
# would be most of the cost) for DURATION s, and prints that figure beside
# its references measured here in the same run: fio reading the same files
# with the same IO size and IOs in flight (the disk's ceiling) and, over
# TCP, iperf3 over loopback with as many streams (the network's).
#   DURATION=10 VERIFY_SECONDS=3 BUILD_DIR=build-demo TRANSPORT=auto|tcp|rdma scripts/demo.sh
set -euo pipefail
source "$(dirname "$0")/lib/storage_server.sh"
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-demo}
duration=${DURATION:-10}
verify_seconds=${VERIFY_SECONDS:-3}
transport=${TRANSPORT:-auto}
# The workload: 64 KiB reads at random offsets, 16 per batchRead, 8 batchReads in flight over 4 connections.
io_size=64K batch=16 depth=8 connections=4

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
server_pid="" iperf_pid=""
cleanup() {
  stop_storage_server
  [[ -z $iperf_pid ]] || kill "$iperf_pid" 2>/dev/null || true
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

bench=("$bin/coio-storage-bench" --address "$address" --dir "$work/data" --transport "$transport" --io-size "$io_size"
       --batch "$batch" --depth "$depth" --connections "$connections")
echo "== checking: coio-storage-bench --verify for ${verify_seconds} s (every byte and checksum checked)"
status=0
"${bench[@]}" --duration "$verify_seconds" --verify || status=$?
if ((status == 0)); then
  echo "== measuring: coio-storage-bench for ${duration} s, no verification"
  "${bench[@]}" --duration "$duration" --json >"$work/bench.json" || status=$?
fi

echo "== stopping the server"
kill -TERM "$server_pid"
wait "$server_pid" || status=$?
server_pid=""
sed -n '/stopping/,$p' "$work/server.log"
((status == 0)) || exit "$status"

# The references, alone on the machine as coio was: the same files, IO size and IOs in flight.
direct=1
grep -qi "buffered" "$work/server.log" && direct=0  # no O_DIRECT here (tmpfs): neither reads with it
files=$(ls "$work"/data/data-* | paste -sd:)
echo "== reference: fio, ${duration} s of ${io_size} random reads of the same files, $((batch * depth)) in flight (direct=$direct)"
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 fio --name=demo --filename="$files" --file_service_type=random --rw=randread \
  --bs="$io_size" --iodepth=$((batch * depth)) --direct=$direct --ioengine=io_uring --runtime="$duration" --time_based \
  --norandommap --randrepeat=0 --output-format=json >"$work/fio.json"
if [[ $transport == tcp ]]; then
  echo "== reference: iperf3 over loopback, ${duration} s, $connections streams of ${io_size} writes"
  port=$((20000 + RANDOM % 20000))
  iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
  iperf_pid=$!
  for _ in $(seq 100); do [[ -n $(ss -ltnH "sport = :$port") ]] && break; sleep 0.05; done
  iperf3 -c 127.0.0.1 -p "$port" -t "$duration" -P "$connections" -l "$io_size" --json >"$work/iperf3.json"
  wait "$iperf_pid" || true
fi

python3 - "$work" "$transport" <<'PY'
import json, os, sys
work, transport = sys.argv[1:3]
coio = json.load(open(f"{work}/bench.json"))["gib_per_s"]
refs = {"fio (the disk)": json.load(open(f"{work}/fio.json"))["jobs"][0]["read"]["bw_bytes"] / 2**30}
if os.path.exists(f"{work}/iperf3.json"):
    refs["iperf3 (loopback TCP)"] = json.load(open(f"{work}/iperf3.json"))["end"]["sum_received"]["bits_per_second"] / 8 / 2**30
print(f"\n== result, measured in this run ({transport}):")
print(f"  coio-storage-bench     {coio:7.3f} GiB/s")
for name, gib in refs.items():
    print(f"  {name:<22} {gib:7.3f} GiB/s")
print(f"  coio / min(references) {coio / min(refs.values()):7.2f}   (docs/benchmarks.md has the figures over sizes and rounds)")
PY
