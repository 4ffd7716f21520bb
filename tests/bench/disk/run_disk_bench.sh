#!/usr/bin/env bash
# Runs disk_bench next to fio (and to a raw liburing loop) in one run and
# prints coio's IOPS, bandwidth and p50/p99 latency as ratios to theirs.
#   tests/bench/disk/run_disk_bench.sh [--bench PATH] [--dir DIR] [--seconds S] [--quick]
#                                      [--cases "4k 32,4k 128"] [--no-hot] [--rounds N]
# --cases: the O_DIRECT cases (block size and depth) to run instead of all;
# --no-hot: skip the page-cache-hot table; --rounds: run every row of a case
# (and of the hot table) N times, alternating, and report medians with the
# IOPS range: the virtual disk drifts by tens of per cent within minutes, so
# one run per row mostly tells which row ran later.
# Needs fio (scripts/install-deps.sh installs it). Leaves a 4 GiB and a
# 1 GiB file in DIR (default /var/tmp/coio-disk-bench) for the next run.
set -euo pipefail
cd "$(dirname "$0")/../../.."

bench=build/tests/bench/disk/disk_bench dir=/var/tmp/coio-disk-bench seconds=5 quick=0 cases="" hot_table=1 rounds=1
while (($#)); do
  case "$1" in
    --bench) bench=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --quick) quick=1; shift ;;  # a few seconds in all: proves the script works
    --cases) cases=$2; shift 2 ;;
    --no-hot) hot_table=0; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "run_disk_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "run_disk_bench.sh: fio not found (scripts/install-deps.sh)" >&2; exit 1; }
[[ -x $bench ]] || { echo "run_disk_bench.sh: $bench not built (cmake --build build --target disk_bench)" >&2; exit 1; }

mkdir -p "$dir"
cold=$dir/cold-4g.dat hot=$dir/hot-1g.dat size=4G hotsize=1G
if ((quick)); then cold=$dir/quick-64m.dat hot=$dir/quick-hot-64m.dat size=64M hotsize=64M seconds=0.3; fi
results=$(mktemp)
trap 'rm -f "$results"' EXIT

layout() {  # real blocks: O_DIRECT reads of unwritten extents never reach the disk
  local file=$1 bytes=$2
  [[ -f $file && $(stat -c %s "$file") -ge $(numfmt --from=iec "$bytes") ]] && return
  echo "laying out $file ($bytes)" >&2
  fio --name=layout --filename="$file" --size="$bytes" --rw=write --bs=4M --direct=1 --ioengine=io_uring \
    --iodepth=8 --output=/dev/null
}
layout "$cold" "$size"
layout "$hot" "$hotsize"

warm() { cat "$1" >/dev/null; }  # the VM pages cold memory out: warm right before each hot run

# fio <label> <file> <size> <bs> <depth> <direct> [extra fio options]
run_fio() {
  local label=$1 file=$2 fsize=$3 bs=$4 depth=$5 direct=$6; shift 6
  fio --name=r --filename="$file" --size="$fsize" --rw=randread --bs="$bs" --iodepth="$depth" --direct="$direct" \
    --ioengine=io_uring --runtime="$(python3 -c "print(int($seconds * 1000))")ms" --time_based --norandommap --randrepeat=0 --lat_percentiles=1 \
    --output-format=json "$@" |
    python3 -c '
import json, sys
label, bs, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = json.load(sys.stdin)["jobs"][0]["read"]
p = r["lat_ns"]["percentile"]
print(json.dumps({"label": label, "bs": bs, "depth": depth, "iops": r["iops"], "mibs": r["bw_bytes"] / 2**20,
                  "p50_us": p["50.000000"] / 1e3, "p99_us": p["99.000000"] / 1e3}))' "$label" "$(numfmt --from=iec "$bs")" "$depth" >>"$results"
}

# coio <label> <disk_bench options>
run_coio() {
  local label=$1; shift
  "$bench" --seconds="$seconds" "$@" |
    python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); d["label"] = sys.argv[1]; print(json.dumps(d))' \
      "$label" >>"$results"
}

