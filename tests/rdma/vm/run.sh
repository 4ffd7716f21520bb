#!/usr/bin/env bash
# Boots a throw-away qemu guest running Debian's kernel with a Soft-RoCE
# device (rxe0), runs one command in it and exits with its status.
#
#   tests/rdma/vm/run.sh [--] CMD [ARGS...]
#
# The guest mounts the host's /usr and /etc read-only (host-built binaries
# run unchanged) and $COIO_VM_SHARE (default: the git work tree) read-write
# at the same path. CMD runs as root under bash in $COIO_VM_CWD (default:
# the current folder), with COIO_VM=1, COIO_RDMA_DEVICE=rxe0 and
# COIO_VM_IP set; its output streams to our stdout.
# Exit status: CMD's; 124 on timeout; 125 if the guest failed to boot or to
# set up rxe0 (a boot failure is a failure, never a skip).
#
# Environment: COIO_VM_CACHE (image cache), COIO_VM_SHARE, COIO_VM_CWD,
# COIO_VM_TIMEOUT (s, default 1800), COIO_VM_MEM (MiB, default 2048),
# COIO_VM_SMP (default 2), COIO_VM_ACCEL (auto|kvm|tcg), COIO_VM_IP
# (default 10.77.0.1), COIO_VM_PASS_ENV (names of variables to pass on).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ ${1:-} == -- ]] && shift
(($#)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2; }
say() { echo "coio-vm: $*" >&2; }

"$here/build-image.sh"
img=${COIO_VM_CACHE:-/var/cache/coio-rxe-vm}/image
share=$(realpath "${COIO_VM_SHARE:-$(git rev-parse --show-toplevel 2>/dev/null || pwd)}")
cwd=$(realpath "${COIO_VM_CWD:-$PWD}")
case "$share" in / | /usr | /usr/* | /etc | /etc/*) say "cannot share $share"; exit 2 ;; esac
case "$cwd/" in "$share"/*) ;; *) say "$cwd is outside the shared folder $share"; exit 2 ;; esac

accel=${COIO_VM_ACCEL:-auto}
if [[ $accel == auto ]]; then
  # A /dev/kvm without vmx/svm (nested PVM hosts) hangs a stock kernel at boot.
  if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; else accel=tcg; fi
fi
case $accel in
  kvm) accel_args=(-accel kvm -cpu host) ;;
  tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
  *) say "COIO_VM_ACCEL=$accel: want auto, kvm or tcg"; exit 2 ;;
esac

ctl=$(mktemp -d /tmp/coio-vm.XXXXXX)
qemu_pid=""
tail_pid=""
cleanup() {
  [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
  [[ -n $tail_pid ]] && kill "$tail_pid" 2>/dev/null && wait "$tail_pid" 2>/dev/null
  rm -rf "$ctl"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

{
  printf 'COIO_VM_SHARE=%q\nCOIO_VM_CWD=%q\nCOIO_VM_IP=%q\n' "$share" "$cwd" "${COIO_VM_IP:-10.77.0.1}"
  echo "COIO_VM=1 COIO_RDMA_DEVICE=rxe0"
  echo "export COIO_VM COIO_RDMA_DEVICE COIO_VM_SHARE COIO_VM_CWD COIO_VM_IP"
} >"$ctl/env"
{
  for v in ${COIO_VM_PASS_ENV:-}; do [[ -n ${!v+set} ]] && printf 'export %s=%q\n' "$v" "${!v}"; done
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$ctl/cmd.sh"
: >"$ctl/out"

timeout=${COIO_VM_TIMEOUT:-1800}
say "booting ($accel, ${COIO_VM_SMP:-2} vCPU, timeout ${timeout} s)"
start=$(date +%s.%N)
# pdeathsig: qemu dies with us even if we are SIGKILLed.
setpriv --pdeathsig TERM timeout -k 10 "$timeout" setpriv --pdeathsig KILL qemu-system-x86_64 "${accel_args[@]}" \
  -machine pc -m "${COIO_VM_MEM:-2048}" -smp "${COIO_VM_SMP:-2}" \
  -nodefaults -no-user-config -display none -no-reboot \
  -kernel "$img/vmlinuz" -initrd "$img/initrd.img" -append "console=ttyS0 quiet panic=-1" \
  -serial "file:$ctl/console.log" \
  -virtfs local,path=/usr,mount_tag=usr,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path=/etc,mount_tag=etc,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$ctl,mount_tag=ctl,security_model=none" \
  -virtfs "local,path=$share,mount_tag=work,security_model=none,multidevs=remap" \
  </dev/null >"$ctl/qemu.log" 2>&1 &
qemu_pid=$!
setpriv --pdeathsig TERM tail -n +1 -F --pid="$qemu_pid" "$ctl/out" 2>/dev/null &
tail_pid=$!
set +e
wait "$qemu_pid"
qemu_rc=$?
qemu_pid=""
wait "$tail_pid"
tail_pid=""
set -e
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

if [[ -f $ctl/rc ]]; then
  rc=$(cat "$ctl/rc")
  say "command exited $rc; guest ran ${elapsed} s; $(grep -o 'rxe0 ready after [0-9.]* s' "$ctl/console.log" || true)"
  exit "$rc"
fi
if [[ $qemu_rc == 124 || $qemu_rc == 137 ]]; then
  say "TIMEOUT after ${timeout} s"
  rc=124
else
  say "guest FAILED before the command finished (qemu status $qemu_rc)${ctl:+; $(cat "$ctl/setup-error" 2>/dev/null)}"
  rc=125
fi
tail -n 40 "$ctl/console.log" >&2 || true
cat "$ctl/qemu.log" >&2 || true
exit "$rc"
