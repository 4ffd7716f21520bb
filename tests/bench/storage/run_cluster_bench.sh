#!/usr/bin/env bash
# The storage cluster read with its routing from etcd against the same cluster read with its routing
# from a file. Goal: with routing from etcd (coio-storage-bench --etcd URL) the cluster bench delivers
# >= 0.98 of its throughput with routing from the file (--cluster FILE): etcd is off the data path.
#
#   tests/bench/storage/run_cluster_bench.sh [BUILD_DIR]        (default build-cbench)
#
# Environment (defaults in brackets):
#   DURATION [5]     seconds per bench run (an integer: the bench takes whole seconds)
#   ROUNDS [3]       rounds; each runs the bench once with the file and once with etcd, back to back
#                    (the order alternates from round to round, so that a drift favours neither)
#   IO_SIZE [512K]   bytes per IO; BATCH [4] IOs per batchRead, DEPTH [8] batchReads in flight
#   CHUNKS [192]     chunks of CHUNK_SIZE [4M] in the dataset (768 MiB; every chunk on its chain's 2
#                    replicas: 1.5 GiB on disk)
#   REACTOR [uring]  reactor of the servers and the bench
#   BUFFERED [0]     1: the servers read through the page cache (serve --buffered), as the
#                    simulation's do (docs/benchmarks.md, Simulation)
#   VERIFY_SECONDS [1]  each mode is first checked with a --verify run this long, which must report
#                    0 errors
#   TMPDIR [/var/tmp] where the dataset and etcd's data go (must allow O_DIRECT; tmpfs does not)
#   CC [cubic]       TCP congestion control of the servers (--tcp-congestion); "" for the system's
#
# The cluster is the storage guide's (docs/storage-example.md): three coio-storage-servers on
# loopback, two targets each, three chains of two replicas, read O_DIRECT as the other storage
# benchmarks read; one etcd (loopback, data in the work directory) holds the same chain table,
# put there by `cluster load`. Both modes read the same servers with the same chain versions:
# the servers take their versions from the file (serve --chains) and are not registered in etcd,
# and no mgmtd runs. So nothing changes a version during the runs: the file, etcd and the servers
# agree on version 1 of every chain, no IO is answered staleRouting, and the only difference is
# where the bench's routing comes from (one read of etcd, then a watch that stays idle beside the
# reads; the script checks both: no routing update, refresh or stale retry). A manager would mark
# the targets of unregistered servers offline and move versions the file does not follow;
# registered servers (serve --etcd) would add the same keep-alives in both modes, to no purpose.
#
# Output: a Markdown table, per round the throughput of each mode and the ratio etcd / file, then
# the medians and the ratio's median and range. Exits non-zero, printing no ratio, if a run fails
# or reports an error.
set -euo pipefail
source "$(dirname "$0")/../../../scripts/lib/storage_server.sh"
cd "$(dirname "$0")/../../.."

build_dir=${1:-build-cbench}
duration=${DURATION:-5}
rounds=${ROUNDS:-3}
io_size=${IO_SIZE:-512K}
buffered=""; [[ ${BUFFERED:-0} == 1 ]] && buffered=1
batch=${BATCH:-4}
depth=${DEPTH:-8}
chunks=${CHUNKS:-192}
chunk_size=${CHUNK_SIZE:-4M}
reactor=${REACTOR:-uring}
verify_seconds=${VERIFY_SECONDS:-1}
cc=${CC-cubic}

die() { echo "run_cluster_bench.sh: $*" >&2; exit 1; }
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds, not '$duration'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
for tool in etcd etcdctl python3 cmake; do
  command -v $tool >/dev/null || die "missing $tool (scripts/install-deps.sh installs it)"
done

# --- build ------------------------------------------------------------------
echo "== building coio-storage-server and coio-storage-bench in $build_dir" >&2
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target coio-storage-server coio-storage-bench >&2
bin=$build_dir/examples/storage_server
[[ -x $bin/coio-storage-server && -x $bin/coio-storage-bench ]] || die "the storage example was not built (needs liburing)"

# --- cleanup ------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/var/tmp}/coio-cbench-XXXXXX")
pids=()
trap stop_pids_and_remove_work EXIT
trap 'exit 130' INT TERM

# Five loopback ports free now: three servers, etcd's client and peer URLs.
read -r p1 p2 p3 client_port peer_port < <(python3 tests/free_ports.py 5)

# --- etcd ----------------------------------------------------------------------
endpoint=http://127.0.0.1:$client_port
echo "== starting etcd on $endpoint" >&2
etcd --data-dir "$work/etcd" --listen-client-urls "$endpoint" --advertise-client-urls "$endpoint" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "default=http://127.0.0.1:$peer_port" --log-level warn >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints "$endpoint" endpoint health >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/etcd.log" >&2; die "etcd exited"; }
  sleep 0.1
done

# --- the chain table, the datasets, the servers ------------------------------------
chains=$work/chains.txt
printf '%s\n' 'coio-chains 1' "chunks $chunks" "chunk-size $chunk_size" \
  "chain 1  127.0.0.1:$p1/11  127.0.0.1:$p2/21" \
  "chain 2  127.0.0.1:$p2/22  127.0.0.1:$p3/31" \
  "chain 3  127.0.0.1:$p3/32  127.0.0.1:$p1/12" >"$chains"
echo "== creating the targets: $chunks chunks of $chunk_size on 3 chains of 2 replicas, in $work" >&2
for t in 11 12 21 22 31 32; do
  "$bin/coio-storage-server" init --chains "$chains" --target $t --dir "$work/t$t" >/dev/null