cold_cases=("4k 1" "4k 32" "4k 128" "512k 8" "512k 32" "4m 8" "4m 32")
((quick)) && cold_cases=("4k 32" "512k 8")
[[ -n $cases ]] && IFS=, read -r -a cold_cases <<<"$cases"
for c in "${cold_cases[@]}"; do
 for round in $(seq "$rounds"); do
  read -r bs depth <<<"$c"
  bytes=$(numfmt --from=iec "${bs^^}")
  echo "O_DIRECT random reads, bs=$bs depth=$depth" >&2
  run_fio fio "$cold" "$size" "${bs^^}" "$depth" 1
  run_fio fio-fixed "$cold" "$size" "${bs^^}" "$depth" 1 --fixedbufs=1 --registerfiles=1
  # Like fio's, the buffers are on 4 KiB pages (--thp=0); the pool's default,
  # transparent huge pages, is shown apart where it matters (large reads).
  for engine in epoll uring; do
    run_coio "coio-$engine" --engine=$engine --file="$cold" --bs="$bytes" --depth="$depth" --direct=1 --fixed=1 --thp=0
  done
  if [[ $bs != 4k ]]; then
    for engine in epoll uring; do
      run_coio "coio-$engine-THP" --engine=$engine --file="$cold" --bs="$bytes" --depth="$depth" --direct=1 --fixed=1
    done
  fi
  if [[ $bs == 4k ]]; then  # when the reactor's ring posts completions (UringReactor::Options::taskRun)
    for taskrun in immediate cooperative; do  # coio-uring itself: the default, deferred
      run_coio "coio-uring-$taskrun" --engine=uring --taskrun=$taskrun --file="$cold" --bs="$bytes" --depth="$depth" \
        --direct=1 --fixed=1 --thp=0
    done
  fi
  if [[ $bs == 4k && $depth != 1 ]]; then  # the submission patterns, where they matter
    run_coio "coio-uring-never-eager" --engine=uring --file="$cold" --bs="$bytes" --depth="$depth" --direct=1 \
      --fixed=1 --thp=0 --eager-below=0
    run_coio "coio-uring-always-eager" --engine=uring --file="$cold" --bs="$bytes" --depth="$depth" --direct=1 \
      --fixed=1 --thp=0 --eager-below=100000
    run_coio "coio-uring-ReadBatch$depth" --engine=uring --file="$cold" --bs="$bytes" --depth="$depth" \
      --batch="$depth" --direct=1 --fixed=1 --thp=0
  fi
 done
done

for round in $(seq "$rounds"); do
  ((hot_table)) || break
  echo "page-cache-hot 4 KiB random reads, depth 32" >&2
  warm "$hot"; run_coio hot-raw --engine=raw --file="$hot" --bs=4096 --depth=32 --direct=0 --latency=0
  for engine in epoll uring; do
    warm "$hot"; run_coio "hot-coio-$engine" --engine=$engine --file="$hot" --bs=4096 --depth=32 --direct=0 --latency=0
    warm "$hot"; run_coio "hot-coio-$engine-ReadBatch32" --engine=$engine --file="$hot" --bs=4096 --depth=32 \
      --batch=32 --direct=0 --latency=0
  done
  warm "$hot"; run_fio hot-fio "$hot" "$hotsize" 4K 32 0 --invalidate=0
done

python3 - "$results" <<'PY'
import json, sys
from statistics import median
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault((r["label"], r["bs"], r["depth"]), []).append(r)
# One row per label and case: medians over the rounds, and the IOPS range.
rows = []
for group in runs.values():
    row = dict(group[0])
    for k in ("iops", "mibs", "p50_us", "p99_us"):
        if k in row:
            row[k] = median(g[k] for g in group)
    row["range"] = f"{min(g['iops'] for g in group):.0f}–{max(g['iops'] for g in group):.0f}" if len(group) > 1 else "-"
    rows.append(row)
cold = [r for r in rows if not r["label"].startswith("hot-")]
hot = [r for r in rows if r["label"].startswith("hot-")]
def ratio(a, b): return f"{a / b:.2f}" if a and b else "-"
def size(bs): return f"{bs // 2**20} MiB" if bs >= 2**20 else f"{bs // 1024} KiB"

print("\n## O_DIRECT random reads, 4 GiB file: coio (registered buffers and file) vs fio (io_uring engine)\n")
print("| bs | depth | run | IOPS | IOPS range | MiB/s | p50 µs | p99 µs | IOPS / fio | IOPS / fio-fixed | p50 / fio | p99 / fio |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
cases = list(dict.fromkeys((r["bs"], r["depth"]) for r in cold))
for bs, depth in cases:
    group = [r for r in cold if (r["bs"], r["depth"]) == (bs, depth)]
    fio = next(r for r in group if r["label"] == "fio")
    fixed = next(r for r in group if r["label"] == "fio-fixed")
    for r in group:
        print(f"| {size(bs)} | {depth} | {r['label']} | {r['iops']:.0f} | {r['range']} | {r['mibs']:.0f} | {r['p50_us']:.0f} | "
              f"{r['p99_us']:.0f} | {ratio(r['iops'], fio['iops'])} | {ratio(r['iops'], fixed['iops'])} | "
              f"{ratio(r['p50_us'], fio['p50_us'])} | {ratio(r['p99_us'], fio['p99_us'])} |")

if not hot:
    sys.exit(0)
print("\n## Page-cache-hot 4 KiB random reads, 1 GiB file, depth 32 (CPU-bound), vs the raw liburing loop\n")
print("| run | IOPS | IOPS range | IOPS / raw |")
print("|---|---|---|---|")
raw = next(r for r in hot if r["label"] == "hot-raw")
for r in hot:
    print(f"| {r['label'][4:]} | {r['iops']:.0f} | {r['range']} | {ratio(r['iops'], raw['iops'])} |")
PY
