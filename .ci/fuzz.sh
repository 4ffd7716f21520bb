#!/usr/bin/env bash
# Fuzzes with libFuzzer (clang, ASan, UBSan) for a bounded time, split
# between two targets, each from its committed seed corpus: the storage
# protocol's frame decoder (after checking its corpus still matches what
# the encoder writes), and the etcd client's HTTP/1.1 response parser and
# JSON decoding (hand-written seeds: replies as etcd's gateway sends them).
#   .ci/fuzz.sh [seconds in all, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=tests/storage/fuzz
flags=(-std=c++20 -Iinclude -Iexamples/storage_server)
fuzz_flags=(-O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize=function -fno-sanitize-recover=all)

clang++ "${flags[@]}" -O1 "$src/make_corpus.cpp" -o "$work/make_corpus"
mkdir "$work/seeds"
"$work/make_corpus" "$work/seeds"
diff -r "$work/seeds" "$src/corpus" ||
  { echo "fuzz: $src/corpus is stale: regenerate it with make_corpus.cpp"; exit 1; }

# run <target> <corpus> <seconds>
run() {
  clang++ "${flags[@]}" "${fuzz_flags[@]}" "$src/$1.cpp" -o "$work/$1"
  mkdir "$work/found-$1"
  "$work/$1" -max_total_time="$3" -print_final_stats=1 "$work/found-$1" "$src/$2" 2>&1 | tail -15
  echo "fuzz: $1: no crash in $3 s"
}
run frame_decoder_fuzz corpus $((seconds / 2))
run etcd_reply_fuzz etcd_corpus $((seconds - seconds / 2))