done
echo "== loading the chain table into etcd" >&2
"$bin/coio-storage-server" cluster load "$chains" --etcd "$endpoint" >&2
n=0
for port in $p1 $p2 $p3; do
  n=$((n + 1))
  start_storage_server "$bin/coio-storage-server" "$work/server$n.log" 100 serve --listen 127.0.0.1:$port \
    --target ${n}1="$work/t${n}1" --target ${n}2="$work/t${n}2" --chains "$chains" --transport tcp \
    --reactor "$reactor" --pool 128M ${cc:+--tcp-congestion "$cc"} ${buffered:+--buffered}
  pids+=("$server_pid")
  [[ -n $address ]] || { cat "$work/server$n.log" >&2; die "server $n did not start"; }
  [[ -z $buffered ]] && grep -qi "buffered" "$work/server$n.log" && { cat "$work/server$n.log" >&2; die "server $n fell back to buffered reads (no O_DIRECT in $work)"; }
done

# --- the runs: each appends one JSON line to $results or fails -----------------------
results=$work/results.jsonl
run_bench() {  # mode(file|etcd) seconds round verify(0|1)
  local mode=$1 seconds=$2 round=$3 verify=$4 out=$work/bench.json flags pid
  if [[ $mode == file ]]; then flags=(--cluster "$chains"); else flags=(--etcd "$endpoint"); fi
  ((verify == 0)) || flags+=(--verify)
  "$bin/coio-storage-bench" "${flags[@]}" --io-size "$io_size" --batch "$batch" --depth "$depth" \
    --duration "$seconds" --reactor "$reactor" --json >"$out" ||
    { cat "$out" >&2; die "coio-storage-bench --$mode failed or reported errors"; }
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || die "etcd or a server died during the run"; done
  python3 - "$out" "$mode" "$round" >>"$results" <<'PY' || { cat "$out" >&2; die "coio-storage-bench's output is unusable or not as expected"; }
import json, sys
d = json.load(open(sys.argv[1]))
c = d["cluster"]
assert d["errors"]["total"] == 0 and d["ios"] > 0 and c["failed_ios"] == 0, "errors"
assert c["servers"] == 3 and c["chains"] == 3, "not the 3 servers and 3 chains"
# The routing did not move: no staleRouting met, nothing fetched again, nothing applied.
assert c["routing_refreshes"] == 0 and c["stale_routing_retries"] == 0 and c["routing_updates"] == 0, "routing moved"
assert ("etcd" in c) == (sys.argv[2] == "etcd"), "the routing's source"
if sys.argv[2] == "etcd":
    assert c["etcd"]["updates"] == 0 and c["etcd"]["reloads"] == 0 and c["etcd"]["bad_records"] == 0, c["etcd"]
print(json.dumps({"mode": sys.argv[2], "round": int(sys.argv[3]), "gib": d["gib_per_s"], "iops": d["iops"],
                  "p50_ms": d["batch_latency_ms"]["p50"], "p99_ms": d["batch_latency_ms"]["p99"]}))
PY
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for mode in file etcd; do
  echo "== $mode routing: a --verify check, $verify_seconds s" >&2
  run_bench $mode "$verify_seconds" 0 1
done
for ((round = 1; round <= rounds; ++round)); do
  order="file etcd"
  ((round % 2)) || order="etcd file"
  echo "== round $round/$rounds: $order, $duration s each (io size $io_size, batch $batch, depth $depth)" >&2
  for mode in $order; do run_bench $mode "$duration" "$round" 0; done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the report -------------------------------------------------------------------
python3 - "$results" "$duration" "$rounds" "$io_size" "$batch" "$depth" "$chunks" "$chunk_size" "$reactor" \
  "$load_before" "$load_after" "${cc:-$(cat /proc/sys/net/ipv4/tcp_congestion_control)}" \
  "${buffered:+buffered reads}" <<'PY'
import json, statistics, sys
path, duration, rounds, io_size, batch, depth, chunks, chunk_size, reactor, load0, load1, cc, reads = sys.argv[1:]
rows = [json.loads(line) for line in open(path) if json.loads(line)["round"] > 0]
by = {(r["mode"], r["round"]): r for r in rows}
ratios = []
print(f"coio-storage-bench on a cluster of 3 servers (2 targets each, 3 chains of 2 replicas; loopback TCP, {reads or 'O_DIRECT'}, "
      f"{reactor} reactors, congestion control {cc}), routing from etcd vs from the file; io size {io_size}, batch {batch}, "
      f"depth {depth}; dataset {chunks} x {chunk_size}; {duration} s per run, {rounds} round(s); "
      f"load average {load0} before, {load1} after.")
print()
print("| round | file GiB/s | etcd GiB/s | etcd / file | file p99 ms | etcd p99 ms |")
print("|---|---|---|---|---|---|")
for n in range(1, int(rounds) + 1):
    f, e = by[("file", n)], by[("etcd", n)]
    ratios.append(e["gib"] / f["gib"])
    print(f"| {n} | {f['gib']:.3f} | {e['gib']:.3f} | {ratios[-1]:.3f} | {f['p99_ms']:.2f} | {e['p99_ms']:.2f} |")
med = lambda mode, key="gib": statistics.median(r[key] for r in rows if r["mode"] == mode)
ratio = statistics.median(ratios)
print(f"| median | {med('file'):.3f} | {med('etcd'):.3f} | **{ratio:.3f}** (range {min(ratios):.3f} to {max(ratios):.3f}) | "
      f"{med('file', 'p99_ms'):.2f} | {med('etcd', 'p99_ms'):.2f} |")
print()
print(f"Goal: etcd / file >= 0.98 (the median of the rounds' ratios): {'met' if ratio >= 0.98 else 'NOT met'}.")
PY
