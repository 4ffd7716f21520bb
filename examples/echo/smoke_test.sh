#!/usr/bin/env bash
# Starts echo_server on a free port, runs echo_client against it, stops the
# server with SIGTERM. Usage: smoke_test.sh <bin dir> <epoll|uring>
set -euo pipefail
bin=$1 reactor=$2
out=$(mktemp)
trap 'rm -f "$out"; kill "$server" 2>/dev/null || true' EXIT
"$bin/echo_server" --reactor "$reactor" --address 127.0.0.1:0 >"$out" &
server=$!
for _ in $(seq 100); do
  address=$(sed -n 's/.*listening on \(.*\)$/\1/p' "$out")
  [[ -n $address ]] && break
  sleep 0.1
done
[[ -n ${address:-} ]] || { echo "server did not start"; exit 1; }
"$bin/echo_client" --reactor "$reactor" --address "$address" --connections 8 --messages 200 --size 1000
kill -TERM "$server"
wait "$server"
grep -q "stopping" "$out"
