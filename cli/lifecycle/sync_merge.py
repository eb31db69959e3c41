"""The three-way merge of a stack file with its shared copy, per job against the last synced copy: a
job changed on one side takes that side, on both is a conflict; the local file's comments, layout
and line ends stay. Pure: texts in, text out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.jobmerge import check_forward, merge_fields
from cli.lifecycle.states import LifecycleError
from infra.config import ConfigError, namespaced, validate

SIDES = ("local", "shared")
SETTINGS = "the stack-wide settings (everything but spotctl:jobs)"


def as_text(data: bytes, where: str) -> str:
    """A stack file's bytes as the loader reads them (UTF-8, no byte-order mark, LF line ends)."""
    return stackfile.decode(data, where)


# ---- the merge (pure) ---------------------------------------------------------------------------------


class Conflict(ConfigError):
    """The same job (or the stack-wide settings) changed both here and in the shared copy."""


@dataclass
class Merged:
    text: str
    from_shared: list[str] = field(default_factory=list)  # jobs (or SETTINGS) the shared copy changed
    from_local: list[str] = field(default_factory=list)  # ... this file changed (still to push)
    dropped: list[str] = field(default_factory=list)  # jobs only this file had, never synced: not merged in


def _parse_as(path: Path, text: str, where: str) -> Any:
    """``stackfile._parse`` of a text that is not ``path``'s own: its errors name ``where``."""
    try:
        return stackfile._parse(path, text, shared=False)
    except ConfigError as exc:
        if exc.source != str(path) or where == str(path):
            raise
        raise ConfigError(where, exc.problems) from None


def _split(path: Path, text: str, where: str) -> tuple[dict[str, Any], dict[str, Any], list[str], bool]:
    """(the document without spotctl:jobs, job id -> entry, ids in file order, whether it has the key)."""
    doc = stackfile.plain(_parse_as(path, text, where).doc or {})
    config = dict(doc.get("config") or {})
    has_jobs = stackfile.key("jobs") in config
    entries = config.pop(stackfile.key("jobs"), None) or []
    jobs: dict[str, Any] = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        ident = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(ident, str) or ident in jobs:
            raise ConfigError(where, [f"spotctl:jobs[{i}]: a job without a unique id cannot be merged"])
        jobs[ident] = entry
    return {**doc, "config": config}, jobs, list(jobs), has_jobs


def _side(name: str, base: Any, ours: Any, theirs: Any, has_base: bool, keep: str | None) -> str | None:
    """Which side one job (or the settings) is taken from: "same", "local", "shared", or None (a conflict)."""
    if ours == theirs:
        return "same"
    if has_base and ours == base:
        return "shared"
    if has_base and theirs == base:
        return "local"
    if not has_base and ours is None:
        return "shared"
    if not has_base and theirs is None:
        return "dropped"  # never synced: the shared copy is the live file, and it lacks (removed?) this job
    return keep


