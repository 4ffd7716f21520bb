#!/usr/bin/env bash
# coio's storage server against the kernel's NVMe-oF target, side by side in one boot of the
# Soft-RoCE guest (tests/rdma/vm/run.sh), over RDMA and over TCP.
#
#   tests/bench/storage/run_nvmet_compare.sh [LABEL=BUILD_DIR[:SERVER_ARGS[:BENCH_ARGS]]]...
#
# With no argument, one variant: coio=build-rdma-ci with $SERVER_ARGS. Several variants (builds of
# two commits, one build with two server settings, or with more bench options, e.g.
# `two=build:--reactors 2:--connections 2`) are each measured in every round, so their ratios
# come from the same boot. Run on the host: it builds what is missing (a BUILD_DIR without
# a CMakeCache is configured with RDMA on), boots the guest and runs itself there. Host needs:
# fio and nvme-cli (`apt-get install fio nvme-cli`), the guest image's packages (build-image.sh
# installs them). Takes about 10 minutes with the defaults and one variant (TCG is slow); not in
# CI. Where the machine is shared, run it under the benchmark lock (flock).
#
# In the guest:
# - The data: a coio dataset of CHUNKS x 4 MiB chunks in ONE data file on the guest's tmpfs
#   (`coio-storage-server init --chunks-per-file CHUNKS`). Every reader reads that file through
#   the page cache: the kernel target's namespaces are backed by it (file backend, buffered_io=1)
#   and coio's servers serve it with --buffered.
# - The kernel target (nvmet, set up through configfs): two subsystems on the same file, one
#   exported by nvmet-rdma on rxe0 (COIO_VM_IP:4420), one by nvmet-tcp (COIO_VM_IP:4421), each
#   connected with `nvme connect` (nvme-cli, the kernel's host driver: nvme-rdma / nvme-tcp, its
#   default queues) and read by fio: io_uring engine, O_DIRECT on /dev/nvmeXnY, random reads,
#   one job, iodepth = the IOs in flight.
# - coio: a coio-storage-server per variant and transport (--transport rdma --rdma-device rxe0,
#   --transport tcp), all started once and idle while another is measured, each read by its
#   build's coio-storage-bench (random unaligned offsets, no --verify) with the same IOs in
#   flight: 4 KiB: 64 (batch 16 x depth 4), 512 KiB and 4 MiB: 8 (batch 2 x depth 4), over
#   CONNECTIONS connections.
# - Rounds: per round, per IO size and transport, nvmet and every variant back to back, the order
#   rotating from round to round. Each run is timed alone: throughput = bytes moved / run time
#   (fio's and the bench's own reports), CPU = the whole guest's busy time (/proc/stat: all but
#   idle and iowait, both vCPUs) from just before the reader starts to just after it exits, per
#   GiB moved. Everything in the guest counts: the reader, the target or server, interrupts, the
#   soft-RoCE and TCP stacks.
# - Checks: before the rounds, the first 4 MiB of each nvme device must equal the file's; after
#   them, a 2 s `--verify` run (512 KiB, every byte and CRC checked) per variant and transport
#   must report 0 errors.
#
# Output: a Markdown table per transport and IO size: MiB/s and CPU s per GiB of nvmet and of
# each variant (medians of the rounds), and coio / nvmet of both (median and range of the
# per-round ratios); with several variants also each one's throughput over the first's. Exits
# non-zero if a run fails or a check does. The guest is TCG-emulated: absolute figures swing by
# 2x between boots, only ratios measured in one boot carry.
#
# Environment (defaults in brackets):
#   ROUNDS [3]           rounds (at least 3 for a median)
#   DURATION [5]         seconds per run
#   SIZES ["4K 512K 4M"] IO sizes (4K, 512K, 4M)
#   TRANSPORTS ["rdma tcp"]
#   SERVER_ARGS [""]     more `coio-storage-server serve` options for the default variant
#   REACTORS [unset]     --reactors N for every server (unset: the server's default)
#   CONNECTIONS [1]      the bench's --connections (a variant's BENCH_ARGS may override it)
#   PERFTEST [0]         1: ib_write_bw (perftest, same message size, as many in flight) is a reader
#                        too over RDMA: the ceiling of user-space verbs on the device
#   NVME_IO_QUEUES [unset]  `nvme connect --nr-io-queues` (unset: the host driver's default, one
#                        per CPU); each I/O queue of nvme-rdma is a queue pair
#   NVME_DIGEST [0]      1: nvme-tcp connects with `--data-digest`: nvmet-tcp and its host then
#                        compute and check a CRC32C of every data PDU, as coio does of every IO
#                        with the bench's `--checksums` (a variant's BENCH_ARGS): integrity on both
#                        sides (nvme-rdma has no data digest)
#   CHUNKS [64]          4 MiB chunks in the data file (256 MiB; the guest has COIO_VM_MEM MiB)
#   RESULTS [unset]      also write every run as a line to this file (in the shared work tree)
#   PERF [unset]         a folder (in the shared work tree): profile every run, the whole guest
#                        (perf record -a, cpu-clock), into PERF/TRANSPORT-SIZE-READER-rROUND.data,
#                        and write each one's report (by command, object, symbol) beside it as .txt.
#                        The profiler perturbs the figures: for finding where the time goes only
#   COIO_VM_TIMEOUT [3600], COIO_VM_MEM, COIO_VM_CACHE: as tests/rdma/vm/run.sh
set -euo pipefail
# One compound command: bash reads it whole before running it, so editing this file while a run
# goes on (it is long) cannot change what the run does.
{
root=$(cd "$(dirname "$0")/../../.." && pwd)
self=tests/bench/storage/run_nvmet_compare.sh
die() { echo "run_nvmet_compare.sh: $*" >&2; exit 1; }

variants=("$@")
((${#variants[@]})) || variants=("coio=build-rdma-ci:${SERVER_ARGS:-}")
labels=() builds=() args=() bench_args=()
for spec in "${variants[@]}"; do
  [[ $spec =~ ^([A-Za-z0-9._-]+)=([^:]+)(:([^:]*))?(:(.*))?$ ]] ||
    die "not LABEL=BUILD_DIR[:SERVER_ARGS[:BENCH_ARGS]]: $spec"
  labels+=("${BASH_REMATCH[1]}") builds+=("${BASH_REMATCH[2]}") args+=("${BASH_REMATCH[4]}")
  bench_args+=("${BASH_REMATCH[6]}")
done
rounds=${ROUNDS:-3}
duration=${DURATION:-5}
sizes=${SIZES:-4K 512K 4M}
transports=${TRANSPORTS:-rdma tcp}
connections=${CONNECTIONS:-1}
chunks=${CHUNKS:-64}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds"
[[ $connections =~ ^[1-9][0-9]*$ ]] || die "CONNECTIONS must be a positive integer"
[[ -z ${REACTORS:-} || ${REACTORS} =~ ^[1-9][0-9]*$ ]] || die "REACTORS must be a positive integer"
for s in $sizes; do [[ $s == 4K || $s == 512K || $s == 4M ]] || die "SIZES: $s is not 4K, 512K or 4M"; done
for t in $transports; do [[ $t == rdma || $t == tcp ]] || die "TRANSPORTS: $t is not rdma or tcp"; done

# ---- On the host: build, then boot the guest and run this script there.
if [[ -z ${COIO_VM:-} ]]; then
  cd "$root"
  command -v fio >/dev/null || die "no fio on this machine: apt-get install fio"
  command -v nvme >/dev/null || die "no nvme (nvme-cli) on this machine: apt-get install nvme-cli"
  for b in $(printf '%s\n' "${builds[@]}" | sort -u); do
    if [[ ! -f $b/CMakeCache.txt ]]; then
      cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOIO_WITH_RDMA=ON -DCOIO_WITH_URING=ON >/dev/null
    fi
    cmake --build "$b" -j "${JOBS:-$(nproc)}" --target coio-storage-server coio-storage-bench >/dev/null ||
      die "building $b failed"
  done
  echo "host: $(uptime)"
  export COIO_VM_PASS_ENV="ROUNDS DURATION SIZES TRANSPORTS SERVER_ARGS REACTORS CONNECTIONS NVME_IO_QUEUES PERFTEST CHUNKS
    RESULTS PERF NVME_DIGEST"
  set +e
  COIO_VM_TIMEOUT=${COIO_VM_TIMEOUT:-3600} COIO_VM_CWD="$root" tests/rdma/vm/run.sh -- bash "$self" "${variants[@]}"
  rc=$?
  set -e
  echo "host: $(uptime)"
  exit $rc
fi

# ---- In the guest.
source "$root/scripts/lib/storage_server.sh"
cd "$root"
ip=${COIO_VM_IP:?}
dev=${COIO_RDMA_DEVICE:-rxe0}
work=$(mktemp -d /tmp/nvmet-compare.XXXXXX)  # the guest's /tmp is tmpfs
pids=()
trap stop_pids_and_remove_work EXIT
nqn_prefix=nqn.2026-11.io.coio:nvmet-compare
cfs=/sys/kernel/config/nvmet

while read -r module; do
  insmod "/kmods/$module" 2>/dev/null || grep -q "^$(basename "$module" .ko | tr - _) " /proc/modules ||
    echo "insmod $module failed" >&2
done </kmods/nvme.list
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
[[ -d $cfs ]] || die "no nvmet in this guest kernel (is /kmods/nvme.list in the image? tests/rdma/vm/build-image.sh)"

# The data: one file, CHUNKS x 4 MiB.
"${builds[0]}/examples/storage_server/coio-storage-server" init --dir "$work/data" --chunks "$chunks" --chunk-size 4M \
  --chunks-per-file "$chunks" >/dev/null
file=$work/data/data-0
[[ -f $file && $(stat -c %s "$file") -eq $((chunks * 4 * 1024 * 1024)) ]] || die "init made no $file of $chunks x 4 MiB"

# The kernel target: a subsystem per transport, both on the file (two subsystems, so the host's
# native multipath does not merge the two controllers into one device).
declare -A nvme_dev
port=4420
for t in $transports; do
  nqn=$nqn_prefix-$t
  s=$cfs/subsystems/$nqn
  mkdir "$s"
  echo 1 >"$s/attr_allow_any_host"
  mkdir "$s/namespaces/1"
  echo -n "$file" >"$s/namespaces/1/device_path"
  echo 1 >"$s/namespaces/1/buffered_io"
  echo 1 >"$s/namespaces/1/enable"
  p=$cfs/ports/$port
  mkdir "$p"
  echo "$t" >"$p/addr_trtype"
  echo ipv4 >"$p/addr_adrfam"
  echo "$ip" >"$p/addr_traddr"
  echo "$port" >"$p/addr_trsvcid"
  ln -s "$s" "$p/subsystems/$nqn"
  digest=()
  [[ $t == tcp && ${NVME_DIGEST:-0} == 1 ]] && digest=(--data-digest)
  nvme connect -t "$t" -a "$ip" -s "$port" -n "$nqn" ${NVME_IO_QUEUES:+--nr-io-queues "$NVME_IO_QUEUES"} "${digest[@]}" \
    >/dev/null ||
    die "nvme connect -t $t failed"
  for _ in $(seq 100); do
    for b in /sys/block/nvme*; do
      [[ $(basename "$b") =~ ^nvme[0-9]+n[0-9]+$ && $(cat "$b/device/subsysnqn" 2>/dev/null) == "$nqn" ]] &&
        [[ -b /dev/$(basename "$b") ]] && nvme_dev[$t]=/dev/$(basename "$b")
    done
    [[ -n ${nvme_dev[$t]:-} ]] && break
    sleep 0.1
  done
  [[ -n ${nvme_dev[$t]:-} ]] || die "no block device for $nqn after nvme connect"
  dd if="${nvme_dev[$t]}" of="$work/head" bs=1M count=4 iflag=direct status=none
  cmp -n 4194304 "$work/head" "$file" || die "${nvme_dev[$t]} ($t) does not read the file's bytes"
  queues="?"
  for c in /sys/class/nvme/nvme*; do
    [[ $(cat "$c/subsysnqn" 2>/dev/null) == "$nqn" ]] && queues=$(($(cat "$c/queue_count") - 1))
  done
  echo "nvmet-$t: $nqn at $ip:$port, read through ${nvme_dev[$t]} ($queues I/O queues${digest:+, data digest})" >&2
  port=$((port + 1))
done
disconnect_all() {
  for t in $transports; do nvme disconnect -n "$nqn_prefix-$t" >/dev/null 2>&1 || true; done
  stop_pids_and_remove_work
}
trap disconnect_all EXIT

# coio: a server per variant and transport.
declare -A server_at
for i in "${!labels[@]}"; do
  for t in $transports; do
    extra=(--transport "$t" --buffered)
    [[ $t == rdma ]] && extra+=(--rdma-device "$dev")
    [[ -n ${REACTORS:-} ]] && extra+=(--reactors "$REACTORS")
    # shellcheck disable=SC2206  # the variant's options, split as a shell would
    extra+=(${args[$i]})
    start_storage_server "${builds[$i]}/examples/storage_server/coio-storage-server" "$work/server-$i-$t.log" 300 \
      serve --dir "$work/data" --listen "$ip:0" --pool 64M "${extra[@]}"
    pids+=("$server_pid")
    [[ -n $address ]] || { cat "$work/server-$i-$t.log" >&2; die "${labels[$i]}'s $t server did not start"; }
    server_at[$i-$t]=$address
    echo "${labels[$i]}-$t: $(head -1 "$work/server-$i-$t.log")" >&2
  done
done

bytes_of() { case $1 in 4K) echo 4096 ;; 512K) echo 524288 ;; 4M) echo 4194304 ;; esac; }
# The guest's busy clock ticks so far: every CPU's time but idle and iowait.
busy_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
hz=$(getconf CLK_TCK)

# One run; appends "transport size who MiB/s cpu-s-per-GiB" to $work/runs.
measure() {
  local t=$1 size=$2 who=$3 bs batch depth before after profile=()
  bs=$(bytes_of "$size")
  if [[ $size == 4K ]]; then batch=16 depth=4; else batch=2 depth=4; fi
  if [[ -n ${PERF:-} ]]; then
    local name=$who; [[ $who =~ ^[0-9]+$ ]] && name=${labels[$who]}
    profile=(perf record -q -a -e cpu-clock -F 499 -o "$PERF/$t-$size-$name-r$round.data" --)
  fi
  before=$(busy_ticks)
  if [[ $who == nvmet ]]; then
    "${profile[@]}" fio --name=nvmet --filename="${nvme_dev[$t]}" --ioengine=io_uring --direct=1 --rw=randread --bs="$bs" \
      --iodepth=$((batch * depth)) --time_based --runtime="$duration" --norandommap --randrepeat=0 \
      --output-format=json >"$work/run.json" 2>"$work/run.err" || { cat "$work/run.err" >&2; return 1; }
  elif [[ $who == ib_write_bw ]]; then
    local pt=(ib_write_bw -d "$dev" -x 1 -s "$bs" -t $((batch * depth)) -D "$duration" -F)
    timeout 120 "${pt[@]}" >"$work/pt-server" 2>&1 &
    local pt_server=$!
    sleep 1
    "${profile[@]}" timeout 120 "${pt[@]}" "$ip" >"$work/pt-client" 2>&1 || { cat "$work/pt-client" >&2; return 1; }
    wait "$pt_server" || true
    awk -v s="$bs" -v d="$duration" '$1 == s && NF >= 5 { printf "{\"mib_s\": %s, \"seconds\": %s}\n", $4, d; exit }' \
      "$work/pt-client" >"$work/run.json"
  else
    "${profile[@]}" "${builds[$who]}/examples/storage_server/coio-storage-bench" --address "${server_at[$who-$t]}" \
      --dir "$work/data" --transport "$t" --rdma-device "$dev" --io-size "$bs" --batch "$batch" --depth "$depth" \
      --connections "$connections" --duration "$duration" --json ${bench_args[$who]} >"$work/run.json" \
      2>"$work/run.err" || { cat "$work/run.err" >&2; return 1; }
  fi
  after=$(busy_ticks)
  python3 - "$work/run.json" "$who" "$((after - before))" "$hz" <<'PY' >>"$work/runs.line" || return 1
import json, sys
r = json.load(open(sys.argv[1]))
who, ticks, hz = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if who == "nvmet":
    job = r["jobs"][0]
    assert job["error"] == 0, job
    moved, seconds = job["read"]["io_bytes"], job["read"]["runtime"] / 1000
elif who == "ib_write_bw":
    moved, seconds = r["mib_s"] * 2**20 * r["seconds"], r["seconds"]
else:
    assert r["errors"]["total"] == 0, r["errors"]
    moved, seconds = r["bytes"], r["seconds"]
gib = moved / 2**30
assert gib > 0, r
print(f"{moved / seconds / 2**20:.2f} {ticks / hz / gib:.3f}")
PY
  echo "$t $size $who $(tail -1 "$work/runs.line")" >>"$work/runs"
}

status=0
: >"$work/runs"
whos=(nvmet "${!labels[@]}")
[[ ${PERFTEST:-0} == 1 ]] && whos=(nvmet ib_write_bw "${!labels[@]}")
for ((round = 1; round <= rounds; ++round)); do
  for size in $sizes; do
    for t in $transports; do
      n=${#whos[@]}
      for ((k = 0; k < n; ++k)); do
        who=${whos[$(((k + round - 1) % n))]}
        name=$who; [[ $who =~ ^[0-9]+$ ]] && name=${labels[$who]}
        [[ $who == ib_write_bw && $t != rdma ]] && continue
        if measure "$t" "$size" "$who"; then
          read -r mib cpu < <(tail -1 "$work/runs.line")
          echo "round $round: $t $size $name: $mib MiB/s, $cpu CPU s per GiB" >&2
        else
          echo "round $round: $t $size $name FAILED" >&2
          status=1
        fi
      done
    done
  done
done
[[ -n ${RESULTS:-} ]] && cp "$work/runs" "$RESULTS"
if [[ -n ${PERF:-} ]]; then
  for data in "$PERF"/*.data; do
    perf report -q -i "$data" --stdio --sort comm,dso,symbol --percent-limit 0.5 >"${data%.data}.txt" 2>/dev/null || true
  done
  echo "profiles: $PERF/*.txt" >&2
fi

python3 - "$work/runs" "${labels[@]}" <<'PY'
import collections, statistics, sys
labels = sys.argv[2:]
runs = collections.defaultdict(list)  # (transport, size, who) -> [(MiB/s, CPU s per GiB)] in round order
for line in open(sys.argv[1]):
    t, size, who, mib, cpu = line.split()
    runs[(t, size, who)].append((float(mib), float(cpu)))
def ratios(a, b, k):
    return [x[k] / y[k] for x, y in zip(a, b) if y[k] > 0]
def cell(rs):
    return f"**{statistics.median(rs):.2f}** ({min(rs):.2f}–{max(rs):.2f})" if rs else "–"
inflight = {"4K": "64 (16 x 4)", "512K": "8 (2 x 4)", "4M": "8 (2 x 4)"}
head = ("| transport | IO size | IOs in flight | reader | MiB/s | CPU s per GiB | MiB/s / nvmet's: median (range) "
        "| CPU per GiB / nvmet's |")
if len(labels) > 1:
    head += f" MiB/s / {labels[0]}'s |"
print(head)
print("|" + " --- |" * (head.count("|") - 1))
for t in ("rdma", "tcp"):
    for size in ("4K", "512K", "4M"):
        base = runs.get((t, size, "nvmet"))
        if not base:
            continue
        def row(name, rs, extra):
            print(f"| {t} | {size} | {inflight[size]} | {name} | {statistics.median(r[0] for r in rs):.1f} | "
                  f"{statistics.median(r[1] for r in rs):.3f} | {extra}")
        row("nvmet", base, "| |" + (" |" if len(labels) > 1 else ""))
        pt = runs.get((t, size, "ib_write_bw"))
        if pt:
            row("ib_write_bw", pt, f"{cell(ratios(pt, base, 0))} | {cell(ratios(pt, base, 1))} |" +
                (" |" if len(labels) > 1 else ""))
        first = runs.get((t, size, "0"), [])
        for i, label in enumerate(labels):
            rs = runs.get((t, size, str(i)))
            if not rs:
                continue
            extra = f"{cell(ratios(rs, base, 0))} | {cell(ratios(rs, base, 1))} |"
            if len(labels) > 1:
                extra += f" {cell(ratios(rs, first, 0)) if i else ''} |"
            row(label, rs, extra)
print(f"\nRounds: {len(next(iter(runs.values()), []))}. CPU: the whole guest's busy time (both vCPUs) per GiB moved.")
PY

for i in "${!labels[@]}"; do
  for t in $transports; do
    if "${builds[$i]}/examples/storage_server/coio-storage-bench" --address "${server_at[$i-$t]}" --dir "$work/data" \
      --transport "$t" --rdma-device "$dev" --io-size 512K --batch 2 --depth 4 --connections "$connections" \
      --duration 2 --verify --json ${bench_args[$i]} >"$work/verify.json" 2>"$work/verify.err" &&
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(r["errors"]["total"] != 0 or r["ios"] == 0)' \
        "$work/verify.json"; then
      echo "verify run (${labels[$i]}, $t, 512 KiB, 2 s, every byte and CRC checked): 0 errors"
    else
      echo "verify run (${labels[$i]}, $t) FAILED" >&2
      cat "$work/verify.err" "$work/verify.json" >&2 || true
      status=1
    fi
  done
done
exit $status
}
