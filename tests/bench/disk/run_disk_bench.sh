#!/usr/bin/env bash
# Runs disk_bench next to fio (and to a raw liburing loop) in one run and
# prints coio's IOPS, bandwidth and p50/p99 latency as ratios to theirs.
#   tests/bench/disk/run_disk_bench.sh [--bench PATH] [--dir DIR] [--seconds S] [--quick]
#                                      [--cases "4k 32,4k 128"] [--no-hot] [--no-write] [--rounds N]
# --cases: the O_DIRECT read cases (block size and depth) to run instead of all;
# --no-hot: skip the page-cache-hot table; --no-write: skip the write tables
# (O_DIRECT random writes at depth 32, 4 KiB and 512 KiB, through File and
# WriteBatch; write + fdatasync at depth 1), whose goal is 0.95 of fio's
# IOPS; they overwrite the 4 GiB file's blocks in place.
# --rounds: run every row of a case
# (and of the hot table) N times, in reverse order on even rounds, and report medians with the
# IOPS range: the virtual disk drifts by tens of per cent within minutes, so
# one run per row mostly tells which row ran later.
# Needs fio (scripts/install-deps.sh installs it). Leaves a 4 GiB and a
# 1 GiB file in DIR (default /var/tmp/coio-disk-bench) for the next run.
set -euo pipefail
cd "$(dirname "$0")/../../.."

bench=build-bench/tests/bench/disk/disk_bench dir=/var/tmp/coio-disk-bench seconds=5 quick=0 cases="" hot_table=1 write_tables=1
rounds=1
while (($#)); do
  case "$1" in
    --bench) bench=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --quick) quick=1; shift ;;  # a few seconds in all: proves the script works
    --cases) cases=$2; shift 2 ;;
    --no-hot) hot_table=0; shift ;;
    --no-write) write_tables=0; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "run_disk_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "run_disk_bench.sh: fio not found (scripts/install-deps.sh)" >&2; exit 1; }
[[ -x $bench ]] || { echo "run_disk_bench.sh: $bench not built (cmake --build build-bench --target disk_bench: docs/benchmarks.md)" >&2; exit 1; }

mkdir -p "$dir"
cold=$dir/cold-4g.dat hot=$dir/hot-1g.dat size=4G hotsize=1G
if ((quick)); then cold=$dir/quick-64m.dat hot=$dir/quick-hot-64m.dat size=64M hotsize=64M seconds=0.3; fi
results=$(mktemp)
huge_dir="" huge_restore=""  # setup_huge, below
trap 'rm -f "$results"; if [[ -n $huge_restore ]]; then echo "$huge_restore" >/proc/sys/vm/nr_hugepages; fi' EXIT

layout() {  # real blocks: O_DIRECT reads of unwritten extents never reach the disk
  local file=$1 bytes=$2
  [[ -f $file && $(stat -c %s "$file") -ge $(numfmt --from=iec "$bytes") ]] && return
  echo "laying out $file ($bytes)" >&2
  fio --name=layout --filename="$file" --size="$bytes" --rw=write --bs=4M --direct=1 --ioengine=io_uring \
    --iodepth=8 --output=/dev/null
}
layout "$cold" "$size"
layout "$hot" "$hotsize"