def merge(path: Path, base: str | None, ours: str, theirs: str, *, keep: str | None = None,
          where: str = "the shared copy", hint: str = "") -> Merged:
    """Merge the shared copy ``theirs`` into the local ``ours`` per job, against ``base`` (the copy
    last synced; None: never synced, so the shared copy's jobs are taken and a job only ``ours`` has is
    left out, listed in ``dropped``: without a base it cannot be told from a job removed there).

    Raises:
        Conflict: a job (or the settings) changed on both sides and ``keep`` does not say which wins.
        ConfigError: either side cannot be read, or the result is not a valid stack file.
    """
    if theirs == ours or (base is not None and theirs == base):
        return Merged(ours)
    o_rest, o_jobs, o_order, o_has = _split(path, ours, str(path))
    t_rest, t_jobs, t_order, t_has = _split(path, theirs, where)
    if base is not None and ours == base:  # nothing changed here: the shared copy as it is, if it moves no job back
        _validated(path, theirs, where)
        _forward(t_jobs, o_jobs, t_jobs, path, where)
        return Merged(theirs, from_shared=_changed(path, base, theirs, where))
    b_rest, b_jobs = (None, {}) if base is None else _split(path, base, f"{path} (last synced copy)")[:2]
    has_base = base is not None
    conflicts: list[str] = []
    settings = _side(SETTINGS, b_rest, o_rest, t_rest, has_base, keep)
    if settings is None:
        conflicts.append(SETTINGS)
    sides: dict[str, str] = {}
    fields: dict[str, dict] = {}  # jobs changed on both sides, merged field by field (``keep`` for the fields in conflict)
    for ident in dict.fromkeys(o_order + t_order):
        b, o, t = b_jobs.get(ident), o_jobs.get(ident), t_jobs.get(ident)
        side = _side(ident, b, o, t, has_base, None)
        if side is None and keep in SIDES and has_base and isinstance(o, dict) and isinstance(t, dict):
            fields[ident], side = merge_fields(b if isinstance(b, dict) else {}, o, t, keep), "local"
        side = side or keep
        if side is None:
            conflicts.append(f"job {ident}")
        else:
            sides[ident] = side
    if conflicts:
        raise Conflict(str(path), [f"{what} changed both here and in {where}: nothing was written{hint}" for what in conflicts])
    host_is_local = settings != "shared"
    host_order, other_order = (o_order, t_order) if host_is_local else (t_order, o_order)
    kept = {i for i, s in sides.items() if (o_jobs if s in ("same", "local") else t_jobs).get(i) is not None}
    dropped = [i for i, s in sides.items() if s == "dropped"]
    order = [i for i in host_order if i in kept]
    for n, ident in enumerate(other_order):  # the other side's new jobs, after the job they follow there
        if ident in kept and ident not in order:
            before = next((other_order[m] for m in range(n - 1, -1, -1) if other_order[m] in order), None)
            order.insert(0 if before is None else order.index(before) + 1, ident)
    from_host = {i: (sides[i] in ("same", "local")) == host_is_local for i in order}
    host, other = (ours, theirs) if host_is_local else (theirs, ours)
    rest, has_jobs = (o_rest, o_has) if host_is_local else (t_rest, t_has)
    entries = [(o_jobs if sides[i] in ("same", "local") else t_jobs)[i] for i in order]
    expected = {**rest, "config": {**rest["config"], **({stackfile.key("jobs"): entries} if entries or has_jobs else {})}}
    text = _assemble(path, host, other, order, from_host, expected)
    if fields:
        final = [fields.get(i, e) for i, e in zip(order, entries, strict=True)]
        text = _with_fields(path, text, {i: (o_jobs[i], f) for i, f in fields.items() if f != o_jobs[i]},
                            {**expected, "config": {**expected["config"], stackfile.key("jobs"): final}})
    _forward({i: fields.get(i, e) for i, e in zip(order, entries, strict=True)}, o_jobs, t_jobs, path, where)
    text = _validated(path, text, f"{path} (merged with {where})")
    return Merged(text, from_shared=([SETTINGS] if settings == "shared" else []) + [i for i, s in sides.items() if s == "shared"],
                  from_local=([SETTINGS] if settings == "local" else []) + [i for i, s in sides.items() if s == "local"],
                  dropped=dropped)


def _forward(merged: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any], path: Path, where: str) -> None:
    """Refuse a merge that moves a job backwards from either side (``jobmerge.check_forward``).

    Raises:
        Conflict: names the job, the side and both states.
    """
    for ident, entry in merged.items():
        try:
            check_forward(ident, entry, {str(path): ours.get(ident), where: theirs.get(ident)})
        except LifecycleError as exc:
            raise Conflict(str(path), [str(exc)]) from None


def _with_fields(path: Path, text: str, changes: dict[str, tuple[dict, dict]], expected: Any) -> str:
    """``text`` (whose jobs are this file's entries) with each job of ``changes`` (id -> (its entry in
    ``text``, the field-merged one)) rewritten: only the changed values' spans where the layout
    allows, else a ruamel round trip. Checked against ``expected``."""
    for ident, (before, after) in changes.items():
        edit = {k: v for k, v in after.items() if before.get(k, stackfile.MISSING) != v}
        edit.update({k: stackfile.MISSING for k in before if k not in after})
        spliced = stackfile._splice_job_fields(text, ident, edit)
        if spliced is None:
            return _round_trip_fields(path, text, changes, expected)
        text = spliced
    if stackfile.plain(stackfile._parse(path, text, shared=False).doc) != expected:
        return _round_trip_fields(path, text, changes, expected)
    return text


