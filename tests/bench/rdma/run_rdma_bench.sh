#!/usr/bin/env bash
# Runs rdma_bench beside perftest (ib_write_bw, ib_read_bw, ib_send_bw) on
# the same device with the same message sizes, iteration counts and depth,
# and prints a Markdown table of the ratios (coio / perftest). Needs an RDMA
# device: run it in the Soft-RoCE guest (tests/rdma/vm/run.sh) or on real
# hardware.
#   run_rdma_bench.sh BUILD_DIR
# Environment: COIO_RDMA_DEVICE (default: rxe0), COIO_RDMA_GID_INDEX for
# perftest (default 1: Soft-RoCE's IPv4 RoCE v2 GID), COIO_BENCH_SERVER_IP
# (default: $COIO_VM_IP or 127.0.0.1), COIO_BENCH_DEPTH (default 16),
# COIO_BENCH_SCALE (multiplies the iteration counts; default 1),
# COIO_BENCH_ROUNDS (default 3: each row alternates perftest and coio that
# many times and reports the medians; adjacent runs here differ by ±8 %).
set -euo pipefail
build=${1:?usage: run_rdma_bench.sh BUILD_DIR}
bench=$build/tests/bench/rdma/rdma_bench
dev=${COIO_RDMA_DEVICE:-rxe0}
gid=${COIO_RDMA_GID_INDEX:-1}
ip=${COIO_BENCH_SERVER_IP:-${COIO_VM_IP:-127.0.0.1}}
depth=${COIO_BENCH_DEPTH:-16}
scale=${COIO_BENCH_SCALE:-1}
rounds=${COIO_BENCH_ROUNDS:-3}
export COIO_RDMA_DEVICE=$dev
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# perftest: server in the background, client against it; prints BW average
# (MiB/s) and message rate (Mpps) from the client's result line.
perftest() {
  local tool=$1 size=$2 iters=$3
  local args=(-d "$dev" -x "$gid" -s "$size" -n "$iters" -F)
  case $tool in
    ib_read_bw) args+=(-o "$depth") ;;
    *) args+=(-t "$depth") ;;
  esac
  timeout 300 "$tool" "${args[@]}" >"$work/server" 2>&1 &
  local server=$!
  wait_listening 18515 30 || { kill "$server" 2>/dev/null; return 1; }
  if ! timeout 300 "$tool" "${args[@]}" "$ip" >"$work/client" 2>&1; then
    wait "$server" || true
    cat "$work/client" "$work/server" >&2
    return 1
  fi
  wait "$server" || true
  # columns: #bytes #iterations BW-peak BW-average MsgRate
  awk -v s="$size" '$1 == s && NF >= 5 { print $4, $5; exit }' "$work/client"
}

ours() {  # op size iters [rdma_bench options]
  local op=$1 size=$2 iters=$3; shift 3
  "$bench" "$op" --size "$size" --iters "$iters" --depth "$depth" "$@" | awk '$1 == "RESULT" { print $4, $5 }'
}

# shellcheck source=../listen.sh
source "$(dirname "${BASH_SOURCE[0]}")/../listen.sh"
# shellcheck source=../stats.sh
source "$(dirname "${BASH_SOURCE[0]}")/../stats.sh"

echo "| test | size | iterations | depth | perftest (median; range) | coio (median; range) | ratio of medians |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
status=0
row() {  # label tool op size iters metric(1=MiB/s,2=Mmsg/s) unit [rdma_bench options]
  local label=$1 tool=$2 op=$3 size=$4 iters=$(($5 * scale)) metric=$6 unit=$7; shift 7
  local p c ps=() cs=()
  for ((round = 1; round <= rounds; ++round)); do
    p=$(perftest "$tool" "$size" "$iters" | cut -d' ' -f"$metric") || { echo "$tool failed" >&2; status=1; return; }
    c=$(ours "$op" "$size" "$iters" "$@" | cut -d' ' -f"$metric") || { echo "rdma_bench $op failed" >&2; status=1; return; }
    [[ -n $p && -n $c ]] || { echo "no result for $label" >&2; status=1; return; }
    ps+=("$p") cs+=("$c")
  done
  p=$(median "${ps[@]}") c=$(median "${cs[@]}")
  echo "| $label | $size | $iters | $depth | $p $unit; $(range "${ps[@]}") | $c $unit; $(range "${cs[@]}") | $(awk -v a="$c" -v b="$p" 'BEGIN { printf "%.2f", a / b }') |"
}
row "RDMA WRITE bandwidth" ib_write_bw write 65536 1000 1 MiB/s
row "RDMA WRITE bandwidth" ib_write_bw write 1048576 100 1 MiB/s
row "RDMA READ bandwidth" ib_read_bw read 65536 1000 1 MiB/s
row "RDMA READ bandwidth" ib_read_bw read 1048576 100 1 MiB/s
# perftest's sender and receiver are two processes: --split gives ours a
# reactor thread each too; the one-thread row shows what sharing one costs.
row "SEND message rate" ib_send_bw send 64 100000 2 Mmsg/s --split 1
row "SEND message rate, both queue pairs on one reactor thread" ib_send_bw send 64 100000 2 Mmsg/s
exit $status