# fio's buffers on huge pages too, beside coio's default pool (transparent
# huge pages), so that like is compared with like: fio can only map
# hugetlbfs pages (--mem=mmaphuge), so as root the script reserves enough
# 2 MiB pages for the largest case (4 MiB x 32) and mounts hugetlbfs if
# needed, and gives the reservation back at exit; else the rows are left
# out, with a line saying why.
setup_huge() {
  local need=80 free total
  if [[ $(id -u) != 0 ]]; then
    echo "run_disk_bench.sh: fio-huge rows left out: reserving hugetlbfs pages needs root" >&2
    return
  fi
  total=$(awk '/^HugePages_Total/ {print $2}' /proc/meminfo)
  free=$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo)
  if ((free < need)); then
    huge_restore=$total
    echo $((total + need - free)) >/proc/sys/vm/nr_hugepages
  fi
  huge_dir=$(awk '$3 == "hugetlbfs" {print $2; exit}' /proc/mounts)
  if [[ -z $huge_dir ]]; then
    mkdir -p /dev/hugepages && mount -t hugetlbfs none /dev/hugepages && huge_dir=/dev/hugepages
  fi
  free=$(awk '/^HugePages_Free/ {print $2}' /proc/meminfo)
  if [[ -z $huge_dir ]] || ((free < need)); then
    echo "run_disk_bench.sh: fio-huge rows left out: $free free 2 MiB pages (need $need), hugetlbfs at '${huge_dir}'" >&2
    huge_dir=""
  fi
}
((quick)) || setup_huge

warm() { cat "$1" >/dev/null; }  # the VM pages cold memory out: warm right before each hot run

# fio <label> <file> <size> <bs> <depth> <direct> [extra fio options]: random reads
run_fio() { run_fio_rw randread "$@"; }

# fio_rw <randread|randwrite> <label> <file> <size> <bs> <depth> <direct> [extra fio options]
run_fio_rw() {
  local rw=$1 label=$2 file=$3 fsize=$4 bs=$5 depth=$6 direct=$7; shift 7
  fio --name=r --filename="$file" --size="$fsize" --rw="$rw" --bs="$bs" --iodepth="$depth" --direct="$direct" \
    --ioengine=io_uring --runtime="$(python3 -c "print(int($seconds * 1000))")ms" --time_based --norandommap --randrepeat=0 --lat_percentiles=1 \
    --output-format=json "$@" |
    python3 -c '
import json, sys
label, rw, bs, depth = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
job = json.load(sys.stdin)["jobs"][0]
r = job["write" if rw == "randwrite" else "read"]
lat = r["lat_ns"]
row = {"label": label, "bs": bs, "depth": depth, "iops": r["iops"], "mibs": r["bw_bytes"] / 2**20,
       "mean_us": lat["mean"] / 1e3, "p50_us": lat["percentile"]["50.000000"] / 1e3,
       "p99_us": lat["percentile"]["99.000000"] / 1e3}
sync = job.get("sync", {})
if sync.get("total_ios"):
    # --fdatasync=1: fio times the write and its fdatasync apart; one of
    # our operations is the pair. Percentiles add up only approximately
    # (the sum of the two p50s, of the two p99s); the table uses 1 / rate
    # for the mean cycle instead of these means.
    s = sync["lat_ns"]
    row["mean_us"] += s["mean"] / 1e3
    row["p50_us"] += s["percentile"]["50.000000"] / 1e3
    row["p99_us"] += s["percentile"]["99.000000"] / 1e3
print(json.dumps(row))' "$label" "$rw" "$(numfmt --from=iec "$bs")" "$depth" >>"$results"
}

# coio <label> <disk_bench options>
run_coio() {
  local label=$1; shift
  "$bench" --seconds="$seconds" "$@" |
    python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); d["label"] = sys.argv[1]; print(json.dumps(d))' \
      "$label" >>"$results"
}

# Rows run in this order on odd rounds and in reverse on even ones, so that
# no row always runs first (the disk drifts within minutes).
in_round_order() {  # round rows...
  local round=$1; shift
  if ((round % 2)); then printf '%s\n' "$@"; else printf '%s\n' "$@" | tac; fi
}

# Runs `runner row bs depth` for every row, every round, in round order.
run_rounds() {  # title runner bs depth rows...
  local title=$1 runner=$2 bs=$3 depth=$4 round row; shift 4
  for round in $(seq "$rounds"); do
    echo "$title, round $round" >&2
    for row in $(in_round_order "$round" "$@"); do
      "$runner" "$row" "$bs" "$depth"
    done
  done
}

