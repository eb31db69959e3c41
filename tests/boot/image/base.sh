#!/bin/bash
# The boot tier's base root filesystem: Debian 12 from the package mirror, with the packages the
# guest needs. $1: the directory to create (must not exist); $2: the Debian mirror URL.
# Run as root on the host; every mount it makes is undone on exit.
set -euo pipefail
root=$1 mirror=$2
suite=bookworm
# debootstrap resolves no virtual packages (python3-cryptography's cffi ABI), so the packages come
# from apt-get in a chroot, after a minimal debootstrap.
packages=(
  linux-image-cloud-amd64 initramfs-tools systemd-sysv systemd-resolved udev dbus kmod
  cloud-init google-guest-agent python3 curl ca-certificates openssl iproute2 e2fsprogs util-linux
  procps less
)

unmount_all() {
  local m
  for m in dev/pts dev proc sys run; do
    mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true
  done
}
trap unmount_all EXIT

retry() {
  local n
  for n in 1 2 3; do
    "$@" && return 0
    echo "base.sh: attempt $n of: $* failed" >&2
    sleep $((n * 5))
  done
  return 1
}

bootstrap() {
  unmount_all
  rm -rf --one-file-system "$root"
  debootstrap --variant=minbase bookworm "$root" "$mirror"
}
retry bootstrap

mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs tmpfs "$root/run"
# No service starts inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
printf 'deb %s %s main\n' "$mirror" "$suite" >"$root/etc/apt/sources.list"
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
retry in_root apt-get update -q
retry in_root apt-get install -y -q --no-install-recommends "${packages[@]}"
in_root apt-get clean
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root"/var/lib/apt/lists/*
unmount_all
trap - EXIT
