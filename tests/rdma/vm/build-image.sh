#!/usr/bin/env bash
# Builds the kernel + initramfs that run.sh boots, from Debian packages only:
# Debian's stock kernel (linux-image-amd64), the modules Soft-RoCE needs, a
# static busybox and our guest-init.sh as /init. The RDMA userland
# (libibverbs, the rxe provider, perftest) is not copied: the guest mounts
# the host's /usr.
#   build-image.sh [--force]
# Output: $COIO_VM_CACHE/image/{vmlinuz,initrd.img,stamp} (default
# /var/cache/coio-rxe-vm). A no-op when the image is up to date.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${COIO_VM_CACHE:-/var/cache/coio-rxe-vm}
force=0
[[ ${1:-} == --force ]] && force=1

host_packages=(qemu-system-x86 busybox-static cpio kmod iproute2 libibverbs1 ibverbs-providers
  ibverbs-utils perftest)
# Guest modules; modprobe --show-depends adds what they depend on. guest-init.sh loads
# `modules` at boot; `nvme_modules` (the kernel's NVMe-oF target and host, for
# tests/bench/storage/run_nvmet_compare.sh, and the CRC32C its NVME_DIGEST=1 needs) are only
# copied, listed in load order in kmods/nvme.list, for a command that wants them to insmod.
modules=(rdma_rxe ib_uverbs ib_umad crc32_generic dummy virtio_pci 9pnet_virtio 9p)
nvme_modules=(configfs nvmet nvmet_rdma nvmet_tcp nvme_rdma nvme_tcp crc32c_generic crc32c_intel)

say() { echo "coio-vm: $*" >&2; }
sudo=""
[[ $(id -u) -ne 0 ]] && sudo=sudo
updated=0
apt_update() { ((updated)) || { $sudo apt-get update -qq; updated=1; }; }

missing=()
for p in "${host_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  apt_update
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The kernel linux-image-amd64 points at.
kernel_package() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
kpkg=${COIO_VM_KERNEL_PACKAGE:-$(kernel_package)}
[[ -n $kpkg ]] || { apt_update; kpkg=$(kernel_package); }
kver=${kpkg#linux-image-}
[[ -n $kver && $kver != "$kpkg" ]] || { say "cannot tell the kernel package ($kpkg)"; exit 1; }

stamp="$kpkg $(cat "$here/build-image.sh" "$here/guest-init.sh" | md5sum | cut -c1-16)"
img=$cache/image
if ((!force)) && [[ -f $img/stamp && $(cat "$img/stamp") == "$stamp" && -f $img/vmlinuz && -f $img/initrd.img ]]; then
  exit 0
fi

$sudo mkdir -p "$cache"
[[ -w $cache ]] || $sudo chown "$(id -u):$(id -g)" "$cache"
mkdir -p "$cache/download"
deb=$(ls "$cache/download/${kpkg}_"*.deb 2>/dev/null | tail -1 || true)
if [[ -z $deb ]]; then
  say "downloading $kpkg"
  (cd "$cache/download" && { apt-get download -qq "$kpkg" 2>/dev/null || { apt_update; apt-get download -qq "$kpkg"; }; })
  deb=$(ls "$cache/download/${kpkg}_"*.deb | tail -1)
fi

work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
tree=$work/kernel
mkdir -p "$tree"
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tree" --wildcards \
  "./boot/vmlinuz-$kver" "./lib/modules/$kver/modules.*" "./lib/modules/$kver/kernel/*"
depmod -b "$tree" "$kver"

root=$work/root
mkdir -p "$root"/{bb,kmods,proc,sys,dev,tmp,run,usr,etc,ctl,root,var}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
ln -s ../tmp "$root/var/tmp"
cp "$(command -v busybox)" "$root/bb/busybox"
for applet in $("$root/bb/busybox" --list); do [[ $applet == busybox ]] || ln -s busybox "$root/bb/$applet"; done

# Modules in load order (dependencies first), listed in kmods/LIST; a module an
# earlier list (or this one) already holds is left out.
dest=$root/kmods
copy_modules() {
  local list=$1
  shift
  : >"$dest/$list"
  for m in "$@"; do
    modprobe -d "$tree" -S "$kver" --show-depends "$m" || { say "no module $m in $kpkg"; exit 1; }
  done | awk '$1 == "insmod" { print $2 }' | while read -r path; do
    rel=${path#"$tree/lib/modules/$kver/"}
    grep -qxF "$rel" "$dest"/*.list && continue
    echo "$rel" >>"$dest/$list"
    mkdir -p "$dest/$(dirname "$rel")"
    cp "$path" "$dest/$rel"
  done
}
copy_modules load.list "${modules[@]}"
copy_modules nvme.list "${nvme_modules[@]}"
install -m 755 "$here/guest-init.sh" "$root/init"

mkdir -p "$img"
cp "$tree/boot/vmlinuz-$kver" "$img/vmlinuz.new"
# Uncompressed: unpacking beats decompressing under TCG.
(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --owner=0:0 --quiet) >"$img/initrd.img.new"
mv "$img/vmlinuz.new" "$img/vmlinuz"
mv "$img/initrd.img.new" "$img/initrd.img"
echo "$stamp" >"$img/stamp"
say "built $img ($kpkg, $(wc -l <"$dest/load.list") modules loaded at boot, $(wc -l <"$dest/nvme.list") in nvme.list, initrd $(du -h "$img/initrd.img" | cut -f1))"
