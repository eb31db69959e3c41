"""``spotctl logs``: a job's trainer log (stdout and stderr of its command), per attempt and node.

Two places hold it: the job disk (``.spotctl/logs/attempt-<N>-node-<R>.log``, written by the VM
script as the command runs; point ``--dir`` at a copy of the disk's ``.spotctl/``), and the event
bucket, where the scripts upload it in chunks next to the events
(``<stack>/<job>/attempt-<N>/node-<R>/logs/<byte offset>.log``; ``--dir`` may also be a synced
copy of the bucket). Reading is pure apart from the files and the cloud object passed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DISK_LOG_RE = re.compile(r"^attempt-(\d+)-node-(\d+)\.log$")
CHUNK_RE = re.compile(r"attempt-(\d+)/node-(\d+)/logs/(\d+)\.log$")


class LogError(Exception):
    """No log where it was looked for; ``str()`` says where."""


@dataclass(frozen=True)
class LogKey:
    attempt: int
    node: int


def _disk_logs(root: Path) -> dict[LogKey, Path]:
    found = {}
    for base in (root, root / "logs", root / ".spotctl" / "logs"):
        if base.is_dir():
            for path in base.iterdir():
                m = DISK_LOG_RE.match(path.name)
                if m:
                    found[LogKey(int(m[1]), int(m[2]))] = path
    return found


def _chunks(root: Path, job_id: str) -> dict[LogKey, list[tuple[int, Path]]]:
    found: dict[LogKey, list[tuple[int, Path]]] = {}
    for path in root.rglob("*.log") if root.is_dir() else []:
        rel = path.relative_to(root).as_posix()
        m = CHUNK_RE.search(rel)
        if m and f"{job_id}/attempt-" in rel:
            found.setdefault(LogKey(int(m[1]), int(m[2])), []).append((int(m[3]), path))
    return found


def _join(chunks: list[tuple[int, bytes]]) -> bytes:
    """Chunks by offset; a chunk uploaded twice (a retry) or overlapping is not repeated."""
    out = b""
    for offset, data in sorted(chunks, key=lambda c: c[0]):
        if offset + len(data) > len(out):
            out += data[max(0, len(out) - offset):]
    return out


def available(root: Path | None, job_id: str, names: list[str] | None = None) -> list[LogKey]:
    """Every (attempt, node) with a log in ``root`` or among the bucket object ``names``."""
    keys = set()
    if root is not None:
        keys |= set(_disk_logs(root)) | set(_chunks(root, job_id))
    for name in names or []:
        m = CHUNK_RE.search(name)
        if m:
            keys.add(LogKey(int(m[1]), int(m[2])))
    return sorted(keys, key=lambda k: (k.attempt, k.node))


def pick(keys: list[LogKey], attempt: int | None, node: int) -> LogKey:
    """The asked-for log, or the latest attempt's; LogError names what exists."""
    if not keys:
        raise LogError("no log found")
    wanted = [k for k in keys if k.node == node and (attempt is None or k.attempt == attempt)]
    if not wanted:
        have = ", ".join(f"attempt {k.attempt} node {k.node}" for k in keys)
        asked = f"attempt {attempt} node {node}" if attempt is not None else f"node {node}"
        raise LogError(f"no log of {asked} (there are: {have})")
    return wanted[-1]


def read(root: Path | None, job_id: str, key: LogKey, objects: dict[str, bytes] | None = None) -> bytes:
    """The whole log of ``key``: the job disk's copy when there is one (it is complete), else the
    uploaded chunks, from ``root`` or from the bucket ``objects`` (name -> content)."""
    if root is not None:
        disk = _disk_logs(root).get(key)
        if disk is not None:
            return disk.read_bytes()
        chunks = _chunks(root, job_id).get(key)
        if chunks:
            return _join([(offset, path.read_bytes()) for offset, path in chunks])
    pieces = []
    for name, data in (objects or {}).items():
        m = CHUNK_RE.search(name)
        if m and LogKey(int(m[1]), int(m[2])) == key:
            pieces.append((int(m[3]), data))
    return _join(pieces)


def tail(text: str, lines: int) -> str:
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else text
