"""``spotctl logs``: a job's trainer log (stdout and stderr of its command), per attempt and node.

Two places hold it: the job disk (``.spotctl/logs/attempt-<N>-node-<R>.log``, written by the VM
script as the command runs; point ``--dir`` at a copy of the disk's ``.spotctl/``), and the event
bucket, where the scripts upload it in chunks next to the events
(``<stack>/<job>/attempt-<N>/node-<R>/logs/<byte offset>.log``), read through the stack's
``cli.cloud.Cloud`` (``BucketLogs``) or from a synced copy (``DirLogs``). ``show`` prints one log
and, with ``follow``, what is appended until the attempt's events say it ended. Pure apart from the
files, the cloud object and the ``write``/``sleep`` passed in.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.schema import CHUNK_RE, DISK_LOG_RE
from cli.lifecycle.events import BucketEvents, Event, load_events


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


def _chunks(root: Path, job_id: str, stack: str | None = None) -> dict[LogKey, list[tuple[int, Path]]]:
    """Uploaded chunks ``[<stack>/]<job>/attempt-N/node-R/logs/OFFSET.log`` below ``root``: the job's
    own folder by exact name (``xbert-eval`` is not ``bert-eval``), and of ``stack`` when the path
    names one (a synced bucket holds every stack)."""
    found: dict[LogKey, list[tuple[int, Path]]] = {}
    for path in root.rglob("*.log") if root.is_dir() else []:
        rel = path.relative_to(root).as_posix()
        m = CHUNK_RE.search(rel)
        parts = rel.split("/")
        if m and len(parts) >= 5 and parts[-5] == job_id and (stack is None or len(parts) < 6 or parts[-6] == stack):
            found.setdefault(LogKey(int(m[1]), int(m[2])), []).append((int(m[3]), path))
    return found


def _join(chunks: list[tuple[int, bytes]]) -> bytes:
    """Chunks by offset; a chunk uploaded twice (a retry) or overlapping is not repeated, and a chunk
    that never arrived (an upload that failed for good) is said where it is missing."""
    out, end = b"", 0  # ``end``: the log's own offset reached (``out`` may hold gap notes too)
    for offset, data in sorted(chunks, key=lambda c: c[0]):
        if offset > end:
            out += f"\n[spotctl: {offset - end} bytes of this log never reached the bucket]\n".encode()
            end = offset
        if offset + len(data) > end:
            out += data[end - offset:]
            end = offset + len(data)
    return out


def available(root: Path | None, job_id: str, names: list[str] | None = None, stack: str | None = None) -> list[LogKey]:
    """Every (attempt, node) with a log in ``root`` or among the bucket object ``names``."""
    keys = set()
    if root is not None:
        keys |= set(_disk_logs(root)) | set(_chunks(root, job_id, stack))
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


def read(root: Path | None, job_id: str, key: LogKey, objects: dict[str, bytes] | None = None,
         stack: str | None = None) -> bytes:
    """The whole log of ``key``: the job disk's copy when there is one (it is complete), else the
    uploaded chunks, from ``root`` or from the bucket ``objects`` (name -> content)."""
    if root is not None:
        disk = _disk_logs(root).get(key)
        if disk is not None:
            return disk.read_bytes()
        chunks = _chunks(root, job_id, stack).get(key)
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


# An attempt's log is complete once its events say the attempt ended (the scripts upload the last
# chunk before recording completed/failed; a stop's last lines stay on the job disk).
ENDED = ("completed", "failed", "preempted", "stopped")


class LogSource(Protocol):
    where: str

    def keys(self) -> list[LogKey]: ...

    def read(self, key: LogKey) -> bytes: ...

    def events(self, key: LogKey) -> list[Event]: ...


class DirLogs:
    """Logs and events in a directory: a copy of the job disk's ``.spotctl/`` or of the bucket."""

    def __init__(self, root: Path, job_id: str, stack: str | None = None):
        self.root, self.job_id, self.stack, self.where = root, job_id, stack, str(root)

    def keys(self) -> list[LogKey]:
        return available(self.root, self.job_id, stack=self.stack)

    def read(self, key: LogKey) -> bytes:
        return read(self.root, self.job_id, key, stack=self.stack)

    def events(self, key: LogKey) -> list[Event]:
        return load_events(self.root, self.job_id, self.stack)


class BucketLogs:
    """Logs and events of one job in the stack's event bucket, through ``cloud`` (a ``cli.cloud.Cloud``:
    its failures raise CloudError). Objects already read are not downloaded again, except each
    log's last chunk: after a reboot the VM may upload it again from the same offset, longer."""

    def __init__(self, cloud: Any, bucket: str, job_id: str):
        self.cloud, self.bucket, self.job_id = cloud, bucket, job_id
        self.prefix = f"{cloud.stack}/{job_id}/"
        self.where = f"bucket {bucket} under {self.prefix}"
        self.cache: dict[str, bytes] = {}
        self.parsed = BucketEvents(cloud.stack)

    def _fetch(self, prefix: str, suffix: str, keep_last: bool = False) -> dict[str, bytes]:
        mine = sorted(n for n in self.cache if n.startswith(prefix) and n.endswith(suffix))
        skip = frozenset(mine[:-1] if keep_last else mine)
        listed = self.cloud.bucket_objects(self.bucket, prefix, skip, suffix)
        for name in [n for n in mine if n not in listed]:  # expired by the bucket's lifecycle rule
            del self.cache[name]
        self.cache.update({n: data for n, data in listed.items() if data is not None})
        return {n: self.cache[n] for n in listed if n in self.cache}

    def keys(self) -> list[LogKey]:
        return available(None, self.job_id, self.cloud.bucket_names(self.bucket, self.prefix))

    def read(self, key: LogKey) -> bytes:
        return read(None, self.job_id, key, self._fetch(f"{self.prefix}attempt-{key.attempt}/node-{key.node}/logs/", ".log", True))

    def events(self, key: LogKey) -> list[Event]:
        prefix = f"{self.prefix}attempt-{key.attempt}/"
        self.parsed.read(self.cloud, self.bucket, prefix)
        return self.parsed.events({self.job_id}, None, prefix=prefix)


def show(source: LogSource, attempt: int | None, node: int, write: Callable[[str], None], *, lines: int = 0,
         follow: bool = False, poll_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> LogKey:
    """Write the asked-for log (its last ``lines``); with ``follow``, then what is appended every
    ``poll_s`` until the attempt's events say this node ended. LogError names what exists."""
    key = pick(source.keys(), attempt, node)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a chunk may end inside a character
    data = source.read(key)
    write(tail(decoder.decode(data, final=not follow), lines))
    shown, seen = len(data), data
    while follow:
        # this node's end event, or a later attempt started (an attempt replaced without one: a VM
        # that never came back to record it)
        ended = any((e.attempt == key.attempt and e.node == key.node and e.event in ENDED)
                    or (e.attempt > key.attempt and e.event == "started") for e in source.events(key))
        data = source.read(key)  # after the events: what was uploaded before the end is in
        if not data.startswith(seen):
            # a chunk said missing arrived late: what is on the terminal cannot change; go on from here
            shown = len(data)
        elif len(data) > shown:
            write(decoder.decode(data[shown:], final=ended))
            shown = len(data)
        seen = data
        if ended:
            break
        sleep(poll_s)
    return key
