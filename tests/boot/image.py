"""The boot tier's guest image: built once from Debian's packages, cached outside the repository
under ``~/.cache/spotctl-boot/<sha256 of the recipe>/`` (``SPOTCTL_BOOT_CACHE`` moves it).

Two layers, each keyed by the hash of what makes it: the base root filesystem (``base.sh``, the
mirror) and the image (the base's key, ``finish.sh``, ``files/``). Changing the trainer rebuilds the
image in seconds, not the base. A lock file makes a second builder (another xdist worker, another
checkout) wait for the first and then use its result."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent / "image"
# What the tier needs on the host (Debian package -> a command it provides).
HOST_TOOLS = {"debootstrap": "debootstrap", "qemu-system-x86": "qemu-system-x86_64", "qemu-utils": "qemu-img",
              "dnsmasq-base": "dnsmasq", "mtools": "mcopy", "dosfstools": "mkfs.vfat", "e2fsprogs": "debugfs",
              "iproute2": "ip", "openssl": "openssl"}
FALLBACK_MIRROR = "http://deb.debian.org/debian"


def cache_root() -> Path:
    return Path(os.environ.get("SPOTCTL_BOOT_CACHE") or Path.home() / ".cache" / "spotctl-boot")


def debian_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The host's Debian mirror (its apt sources: deb822 ``URIs:`` or one-line ``deb``), so the
    guest comes from where this machine is allowed to fetch."""
    files = sorted(sources.glob("sources.list.d/*.sources")) + [sources / "sources.list"]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", text, re.M):
            if "security" not in uri and "/debian" in uri:
                return uri.rstrip("/")
    return FALLBACK_MIRROR


def _digest(*parts: bytes | Path) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            for path in sorted(p for p in part.rglob("*") if p.is_file()) if part.is_dir() else [part]:
                h.update(str(path.relative_to(part if part.is_dir() else part.parent)).encode())
                h.update(b"x" if path.stat().st_mode & 0o111 else b"-")  # (as git keeps it: a checkout's umask varies)
                h.update(path.read_bytes())
        else:
            h.update(part)
    return h.hexdigest()


@dataclass(frozen=True)
class Image:
    dir: Path

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs.raw"

    @property
    def tls(self) -> tuple[Path, Path]:
        return self.dir / "tls.crt", self.dir / "tls.key"


@dataclass
class BuildTimes:
    base_s: float | None = None  # None: from the cache
    image_s: float | None = None


def missing_tools() -> list[str]:
    return [pkg for pkg, cmd in HOST_TOOLS.items() if shutil.which(cmd) is None and not Path("/usr/sbin", cmd).exists()]


def install_host_tools() -> None:
    """apt-get the tools the tier needs when some are missing (root only)."""
    missing = missing_tools()
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=False, env=env, capture_output=True)
    done = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"could not install {' '.join(missing)}: {done.stderr[-2000:]}")


class _Lock:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a+")  # noqa: SIM115 - held for the with block

    def __enter__(self) -> _Lock:
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _remove(path: Path) -> None:
    """Remove an unfinished build, first undoing any mount a killed base.sh left in it (its /dev
    is the host's, bind-mounted: never delete through it)."""
    with open("/proc/mounts") as fh:
        points = [line.split()[1] for line in fh]
    inside = [p for p in points if p == str(path) or p.startswith(f"{path}/")]
    for point in sorted(inside, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _run(args: list[str], log: Path) -> None:
    with open(log, "w") as out:
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {done.returncode}); its log: {log}\n"
                           + log.read_text(errors="replace")[-3000:])


def build(mirror: str | None = None, times: BuildTimes | None = None) -> Image:
    """The cached image, built first if needed (minutes from nothing; a lock file held meanwhile)."""
    mirror = mirror or debian_mirror()
    times = times if times is not None else BuildTimes()
    root = cache_root()
    base_key = _digest(HERE / "base.sh", mirror.encode())
    image_key = _digest(base_key.encode(), HERE / "finish.sh", HERE / "files")
    base_dir, image_dir = root / f"base-{base_key[:16]}", root / image_key
    with _Lock(root / "build.lock"):
        if not (base_dir / "done").exists():
            _remove(base_dir)
            base_dir.mkdir(parents=True)
            start = time.monotonic()
            _run([str(HERE / "base.sh"), str(base_dir / "root"), mirror], base_dir / "build.log")
            times.base_s = time.monotonic() - start
            (base_dir / "done").write_text(f"{times.base_s:.0f}\n")
        if not (image_dir / "done").exists():
            _remove(image_dir)
            image_dir.mkdir(parents=True)
            start = time.monotonic()
            _run([str(HERE / "finish.sh"), str(base_dir / "root"), str(HERE / "files"), str(image_dir)],
                 image_dir.parent / f"{image_key}.log")
            times.image_s = time.monotonic() - start
            (image_dir / "done").write_text(f"{times.image_s:.0f}\n")
    return Image(image_dir)