# The rows of one O_DIRECT case.
cold_rows() {  # bs depth
  local bs=$1 depth=$2
  echo fio fio-fixed coio-epoll coio-uring
  # Like fio's, coio's buffers are on 4 KiB pages (--thp=0); the pool's
  # default, transparent huge pages, is shown apart where it matters.
  if [[ $bs != 4k ]]; then echo coio-epoll-THP coio-uring-THP; fi
  if [[ $bs != 4k && -n $huge_dir ]]; then echo fio-huge fio-fixed-huge; fi
  # When the reactor's ring posts completions (UringReactor::Options::taskRun;
  # coio-uring itself is the default, deferred).
  if [[ $bs == 4k ]]; then echo coio-uring-immediate coio-uring-cooperative; fi
  # The submission patterns, where they matter.
  if [[ $bs == 4k && $depth != 1 ]]; then echo coio-uring-never-eager coio-uring-always-eager "coio-uring-ReadBatch$depth"; fi
}

run_cold_row() {  # label bs depth
  local label=$1 bs=$2 depth=$3
  local common=(--file="$cold" --bs="$(numfmt --from=iec "${bs^^}")" --depth="$depth" --direct=1 --fixed=1)
  case $label in
    fio) run_fio fio "$cold" "$size" "${bs^^}" "$depth" 1 ;;
    fio-fixed) run_fio fio-fixed "$cold" "$size" "${bs^^}" "$depth" 1 --fixedbufs=1 --registerfiles=1 ;;
    fio-huge) run_fio fio-huge "$cold" "$size" "${bs^^}" "$depth" 1 --mem="mmaphuge:$huge_dir/coio-fio.$$" \
      --hugepage-size=2M ;;
    fio-fixed-huge) run_fio fio-fixed-huge "$cold" "$size" "${bs^^}" "$depth" 1 --fixedbufs=1 --registerfiles=1 \
      --mem="mmaphuge:$huge_dir/coio-fio.$$" --hugepage-size=2M ;;
    coio-epoll | coio-uring) run_coio "$label" --engine="${label#coio-}" "${common[@]}" --thp=0 ;;
    coio-epoll-THP | coio-uring-THP) run_coio "$label" --engine="${label:5:5}" "${common[@]}" ;;
    coio-uring-immediate | coio-uring-cooperative)
      run_coio "$label" --engine=uring --taskrun="${label#coio-uring-}" "${common[@]}" --thp=0 ;;
    coio-uring-never-eager) run_coio "$label" --engine=uring "${common[@]}" --thp=0 --eager-below=0 ;;
    coio-uring-always-eager) run_coio "$label" --engine=uring "${common[@]}" --thp=0 --eager-below=100000 ;;
    coio-uring-ReadBatch*) run_coio "$label" --engine=uring "${common[@]}" --thp=0 --batch="$depth" ;;
    *) echo "run_disk_bench.sh: no row $label" >&2; exit 2 ;;
  esac
}

cold_cases=("4k 1" "4k 32" "4k 128" "512k 8" "512k 32" "4m 8" "4m 32")
((quick)) && cold_cases=("4k 32" "512k 8")
[[ -n $cases ]] && IFS=, read -r -a cold_cases <<<"$cases"
for c in "${cold_cases[@]}"; do
  read -r bs depth <<<"$c"
  # shellcheck disable=SC2046  # one word per row
  run_rounds "O_DIRECT random reads, bs=$bs depth=$depth" run_cold_row "$bs" "$depth" $(cold_rows "$bs" "$depth")
done

# The rows of one O_DIRECT random-write case, on the cold file: fio's
# io_uring write job and coio's single writes (File::writeFixed) and
# WriteBatch, all with registered buffers and file except plain fio; like
# fio's, coio's buffers are on 4 KiB pages, huge pages shown apart.
write_rows() {  # bs depth
  echo write-fio write-fio-fixed write-coio-epoll write-coio-uring "write-coio-uring-WriteBatch$2"
  if [[ $1 != 4k ]]; then echo write-coio-uring-THP; fi
}

