"""One job of an indexed stack file read, validated and rewritten alone, in a time that does not
grow with the stack."""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.basics import ConfigError

if TYPE_CHECKING:
    from infra.config import StackConfig

from cli.lifecycle.stackfile import reading, writing
from cli.lifecycle.stackfile.jobindex import _Index, _read_index, _stored_index
from cli.lifecycle.stackfile.reading import _PARSED_LOCK, MAX_NODES, _file_state, _parse, namespaced, plain
from cli.lifecycle.stackfile.shared import _SHARED, _shared_name
from cli.lifecycle.stackfile.splicing import _set_fields, _splice_job_fields, key
from cli.lifecycle.stackfile.writing import _Changed, _stamped_state, _still, _sync_folder, _write_all


@dataclass
class _Part:
    """One job's lines of an indexed file, and the config they make with the stack-wide settings."""

    index: _Index
    text: str | None  # the whole file (None: read in pieces, ``_stamped_part``)
    at: int  # the job's place in the index
    prefix: str  # the lines before the first job
    block: str  # the job's lines
    suffix: str  # the lines after the last job
    raw: dict[str, Any]  # the config of prefix + block + suffix (this job only)
    nodes: int  # their nodes


_LAST_PART: list[tuple[str, str, _Part]] = []  # a command reads its job, then edits it under the lock: one read of the index


def _job_part(path: Path, text: str, job_id: str) -> _Part | None:
    where = (os.path.abspath(path), job_id)
    with _PARSED_LOCK:  # (a watcher's threads)
        last = _LAST_PART.pop() if _LAST_PART else None
    if last is not None and last[:2] == where and last[2].text == text:
        return last[2]  # the same text (compared whole) of the same file: the same part
    part = _read_part(path, text, job_id)
    if part is not None:
        with _PARSED_LOCK:
            _LAST_PART[:] = [(*where, part)]
    return part


def _read_part(path: Path, text: str, job_id: str) -> _Part | None:
    index = _read_index(path, text)
    if index is None:
        return None
    at = index.find(job_id)
    if at is None:
        return None  # the whole file names the job's absence (with "did you mean")
    try:
        first, last = index.span(0)[0], sum(index.segments)
        start, end = index.span(at)
        if not (0 <= first <= start < end <= last <= len(text)
                and all(i == 0 or text[i - 1] == "\n" for i in (first, start))  # whole lines
                and all(i == len(text) or text[i - 1] == "\n" for i in (end, last))):
            return None
    except (TypeError, ValueError, IndexError):
        return None  # a damaged index: read the whole file, whose errors are the ones to show
    return _part_of(path, job_id, index, at, text, text[:first], text[start:end], text[last:])


def _stamped_part(path: Path, job_id: str) -> _Part | None:
    """One job's part of a stack file spotctl wrote itself, read without reading the file whole: its
    index is guarded by the file's state (the section's comment), which an open descriptor shows
    before and after the reads, and the file is plain (its bytes are its text), so the index's offsets
    are the file's: only the lines before the first job, the job's and those after the last are read.
    None when any of that does not hold (``_read_part`` then reads the file whole)."""
    if _SHARED.get(_shared_name(path)) is not None:
        return None  # a shared file is compared whole with its shared copy at each push anyway
    index = _stored_index(path)
    if index is None or not index.plain or not index.guard.startswith("state:"):
        return None
    at = index.find(job_id)
    if at is None:
        return None
    try:
        first, last = index.span(0)[0], sum(index.segments)
        start, end = index.span(at)
        with open(path, "rb") as fh:
            fd = fh.fileno()
            st = os.fstat(fd)
            if _file_state(st) != index.guard or not 0 <= first <= start < end <= last <= st.st_size:
                return None
            # each piece with the character before it (whole lines: the one before is a line end)
            pieces = [os.pread(fd, b - a + (a > 0), a - (a > 0)) for a, b in ((start, end), (last, st.st_size))]
            prefix = os.pread(fd, first, 0)
            if _file_state(os.fstat(fd)) != index.guard:
                return None  # written in place while read
        (block, suffix), head = (piece.decode("ascii") for piece in pieces), prefix.decode("ascii")
    except (OSError, ValueError, TypeError, IndexError):  # (UnicodeDecodeError is a ValueError)
        return None
    if not (len(head) == first and (first == 0 or head.endswith("\n")) and all(
            (len(piece) == b - a + (a > 0)) and (a == 0 or piece.startswith("\n"))
            for piece, (a, b) in ((block, (start, end)), (suffix, (last, st.st_size))))
            and block.endswith("\n")):
        return None
    return _part_of(path, job_id, index, at, None, head, block[start > 0:], suffix[last > 0:])


