#!/usr/bin/env bash
# Variants of the storage server against each other, round by round in one run: builds of two
# commits (the cost of a change), or datasets written with different init options (a setting's).
# The ratios of throughput and CPU per GiB to the first variant are what it reports.
#
#   tests/bench/storage/run_storage_ab.sh LABEL=BUILD_DIR[:INIT[:SERVE[:BENCH]]] LABEL=...
#
#   e.g. base=build-base new=build-sbench                    (BUILD_DIRs configured from two trees)
#        4K=build-sbench:"--block-size 4K" 64K=build-sbench:"--block-size 64K"
#        1x1=build-sbench::"--reactors 1":"--reactors 1" 2x2=build-sbench::"--reactors 2":"--reactors 2"
#   INIT, SERVE, BENCH: more options of the variant's coio-storage-server init, serve (after the
#   script's own: --reactors $REACTORS ...; the last of an option counts) and coio-storage-bench.
#
# Each variant gets its own dataset (CHUNKS x 4 MiB, written by its own coio-storage-server init,
# with its INIT_OPTIONS) and its own server (its build's coio-storage-server, started once, all of
# them running throughout: idle while another is measured), and is read by its own build's
# coio-storage-bench (a build speaks its own protocol version). A BUILD_DIR without a CMakeCache is
# configured from this tree; every BUILD_DIR gets its two programs built (RelWithDebInfo).
#
# Environment (defaults in brackets):
#   DURATION [5]     seconds per bench run (whole seconds)
#   ROUNDS [3]       rounds per IO size; each runs every variant once, back to back, the order
#                    rotating from round to round (so that a drift favours none)
#   SIZES ["4K 512K 4M"]  workloads as run_storage_bench.sh's: 4K batch 8 depth 16, 512K batch 4
#                    depth 8, 4M batch 1 depth 8, 2 connections each, random unaligned offsets
#   CHUNKS [384]     4 MiB chunks per dataset (1.5 GiB each, in TMPDIR [/var/tmp]: O_DIRECT)
#   REACTORS [2]     server reactor threads; REACTOR [uring] of the servers and the benches
#   VERIFY [0]       1: the measured runs use --verify (the client asks for the response checksum
#                    and checks every byte); whatever VERIFY says, each variant and size is first
#                    checked with a 1 s --verify run, which must report 0 errors
#   CC [cubic]       TCP congestion control of the servers
#
# Output: per IO size, a Markdown row per variant: GiB/s and CPU core-seconds per GiB (server +
# bench, and the server's alone), medians over the rounds with their range, and the median (and
# range) of the per-round ratios to the first variant. Exits non-zero if a run fails or reports
# an error.
set -euo pipefail
source "$(dirname "$0")/../../../scripts/lib/storage_server.sh"
cd "$(dirname "$0")/../../.."

duration=${DURATION:-5}
rounds=${ROUNDS:-3}
sizes=${SIZES:-4K 512K 4M}
chunks=${CHUNKS:-384}
reactors=${REACTORS:-2}
reactor=${REACTOR:-uring}
verify=${VERIFY:-0}
cc=${CC-cubic}