run_write_row() {  # label bs depth
  local label=$1 bs=$2 depth=$3
  local common=(--file="$cold" --rw=randwrite --bs="$(numfmt --from=iec "${bs^^}")" --depth="$depth" --direct=1 --fixed=1)
  case $label in
    write-fio) run_fio_rw randwrite "$label" "$cold" "$size" "${bs^^}" "$depth" 1 ;;
    write-fio-fixed) run_fio_rw randwrite "$label" "$cold" "$size" "${bs^^}" "$depth" 1 --fixedbufs=1 --registerfiles=1 ;;
    write-coio-epoll | write-coio-uring) run_coio "$label" --engine="${label#write-coio-}" "${common[@]}" --thp=0 ;;
    write-coio-uring-THP) run_coio "$label" --engine=uring "${common[@]}" ;;
    write-coio-uring-WriteBatch*) run_coio "$label" --engine=uring "${common[@]}" --thp=0 --batch="$depth" ;;
    *) echo "run_disk_bench.sh: no row $label" >&2; exit 2 ;;
  esac
}

# Durable writes: a 4 KiB O_DIRECT write, then fdatasync, one at a time.
run_fsync_row() {  # label (bs and depth are fixed)
  case $1 in
    fsync-fio) run_fio_rw randwrite fsync-fio "$cold" "$size" 4K 1 1 --fdatasync=1 ;;
    fsync-coio-epoll | fsync-coio-uring)
      run_coio "$1" --engine="${1#fsync-coio-}" --file="$cold" --rw=randwrite --bs=4096 --depth=1 --direct=1 --fixed=1 \
        --thp=0 --fdatasync=1 ;;
    *) echo "run_disk_bench.sh: no row $1" >&2; exit 2 ;;
  esac
}

write_cases=("4k 32" "512k 32")
for c in "${write_cases[@]}"; do
  ((write_tables)) || break
  read -r bs depth <<<"$c"
  # shellcheck disable=SC2046  # one word per row
  run_rounds "O_DIRECT random writes, bs=$bs depth=$depth" run_write_row "$bs" "$depth" $(write_rows "$bs" "$depth")
done
if ((write_tables)); then
  run_rounds "4 KiB O_DIRECT write + fdatasync, depth 1" run_fsync_row 4k 1 fsync-fio fsync-coio-epoll fsync-coio-uring
fi

run_hot_row() {  # label (bs and depth are fixed)
  local common=(--file="$hot" --bs=4096 --depth=32 --direct=0 --latency=0)
  warm "$hot"
  case $1 in
    hot-raw) run_coio hot-raw --engine=raw "${common[@]}" ;;
    hot-coio-epoll | hot-coio-uring) run_coio "$1" --engine="${1#hot-coio-}" "${common[@]}" ;;
    hot-coio-*-ReadBatch32) run_coio "$1" --engine="${1:9:5}" "${common[@]}" --batch=32 ;;
    hot-fio) run_fio hot-fio "$hot" "$hotsize" 4K 32 0 --invalidate=0 ;;
    *) echo "run_disk_bench.sh: no row $1" >&2; exit 2 ;;
  esac
}

if ((hot_table)); then
  run_rounds "page-cache-hot 4 KiB random reads, depth 32" run_hot_row 4k 32 hot-raw hot-coio-epoll \
    hot-coio-epoll-ReadBatch32 hot-coio-uring hot-coio-uring-ReadBatch32 hot-fio
fi

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
    for k in ("iops", "mibs", "mean_us", "p50_us", "p99_us"):
        if k in row:
            row[k] = median(g[k] for g in group)
    row["range"] = f"{min(g['iops'] for g in group):.0f}–{max(g['iops'] for g in group):.0f}" if len(group) > 1 else "-"
    rows.append(row)
def kind(r):
    return next((p for p in ("hot", "write", "fsync") if r["label"].startswith(p + "-")), "cold")