def _part_of(path: Path, job_id: str, index: _Index, at: int, text: str | None, prefix: str, block: str,
             suffix: str) -> _Part | None:
    """The part the index names, when the job's lines with the stack-wide ones make a valid config of
    this job alone."""
    try:
        parsed = _parse(path, prefix + block + suffix, shared=False)
    except ConfigError:
        return None  # a damaged index: read the whole file, whose errors are the ones to show
    raw = plain(parsed.doc.get("config", {}))
    jobs = raw.get(key("jobs"))
    if parsed.anchored or not (isinstance(jobs, list) and len(jobs) == 1 and isinstance(jobs[0], dict)
                               and jobs[0].get("id") == job_id):
        return None
    return _Part(index, text, at, prefix, block, suffix, raw, parsed.nodes)


def _splice_part(path: Path, part: _Part, job_id: str, fields: Mapping[str, Any]
                 ) -> tuple[str, StackConfig, _Index] | None:
    """(the new file, its config of this job, its index) with ``fields`` set in the job's lines, or
    None when the whole file must be edited instead (an id changed, an unusual layout, or a result
    the one-job check refuses: the whole file then names the problem with the job's real index)."""
    if "id" in fields:
        return None
    new_part = _splice_job_fields(part.prefix + part.block + part.suffix, job_id, fields)
    if new_part is None:
        return None
    try:
        parsed = _parse(path, new_part, shared=False)
    except ConfigError:
        return None
    expected = copy.deepcopy(part.raw)
    _set_fields(expected[key("jobs")][0], fields)
    if parsed.anchored or plain(parsed.doc.get("config", {})) != expected:
        return None
    head, tail = len(part.prefix), len(new_part) - len(part.suffix)
    if not (tail > head and new_part.startswith(part.prefix) and new_part.endswith(part.suffix)
            and new_part[tail - 1:tail] == part.block[-1:]):  # (still whole lines)
        return None  # the splice reached outside the job's lines
    nodes = part.index.nodes - part.nodes + parsed.nodes
    if nodes > MAX_NODES:
        return None
    try:
        new = reading.validate(namespaced(expected, str(path)), str(path))
    except ConfigError:
        return None
    block = new_part[head:tail]
    segments = part.index.segments[:]  # (a copy: the part may be read again)
    segments[2 * part.at + 1] = len(block)  # the jobs after it keep their gaps: nothing else changes
    return block, new, _Index("", nodes, part.index.ids, segments)  # (its guard once written: ``_update_job``)


def _rewrite(path: Path, part: _Part, block: str) -> str | None:
    """Write the stack file read in pieces (``_stamped_part``) with ``block`` as the job's lines, as
    ``atomic_write`` does, the rest copied from the file by the kernel (never into this process: the
    cost does not grow with the stack). Returns the new file's state when it is still ours after the
    write, "" when not (no index then), or None when the file changed since it was read (nothing written).

    Raises:
        ConfigError: the new file could not be written whole (a full disk): the old one stays.
    """
    import tempfile

    target = Path(os.path.realpath(path))
    start, end = part.index.span(part.at)
    data = block.encode("utf-8")
    stamp = time.time_ns()
    tmp, old = "", -1
    try:
        old = os.open(target, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(old)
        if _file_state(st) != part.index.guard:
            raise _Changed
        size = st.st_size - (end - start) + len(data)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb", buffering=0) as out:
            writing._copy(old, out.fileno(), 0, start)
            _write_all(out.fileno(), data)
            writing._copy(old, out.fileno(), end, st.st_size - end)
            if os.fstat(out.fileno()).st_size != size:
                raise OSError(errno.EIO, "the new file came out short")
            os.utime(out.fileno(), ns=(stamp, stamp))
            os.fsync(out.fileno())
        os.chmod(tmp, st.st_mode & 0o777)
        # last, right before the rename: a hand edit saved in place or over the file while this one
        # was copied or synced is kept (the guard covers the file's ctime and inode)
        if _file_state(os.fstat(old)) != part.index.guard:
            raise _Changed
        os.close(old)  # (before the rename, which then frees the old file's pages and blocks itself)
        old = -1
        _still(target, part.index.guard)
        os.replace(tmp, target)
    except BaseException as exc:
        if old >= 0:
            os.close(old)
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(exc, _Changed | FileNotFoundError):  # (removed: a checkout, a stash)
            return None
        if isinstance(exc, OSError):
            raise ConfigError(str(path), [f"cannot write: {exc.strerror or exc}; the file is as it was"]) from None
        raise
    _sync_folder(target)
    return _stamped_state(target, stamp, size)
