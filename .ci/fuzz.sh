#!/usr/bin/env bash
# Fuzzes the storage protocol's frame decoder with libFuzzer (clang, ASan,
# UBSan) for a bounded time, starting from the committed seed corpus, after
# checking the corpus still matches what the encoder writes.
#   .ci/fuzz.sh [seconds, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=tests/storage/fuzz
flags=(-std=c++20 -Iinclude -Iexamples/storage_server)

clang++ "${flags[@]}" -O1 "$src/make_corpus.cpp" -o "$work/make_corpus"
mkdir "$work/seeds"
"$work/make_corpus" "$work/seeds"
diff -r "$work/seeds" "$src/corpus" ||
  { echo "fuzz: $src/corpus is stale: regenerate it with make_corpus.cpp"; exit 1; }

clang++ "${flags[@]}" -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize=function \
  -fno-sanitize-recover=all "$src/frame_decoder_fuzz.cpp" -o "$work/fuzz"
mkdir "$work/found"
"$work/fuzz" -max_total_time="$seconds" -print_final_stats=1 "$work/found" "$src/corpus" 2>&1 | tail -15
echo "fuzz: no crash in ${seconds} s"
