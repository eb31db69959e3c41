"""Edits of a stack file under the lock: a change of its config, one job's keys, cutting a job out
and putting it back; each validated, written atomically and pushed."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.basics import ConfigError

if TYPE_CHECKING:
    from infra.config import StackConfig

from cli.lifecycle.stackfile import jobindex, reading
from cli.lifecycle.stackfile.commit import _commit, _synced
from cli.lifecycle.stackfile.jobindex import _guard, _plain_written, _write_index
from cli.lifecycle.stackfile.locking import locked
from cli.lifecycle.stackfile.parts import _job_part, _rewrite, _splice_part, _stamped_part
from cli.lifecycle.stackfile.reading import (
    _fast_load,
    _load_document,
    _parse,
    _parsed,
    _remember,
    _yaml,
    namespaced,
    plain,
    provider_conflicts,
    read_config,
)
from cli.lifecycle.stackfile.splicing import (
    _entry_lines,
    _jobs_node,
    _set_fields,
    _splice_job_fields,
    key,
    remove_job,
    set_job_fields,
)
from cli.lifecycle.stackfile.writing import CHANGED_MEANWHILE


def edit(path: Path, change: Callable[[Any, StackConfig], None]) -> StackConfig:
    """``_edit`` (below), pushed to the shared copy when the stack file is shared."""
    return _synced(path, lambda: _edit(path, change))


def _edit(path: Path, change: Callable[[Any, StackConfig], None]) -> StackConfig:
    """Apply ``change`` to the stack file's round-trip document, reading.validate, and write it back.

    ``change(config_map, current)`` mutates the ruamel ``config:`` map in place (so comments and
    unrelated keys stay exactly as they were) given the validated current config. The result is
    validated before writing; an invalid result raises ConfigError and the file is not touched.

    Returns:
        The validated new config.
    """
    with locked(path):
        text = reading._read_text(path)
        doc = _load_document(path, text)
        config = doc.setdefault("config", {})
        current = reading.validate(namespaced(plain(config), str(path)), str(path))
        before = plain(config)
        change(config, current)
        if plain(config) == before:
            return current  # nothing to write: the file stays byte-for-byte as it was
        new = reading.validate(namespaced(plain(config), str(path)), str(path))
        buf = io.StringIO()
        _yaml().dump(doc, buf)
        _commit(path, text, buf.getvalue())
        return new


def take_job(path: Path, job_id: str) -> tuple[str, int, dict[str, Any]]:
    """``_take_job`` (below), pushed to the shared copy when the stack file is shared."""
    return _synced(path, lambda: _take_job(path, job_id))


def _take_job(path: Path, job_id: str) -> tuple[str, int, dict[str, Any]]:
    """Remove one job from the stack file (under the lock, validated, atomically) by cutting exactly
    its lines, so the comments of the jobs around it stay. Returns (its text, its index, its keys)
    for ``put_back_job``. Raises KeyError when the file has no such job."""
    with locked(path):
        text = reading._read_text(path)
        raw = plain(_fast_load(path, text).get("config", {}))
        jobs = raw.get(key("jobs")) or []
        index = next((i for i, e in enumerate(jobs) if isinstance(e, dict) and e.get("id") == job_id), None)
        if index is None:
            raise KeyError(job_id)
        reading.validate(namespaced(raw, str(path)), str(path))
        expected = copy.deepcopy(raw)
        entry = expected[key("jobs")].pop(index)
        block, new_text = "", None
        if _jobs_node(text) is not None:
            lines = text.split("\n")
            start, end = _entry_lines(text, index)
            block = "\n".join(lines[start:end]) + "\n"
            new_text = "\n".join(lines[:start] + lines[end:])
        if new_text is None or plain(_fast_load(path, new_text).get("config", {})) != expected:
            doc = _load_document(path, text)
            remove_job(doc["config"], job_id)
            buf = io.StringIO()
            _yaml().dump(doc, buf)
            new_text, block = buf.getvalue(), ""
        reading.validate(namespaced(plain(_fast_load(path, new_text).get("config", {})), str(path)), str(path))
        _commit(path, text, new_text)
        return block, index, entry


def retire(path: Path, job_id: str, attempt: int) -> None:
    """Record that the job ``job_id`` is gone after ``attempt`` (``spotctl:retiredJobs``, under the lock):
    a new job of that id then starts after it (infra/config/stack.py), so the old one's events, which are
    kept, are never read as the new one's."""

    def change(config: Any, current: StackConfig) -> None:
        retired = config.get(key("retiredJobs"))
        if retired is None:
            config[key("retiredJobs")] = retired = {}
        retired[job_id] = max(attempt, int(retired.get(job_id) or 0))

    edit(path, change)


def put_back_job(path: Path, taken: tuple[str, int, dict[str, Any]]) -> bool:
    """``_put_back_job`` (below), pushed to the shared copy when the stack file is shared."""
    return _synced(path, lambda: _put_back_job(path, taken))


