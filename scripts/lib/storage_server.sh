# Sourced by the scripts that run coio-storage-server in the background
# (scripts/demo.sh, tests/bench/storage/*.sh).
#   start_storage_server SERVER_BINARY LOG TRIES serve-arguments...
# starts `SERVER_BINARY serve-arguments...` with its output in LOG and waits
# (TRIES x 0.1 s at most) for its "listening on ADDR" line. Sets
# $server_pid, and $address (empty if the server died or never listened).
start_storage_server() {
  local binary=$1 log=$2 tries=$3
  shift 3
  "$binary" "$@" >"$log" 2>&1 &
  server_pid=$!
  address=""
  for _ in $(seq "$tries"); do
    address=$(sed -n 's/^listening on //p' "$log")
    [[ -n $address ]] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
}

# Stops the server started above (SIGTERM, then waits), if it still runs.
stop_storage_server() {
  if [[ -n ${server_pid:-} ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}

# CPU accounting of a bench run (tests/bench/storage/*.sh):
#   cpu_ticks PID        utime + stime of a running process, in clock ticks (getconf CLK_TCK)
#   children_cpu FILE    CPU seconds of the waited-for children of the shell, from `times >FILE`
#                        (times must run in the script's shell, not in a $(...) subshell)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
children_cpu() { python3 -c '
import re, sys
print(sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", open(sys.argv[1]).read().splitlines()[1])))' "$1"; }

# An EXIT trap for a script that runs processes in the background: SIGTERM to
# each of $pids, waits for them, then removes $work.
stop_pids_and_remove_work() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
