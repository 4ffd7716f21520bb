# Sourced by the benchmark scripts. wait_listening PORT [SECONDS]: returns
# once a TCP socket listens on PORT (perftest's server, started in the
# background, before its client connects), or fails after SECONDS (10). A
# fixed sleep is not enough under TCG with the host loaded.
wait_listening() {
  local port=$1 tries=$((${2:-10} * 10))
  for ((i = 0; i < tries; ++i)); do
    [[ -n $(ss -Hltn "sport = :$port") ]] && return 0
    sleep 0.1
  done
  echo "nothing listens on port $port after ${2:-10} s" >&2
  return 1
}