die() { echo "run_storage_ab.sh: $*" >&2; exit 1; }
(($# >= 2)) || die "give two variants or more: LABEL=BUILD_DIR[:INIT_OPTIONS] (see the header)"
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds, not '$duration'"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
labels=() builds=() inits=() serves=() benches=()
for spec in "$@"; do
  [[ $spec =~ ^([A-Za-z0-9._-]+)=([^:]+)(:([^:]*))?(:([^:]*))?(:([^:]*))?$ ]] ||
    die "not LABEL=BUILD_DIR[:INIT[:SERVE[:BENCH]]]: $spec"
  labels+=("${BASH_REMATCH[1]}") builds+=("${BASH_REMATCH[2]}") inits+=("${BASH_REMATCH[4]}")
  serves+=("${BASH_REMATCH[6]}") benches+=("${BASH_REMATCH[8]}")
done

work=$(mktemp -d "${TMPDIR:-/var/tmp}/coio-sab-XXXXXX")
pids=()
trap stop_pids_and_remove_work EXIT
trap 'exit 130' INT TERM

addresses=()
for i in "${!labels[@]}"; do
  label=${labels[$i]} build=${builds[$i]}
  echo "== $label: building in $build" >&2
  [[ -f $build/CMakeCache.txt ]] ||
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_BUILD_TESTS=OFF -DCOIO_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target coio-storage-server coio-storage-bench >&2
  bin=$build/examples/storage_server
  echo "== $label: dataset of $chunks x 4 MiB (init ${inits[$i]:-with no option})" >&2
  # shellcheck disable=SC2086  # INIT and SERVE options are words
  "$bin/coio-storage-server" init --dir "$work/$label" --chunks "$chunks" --chunk-size 4M --chunks-per-file 64 \
    ${inits[$i]} >&2
  start_storage_server "$bin/coio-storage-server" "$work/$label.log" 100 serve --dir "$work/$label" \
    --listen 127.0.0.1:0 --reactors "$reactors" --reactor "$reactor" --pool 128M ${cc:+--tcp-congestion "$cc"} \
    ${serves[$i]}
  [[ -n $address ]] || { cat "$work/$label.log" >&2; die "$label: the server did not start"; }
  grep -qi "buffered" "$work/$label.log" && die "$label: the server fell back to buffered reads (no O_DIRECT in $work)"
  pids+=("$server_pid") addresses+=("$address")
done

results=$work/results.jsonl
run_bench() {  # variant size batch depth seconds round check(0|1) [results file]
  local i=$1 size=$2 batch=$3 depth=$4 seconds=$5 round=$6 check=$7 into=${8:-$results} out=$work/bench.json s0 s1 c0 c1
  local flags=()
  local bin=${builds[$i]}/examples/storage_server pid=${pids[$i]}
  ((check)) && flags=(--verify)
  kill -0 "$pid" 2>/dev/null || die "${labels[$i]}: the server is gone"
  times >"$work/times0"
  s0=$(cpu_ticks "$pid")
  "$bin/coio-storage-bench" --address "${addresses[$i]}" --dir "$work/${labels[$i]}" --io-size "$size" \
    --batch "$batch" --depth "$depth" --connections 2 --duration "$seconds" --reactor "$reactor" --json "${flags[@]}" \
    ${benches[$i]} >"$out" || { cat "$out" >&2; die "${labels[$i]}: coio-storage-bench failed or reported errors ($size)"; }
  times >"$work/times1"
  s1=$(cpu_ticks "$pid")
  c0=$(children_cpu "$work/times0") c1=$(children_cpu "$work/times1")
  python3 - "$out" "${labels[$i]}" "$size" "$round" "$(getconf CLK_TCK)" "$s0" "$s1" "$c0" "$c1" >>"$into" <<'PY' ||
import json, sys
out, label, size, rnd, hz, s0, s1, c0, c1 = sys.argv[1:]
d = json.load(open(out))
assert d["errors"]["total"] == 0 and d["ios"] > 0, d
gib = d["bytes"] / 2**30
server = (int(s1) - int(s0)) / int(hz)
print(json.dumps({"label": label, "size": size, "round": int(rnd), "gib_s": d["gib_per_s"],
                  "cpu_gib": (server + float(c1) - float(c0)) / gib, "server_cpu_gib": server / gib}))
PY
    die "${labels[$i]}: the bench's output is unusable"
}

declare -A batch_of=([4K]=8 [512K]=4 [4M]=1) depth_of=([4K]=16 [512K]=8 [4M]=8)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
n=${#labels[@]}
for size in $sizes; do
  [[ -n ${batch_of[$size]:-} ]] || die "no workload defined for size $size (known: ${!batch_of[*]})"
  for ((i = 0; i < n; ++i)); do
    echo "== $size: ${labels[$i]}: --verify check, 1 s" >&2
    run_bench "$i" "$size" "${batch_of[$size]}" "${depth_of[$size]}" 1 0 1 "$work/checks.jsonl"
  done
  for ((round = 1; round <= rounds; ++round)); do
    for ((k = 0; k < n; ++k)); do
      i=$(((round - 1 + k) % n))
      echo "== $size round $round/$rounds: ${labels[$i]}, $duration s" >&2
      run_bench "$i" "$size" "${batch_of[$size]}" "${depth_of[$size]}" "$duration" "$round" "$verify"
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

for i in "${!labels[@]}"; do
  echo "- ${labels[$i]}: ${builds[$i]}; init ${inits[$i]:-as is}; serve ${serves[$i]:-as is}; bench ${benches[$i]:-as is}"
done

python3 - "$results" "$duration" "$rounds" "$reactors" "$reactor" "$verify" "$chunks" "$load_before" "$load_after" \
  "${labels[@]}" <<'PY'
import json, statistics, sys
path, duration, rounds, reactors, reactor, verify, chunks, load0, load1, *labels = sys.argv[1:]
rows = [json.loads(line) for line in open(path)]
print(f"{len(labels)} variants, {rounds} round(s) of {duration} s per IO size, the order rotating; server: {reactors} "
      f"{reactor} reactor(s), O_DIRECT, --pool 128M; bench verify {'on' if verify == '1' else 'off'}; dataset {chunks} x "
      f"4 MiB each; load average {load0} before, {load1} after. Medians (range); ratios: the median (range) of the "
      f"per-round ratios to {labels[0]}.")
print()
print("| io size | variant | GiB/s | CPU s per GiB (server + bench) | server CPU s per GiB | GiB/s ratio | CPU per GiB ratio | server CPU per GiB ratio |")
print("|---|---|---|---|---|---|---|---|")
fmt = lambda xs, d=3: f"{statistics.median(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f})"
for size in dict.fromkeys(r["size"] for r in rows):
    by = {l: sorted((r for r in rows if r["size"] == size and r["label"] == l), key=lambda r: r["round"]) for l in labels}
    for l in labels:
        cells = [fmt([r[k] for r in by[l]]) for k in ("gib_s", "cpu_gib", "server_cpu_gib")]
        ratios = ["-"] * 3 if l == labels[0] else [
            fmt([r[k] / b[k] for r, b in zip(by[l], by[labels[0]])], 2) for k in ("gib_s", "cpu_gib", "server_cpu_gib")]
        print(f"| {size} | {l} | " + " | ".join(cells + ratios) + " |")
PY
