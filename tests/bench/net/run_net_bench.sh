#!/usr/bin/env bash
# net_bench beside the references, same message sizes, same CPU placement:
#   streaming, 1 MiB messages, 1 connection  vs  iperf3 -l 1M (single stream)
#   request/response, 64 B, 1 connection     vs  sockperf ping-pong -m 64
#   request/response, 64 B, 64 connections   vs  the same sockperf figure
#     (sockperf cannot ping-pong over many connections at once)
# Each figure is the median of --rounds runs; a markdown table of figures
# and ratios to the reference goes to stdout, then the median and range of
# the ratios taken within each round.
#   run_net_bench.sh [--build-dir build-bench] [--seconds 3] [--rounds 3]
#                    [--placement pinned|unpinned] [--tests stream,rr1,rr64]
# --tests: which rows to run (default all three; the references are run
# only for the rows that need them). The uring reactor runs with its
# default recv mode (adaptive); each row also measures it with plain recvs
# only (net_bench --recv plain, the default before session 9). The rr1 row
# also measures it with a multishot recv from the first read (--recv
# multishot), with TaskRun::cooperative (the default before session 4),
# and raw liburing doing the same (uring_rr: no coio; ring flags as the
# reactor's default, then with a multishot recv): the floor under coio's
# uring figures.
# pinned: both ends on CPU 0 (this VM charges ~35-40 us per cross-CPU wake-up).
set -euo pipefail
cd "$(dirname "$0")/../../.."

