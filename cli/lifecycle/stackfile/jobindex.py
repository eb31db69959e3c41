"""The job index: where each job's lines are in a stack file spotctl validated whole, guarded by the
text's digest or spotctl's own write, sealed on disk."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.lifecycle.stackfile import reading
from cli.lifecycle.stackfile.reading import _LAST_READ, _LAST_WRITTEN, _digest, _Parsed, _remember
from cli.lifecycle.stackfile.refs import StackRef, index_path
from cli.lifecycle.stackfile.splicing import _jobs_in, _last_line

# ---- the job index: one job read and edited in a time independent of the stack's size ----------------
# A stack file spotctl validated whole is recorded by the reading.sha256 of its whole text and the
# validation code's fingerprint, with the place of every job. While the file still has that hash, a
# command about one job reads and validates only the stack-wide settings and that job's lines: every
# cross-job rule of infra/config/ compares only job ids (unique, not a pool's name), and an edit of
# one job never changes its id. A file with anchors or aliases, or not in plain block layout, is never
# indexed; anything unexpected falls back to the whole file. The index is a cache: a stale, damaged
# or foreign one only means the whole file is read.
#
# Why these choices (the cost of one job's edit must not grow with the stack; and an
# adversary): a file spotctl read is guarded by its content, not size + mtime + inode (an in-place
# edit within the file system's timestamp granularity keeps those: the kernel stamps writes with a
# clock that moves once per tick), and by a cryptographic hash, not a CRC: a CRC is linear, so a file
# of the same length and CRC is built in milliseconds, and an audit did so with a copy of a job
# inside another job's `command: |` text at the old offsets: the edit changed that text and reported
# success. A file spotctl itself wrote is guarded by its state instead (device, inode, size, mtime and
# ctime, read after the write): spotctl stamps the new file's mtime with the clock to the nanosecond,
# which no later write leaves in place (a write sets the tick's time, a rename-over another inode,
# and either sets the ctime, which only the kernel sets), so the state names that version of the
# file without hashing it twice per edit (~1 ms each for a 2 MB file); what a commit or a hand edit
# brings never has it, so it is read and hashed whole. A file system that drops the nanoseconds (the
# stamp read back differs) gets the hash. Who can run code as this user could forge the state, but
# could as well replace this user's key below. The index file itself is sealed with this user's key
# (``cli.lifecycle.cachefile``): the folder is in the checkout, and a forged index could name any
# lines as a job's. Jobs are stored as the lengths of the text's segments (the gap before each job,
# the job), not absolute offsets, so an edit changes one number instead of shifting every later
# job's; the ids and lengths are stored raw (a space-separated line and a machine-word array) rather
# than as JSON, so reading and rewriting the index is a few memory copies at any size.

INDEX_VERSION = 5  # 5: guard by reading.sha256 or spotctl's stamped write; 4: sealed, guard by reading.sha256; 3: CRC-32 (forgeable), segment lengths in binary; 2: JSON offsets; 1: lines
_RULES: list[str] = []
_WORD = "I"  # array typecode of a segment length (4 bytes: a stack file is far below 4 GiB)


def _rules() -> str:
    """A fingerprint of the code that validates stack files: an index written under other rules
    (another spotctl version) proves nothing."""
    if not _RULES:
        import importlib.util

        infra_dir = Path(importlib.util.find_spec("infra").origin).parent  # (not imported: no pydantic for a reader)
        _RULES.append(code_fingerprint(INDEX_VERSION, *sorted((infra_dir / "config").glob("*.py")), infra_dir / "basics.py",
                                       *sorted((infra_dir / "contract").glob("gcp*.py")), *sorted(Path(__file__).parent.glob("*.py"))))
    return _RULES[0]


def code_fingerprint(version: int, *sources: Path) -> str:
    """Which code this is, for a cache that code produced: each source file's size and CRC-32 (a
    version check, not a guard against forgery: ~30x cheaper than hashing it)."""
    import zlib

    parts = [str(version)]
    for source in sources:
        data = source.read_bytes()
        parts.append(f"{len(data)}:{zlib.crc32(data):08x}")
    return "/".join(parts)


def _guard(text: str) -> str:
    """The guard an index of ``text`` records: the file's state when spotctl just wrote this very text
    (stamped: the section's comment), else the text's reading.sha256."""
    last = _LAST_WRITTEN[0] if _LAST_WRITTEN else None
    if last is not None and last[0] is text and last[2] is not None:
        return last[2]
    return _digest(text)


def _plain_written(text: str) -> bool:
    """Whether the stack file spotctl just wrote as ``text`` is plain (its bytes are its text)."""
    last = _LAST_WRITTEN[0] if _LAST_WRITTEN else None
    return last is not None and last[0] is text and len(last[1]) == len(text)


def _guards(guard: str, text: str) -> bool:
    """Whether an index's ``guard`` holds for ``text`` (the file's, as just read or written)."""
    if guard.startswith("state:"):
        return any(seen is text and state == guard for seen, _, state in (*_LAST_READ, *_LAST_WRITTEN))
    return guard == _digest(text)


def _job_spans(lines: list[str], parsed: _Parsed) -> list[list[Any]] | None:
    """``[[id, first line, end line], ...]`` of every job in file order (its own comment lines above
    it included, as ``_entry_lines``), or None for a file the index does not handle."""
    import yaml

    jobs = _jobs_in(parsed.root)
    if parsed.anchored or jobs is None or not jobs.value:
        return None
    spans: list[list[Any]] = []
    previous_end = 0
    for entry in jobs.value:
        if not isinstance(entry, yaml.MappingNode) or entry.flow_style:
            return None
        ident = next((v.value for k, v in entry.value if k.value == "id" and isinstance(v, yaml.ScalarNode)), None)
        if not isinstance(ident, str) or not ident or ident.split() != [ident]:  # (ids are stored space-separated)
            return None
        start, end = entry.start_mark.line, _last_line(entry) + 1
        dash = len(lines[start]) - len(lines[start].lstrip(" "))
        while start > previous_end and lines[start - 1].strip().startswith("#") and \
                len(lines[start - 1]) - len(lines[start - 1].lstrip(" ")) == dash:
            start -= 1
        spans.append([ident, start, end])
        previous_end = end
    return spans


@dataclass
class _Index:
    """A stack file's job index: what it guards and where each job's lines are (character offsets into
    the LF text without a byte-order mark, whole lines)."""

    guard: str  # _guard of the text it indexes
    nodes: int  # the YAML nodes of the whole text (MAX_NODES holds for an edit of one job)
    ids: str  # the job ids in file order, space-separated
    segments: Any  # array: per job, the characters before it (since the previous job's end), then its own
    plain: bool = False  # the file's bytes are its text (ASCII, LF, no byte-order mark): offsets are the file's

    def find(self, job_id: str) -> int | None:
        """The job's place in file order, or None."""
        at = f" {self.ids} ".find(f" {job_id} ")
        return None if at < 0 else self.ids.count(" ", 0, at)

    def span(self, at: int) -> tuple[int, int]:
        """[start, end) of the ``at``-th job."""
        start = sum(self.segments[:2 * at + 1])
        return start, start + self.segments[2 * at + 1]

    def spans(self) -> list[tuple[str, int, int]]:
        """(id, start, end) of every job in file order."""
        import itertools

        ends = list(itertools.accumulate(self.segments))
        return [(ident, ends[2 * k], ends[2 * k + 1]) for k, ident in enumerate(self.ids.split(" "))]

    def to_bytes(self) -> bytes:
        head = json.dumps({"version": INDEX_VERSION, "rules": _rules(), "guard": self.guard, "nodes": self.nodes,
                           "jobs": len(self.segments) // 2, "plain": self.plain})
        return b"\n".join((head.encode(), self.ids.encode(), self.segments.tobytes()))

    @classmethod
    def from_bytes(cls, data: bytes) -> _Index | None:
        """The index in ``data`` when written by this code under these rules and whole, else None."""
        import array

        try:
            head, ids, raw = data.split(b"\n", 2)
            if len(head) > 4096:
                return None
            meta = json.loads(head)
            segments = array.array(_WORD)
            segments.frombytes(raw)
            index = cls(meta["guard"], meta["nodes"], ids.decode(), segments, meta["plain"] is True)
            ok = (meta["version"] == INDEX_VERSION and meta["rules"] == _rules() and isinstance(index.nodes, int)
                  and isinstance(index.guard, str) and meta["jobs"] > 0 and len(segments) == 2 * meta["jobs"]
                  and index.ids.count(" ") == meta["jobs"] - 1)
        except (ValueError, KeyError, TypeError, RecursionError):  # (json, utf-8 and a torn array are ValueErrors)
            return None
        return index if ok else None


def _index(path: Path, text: str, parsed: _Parsed) -> None:
    """Index ``text``, just validated whole (by ``load`` or a whole-file edit): each job's place as
    lengths of the text's segments (see the section's comment)."""
    import array
    import itertools

    existing = _read_index(path, text)
    kept = existing is not None and existing.guard.startswith("state:")  # (spotctl's write: a hash would be a downgrade)
    lines = [] if kept or "\r" in text else text.split("\n")  # (a lone CR is a YAML line break: never indexed)
    try:
        spans = _job_spans(lines, parsed) if lines else None
        if spans is not None:
            starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))  # of each line
            segments, previous = array.array(_WORD), 0
            for _, a, b in spans:
                start, end = starts[a], min(starts[b], len(text))
                segments.extend((start - previous, end - start))
                previous = end
    except (IndexError, OverflowError):  # YAML's line breaks are not only LF (a lone CR, NEL): not indexed
        spans = None
    if spans is not None:
        _write_index(path, _Index(_guard(text), parsed.nodes, " ".join(ident for ident, _, _ in spans), segments,
                                  _plain_written(text)))
        with contextlib.suppress(OSError):  # an earlier version's index (JSON) says nothing any more
            index_path(path).with_name(f"{path.name}.index.json").unlink()
    # a later load of this text in this process need not index it again (absolute: a relative path
    # names another file once the working directory changes)
    _remember(_digest(text), indexed=os.path.abspath(path))