def _round_trip_fields(path: Path, text: str, changes: dict[str, tuple[dict, dict]], expected: Any) -> str:
    import io

    doc = stackfile._load_document(path, text)
    for entry in (doc.get("config") or {}).get(stackfile.key("jobs")) or []:
        if entry.get("id") in changes:
            after = changes[entry["id"]][1]
            for k in [k for k in entry if k not in after]:
                del entry[k]
            for k, v in after.items():
                if entry.get(k, stackfile.MISSING) != v:
                    entry[k] = v
    buf = io.StringIO()
    stackfile._yaml().dump(doc, buf)
    if stackfile.plain(stackfile._parse(path, buf.getvalue(), shared=False).doc) != expected:
        raise ConfigError(str(path), ["cannot merge the shared copy into this file's layout: run `spotctl sync` after "
                                      "making the file plain block YAML"])
    return buf.getvalue()


def _validated(path: Path, text: str, source: str) -> str:
    """``text`` if it is a valid stack file; errors name ``source`` (the shared copy, or the merge)."""
    config = stackfile.plain(_parse_as(path, text, source).doc.get("config", {}))
    validate(namespaced(config, source), source)
    return text


def _changed(path: Path, before: str, after: str, where: str) -> list[str]:
    """The jobs (and SETTINGS) that differ between two texts."""
    b_rest, b_jobs, _, _ = _split(path, before, f"{path} (last synced copy)")
    a_rest, a_jobs, _, _ = _split(path, after, where)
    return ([SETTINGS] if b_rest != a_rest else []) + [i for i in dict.fromkeys([*b_jobs, *a_jobs]) if b_jobs.get(i) != a_jobs.get(i)]


def _assemble(path: Path, host: str, other: str, order: list[str], from_host: dict[str, bool], expected: Any) -> str:
    """The host text with its job entries replaced by ``order``'s, each job's lines taken from the text
    it comes from (with the blank and comment lines above it); a ruamel round-trip when a layout is not
    plain block style. Checked against ``expected`` (the document the merge decided)."""
    blocks: dict[str, list[str]] = {}
    around: tuple[list[str], list[str]] | None = None  # the host's lines before its first job, after its last
    for text, mine in ((host, True), (other, False)):
        lines = text.split("\n")
        spans = stackfile._job_spans(lines, stackfile._parse(path, text, shared=False))
        for n, (ident, start, end) in enumerate(spans or []):
            if from_host.get(ident) is mine:
                blocks[ident] = lines[(spans[n - 1][2] if n else start):end]
        if mine and spans:
            around = lines[:spans[0][1]], lines[spans[-1][2]:]
    if around is not None and len(blocks) == len(order):
        text = "\n".join(around[0] + [line for ident in order for line in blocks[ident]] + around[1])
        if stackfile.plain(stackfile._parse(path, text, shared=False).doc) == expected:
            return text
    return _round_trip(path, host, other, order, from_host, expected)


def _round_trip(path: Path, host: str, other: str, order: list[str], from_host: dict[str, bool], expected: Any) -> str:
    import io

    doc, other_doc = stackfile._load_document(path, host), stackfile._load_document(path, other)
    pick = {}
    for d, mine in ((doc, True), (other_doc, False)):
        for entry in (d.get("config") or {}).get(stackfile.key("jobs")) or []:
            if from_host.get(entry.get("id")) is mine:
                pick[entry["id"]] = entry
    config = doc.setdefault("config", {})
    if order or stackfile.key("jobs") in config:
        config[stackfile.key("jobs")] = [pick[i] for i in order]
    buf = io.StringIO()
    stackfile._yaml().dump(doc, buf)
    text = buf.getvalue()
    if stackfile.plain(stackfile._parse(path, text, shared=False).doc) != expected:
        raise ConfigError(str(path), ["cannot merge the shared copy into this file's layout: run `spotctl sync` after "
                                      "making the file plain block YAML"])
    return text