def _put_back_job(path: Path, taken: tuple[str, int, dict[str, Any]]) -> bool:
    """Undo ``take_job``: re-insert the job where it was, only if the file has no job of that id
    (a concurrent edit wins); everything else in the file stays as it is now. Returns whether it did."""
    block, index, entry = taken
    with locked(path):
        text = reading._read_text(path)
        raw = plain(_fast_load(path, text).get("config", {}))
        jobs = raw.get(key("jobs")) or []
        if any(isinstance(e, dict) and e.get("id") == entry.get("id") for e in jobs):
            return False
        expected = copy.deepcopy(raw)
        expected.setdefault(key("jobs"), []).insert(min(index, len(jobs)), entry)
        new_text = None
        if block and jobs and _jobs_node(text) is not None:
            lines = text.split("\n")
            at = _entry_lines(text, index)[0] if index < len(jobs) else _entry_lines(text, len(jobs) - 1)[1]
            new_text = "\n".join(lines[:at]) + ("\n" if at else "") + block + "\n".join(lines[at:])
        if new_text is None or plain(_fast_load(path, new_text).get("config", {})) != expected:
            doc = _load_document(path, text)
            config = doc.setdefault("config", {})
            if config.get(key("jobs")) is None:
                config[key("jobs")] = []
            config[key("jobs")].insert(min(index, len(jobs)), entry)
            buf = io.StringIO()
            _yaml().dump(doc, buf)
            new_text = buf.getvalue()
        reading.validate(namespaced(plain(_fast_load(path, new_text).get("config", {})), str(path)), str(path))
        _commit(path, text, new_text)
        return True


def update_job(path: Path, job_id: str, decide: Callable[[StackConfig, Mapping[str, Any]], Mapping[str, Any]]
               ) -> tuple[StackConfig, StackConfig]:
    """``_update_job`` (below), pushed to the shared copy when the stack file is shared (a lost race
    calls ``decide`` again, on the file with what won merged in)."""
    return _synced(path, lambda: _update_job(path, job_id, decide))


def _update_job(path: Path, job_id: str, decide: Callable[[StackConfig, Mapping[str, Any]], Mapping[str, Any]]
                ) -> tuple[StackConfig, StackConfig]:
    """Set fields of one job: ``decide(current, raw_entry)`` (called under the lock, on the validated
    file; ``raw_entry`` is the job's keys as written) returns them. Fast path: splice the values into the text, then re-read and check the result
    is exactly the intended config; anything unusual takes the ruamel round-trip instead. Either
    way comments and layout stay, the result is validated, and it is written atomically.

    Returns:
        (config before, config after); the same object twice when nothing changed.
    """
    with locked(path):
        part = _stamped_part(path, job_id)  # (a file spotctl wrote: never read whole)
        text = reading._read_text(path) if part is None else ""
        part = part or _job_part(path, text, job_id)
        if part is not None:
            raw = part.raw
            current = reading.validate(namespaced(raw, str(path)), str(path))
        else:
            raw = plain(_fast_load(path, text).get("config", {}))  # plain: a copy of the shared parse
            cached = _parsed(text)[1] or {}
            current = cached.get("cfg") or reading.validate(namespaced(raw, str(path)), str(path))
        written = next((e for e in raw.get(key("jobs")) or [] if isinstance(e, dict) and e.get("id") == job_id), {})
        fields = dict(decide(current, written))
        if not fields:
            return current, current
        if not written:  # removed since this command last read it (a hand edit, `cleanup --no-apply`)
            raise ConfigError(str(path), [f"job {job_id}: no longer in the stack file (removed while this command ran)"])
        if part is not None:
            spliced = _splice_part(path, part, job_id, fields)
            if spliced is not None:
                block, new, index = spliced
                if part.text is None:
                    guard = _rewrite(path, part, block)
                    if guard is None:  # a hand edit under the lock: never overwritten, and decided on what it replaced
                        raise ConfigError(str(path), [f"job {job_id}: {CHANGED_MEANWHILE}"])
                    index.guard, index.plain = guard, block.isascii()
                else:
                    start, end = part.index.span(part.at)
                    new_text = part.text[:start] + block + part.text[end:]  # one copy of the file, no split into lines
                    _commit(path, text, new_text)
                    index.guard, index.plain = _guard(new_text), _plain_written(new_text)  # (after the write)
                if index.guard:
                    _write_index(path, index)
                return current, new  # (only this job: never kept as the whole file's config)
            # something unusual: the whole file, with the fields already decided
            text = text or reading._read_text(path)  # (read in pieces: now whole)
            raw = plain(_fast_load(path, text).get("config", {}))
            current = reading.validate(namespaced(raw, str(path)), str(path))
        expected = raw  # already a copy of its own (plain), and decide is done with `written`
        entry = next(e for e in expected[key("jobs")] if isinstance(e, dict) and e.get("id") == job_id)
        _set_fields(entry, fields)
        new_text = _splice_job_fields(text, job_id, fields)
        new_raw = plain(_fast_load(path, new_text).get("config", {})) if new_text is not None else None
        if new_raw != expected:
            doc = _load_document(path, text)
            set_job_fields(doc["config"], job_id, fields)
            buf = io.StringIO()
            _yaml().dump(doc, buf)
            new_text = buf.getvalue()
            new_raw = plain(_fast_load(path, new_text).get("config", {}))
        new = reading.validate(namespaced(new_raw, str(path)), str(path))
        _commit(path, text, new_text)
        try:
            provider_conflicts(new_raw, new, str(path))
        except ConfigError:
            pass  # the next load reports it
        else:  # the next cycle's load of what was just written is not parsed or validated again
            _remember(_parsed(new_text)[0], cfg=new)
            jobindex._index(path, new_text, _parse(path, new_text))
        return current, new


def job_fields(path: Path, job_id: str, names: list[str]) -> dict[str, Any]:
    """The current values of some keys of one job, as written in the file."""
    raw = read_config(path)
    entry = next(e for e in raw.get(key("jobs")) or [] if isinstance(e, dict) and e.get("id") == job_id)
    return {n: entry[n] for n in names if n in entry}
