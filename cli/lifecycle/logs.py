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
import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.schema import CHUNK_RE, DISK_LOG_RE
from cli.lifecycle.bucketevents import BucketEvents
from cli.lifecycle.direvents import dir_events
from cli.lifecycle.events import Event


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


class Joiner:
    """One log joined from its chunks as they arrive, each byte of the log once: a chunk uploaded twice
    (a retry) or overlapping is not repeated, and a chunk that never arrived (an upload that failed for
    good) is said where it is missing. ``end`` is the log's own offset reached (the output holds the
    gap notes too); a chunk arriving later for what was already said missing adds nothing."""

    def __init__(self) -> None:
        self.end = 0

    def add(self, chunks: Iterable[tuple[int, bytes]]) -> bytes:
        """What ``chunks`` (offset, data) add after ``end``."""
        out = []
        for offset, data in sorted(chunks, key=lambda c: c[0]):
            if offset > self.end:
                out.append(f"\n[spotctl: {offset - self.end} bytes of this log never reached the bucket]\n".encode())
                self.end = offset
            if offset + len(data) > self.end:
                out.append(data[self.end - offset:])
                self.end = offset + len(data)
        return b"".join(out)  # (one join: adding to a bytes object was quadratic in the chunks)


def _join(chunks: Iterable[tuple[int, bytes]]) -> bytes:
    """Chunks by offset, joined (``Joiner``)."""
    return Joiner().add(chunks)


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
            return b"".join(data for _, data in _blocks(disk, 0))
        chunks = _chunks(root, job_id, stack).get(key)
        if chunks:
            return _join([(offset, path.read_bytes()) for offset, path in chunks])
    return _join(_pieces(objects or {}, key))


def _pieces(objects: dict[str, bytes], key: LogKey) -> list[tuple[int, bytes]]:
    """(offset, data) of ``key``'s chunks among bucket ``objects`` (name -> content)."""
    pieces = []
    for name, data in objects.items():
        m = CHUNK_RE.search(name)
        if m and LogKey(int(m[1]), int(m[2])) == key:
            pieces.append((int(m[3]), data))
    return pieces


BLOCK = 1 << 20  # a job disk's log is read this much at a time: an 800 MiB log is never held whole


def _blocks(path: Path, since: int) -> Iterator[tuple[int, bytes]]:
    """(offset, data) blocks of a job disk's log from byte ``since`` to its end as it is now; a
    file that is not a regular one (a FIFO would block) is none."""
    from cli.lifecycle.stackfile.writing import open_regular

    opened = open_regular(path, follow=True)
    if opened is None:
        raise LogError(f"{path} is not a regular file")
    with open(opened[0], "rb", buffering=0) as fh:
        fh.seek(since)
        offset, left = since, max(0, opened[1].st_size - since)  # only what was there when it was opened
        while left > 0 and (data := fh.read(min(BLOCK, left))):
            yield offset, data
            offset, left = offset + len(data), left - len(data)


def tail(text: str, lines: int) -> str:
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else text


# An attempt's log is complete once its events say the attempt ended (the scripts upload the last
# chunk before recording completed/failed; a stop's last lines stay on the job disk).
ENDED = ("completed", "failed", "preempted", "stopped")


class LogSource(Protocol):
    where: str

    def keys(self) -> list[LogKey]: ...

    def chunks(self, key: LogKey, since: int = 0) -> Iterable[tuple[int, bytes]]:
        """(offset, data) of the log's pieces that reach past byte ``since``, by offset; after the
        first call only what is new is read (``logs --follow``)."""
        ...

    def events(self, key: LogKey) -> list[Event]: ...


