#!/bin/bash
# The boot tier's guest image from the base root filesystem (base.sh): the tier's own files added,
# a test CA trusted, then the kernel, the initrd and an ext4 root image written to $3.
# $1: the base root (read only); $2: the files to add (a tree); $3: the output directory.
set -euo pipefail
base=$1 files=$2 out=$3
stage=$out/stage
rm -rf --one-file-system "$stage"
mkdir -p "$out"
cp -a "$base" "$stage"
cp -a "$files/." "$stage/"
in_root() { chroot "$stage" env LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# A CA of this image's own: the scripts reach the bucket APIs over https, served by the emulator
# in the test's namespace under the real names (storage.googleapis.com, s3.<region>.amazonaws.com).
openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=spotctl boot tier CA" \
  -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=storage.googleapis.com" -keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
printf 'subjectAltName=%s\n' "DNS:storage.googleapis.com,DNS:secretmanager.googleapis.com,DNS:*.googleapis.com,DNS:*.us-east-1.amazonaws.com,DNS:*.us-west-2.amazonaws.com,DNS:*.eu-west-1.amazonaws.com" >"$out/tls.ext"
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial -days 3650 \
  -extfile "$out/tls.ext" -out "$out/tls.crt" 2>/dev/null
install -D -m 644 "$out/ca.crt" "$stage/usr/local/share/ca-certificates/spotctl-boot.crt"
in_root update-ca-certificates >/dev/null
# The bundle curl reads holds this CA alone: the guest reaches no other TLS server, and parsing
# Debian's ~140 roots at every curl costs an emulated CPU about a second.
cp "$out/ca.crt" "$stage/etc/ssl/certs/ca-certificates.crt"
# What a minimal cloud image would not run at boot and the tier does not need: timers, scrubbing,
# the login prompts (the console is a log here).
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
  dpkg-db-backup.timer getty@tty1.service serial-getty@ttyS0.service; do
  ln -sf /dev/null "$stage/etc/systemd/system/$unit"
done

in_root systemctl enable systemd-networkd.service systemd-resolved.service >/dev/null 2>&1
ln -sf ../run/systemd/resolve/resolv.conf "$stage/etc/resolv.conf"
in_root passwd -d root >/dev/null
mkdir -p "$stage/var/log/journal"
chmod 755 "$stage/opt/spotctl-boot/trainer.py"

cp "$(ls "$stage"/boot/vmlinuz-* | sort -V | tail -n 1)" "$out/vmlinuz"
cp "$(ls "$stage"/boot/initrd.img-* | sort -V | tail -n 1)" "$out/initrd.img"
rm -f "$out/rootfs.raw"
truncate -s 3G "$out/rootfs.raw"
mkfs.ext4 -q -F -L root -d "$stage" "$out/rootfs.raw"
rm -rf --one-file-system "$stage"
