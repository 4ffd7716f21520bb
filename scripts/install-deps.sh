#!/usr/bin/env bash
# Installs what coio's build, tests and benchmarks need on Debian 12.
# Idempotent: does nothing (and needs no network) when all is present.
set -euo pipefail

packages=(
  g++ clang libclang-rt-14-dev cmake make pkg-config python3 python3-venv
  catch2 libbenchmark-dev
  liburing-dev libibverbs-dev
  fio doxygen
  iperf3 sockperf gnuplot-nox
  nlohmann-json3-dev libcli11-dev etcd-server etcd-client
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all dependencies present"
fi