build_dir=build-bench seconds=3 rounds=3 placement=pinned tests=stream,rr1,rr64
while (($#)); do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --placement) placement=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    *) echo "run_net_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
bench=$build_dir/tests/bench/net/net_bench
raw=$build_dir/tests/bench/net/uring_rr
for b in "$bench" "$raw"; do
  [[ -x $b ]] || { echo "build $b first (cmake --build $build_dir --target net_bench uring_rr)" >&2; exit 1; }
done
for tool in iperf3 sockperf taskset python3 ss; do
  command -v $tool >/dev/null || { echo "missing $tool (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
pin=()
[[ $placement == pinned ]] && pin=(taskset -c 0)

port=$((20000 + RANDOM % 20000))
server="" result=""
trap '[[ -n $server ]] && kill $server 2>/dev/null || true' EXIT

# Without connecting: sockperf's server exits when a client connects and leaves.
wait_for_port() {
  for _ in $(seq 100); do
    [[ -n $(ss -ltnH "sport = :$1") ]] && return 0
    sleep 0.05
  done
  echo "server on port $1 did not start" >&2
  return 1
}

iperf3_gbps() {
  port=$((port + 1))
  "${pin[@]}" iperf3 -s -1 -p $port >/dev/null 2>&1 &
  server=$!
  wait_for_port $port
  local json
  json=$("${pin[@]}" iperf3 -c 127.0.0.1 -p $port -t "$seconds" -l 1M -J)
  wait $server || true
  server=""
  result=$(python3 -c 'import json, sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))' <<<"$json")
}

sockperf_rate() {
  port=$((port + 1))
  "${pin[@]}" sockperf sr --tcp -i 127.0.0.1 -p $port >/dev/null 2>&1 &
  server=$!
  wait_for_port $port
  local out
  out=$("${pin[@]}" sockperf pp --tcp -i 127.0.0.1 -p $port -m 64 -t "$seconds" 2>&1)
  kill $server; wait $server 2>/dev/null || true
  server=""
  # "[Valid Duration] RunTime=1.550 sec; SentMessages=41795; ReceivedMessages=41795"
  result=$(python3 -c '
import re, sys
m = re.search(r"\[Valid Duration\] RunTime=([0-9.]+) sec;.*ReceivedMessages=([0-9]+)", sys.stdin.read())
print("%.0f" % (int(m.group(2)) / float(m.group(1))))' <<<"$out")
}

coio_figure() {  # reactor mode connections size [net_bench options]
  local reactor=$1 mode=$2 connections=$3 size=$4; shift 4
  result=$("${pin[@]}" "$bench" --reactor "$reactor" --mode "$mode" --connections "$connections" --size "$size" \
    --seconds "$seconds" "$@" | sed 's/.*=//')
}
raw_figure() {  # [uring_rr options]
  result=$("${pin[@]}" "$raw" --seconds "$seconds" "$@" | sed 's/.*=//')
}
want() { [[ ,$tests, == *,$1,* ]]; }

# shellcheck source=../stats.sh
source tests/bench/stats.sh
ratio() { python3 -c "print('%.2f' % ($1 / $2))"; }

declare -A samples
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round/$rounds" >&2
  # The functions set $result (not echo it): they keep $port and $server here.
  if want stream; then iperf3_gbps; samples[iperf3]+=" $result"; fi
  if want rr1 || want rr64; then sockperf_rate; samples[sockperf]+=" $result"; fi
  for reactor in epoll uring; do
    if want stream; then coio_figure $reactor stream 1 1048576; samples[$reactor-stream]+=" $result"; fi
    if want rr1; then coio_figure $reactor rr 1 64; samples[$reactor-rr1]+=" $result"; fi
    if want rr64; then coio_figure $reactor rr 64 64; samples[$reactor-rr64]+=" $result"; fi
  done
  if want stream; then coio_figure uring stream 1 1048576 --recv plain; samples[plain-stream]+=" $result"; fi
  if want rr1; then coio_figure uring rr 1 64 --recv plain; samples[plain-rr1]+=" $result"; fi
  if want rr64; then coio_figure uring rr 64 64 --recv plain; samples[plain-rr64]+=" $result"; fi
  if want rr1; then
    coio_figure uring rr 1 64 --recv multishot; samples[multishot-rr1]+=" $result"
    coio_figure uring rr 1 64 --taskrun cooperative; samples[uring-cooperative-rr1]+=" $result"
    raw_figure --size 64; samples[raw-rr1]+=" $result"
    raw_figure --size 64 --multishot 1; samples[raw-multishot-rr1]+=" $result"
  fi
done

declare -A m
for key in "${!samples[@]}"; do
  # shellcheck disable=SC2086
  m[$key]=$(median ${samples[$key]})
done

echo "Placement: $placement; $seconds s per run; median of $rounds rounds; $(nproc) vCPUs, kernel $(uname -r)."
echo
echo "| test | reference | coio epoll | ratio | coio uring | ratio |"
echo "|---|---|---|---|---|---|"
if want stream; then
  echo "| streaming 1 MiB messages, 1 connection (Gbit/s) | iperf3 ${m[iperf3]} | ${m[epoll-stream]} | $(ratio ${m[epoll-stream]} ${m[iperf3]}) | ${m[uring-stream]} | $(ratio ${m[uring-stream]} ${m[iperf3]}) |"
  echo "| same, uring with RecvMode::plain | iperf3 ${m[iperf3]} | - | - | ${m[plain-stream]} | $(ratio ${m[plain-stream]} ${m[iperf3]}) |"
fi
if want rr1; then
  echo "| request/response 64 B, 1 connection (round trips/s) | sockperf ${m[sockperf]} | ${m[epoll-rr1]} | $(ratio ${m[epoll-rr1]} ${m[sockperf]}) | ${m[uring-rr1]} | $(ratio ${m[uring-rr1]} ${m[sockperf]}) |"
  echo "| same, uring with RecvMode::plain | sockperf ${m[sockperf]} | - | - | ${m[plain-rr1]} | $(ratio ${m[plain-rr1]} ${m[sockperf]}) |"
  echo "| same, uring with RecvMode::multishot | sockperf ${m[sockperf]} | - | - | ${m[multishot-rr1]} | $(ratio ${m[multishot-rr1]} ${m[sockperf]}) |"
  echo "| same, uring with TaskRun::cooperative | sockperf ${m[sockperf]} | - | - | ${m[uring-cooperative-rr1]} | $(ratio ${m[uring-cooperative-rr1]} ${m[sockperf]}) |"
  echo "| same, raw liburing (uring_rr, no coio), default ring flags | sockperf ${m[sockperf]} | - | - | ${m[raw-rr1]} | $(ratio ${m[raw-rr1]} ${m[sockperf]}) |"
  echo "| same, raw liburing, multishot recv + provided buffers | sockperf ${m[sockperf]} | - | - | ${m[raw-multishot-rr1]} | $(ratio ${m[raw-multishot-rr1]} ${m[sockperf]}) |"
fi
if want rr64; then
  echo "| request/response 64 B, 64 connections (round trips/s) | sockperf (1 conn) ${m[sockperf]} | ${m[epoll-rr64]} | $(ratio ${m[epoll-rr64]} ${m[sockperf]}) | ${m[uring-rr64]} | $(ratio ${m[uring-rr64]} ${m[sockperf]}) |"
  echo "| same, uring with RecvMode::plain | sockperf (1 conn) ${m[sockperf]} | - | - | ${m[plain-rr64]} | $(ratio ${m[plain-rr64]} ${m[sockperf]}) |"
fi
if want rr1; then
  echo
  echo "coio uring / raw liburing, request/response (same ring flags and pinning), plain recvs:" \
    "$(ratio ${m[plain-rr1]} ${m[raw-rr1]}); both with a multishot recv: $(ratio ${m[multishot-rr1]} ${m[raw-multishot-rr1]});" \
    "coio's default (adaptive) / raw multishot: $(ratio ${m[uring-rr1]} ${m[raw-multishot-rr1]})"
fi

# Each round runs the reference and coio minutes apart at most: the ratio
# within a round cancels the drift between rounds. Median and range of those.
round_ratios() {  # key reference-key
  # shellcheck disable=SC2086
  python3 - ${samples[$1]} -- ${samples[$2]} <<'PY'
import random, statistics, sys
args = sys.argv[1:]
cut = args.index("--")
ratios = sorted(float(a) / float(b) for a, b in zip(args[:cut], args[cut + 1:]))
text = "%.2f (%.2f-%.2f" % (statistics.median(ratios), ratios[0], ratios[-1])
if len(ratios) >= 10:  # a bootstrap 95 % interval of the median, seeded: the same rounds print the same
    rng = random.Random(1)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(4000))
    text += "; median's 95 %% CI %.3f-%.3f" % (medians[100], medians[3899])
print(text + ")")
PY
}
echo
echo "Per-round ratios, median (range; from 10 rounds on, a bootstrap 95 % interval of that median):"
if want stream; then
  echo "- streaming vs iperf3: epoll $(round_ratios epoll-stream iperf3), uring $(round_ratios uring-stream iperf3)," \
    "uring plain $(round_ratios plain-stream iperf3)"
fi
if want rr1; then
  echo "- request/response, 1 connection, vs sockperf: epoll $(round_ratios epoll-rr1 sockperf)," \
    "uring $(round_ratios uring-rr1 sockperf), uring plain $(round_ratios plain-rr1 sockperf)," \
    "uring multishot $(round_ratios multishot-rr1 sockperf)," \
    "raw liburing $(round_ratios raw-rr1 sockperf)"
fi