def _write_index(path: Path, index: _Index) -> None:
    write_cache(index_path(path), index.to_bytes())


def write_cache(target: Path, value: Any) -> None:
    """Write a cache file (the job index, status's per-job cache) whole or not at all, never failing,
    sealed (``cli.lifecycle.cachefile``). ``value``: the bytes to write, or a value written as JSON."""
    from cli.lifecycle import cachefile

    cachefile.write(target, value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode())


CACHE_LIMIT = 1 << 26  # bytes of a cache file read at most (a 5,000-job index is ~60 KB)


def _read_index(path: Path, text: str) -> _Index | None:
    """The index of exactly this text under these rules, sealed by this user's spotctl, or None."""
    index = _stored_index(path)
    return index if index is not None and _guards(index.guard, text) else None


def _stored_index(path: Path) -> _Index | None:
    """The index file beside ``path`` when sealed by this user's spotctl and written by this code, or None."""
    from cli.lifecycle import cachefile

    data = cachefile.read(index_path(path), CACHE_LIMIT)
    return _Index.from_bytes(data) if data is not None else None


def job_digests(ref: StackRef, text: str, only: str | None = None) -> list[tuple[str, str]] | None:
    """``(id, reading.sha256 of its lines)`` of every job in file order (``only``: of that job alone, []
    when the file has none) when ``text`` (the file's) is exactly one spotctl validated whole under these
    rules (its index matches), else None. What a reader derived from one job's validated config stays
    true while that job's lines do, so it can be kept per job and used without parsing or validating
    anything (``status``)."""
    index = _read_index(ref.path, text)
    if index is None:
        return None
    if only is not None:
        at = index.find(only)
        spans = [] if at is None else [(only, *index.span(at))]
    else:
        spans = index.spans()
    return [(ident, reading.sha256(text[start:end].encode("utf-8", "surrogatepass")).hexdigest()) for ident, start, end in spans]
