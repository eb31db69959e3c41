"""The deterministic archive of a job's code: the same files give the same bytes, so the same sha256.

Entries sorted by name, fixed mtime, owner 0/0 with no names, modes 0644 or 0755 (git's two), no
directory entries; gzip with no name and mtime 0 in its header (RFC 1952 lets MTIME be 0: "no time
stamp is available"). Symlinks are kept as links (the VM's unpacking refuses ones leaving the code)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from cli.code import CodeError

MAX_CODE_BYTES = 512 * 1024 * 1024  # of files, before compression: code, not data or checkpoints
MTIME = 315532800  # 1980-01-01T00:00:00Z: a fixed time every extractor accepts


@dataclass(frozen=True)
class Archive:
    data: bytes
    sha256: str
    files: int
    size: int  # the files' bytes before compression


def _biggest(root: Path, names: list[str], n: int = 5) -> str:
    sizes = sorted(((os.lstat(root / name).st_size, name) for name in names), reverse=True)[:n]
    return ", ".join(f"{name} ({_mib(size)})" for size, name in sizes)


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB"


def _inside(name: str, target: str) -> bool:
    """Whether a link at ``name`` (relative to the code's top) to ``target`` stays inside the code."""
    if os.path.isabs(target):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(name), target))
    return resolved != ".." and not resolved.startswith("../") and resolved != "."


def _loop(name: str, target: str) -> bool:
    """Whether a link at ``name`` points at the code's top, which contains it (``loop -> .``, ``a/up -> ..``)."""
    return not os.path.isabs(target) and os.path.normpath(os.path.join(os.path.dirname(name), target)) == "."


def pack(root: Path, names: tuple[str, ...] | list[str], *, limit: int = MAX_CODE_BYTES, what: str = "code") -> Archive:
    """A tar.gz of ``names`` (relative to ``root``), refused over ``limit`` bytes before any is read.

    Raises:
        CodeError: over the limit (naming the biggest files), or a file that cannot be read; ``what``
            starts the message (e.g. "job train: code ./src").
    """
    names = sorted(names)
    try:
        total = sum(os.lstat(root / name).st_size for name in names)
    except OSError as exc:
        raise CodeError(f"{what}: cannot read {exc.filename}: {exc.strerror}") from None
    if total > limit:
        raise CodeError(f"{what}: {_mib(total)} of files, more than the {_mib(limit)} a code archive may hold; "
                        f"the biggest: {_biggest(root, names)}. Keep data and checkpoints out of the code "
                        f"(list them in .gitignore or .spotctlignore) and read them from a bucket or the job disk")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            path = root / name
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
            try:
                st = os.lstat(path)
                if path.is_symlink():
                    target = os.readlink(path)
                    if _loop(name, target):
                        raise CodeError(f"{what}: {name} is a link to {target}, a loop (a link to a directory that "
                                        "contains it; the VM refuses such a link): remove it or list it in .spotctlignore")
                    if not _inside(name, target):
                        raise CodeError(f"{what}: {name} is a link to {target}, outside the code (the VM refuses such "
                                        "a link): list it in .spotctlignore and read what it points to from a bucket")
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                    tar.addfile(info)
                    continue
                info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o100 else 0o644
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            except OSError as exc:
                raise CodeError(f"{what}: cannot read {name}: {exc.strerror}") from None
    data = buf.getvalue()
    return Archive(data, hashlib.sha256(data).hexdigest(), len(names), total)