cold = [r for r in rows if kind(r) == "cold"]
hot = [r for r in rows if kind(r) == "hot"]
writes = [r for r in rows if kind(r) == "write"]
fsyncs = [r for r in rows if kind(r) == "fsync"]
def ratio(a, b): return f"{a / b:.2f}" if a and b else "-"
def size(bs): return f"{bs // 2**20} MiB" if bs >= 2**20 else f"{bs // 1024} KiB"

# One table row per run of each case, with its ratios to the case's fio rows.
def transfer_table(rows, prefix):
    # IOPS / fio-fixed-huge: coio's huge-page (THP) rows against fio with
    # registered buffers on huge pages, where the script could reserve them.
    print("| bs | depth | run | IOPS | IOPS range | MiB/s | p50 µs | p99 µs | IOPS / fio | IOPS / fio-fixed | "
          "IOPS / fio-fixed-huge | p50 / fio | p99 / fio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for bs, depth in dict.fromkeys((r["bs"], r["depth"]) for r in rows):
        group = [r for r in rows if (r["bs"], r["depth"]) == (bs, depth)]
        fio = next(r for r in group if r["label"] == prefix + "fio")
        fixed = next(r for r in group if r["label"] == prefix + "fio-fixed")
        huge = next((r for r in group if r["label"] == prefix + "fio-fixed-huge"), None)
        for r in group:
            print(f"| {size(bs)} | {depth} | {r['label'][len(prefix):]} | {r['iops']:.0f} | {r['range']} | {r['mibs']:.0f} | "
                  f"{r['p50_us']:.0f} | {r['p99_us']:.0f} | {ratio(r['iops'], fio['iops'])} | "
                  f"{ratio(r['iops'], fixed['iops'])} | {ratio(r['iops'], huge['iops']) if huge else '-'} | "
                  f"{ratio(r['p50_us'], fio['p50_us'])} | {ratio(r['p99_us'], fio['p99_us'])} |")

if cold:
    print("\n## O_DIRECT random reads, 4 GiB file: coio (registered buffers and file) vs fio (io_uring engine)\n")
    transfer_table(cold, "")
if writes:
    print("\n## O_DIRECT random writes, same file: coio (File::writeFixed, WriteBatch; registered buffers and file) "
          "vs fio (io_uring engine); goal: IOPS / fio >= 0.95\n")
    transfer_table(writes, "write-")
if fsyncs:
    print("\n## 4 KiB O_DIRECT write + fdatasync, depth 1: coio (writeFixed, then File::fdatasync) vs fio --fdatasync=1\n")
    print("µs per write is 1 / rate: at depth 1 the whole cycle of a write and its fdatasync, measured the same "
          "way for both (fio times the write and the fdatasync apart, and the sum of its two means fell short of "
          "its 1 / rate in our runs). fio's p50 / p99 are the sums of the two (an approximation).\n")
    print("| run | writes/s | IOPS range | µs per write | p50 µs | p99 µs | writes/s / fio | p99 / fio |")
    print("|---|---|---|---|---|---|---|---|")
    fio = next(r for r in fsyncs if r["label"] == "fsync-fio")
    for r in fsyncs:
        print(f"| {r['label'][6:]} | {r['iops']:.0f} | {r['range']} | {1e6 / r['iops']:.0f} | {r['p50_us']:.0f} | "
              f"{r['p99_us']:.0f} | {ratio(r['iops'], fio['iops'])} | {ratio(r['p99_us'], fio['p99_us'])} |")

if not hot:
    sys.exit(0)
print("\n## Page-cache-hot 4 KiB random reads, 1 GiB file, depth 32 (CPU-bound), vs the raw liburing loop\n")
print("| run | IOPS | IOPS range | IOPS / raw |")
print("|---|---|---|---|")
raw = next(r for r in hot if r["label"] == "hot-raw")
for r in hot:
    print(f"| {r['label'][4:]} | {r['iops']:.0f} | {r['range']} | {ratio(r['iops'], raw['iops'])} |")
PY
