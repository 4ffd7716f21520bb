#!/bb/sh
# PID 1 of the coio Soft-RoCE guest (installed by build-image.sh).
# Loads the modules, mounts the host's /usr and /etc read-only and the run
# folder + work tree read-write over virtio-9p, creates the Soft-RoCE device
# rxe0 on a dummy netdev, runs /ctl/cmd.sh, writes its status to /ctl/rc and
# powers off. A setup failure leaves /ctl/setup-error instead of /ctl/rc.
PATH=/bb
export PATH

log() { echo "coio-vm: $*" >/dev/console; }
halt() {
  sync
  poweroff -f
  sleep 5
  echo o >/proc/sysrq-trigger
}
fail() {
  log "setup failed: $*"
  echo "$*" >/ctl/setup-error 2>/dev/null
  dmesg | tail -30 >/dev/console
  halt
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
# What udev would add: bash's process substitution needs /dev/fd.
ln -s /proc/self/fd /dev/fd
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run

while read -r module; do
  insmod "/kmods/$module" || log "insmod $module failed"
done </kmods/load.list

opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts" ctl /ctl || fail "mount the run folder"
mount -t 9p -o "$opts,ro,cache=loose" usr /usr || fail "mount the host's /usr"
mount -t 9p -o "$opts,ro,cache=loose" etc /etc || fail "mount the host's /etc"
. /ctl/env || fail "read /ctl/env"
mkdir -p "$COIO_VM_SHARE" && mount -t 9p -o "$opts" work "$COIO_VM_SHARE" || fail "mount $COIO_VM_SHARE"

hostname coio-vm
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/bb
HOME=/root
export PATH HOME

# busybox sh prefers its own applets to PATH: name iproute2 by full path.
IP=/usr/bin/ip
$IP link set lo up
$IP link add rxenet0 type dummy || fail "create the dummy netdev"
$IP link set rxenet0 up || fail "bring rxenet0 up"
$IP addr add "$COIO_VM_IP/24" dev rxenet0 || fail "address rxenet0"
/usr/bin/rdma link add rxe0 type rxe netdev rxenet0 || fail "create rxe0"

# Ready once port 1 is ACTIVE and the RoCE v2 GID of our IPv4 address exists.
gid=$(echo "$COIO_VM_IP" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
port=/sys/class/infiniband/rxe0/ports/1
tries=0
until grep -q ACTIVE "$port/state" 2>/dev/null && cat "$port"/gids/* 2>/dev/null | grep -qx "$gid"; do
  tries=$((tries + 1))
  [ $tries -le 300 ] || fail "rxe0 port 1 not ACTIVE with GID $gid after 30 s"
  sleep 0.1
done
ulimit -l unlimited
log "rxe0 ready after $(cut -d' ' -f1 /proc/uptime) s"

cd "$COIO_VM_CWD" || fail "cd $COIO_VM_CWD"
/bin/bash /ctl/cmd.sh </dev/null >>/ctl/out 2>&1
echo $? >/ctl/rc
cd /
umount "$COIO_VM_SHARE"
umount /ctl
halt
