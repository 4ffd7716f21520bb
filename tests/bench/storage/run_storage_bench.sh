#!/usr/bin/env bash
# The storage read server over TCP against its two ceilings, in one run:
#   disk ceiling  fio randread, O_DIRECT, on the dataset's own data files
#   TCP ceiling   iperf3 over loopback
#   coio          coio-storage-bench --transport tcp against a coio-storage-server started here
# for 4 KiB, 512 KiB and 4 MiB IOs, and prints coio's throughput as a ratio to
# min(fio, iperf3). Goals: >= 0.9 at every size; the disk queue under coio >= 0.9 of fio's; coio's
# server + bench CPU per GiB <= iperf3's at 512 KiB and 4 MiB; the unloaded 4 KiB latency (LATENCY)
# p50 <= fio's QD1 p50 + one sockperf round trip.
#
#   tests/bench/storage/run_storage_bench.sh [BUILD_DIR]        (default build-sbench)
#
# Environment (defaults in brackets):
#   DURATION [5]     seconds per fio / iperf3 / coio run (an integer: the bench takes whole seconds)
#   ROUNDS [1]       rounds of fio, iperf3, coio per IO size; every figure is the median of the rounds
#   SIZES ["4K 512K 4M"]
#   CHUNKS [384]     4 MiB chunks in the dataset (384 = 1.5 GiB, 6 data files of 64 chunks)
#   REACTORS [1]     server reactor threads (2 vCPUs: one for the server, one for the bench)
#   REACTOR [uring]  reactor of both the server and the bench
#   VERIFY [0]       1: the measured bench runs use --verify (costs ~half the throughput at >= 512K,
#                    the client checks every byte). Whatever VERIFY says, every size is first checked
#                    with a VERIFY_SECONDS [1] --verify run, which must report 0 errors.
#   TMPDIR [/var/tmp] where the dataset goes (must allow O_DIRECT; tmpfs does not)
#   CC [cubic]       TCP congestion control of both senders: coio's server (--tcp-congestion) and
#                    iperf3 (-C); "" for the system default. Over loopback bbr's pacing sends one
#                    socket's segments from two CPUs (the pacing timer's and the ACK's), whose
#                    backlogs deliver them out of order: spurious retransmissions, and ~25 % more
#                    CPU per GiB for coio's server (iperf3, streaming flat out, loses nothing).
#                    Linux's default is cubic; some VM kernels are built with bbr.
#   LATENCY [1]      1: also the unloaded-latency row: one 4 KiB IO at a time (coio batch 1, depth 1,
#                    1 connection) against fio's QD1 p50 plus one sockperf round trip (TCP ping-pong,
#                    64 B: twice sockperf's reported p50, which is half a round trip)
#   SWEEP ["1 2 4 8 16 32 64"]  outstanding 512 KiB IOs for the depth sweep (coio batch 1, depth D,
#                    2 connections; fio iodepth D), "" to skip; SWEEP_SECONDS [3] per point
#   PLOT [$TMPDIR/...] where the sweep's SVG plot goes (gnuplot; skipped with a notice without it)
#   SERVER_ARGS [""]  more coio-storage-server serve flags, e.g. --zero-copy-send (an A/B of one flag)
#   HOT [1]          1: also the hot-data rows: the same dataset read through the page cache (cat into it
#                    before each size's rounds), from two more servers, --buffered --data-path copy (read
#                    into the pool, checked, sent) and --buffered --data-path splice (file -> pipe ->
#                    socket), alternated in each round (copy first in odd rounds, splice first in even
#                    ones), against min(fio buffered on the cached files, iperf3); each with its server's
#                    CPU s per GiB (the server process's CPU time over the bytes moved). The bench asks
#                    for CRCs and checks them in both (--checksums, as a cluster client always does: the
#                    server splices only such requests). The hot servers take SERVER_ARGS too; each size
#                    gets a --verify check on the splice server first.
#   FLOOR [0]        1: also, in each round after coio, floor_bench (tests/bench/storage/floor_bench.cpp,
#                    no coio: raw liburing, the same files, IO size, outstanding IOs, 128 KiB pieces
#                    kept apart and connections) twice: --send copy (O_DIRECT, the server copies into
#                    the socket: the floor of any O_DIRECT server over loopback) and --send splice
#                    (buffered reads spliced file -> pipe -> socket, evicted after use: only the client
#                    copies). Prints their throughput, CPU per GiB and disk queue beside coio's and
#                    iperf3's, and the share of the splice run's bytes that came off the disk. Needs
#                    Google Benchmark (the benchmarks' CMake).
#
# Workload per IO size ("outstanding" = IOs the bench keeps in flight):
#   io size  batch  depth  connections  outstanding   fio iodepth   iperf3
#   4K       8      16     2            128           128           -P 2 -l 4K
#   512K     4      8      2            32            32            -P 2 -l 512K
#   4M       1      8      2            8             8             -P 2 -l 1M (iperf3's largest)
# Mapping: the bench's --depth is the number of batchReads in flight in total (spread round robin
# over the connections, not per connection), so outstanding IOs = depth x batch, and fio gets
# iodepth = depth x batch with bs = the IO size. Batches of 8 at 4K amortise the request and
# response frames of a batchRead (protocol version 2 and later: the client grants transmission with the
# request while it has a free slot; each IO's data follows an IoData frame); depth 16 keeps a slow IO from idling the
# queue. At 4M one IO already becomes 32 reads of 128 KiB (the server's --piece-size), each its
# own request to the device (ReadBatch::keepApart) and sent as soon as it is read, so batch 1.
# fio: io_uring, direct=1, random offsets that are multiples of bs (blockalign=bs) in the 6 data
# files, so every IO lies inside one chunk (4 MiB chunks, a multiple of every bs). The server's
# read buffers are transparent huge pages (BufferPool's default); fio's are too, through glibc's
# malloc tunable (glibc.malloc.hugetlb=1 -> MADV_HUGEPAGE): with 4 KiB-page buffers fio reads
# 512K at 1.2 instead of 2.5 GiB/s and 4M at 1.7 instead of 2.9 on this virtio disk
# (max_segments 254), a lower ceiling that would flatter us.
# The bench picks unaligned offsets (random byte offset in the chunk), so the server widens each
# read to 4 KiB alignment: a 4K IO is one 8 KiB disk read, a 512K IO one of 516 KiB.
# iperf3: as many streams as the bench has connections, same duration, message size = the IO size
# (capped at iperf3's 1 MiB). iperf3 3.12 runs all streams on one thread per side, as our server
# (one reactor) and bench (one thread) do. Processes are not pinned.
# Server: --reactors $REACTORS --pool 128M (per reactor; 4M x 8 outstanding needs 32 MiB of 128 KiB
# pieces, 4K x 128 needs 128 pieces = 16 MiB).
#
# Output: a Markdown table (medians over ROUNDS; the ratio is the median of the per-round ratios,
# each round running fio, iperf3 and coio back to back, then iperf3 again paced at coio's rate),
# then a details table: IOPS, the disk's queue during fio and during coio in IOs (bytes in flight
# at the block device over the IO size, from time_in_queue x the average request's size: coio
# reads an IO in several requests, fio in one), coio's batch latency, CPU use (% of one core:
# fio's own figure, iperf3's host + remote, coio's server and bench from /proc and the shell's
# child times) and CPU core-seconds per GiB moved (iperf3 flat out and paced, coio).
# Exits non-zero, printing no ratio, if any tool fails or reports an error.
set -euo pipefail
source "$(dirname "$0")/../../../scripts/lib/storage_server.sh"
cd "$(dirname "$0")/../../.."

