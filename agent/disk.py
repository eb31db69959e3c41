"""The job disk: found by its stable device name, formatted only when blank, mounted, and kept in
/etc/fstab by UUID so a reboot or stop/start mounts it before the job unit starts."""

from __future__ import annotations

import os
import subprocess
import time

from agent.config import Config
from agent.util import log, read

BLANK_PROBE = 1 << 20  # a new disk's first MiB reads as zeros


def _run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, check=False, **kw)


def find_device(cfg: Config, sleep=time.sleep) -> str:
    """The job disk's device path (``disk_device`` or one of its aliases), waiting for it to appear:
    AWS attaches the volume only once the instance exists, GCE with the instance. "" if it never did."""
    waited = 0
    while True:
        for name in (cfg.disk_device, *cfg.disk_aliases):
            if os.path.exists(name):
                if name != cfg.disk_device:
                    log(cfg, "job disk found as " + name)
                return name
        if waited >= cfg.disk_wait_s:
            log(cfg, f"job disk {cfg.disk_device} did not appear")
            return ""
        sleep(1)
        waited += 1


def is_blank(device: str) -> bool:
    with open(device, "rb") as fh:
        return not fh.read(BLANK_PROBE).strip(b"\0")


def mounted(path: str) -> bool:
    return _run(["mountpoint", "-q", path]).returncode == 0


def prepare(cfg: Config) -> str:
    """Mount the job disk; returns the device ("" without one), raises RuntimeError when it cannot.

    Format it only when it holds no filesystem and no partition table (``blkid -p`` exit status 2)
    and its first MiB reads as zeros, as a new disk does; anything else is data, never touched."""
    if not cfg.disk_device:
        os.makedirs(cfg.mount_point, exist_ok=True)
        return ""
    device = find_device(cfg)
    if not device:
        raise RuntimeError(f"job disk {cfg.disk_device} did not appear")
    if mounted(cfg.mount_point):
        return device
    probe = _run(["blkid", "-p", device]).returncode
    if probe == 2:
        if not is_blank(device):
            raise RuntimeError("job disk has no filesystem but is not blank: refusing to format it")
        log(cfg, "job disk is blank: creating a filesystem")
        if _run(["mkfs.ext4", "-q", "-F", "-L", "spotctl-data", "-m", "0", device]).returncode != 0:
            raise RuntimeError("mkfs.ext4 failed on " + device)
    elif probe != 0:
        raise RuntimeError("cannot probe %s (blkid exit %d): not formatting" % (device, probe))
    os.makedirs(cfg.mount_point, exist_ok=True)
    if _run(["mount", "-o", "defaults,discard", device, cfg.mount_point]).returncode != 0:
        raise RuntimeError(f"mount of {device} failed")
    grow(cfg, device)
    return device


def sizes(device: str) -> tuple[int, int]:
    """(the device's bytes, its ext4 filesystem's bytes; 0 when dumpe2fs cannot say)."""
    fd = os.open(device, os.O_RDONLY)
    try:
        total = os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
    head = _run(["dumpe2fs", "-h", device]).stdout.decode(errors="replace")
    fields = dict(line.split(":", 1) for line in head.splitlines() if ":" in line)
    try:
        return total, int(fields["Block count"]) * int(fields["Block size"])
    except (KeyError, ValueError):
        return total, 0


def grow(cfg: Config, device: str) -> None:
    """A disk grown by a larger ``diskGb`` (the cloud resizes the device, never the filesystem): grow
    the mounted ext4 filesystem to the device, online ("resize2fs ... If the filesystem is mounted, it
    can be used to expand the size of the mounted filesystem", resize2fs(8); GCE: "Resize the file
    system", https://cloud.google.com/compute/docs/disks/resize-persistent-disk; AWS:
    https://docs.aws.amazon.com/ebs/latest/userguide/recognize-expanded-volume-linux.html)."""
    total, fs = sizes(device)
    if not fs or total <= fs:
        return
    log(cfg, f"job disk grew to {total >> 30} GiB: growing its filesystem")
    if _run(["resize2fs", device]).returncode != 0:
        log(cfg, "resize2fs failed on " + device + ": the job runs on the old size")


def fstab_line(uuid: str, mount_point: str) -> str:
    """``nofail``: a VM booted without the disk still boots."""
    return f"UUID={uuid} {mount_point} auto defaults,discard,nofail,x-systemd.device-timeout=120s 0 2\n"


def add_to_fstab(cfg: Config, device: str) -> None:
    if not device:
        return
    uuid = _run(["blkid", "-s", "UUID", "-o", "value", device]).stdout.decode().strip()
    if not uuid:
        return
    current = read(cfg.fstab) or ""
    if any(line.startswith(f"UUID={uuid} ") for line in current.splitlines()):
        return
    with open(cfg.fstab, "a", encoding="utf-8") as fh:
        fh.write(fstab_line(uuid, cfg.mount_point))
    # On the disk before a reset can come (ext4's delayed allocation, as for the units).
    os.sync()