class DirLogs:
    """Logs and events in a directory: a copy of the job disk's ``.spotctl/`` or of the bucket. The
    directory is searched once; then only the folders a log's chunks were found in are listed again."""

    def __init__(self, root: Path, job_id: str, stack: str | None = None):
        self.root, self.job_id, self.stack, self.where = root, job_id, stack, str(root)
        self.folders: dict[LogKey, set[Path]] = {}
        self.found: dict[LogKey, list[tuple[int, Path]]] | None = None  # the last search's chunks

    def keys(self) -> list[LogKey]:
        self.found = _chunks(self.root, self.job_id, self.stack)
        return sorted(set(_disk_logs(self.root)) | set(self.found), key=lambda k: (k.attempt, k.node))

    def chunks(self, key: LogKey, since: int = 0) -> Iterable[tuple[int, bytes]]:
        disk = _disk_logs(self.root).get(key)
        if disk is not None:
            return _blocks(disk, since)
        if key not in self.folders:
            found = (self.found if self.found is not None else _chunks(self.root, self.job_id, self.stack)).get(key, [])
            self.found = None  # searched again next time, until found
            if not found:
                return []
            self.folders[key] = {path.parent for _, path in found}
            return [(offset, data) for offset, path in sorted(found) if (data := _read(path)) is not None
                    and offset + len(data) > since]
        listed = []
        for folder in self.folders[key]:
            with contextlib.suppress(OSError):
                for entry in os.scandir(folder):
                    m = re.fullmatch(r"(\d+)\.log", entry.name)
                    if m and entry.is_file() and int(m[1]) + entry.stat().st_size > since:
                        listed.append((int(m[1]), Path(entry.path)))
        return [(offset, data) for offset, path in sorted(listed) if (data := _read(path)) is not None]

    def events(self, key: LogKey) -> list[Event]:
        return dir_events(self.root, {self.job_id}, self.stack)


def _read(path: Path) -> bytes | None:
    """A chunk's bytes (at most ``CHUNK_LIMIT``; a FIFO or device is none)."""
    from cli.lifecycle.cachefile import read_bounded

    return read_bounded(path, CHUNK_LIMIT, follow=True)


# The scripts upload 64 KiB chunks (spotctl_upload_log_chunks, templates/common/lib.sh.j2); a chunk
# file larger than this is no chunk of theirs and is not read.
CHUNK_LIMIT = 1 << 24


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

    def chunks(self, key: LogKey, since: int = 0) -> Iterable[tuple[int, bytes]]:
        fetched = self._fetch(f"{self.prefix}attempt-{key.attempt}/node-{key.node}/logs/", ".log", True)
        return sorted((offset, data) for offset, data in _pieces(fetched, key) if offset + len(data) > since)

    def events(self, key: LogKey) -> list[Event]:
        prefix = f"{self.prefix}attempt-{key.attempt}/"
        self.parsed.read(self.cloud, self.bucket, prefix)
        return self.parsed.events({self.job_id}, None, prefix=prefix)


TAIL_LIMIT = 1 << 26  # ``--tail``: the last 64 MiB of the log are kept while it is read, never all of it


def show(source: LogSource, attempt: int | None, node: int, write: Callable[[str], None], *, lines: int = 0,
         follow: bool = False, poll_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> LogKey:
    """Write the asked-for log (its last ``lines``); with ``follow``, then what is appended every
    ``poll_s`` until the attempt's events say this node ended, reading only what is new. Written as
    it is read: memory stays bounded whatever the log's size. LogError names what exists."""
    key = pick(source.keys(), attempt, node)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a chunk may end inside a character
    joiner = Joiner()
    if lines:
        kept = bytearray()
        for piece in source.chunks(key):
            kept += joiner.add([piece])
            if len(kept) > 2 * TAIL_LIMIT:
                del kept[:-TAIL_LIMIT]
        write(tail(decoder.decode(bytes(kept), final=not follow), lines))
    else:
        held: list[str] = []  # written a block at a time: one write for a log of up to a block
        size = 0
        for piece in source.chunks(key):
            held.append(decoder.decode(joiner.add([piece])))
            size += len(held[-1])
            if size >= BLOCK:
                write("".join(held))
                held, size = [], 0
        if text := "".join(held) + decoder.decode(b"", final=not follow):
            write(text)
    while follow:
        # this node's end event, or a later attempt started (an attempt replaced without one: a VM
        # that never came back to record it)
        ended = any((e.attempt == key.attempt and e.node == key.node and e.event in ENDED)
                    or (e.attempt > key.attempt and e.event == "started") for e in source.events(key))
        new = b"".join(joiner.add([piece]) for piece in source.chunks(key, joiner.end))  # after the events: the end's chunk is in
        if text := decoder.decode(new, final=ended):
            write(text)
        if ended:
            break
        sleep(poll_s)
    return key