build_dir=${1:-build-sbench}
duration=${DURATION:-5}
rounds=${ROUNDS:-1}
sizes=${SIZES:-4K 512K 4M}
chunks=${CHUNKS:-384}
reactors=${REACTORS:-1}
reactor=${REACTOR:-uring}
verify=${VERIFY:-0}
verify_seconds=${VERIFY_SECONDS:-1}
latency=${LATENCY:-1}
sweep=${SWEEP-1 2 4 8 16 32 64}
sweep_seconds=${SWEEP_SECONDS:-3}
cc=${CC-cubic}
floor=${FLOOR:-0}
hot=${HOT:-1}

die() { echo "run_storage_bench.sh: $*" >&2; exit 1; }
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds, not '$duration'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
for tool in fio iperf3 python3 ss cmake; do
  command -v $tool >/dev/null || die "missing $tool (scripts/install-deps.sh installs it)"
done

# --- build ------------------------------------------------------------------
echo "== building coio-storage-server and coio-storage-bench in $build_dir" >&2
targets=(coio-storage-server coio-storage-bench) benchmarks=OFF
if ((floor)); then targets+=(floor_bench) benchmarks=ON; fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=$benchmarks >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" >&2
bin=$build_dir/examples/storage_server
[[ -x $bin/coio-storage-server && -x $bin/coio-storage-bench ]] || die "the storage example was not built (needs liburing)"
floor_bench=$build_dir/tests/bench/storage/floor_bench
((floor == 0)) || [[ -x $floor_bench ]] || die "floor_bench was not built"

