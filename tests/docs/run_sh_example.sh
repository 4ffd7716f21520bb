#!/usr/bin/env bash
# Runs a shell example of the guides as a reader would, and fails if one of
# its commands fails:
#   tests/docs/run_sh_example.sh EXAMPLE.sh BIN_DIR
# EXAMPLE.sh is a ```sh run block, after its page's ```sh setup blocks, as
# scripts/extract_examples.py writes it. The harness gives it what the page
# says the reader has:
#   $bin   BIN_DIR, the build's examples/storage_server
#   $data  a fresh directory, removed at the end: in /dev/shm when there is one
#          (etcd fsyncs every write, and a disk busy with other writes stalls
#          it past the sleeps of a block; the servers read buffered there)
# and runs it with bash -eo pipefail, so that a check in the block (a test
# or a grep that finds nothing) fails it. Every fixed loopback port the block
# names (127.0.0.1:NNNN) is moved to a free one, so that tests running at
# once, or anything else listening on the machine, cannot collide with it.
# The block runs in its own session; whatever it leaves running (servers,
# etcd...) is killed when it ends, however it ends.
set -euo pipefail
example=$1 bin=$2
[[ -r $example && -x $bin/coio-storage-server ]] || { echo "usage: $0 EXAMPLE.sh BIN_DIR" >&2; exit 2; }
base=${TMPDIR:-/tmp}
[[ -d /dev/shm && -w /dev/shm ]] && base=/dev/shm
data=$(mktemp -d "$base/coio-docs-XXXXXX")
session=""
cleanup() {
  [[ -z $session ]] || kill -KILL -- "-$session" 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The block with its ports moved: each distinct fixed port to one free now, below
# the ephemeral range (tests/free_ports.py: no test's connection or bind(0) takes it).
PYTHONPATH="$(dirname "$0")/.." python3 - "$example" "$data/example.sh" <<'PY'
import re, sys
from free_ports import free_ports
text = open(sys.argv[1]).read()
fixed = list(dict.fromkeys(re.findall(r"127\.0\.0\.1:(\d{2,5})\b", text)))
moved = dict(zip(fixed, map(str, free_ports(len(fixed)))))
text = re.sub(r"(127\.0\.0\.1:)(\d{2,5})\b", lambda m: m.group(1) + moved[m.group(2)], text)
open(sys.argv[2], "w").write(text)
print("ports moved: " + (", ".join(f"{a} -> {b}" for a, b in moved.items()) or "none"))
PY

cd "$data"
bin=$bin data=$data setsid bash -eo pipefail -x example.sh &
session=$!
status=0
wait "$session" || status=$?
echo "the example exited with status $status"
if ((status != 0)); then
  # What the block wrote aside (a program's stderr redirected to a file, say): the
  # lines that say why are often there, and $data is removed on exit.
  for f in "$data"/*.txt "$data"/*.log; do
    [[ -f $f ]] || continue
    echo "--- the last 40 lines of ${f#"$data"/}:"
    tail -n 40 "$f"
  done
fi
exit "$status"