# --- dataset, cleanup ---------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/var/tmp}/coio-sbench-XXXXXX")
server_pid="" iperf_pid="" hot_pids=()
stop_server() {  # TERM, then wait; returns the server's exit status
  local pid=$server_pid status=0
  server_pid=""
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || status=$?
  return $status
}
cleanup() {
  if [[ -n $iperf_pid ]]; then kill "$iperf_pid" 2>/dev/null || true; wait "$iperf_pid" 2>/dev/null || true; fi
  if [[ -n $server_pid ]]; then stop_server || true; fi
  local pid
  for pid in "${hot_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

data=$work/data
echo "== creating the dataset: $chunks chunks of 4 MiB in $data" >&2
"$bin/coio-storage-server" init --dir "$data" --chunks "$chunks" --chunk-size 4M --chunks-per-file 64 >&2
files=$(python3 -c 'import sys; print(":".join(f"{sys.argv[1]}/data-{f}" for f in range((int(sys.argv[2]) + 63) // 64)))' \
  "$data" "$chunks")
[[ $data != *:* ]] || die "the dataset path must not contain ':' (fio's file separator)"

declare -A hot_pid hot_address
if ((hot)); then  # first: start_storage_server sets $server_pid and $address, the main server's below
  for mode in copy splice; do
    echo "== starting the hot-data server: --buffered --data-path $mode" >&2
    start_storage_server "$bin/coio-storage-server" "$work/server-$mode.log" 100 serve --dir "$data" \
      --listen 127.0.0.1:0 --transport tcp --reactors "$reactors" --reactor "$reactor" --pool 128M --buffered \
      --data-path $mode ${cc:+--tcp-congestion "$cc"} ${SERVER_ARGS:-}
    [[ -n $address ]] || { cat "$work/server-$mode.log" >&2; die "the hot-data server ($mode) did not start"; }
    hot_pids+=("$server_pid")
    hot_pid[$mode]=$server_pid hot_address[$mode]=$address
    sed 's/^/   server ('"$mode"'): /' "$work/server-$mode.log" >&2
  done
fi

echo "== starting coio-storage-server (tcp, $reactors $reactor reactor(s), --pool 128M, congestion control ${cc:-default})" >&2
start_storage_server "$bin/coio-storage-server" "$work/server.log" 100 serve --dir "$data" --listen 127.0.0.1:0 \
  --transport tcp --reactors "$reactors" --reactor "$reactor" --pool 128M ${cc:+--tcp-congestion "$cc"} ${SERVER_ARGS:-}
[[ -n $address ]] || { cat "$work/server.log" >&2; die "the server did not start"; }
grep -qi "buffered" "$work/server.log" && { cat "$work/server.log" >&2; die "the server fell back to buffered reads (no O_DIRECT in $work)"; }
sed 's/^/   server: /' "$work/server.log" >&2

results=$work/results.jsonl
# The block device under the dataset, for the disk's average queue depth during fio and coio runs.
diskstat=/sys/class/block/$(basename "$(findmnt -n -o SOURCE --target "$data" 2>/dev/null || echo none)")/stat
[[ -r $diskstat ]] || diskstat=/dev/null
# Prints "requests bytes": the average requests in flight (time_in_queue / wall) and the average
# request's size (sectors read / reads). coio reads an IO in --piece-size requests and fio in one,
# so the goal compares bytes in flight: requests x request size / IO size, in IOs.
disk_queue() {  # stat-before stat-after seconds
  python3 -c 'import sys; a, b = sys.argv[1].split(), sys.argv[2].split()
ok = len(a) > 10 and len(b) > 10 and int(b[0]) > int(a[0])
print(f"{(int(b[10]) - int(a[10])) / 1000 / float(sys.argv[3])} {(int(b[2]) - int(a[2])) * 512 / (int(b[0]) - int(a[0]))}" if ok else "-1 0")' "$1" "$2" "$3"
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the three tools; each appends one JSON line to $results or fails -------------

run_fio() {  # size iodepth round [seconds label]
  local size=$1 depth=$2 round=$3 seconds=${4:-$duration} label=${5:-fio} out=$work/fio.json d0 d1
  d0=$(cat "$diskstat")
  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 fio --name=sbench --filename="$files" --file_service_type=random \
    --rw=randread --bs="$size" --blockalign="$size" --iodepth="$depth" --direct="${FIO_DIRECT:-1}" --ioengine=io_uring \
    --runtime="$seconds" --time_based --norandommap --randrepeat=0 --output-format=json >"$out" ||
    die "fio failed (bs=$size iodepth=$depth)"
  d1=$(cat "$diskstat")
  python3 - "$out" "$size" "$round" "$(disk_queue "$d0" "$d1" "$seconds")" "$label" "$depth" >>"$results" <<'PY' ||
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
assert job["error"] == 0, job["error"]
r = job["read"]
assert r["io_bytes"] > 0 and r["runtime"] > 0
queue, request = map(float, sys.argv[4].split())
print(json.dumps({"tool": sys.argv[5], "size": sys.argv[2], "round": int(sys.argv[3]), "gib": r["bw_bytes"] / 2**30,
                  "iops": r["iops"], "cpu": job["usr_cpu"] + job["sys_cpu"], "queue": queue, "request": request,
                  "depth": int(sys.argv[6]), "p50_ms": r["clat_ns"]["percentile"]["50.000000"] / 1e6}))
PY
    die "fio's output is unusable"
}

port=$((20000 + RANDOM % 20000))
wait_for_port() {
  for _ in $(seq 100); do
    [[ -n $(ss -ltnH "sport = :$1") ]] && return 0
    kill -0 "$iperf_pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
run_iperf3() {  # size streams round [GiB/s to pace at, label]
  local size=$1 streams=$2 round=$3 rate=${4:-} label=${5:-iperf3} len out=$work/iperf3.json pace=()
  len=$(python3 -c 'import sys; print(min(int(sys.argv[1]), 1 << 20))' "$(numfmt --from=iec "$size")")
  # -b paces each stream: the total rate split between them, in bits/s.
  [[ -n $rate ]] && pace=(-b "$(python3 -c 'import sys; print(int(float(sys.argv[1]) * 2**30 * 8 / int(sys.argv[2])))' "$rate" "$streams")")
  port=$((port + 1))
  iperf3 -s -1 -p $port >"$work/iperf3-server.log" 2>&1 &
  iperf_pid=$!
  wait_for_port $port || { cat "$work/iperf3-server.log" >&2; die "the iperf3 server did not start on port $port"; }
  iperf3 -c 127.0.0.1 -p $port -t "$duration" -P "$streams" -l "$len" ${cc:+-C "$cc"} "${pace[@]}" -J >"$out" ||
    { cat "$out" >&2; die "iperf3 failed (-P $streams -l $len)"; }
  wait "$iperf_pid" || die "the iperf3 server failed"
  iperf_pid=""
  python3 - "$out" "$size" "$round" "$streams" "$len" "$label" >>"$results" <<'PY' || die "iperf3's output is unusable"
import json, sys
d = json.load(open(sys.argv[1]))
assert "error" not in d, d.get("error")
end = d["end"]
assert end["sum_received"]["bytes"] > 0
print(json.dumps({"tool": sys.argv[6], "size": sys.argv[2], "round": int(sys.argv[3]), "streams": int(sys.argv[4]),
                  "len": int(sys.argv[5]), "gib": end["sum_received"]["bits_per_second"] / 8 / 2**30,
                  "cpu": end["cpu_utilization_percent"]["host_total"] + end["cpu_utilization_percent"]["remote_total"],
                  "cpu_per_gib": (end["cpu_utilization_percent"]["host_total"] + end["cpu_utilization_percent"]["remote_total"])
                                 / 100 / (end["sum_received"]["bits_per_second"] / 8 / 2**30)}))
PY
}

# sockperf ping-pong, 64 B, TCP: its p50 latency in ms (half a round trip, as sockperf reports it).
run_sockperf() {  # round
  local round=$1 out
  port=$((port + 1))
  sockperf sr --tcp -i 127.0.0.1 -p $port >"$work/sockperf-server.log" 2>&1 &
  iperf_pid=$!
  wait_for_port $port || { cat "$work/sockperf-server.log" >&2; die "the sockperf server did not start on port $port"; }
  out=$(sockperf pp --tcp -i 127.0.0.1 -p $port -m 64 -t "$duration" 2>&1) || { echo "$out" >&2; die "sockperf failed"; }
  kill "$iperf_pid" 2>/dev/null || true
  wait "$iperf_pid" 2>/dev/null || true
  iperf_pid=""
  python3 -c '
import json, re, sys
m = re.search(r"percentile 50.000 =\s*([0-9.]+)", sys.stdin.read())
print(json.dumps({"tool": "sockperf", "size": "64", "round": int(sys.argv[1]), "p50_ms": float(m.group(1)) / 1e3}))' \
    "$round" <<<"$out" >>"$results" || { echo "$out" >&2; die "sockperf's output is unusable"; }
}

run_coio() {  # size batch depth connections seconds round verify(0|1) [label]; COIO_PID, COIO_ADDRESS: another
              # server; COIO_CHECKSUMS=1: the bench asks for CRCs and checks them (--checksums)
  local size=$1 batch=$2 depth=$3 conns=$4 seconds=$5 round=$6 check=$7 label=${8:-coio}
  local out=$work/coio.json s0 s1 c0 c1 t0 t1 d0 d1 flags=() pid=${COIO_PID:-$server_pid} addr=${COIO_ADDRESS:-$address}
  ((check)) && flags=(--verify)
  [[ -n ${COIO_CHECKSUMS:-} ]] && flags+=(--checksums)
  kill -0 "$pid" 2>/dev/null || die "the server is gone"
  times >"$work/times0"
  s0=$(cpu_ticks "$pid") t0=$(date +%s.%N) d0=$(cat "$diskstat")
  "$bin/coio-storage-bench" --address "$addr" --dir "$data" --transport tcp --io-size "$size" --batch "$batch" \
    --depth "$depth" --connections "$conns" --duration "$seconds" --reactor "$reactor" --json "${flags[@]}" \
    >"$out" || { cat "$out" >&2; die "coio-storage-bench failed or reported errors ($size batch $batch depth $depth)"; }
  t1=$(date +%s.%N) d1=$(cat "$diskstat")
  times >"$work/times1"
  c0=$(children_cpu "$work/times0") c1=$(children_cpu "$work/times1")
  kill -0 "$pid" 2>/dev/null || die "the server died during the run"
  s1=$(cpu_ticks "$pid")
  python3 - "$out" "$size" "$round" "$label" "$(getconf CLK_TCK)" "$s0" "$s1" "$c0" "$c1" "$t0" "$t1" \
    "$(disk_queue "$d0" "$d1" "$(python3 -c "print($t1 - $t0)")")" >>"$results" <<'PY' ||
import json, sys
out, size, rnd, label, hz, s0, s1, c0, c1, t0, t1, disk = sys.argv[1:]
queue, request = map(float, disk.split())
d = json.load(open(out))
assert d["errors"]["total"] == 0 and d["ios"] > 0, d
wall = float(t1) - float(t0)
server_cpu, bench_cpu = (int(s1) - int(s0)) / int(hz), float(c1) - float(c0)  # seconds
print(json.dumps({"cpu_per_gib": (server_cpu + bench_cpu) / (d["bytes"] / 2**30),
                  "server_cpu_per_gib": server_cpu / (d["bytes"] / 2**30),
                  "tool": label, "size": size, "round": int(rnd), "gib": d["gib_per_s"], "iops": d["iops"],
                  "batch": d["batch"], "depth": d["depth"], "connections": d["connections"], "verify": d["verify"],
                  "p50_ms": d["batch_latency_ms"]["p50"], "p99_ms": d["batch_latency_ms"]["p99"],
                  "server_cpu": 100 * server_cpu / wall, "bench_cpu": 100 * bench_cpu / wall, "queue": queue,
                  "request": request}))
PY
    { cat "$out" >&2; die "coio-storage-bench's output is unusable or reports errors"; }
}

run_floor() {  # size outstanding connections round send(copy|splice)
  local size=$1 outstanding=$2 conns=$3 round=$4 send=$5 out=$work/floor.json t0 t1 d0 d1
  t0=$(date +%s.%N) d0=$(cat "$diskstat")
  "$floor_bench" --dir "$data" --send "$send" --io-size "$size" --outstanding "$outstanding" --connections "$conns" \
    --seconds "$duration" ${cc:+--tcp-congestion "$cc"} >"$out" || die "floor_bench failed ($send, $size)"
  t1=$(date +%s.%N) d1=$(cat "$diskstat")
  python3 - "$out" "$size" "$round" "floor-$send" "$(disk_queue "$d0" "$d1" "$(python3 -c "print($t1 - $t0)")")" \
    "$d0" "$d1" >>"$results" <<'PY' || die "floor_bench's output is unusable"
import json, sys
out, size, rnd, label, disk, d0, d1 = sys.argv[1:]
queue, request = map(float, disk.split())
d = json.load(open(out))
assert d["bytes"] > 0, d
print(json.dumps({"tool": label, "size": size, "round": int(rnd), "gib": d["gib_per_s"], "cpu_per_gib": d["cpu_per_gib"],
                  "server_cpu": 100 * d["server_cpu"] / d["seconds"], "bench_cpu": 100 * d["client_cpu"] / d["seconds"],
                  "queue": queue, "request": request,
                  # bytes read off the disk over bytes moved (the whole run: also the drain after the measured interval)
                  "from_disk": (int(d1.split()[2]) - int(d0.split()[2])) * 512 / d["bytes"]}))
PY
}

# --- the runs -------------------------------------------------------------------
declare -A batch_of=([4K]=8 [512K]=4 [4M]=1) depth_of=([4K]=16 [512K]=8 [4M]=8) conns_of=([4K]=2 [512K]=2 [4M]=2)
for size in $sizes; do
  [[ -n ${batch_of[$size]:-} ]] || die "no workload defined for size $size (known: ${!batch_of[*]})"
  b=${batch_of[$size]} d=${depth_of[$size]} c=${conns_of[$size]}
  echo "== $size: --verify check, $verify_seconds s" >&2
  run_coio "$size" "$b" "$d" "$c" "$verify_seconds" 0 1 verify-check
  if ((hot)); then
    echo "== $size: the dataset into the page cache; --verify check of the splice server, $verify_seconds s" >&2
    cat "$data"/data-* >/dev/null
    COIO_PID=${hot_pid[splice]} COIO_ADDRESS=${hot_address[splice]} \
      run_coio "$size" "$b" "$d" "$c" "$verify_seconds" 0 1 verify-check-splice
  fi
  for ((round = 1; round <= rounds; ++round)); do
    echo "== $size round $round/$rounds: fio (iodepth $((b * d))), iperf3 (-P $c), coio (batch $b depth $d connections $c), $duration s each" >&2
    run_fio "$size" $((b * d)) "$round"
    run_iperf3 "$size" "$c" "$round"
    run_coio "$size" "$b" "$d" "$c" "$duration" "$round" "$verify"
    # CPU per GiB at the rate coio just reached: iperf3 flat out amortises more per wake-up.
    run_iperf3 "$size" "$c" "$round" "$(tail -n 1 "$results" | python3 -c 'import json, sys; print(json.load(sys.stdin)["gib"])')" iperf3-paced
    if ((hot)); then
      order=(copy splice)
      ((round % 2 == 0)) && order=(splice copy)
      echo "== $size round $round/$rounds, hot data: fio buffered, coio ${order[0]} then ${order[1]}" >&2
      FIO_DIRECT=0 run_fio "$size" $((b * d)) "$round" "$duration" fio-hot
      for mode in "${order[@]}"; do
        COIO_PID=${hot_pid[$mode]} COIO_ADDRESS=${hot_address[$mode]} COIO_CHECKSUMS=1 \
          run_coio "$size" "$b" "$d" "$c" "$duration" "$round" "$verify" "coio-hot-$mode"
      done
    fi
    if ((floor)); then
      echo "== $size round $round/$rounds: floor_bench --send copy, then --send splice ($((b * d)) outstanding, $c connections)" >&2
      run_floor "$size" $((b * d)) "$c" "$round" copy
      run_floor "$size" $((b * d)) "$c" "$round" splice
    fi
  done
done

if ((latency)); then
  echo "== unloaded latency: fio 4K QD1, sockperf ping-pong, coio 4K batch 1 depth 1, $duration s each" >&2
  run_fio 4K 1 1 "$duration" fio-qd1
  run_sockperf 1
  run_coio 4K 1 1 1 "$duration" 1 0 coio-qd1
fi
for depth in $sweep; do
  echo "== 512K depth sweep: $depth outstanding, fio then coio, $sweep_seconds s each" >&2
  run_fio 512K "$depth" 1 "$sweep_seconds" fio-sweep
  run_coio 512K 1 "$depth" $((depth < 2 ? depth : 2)) "$sweep_seconds" 1 0 coio-sweep
done

stop_server || die "the server exited with an error"
for pid in "${hot_pids[@]}"; do
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || die "a hot-data server exited with an error"
done
hot_pids=()
tail -n +1 "$work/server.log" | grep -E "stopped|error" >&2 || true
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
plot=${PLOT:-${TMPDIR:-/var/tmp}/coio-storage-sweep.svg}

# --- the report -------------------------------------------------------------------
python3 - "$results" "$duration" "$rounds" "$reactors" "$reactor" "$verify" "$chunks" "$load_before" "$load_after" \
  "${cc:-$(cat /proc/sys/net/ipv4/tcp_congestion_control)}" <<'PY'
import json, statistics, sys
path, duration, rounds, reactors, reactor, verify, chunks, load0, load1, cc = sys.argv[1:]
rows = [json.loads(line) for line in open(path)]
goal = {"4K": 0.9, "512K": 0.9, "4M": 0.9}
sizes = list(dict.fromkeys(r["size"] for r in rows if r["tool"] == "coio"))  # the main rounds (not latency, sweep)
def med(size, tool, key="gib"):
    return statistics.median(r[key] for r in rows if r["size"] == size and r["tool"] == tool)
print(f"coio-storage-bench over TCP (loopback) vs min(fio, iperf3); {duration} s per run; GiB/s: medians of {rounds} round(s), "
      f"ratio: median of the rounds' coio / min(fio, iperf3); "
      f"server: {reactors} {reactor} reactor(s), O_DIRECT; bench --reactor {reactor}, verify {'on' if verify == '1' else 'off'}; "
      f"dataset {chunks} x 4 MiB; TCP congestion control {cc}; load average {load0} before, {load1} after.")
print()
print("| io size | fio GiB/s | iperf3 GiB/s | coio GiB/s | ratio to min | goal | met? |")
print("|---|---|---|---|---|---|---|")
def per_round(size):  # [(fio, iperf3, coio)] by round: the three ran back to back, under the same conditions
    by = lambda t: sorted((r for r in rows if r["size"] == size and r["tool"] == t), key=lambda r: r["round"])
    return [(a["gib"], b["gib"], c["gib"]) for a, b, c in zip(by("fio"), by("iperf3"), by("coio"))]
for s in sizes:
    f, i, c = med(s, "fio"), med(s, "iperf3"), med(s, "coio")
    # The ratio is the median of each round's coio / min(fio, iperf3) (not a ratio of medians).
    ratios = [rc / min(rf, ri) for rf, ri, rc in per_round(s)]
    ratio = statistics.median(ratios)
    g = goal.get(s)
    print(f"| {s} | {f:.3f} | {i:.3f} | {c:.3f} | {ratio:.2f} ({'fio' if f <= i else 'iperf3'}) | "
          f"{'≥ %.1f' % g if g else '-'} | {('yes' if ratio >= g else 'NO') if g else '-'} |")
print()
# The disk queue in IOs: bytes in flight at the device (requests in flight x the average request)
# over the IO size. fio reads an IO in one request, coio in --piece-size ones.
def in_ios(r):
    return r["queue"] * r["request"] / size_bytes[r["size"]] if r["queue"] >= 0 else -1
size_bytes = {"4K": 4096, "512K": 512 << 10, "4M": 4 << 20}
for r in rows:
    if "queue" in r and r["size"] in size_bytes:
        r["queue_ios"] = in_ios(r)
print("| io size | batch × depth / conns | fio IOPS | coio IOPS | disk queue in IOs fio / coio (requests; avg request KiB) | coio batch p50 / p99 ms | CPU % fio | CPU % iperf3 (both ends) | CPU % coio server / bench | CPU s per GiB: iperf3 / iperf3 at coio's rate / coio |")
print("|---|---|---|---|---|---|---|---|---|---|")
for s in sizes:
    c = next(r for r in rows if r["size"] == s and r["tool"] == "coio")
    q = lambda t: (f"{med(s, t, 'queue_ios'):.1f} ({med(s, t, 'queue'):.1f}; {med(s, t, 'request') / 1024:.0f})"
                   if med(s, t, 'queue') >= 0 else "-")
    print(f"| {s} | {c['batch']} × {c['depth']} / {c['connections']} | {med(s, 'fio', 'iops'):.0f} | {med(s, 'coio', 'iops'):.0f} | "
          f"{q('fio')} / {q('coio')} | "
          f"{med(s, 'coio', 'p50_ms'):.2f} / {med(s, 'coio', 'p99_ms'):.2f} | {med(s, 'fio', 'cpu'):.0f} | "
          f"{med(s, 'iperf3', 'cpu'):.0f} | {med(s, 'coio', 'server_cpu'):.0f} / {med(s, 'coio', 'bench_cpu'):.0f} | "
          f"{med(s, 'iperf3', 'cpu_per_gib'):.2f} / {med(s, 'iperf3-paced', 'cpu_per_gib'):.2f} / "
          f"{med(s, 'coio', 'cpu_per_gib'):.2f} |")
print()
print("Goals beside the ratio: disk queue (in IOs) coio / fio >= 0.9; CPU s per GiB coio <= iperf3 at 512K and 4M: " + "; ".join(
    f"{s}: queue {med(s, 'coio', 'queue_ios') / med(s, 'fio', 'queue_ios'):.2f}"
    + (f", CPU {med(s, 'coio', 'cpu_per_gib') / med(s, 'iperf3', 'cpu_per_gib'):.2f} of iperf3's "
       f"({med(s, 'coio', 'cpu_per_gib') / med(s, 'iperf3-paced', 'cpu_per_gib'):.2f} at coio's rate)" if s != "4K" else "")
    for s in sizes if med(s, 'fio', 'queue') > 0))
if any(r["tool"] == "floor-copy" for r in rows):
    print()
    print("Floor (floor_bench, no coio, same round): --send copy reads O_DIRECT and copies into the socket; "
          "--send splice splices page-cache pages (buffered, evicted after use) into the socket.")
    print()
    print("| io size | GiB/s floor copy / splice / coio | CPU % floor copy server / client | CPU s per GiB iperf3 / floor copy / splice / coio | floor copy / iperf3 | coio / floor copy | splice / floor copy | disk queue in IOs fio / floor copy / splice / coio | coio / floor copy queue | splice bytes off the disk |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in sizes:
        m = lambda t, k="gib": med(s, t, k)
        print(f"| {s} | {m('floor-copy'):.3f} / {m('floor-splice'):.3f} / {m('coio'):.3f} | "
              f"{m('floor-copy', 'server_cpu'):.0f} / {m('floor-copy', 'bench_cpu'):.0f} | "
              f"{m('iperf3', 'cpu_per_gib'):.2f} / {m('floor-copy', 'cpu_per_gib'):.2f} / {m('floor-splice', 'cpu_per_gib'):.2f} / "
              f"{m('coio', 'cpu_per_gib'):.2f} | {m('floor-copy', 'cpu_per_gib') / m('iperf3', 'cpu_per_gib'):.2f} | "
              f"{m('coio', 'cpu_per_gib') / m('floor-copy', 'cpu_per_gib'):.2f} | "
              f"{m('floor-splice', 'cpu_per_gib') / m('floor-copy', 'cpu_per_gib'):.2f} | "
              f"{m('fio', 'queue_ios'):.1f} / {m('floor-copy', 'queue_ios'):.1f} / {m('floor-splice', 'queue_ios'):.1f} / "
              f"{m('coio', 'queue_ios'):.1f} | {m('coio', 'queue_ios') / m('floor-copy', 'queue_ios'):.2f} | "
              f"{m('floor-splice', 'from_disk'):.2f} |")
hot = [s for s in sizes if any(r["tool"] == "coio-hot-splice" and r["size"] == s for r in rows)]
if hot:
    print()
    print("Hot data (the dataset in the page cache): servers --buffered --data-path copy and splice, alternated in "
          "each round, the bench checking CRCs (--checksums), against min(fio buffered on the cached files, iperf3); "
          "ratios: medians of the rounds'. "
          "CPU s per GiB: the server process's CPU time over the bytes it served (and with the bench's).")
    print()
    print("| io size | fio buffered GiB/s | iperf3 GiB/s | coio copy / splice GiB/s | ratio to min: copy / splice | splice / copy | server CPU s per GiB copy / splice | server + bench CPU s per GiB copy / splice |")
    print("|---|---|---|---|---|---|---|---|")
    for s in hot:
        by = lambda t: sorted((r for r in rows if r["size"] == s and r["tool"] == t), key=lambda r: r["round"])
        rounds_ = list(zip(by("fio-hot"), by("iperf3"), by("coio-hot-copy"), by("coio-hot-splice")))
        ratio = lambda k: statistics.median(x[k]["gib"] / min(x[0]["gib"], x[1]["gib"]) for x in rounds_)
        m = lambda t, k="gib": med(s, t, k)
        print(f"| {s} | {m('fio-hot'):.3f} | {m('iperf3'):.3f} | {m('coio-hot-copy'):.3f} / {m('coio-hot-splice'):.3f} | "
              f"{ratio(2):.2f} / {ratio(3):.2f} | {statistics.median(x[3]['gib'] / x[2]['gib'] for x in rounds_):.2f} | "
              f"{m('coio-hot-copy', 'server_cpu_per_gib'):.3f} / {m('coio-hot-splice', 'server_cpu_per_gib'):.3f} | "
              f"{m('coio-hot-copy', 'cpu_per_gib'):.3f} / {m('coio-hot-splice', 'cpu_per_gib'):.3f} |")
    if int(rounds) > 1:
        print()
        print("Hot, per round, fio buffered / iperf3 / copy / splice GiB/s: " + "; ".join(
            f"{s}: " + ", ".join("/".join(f"{r['gib']:.2f}" for r in x) for x in zip(
                *[sorted((r for r in rows if r["size"] == s and r["tool"] == t), key=lambda r: r["round"])
                  for t in ("fio-hot", "iperf3", "coio-hot-copy", "coio-hot-splice")]))
            for s in hot))
qd1 = [r for r in rows if r["tool"] in ("fio-qd1", "sockperf", "coio-qd1")]
if qd1:
    f = next(r["p50_ms"] for r in qd1 if r["tool"] == "fio-qd1") * 1e3
    rtt = 2 * next(r["p50_ms"] for r in qd1 if r["tool"] == "sockperf") * 1e3
    c = next(r["p50_ms"] for r in qd1 if r["tool"] == "coio-qd1") * 1e3
    print()
    print(f"Unloaded latency, 4 KiB: coio p50 {c:.0f} us; fio QD1 p50 {f:.0f} us + sockperf round trip {rtt:.0f} us "
          f"= {f + rtt:.0f} us -> {'met' if c <= f + rtt else 'NOT met'} ({c / (f + rtt):.2f} of the bound)")
fs = sorted((r for r in rows if r["tool"] == "fio-sweep"), key=lambda r: r["depth"])
cs = {r["depth"]: r for r in rows if r["tool"] == "coio-sweep"}
if fs:
    print()
    print("512 KiB depth sweep (outstanding IOs; coio batch 1 over 2 connections, fio iodepth):")
    print()
    print("| outstanding | fio GiB/s | coio GiB/s | ratio | disk queue in IOs fio / coio |")
    print("|---|---|---|---|---|")
    with open(path + ".sweep", "w") as out:
        for r in fs:
            c = cs[r["depth"]]
            print(f"| {r['depth']} | {r['gib']:.3f} | {c['gib']:.3f} | {c['gib'] / r['gib']:.2f} | {r['queue_ios']:.1f} / {c['queue_ios']:.1f} |")
            out.write(f"{r['depth']} {r['gib']:.4f} {c['gib']:.4f}\n")
if int(rounds) > 1:
    print()
    print("Per round, fio / iperf3 / coio GiB/s -> ratio: " + "; ".join(
        f"{s}: " + ", ".join(f"{rf:.2f}/{ri:.2f}/{rc:.2f} -> {rc / min(rf, ri):.2f}" for rf, ri, rc in per_round(s))
        for s in sizes))
PY

if [[ -s $results.sweep ]]; then
  if command -v gnuplot >/dev/null; then
    gnuplot <<EOF || die "gnuplot failed"
set terminal svg size 640,400 font "sans,12" background rgb "white"
set output "$plot"
set title "512 KiB random reads: throughput vs outstanding IOs ($(date -u +%F), $(nproc) vCPUs)"
set xlabel "outstanding IOs (fio iodepth; coio: batchReads of 1 IO in flight)"
set ylabel "GiB/s"
set logscale x 2
set key bottom right
set grid
plot "$results.sweep" using 1:2 with linespoints title "fio (disk)", \
     "$results.sweep" using 1:3 with linespoints title "coio over TCP (disk + loopback)"
EOF
    echo "sweep plot: $plot" >&2
  else
    echo "run_storage_bench.sh: gnuplot not installed (scripts/install-deps.sh installs it): no sweep plot" >&2
  fi
fi
