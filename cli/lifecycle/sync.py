"""The stack file's shared copy: one object in the stack's event bucket that every machine editing
the stack (laptops, CI, the watcher VM) pulls before it decides and pushes after it writes.

Key ``<stack>.spotctl/Pulumi.<stack>.yaml`` (``shared_key``): beside, never under, the events'
``<stack>/`` prefix, so the bucket's expiry rule (scoped to ``<stack>/``) never deletes it and no job's
identity (which may write only ``<stack>/<job>/``) can write it. This machine's last synced copy (the
merge base) and its generation live in ``stacks/.spotctl/`` beside the job index.

- **pull** (when a command takes the stack file's lock, and ``spotctl sync``): if the shared copy's
  generation is not the one last synced, merge it into the local file per job, three-way against the
  last synced copy: a job changed on one side only takes that side; the same job changed on both is one
  error naming the job and the file, and nothing is written. The local file's comments, layout and line
  ends stay (a job taken from the shared copy brings its own lines).
- **push** (after every write of the stack file under the lock): a conditional write (S3 ``If-Match`` /
  ``If-None-Match``, GCS ``ifGenerationMatch``), so two writers never overwrite each other: a lost race
  undoes the local write, pulls, and the command decides again (``stackfile._synced``).
- Unreachable (no credentials, offline): one warning, then the local file alone, as without sharing.

Pure decisions (``merge``) are apart from I/O; the cloud is the ``cli.cloud.Cloud`` object.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.cloud import CloudError, PreconditionFailed
from cli.lifecycle import stackfile
from infra.config import ConfigError, namespaced, validate
from infra.naming import shared_stack_file

RECORD_VERSION = 1
SIDES = ("local", "shared")
SETTINGS = "the stack-wide settings (everything but spotctl:jobs)"


def shared_key(stack: str) -> str:
    """The shared copy's object name in the stack's event bucket."""
    return shared_stack_file(stack)


def record_path(path: Path) -> Path:
    return stackfile.sync_record_path(path)


def base_path(path: Path) -> Path:
    return stackfile.index_path(path).with_name(f"{path.name}.sync.base")


@dataclass(frozen=True)
class Record:
    """What this machine last synced: where, the generation, and that copy's text (the merge base)."""

    bucket: str
    key: str
    generation: str | None
    base: str | None


def read_record(path: Path) -> Record | None:
    """The record, or None (never synced; a damaged record counts as none: the next pull has no base)."""
    try:
        doc = json.loads(record_path(path).read_text(encoding="utf-8"))
        if doc["version"] != RECORD_VERSION:
            return None
        bucket, key, generation = str(doc["bucket"]), str(doc["key"]), doc["generation"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        base = base_path(path).read_text(encoding="utf-8")
    except OSError:
        base = None
    return Record(bucket, key, None if generation is None else str(generation), base)


def write_record(path: Path, rec: Record) -> None:
    record_path(path).parent.mkdir(exist_ok=True)
    if rec.base is not None:
        stackfile.atomic_write(base_path(path), rec.base)
    stackfile.atomic_write(record_path(path), json.dumps(
        {"version": RECORD_VERSION, "bucket": rec.bucket, "key": rec.key, "generation": rec.generation}, sort_keys=True) + "\n")


def as_text(data: bytes, where: str) -> str:
    """A stack file's bytes as the loader reads them (UTF-8, no byte-order mark, LF line ends)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(where, ["not UTF-8 text"]) from None
    return text.removeprefix(stackfile.BOM).replace("\r\n", "\n")


# ---- the merge (pure) ---------------------------------------------------------------------------------


class Conflict(ConfigError):
    """The same job (or the stack-wide settings) changed both here and in the shared copy."""


@dataclass
class Merged:
    text: str
    from_shared: list[str] = field(default_factory=list)  # jobs (or SETTINGS) the shared copy changed
    from_local: list[str] = field(default_factory=list)  # ... this file changed (still to push)


def _split(path: Path, text: str, where: str) -> tuple[dict[str, Any], dict[str, Any], list[str], bool]:
    """(the document without spotctl:jobs, job id -> entry, ids in file order, whether it has the key)."""
    doc = stackfile.plain(stackfile._parse(path, text, shared=False).doc or {})
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
        return "local"
    return keep


def merge(path: Path, base: str | None, ours: str, theirs: str, *, keep: str | None = None,
          where: str = "the shared copy", hint: str = "") -> Merged:
    """Merge the shared copy ``theirs`` into the local ``ours`` per job, against ``base`` (the copy
    last synced; None: never synced, so only what one side lacks is taken).

    Raises:
        Conflict: a job (or the settings) changed on both sides and ``keep`` does not say which wins.
        ConfigError: either side cannot be read, or the result is not a valid stack file.
    """
    if theirs == ours or (base is not None and theirs == base):
        return Merged(ours)
    if base is not None and ours == base:  # nothing changed here: the shared copy as it is
        _validated(path, theirs, where)
        return Merged(theirs, from_shared=_changed(path, base, theirs, where))
    o_rest, o_jobs, o_order, o_has = _split(path, ours, str(path))
    t_rest, t_jobs, t_order, t_has = _split(path, theirs, where)
    b_rest, b_jobs = (None, {}) if base is None else _split(path, base, f"{path} (last synced copy)")[:2]
    has_base = base is not None
    conflicts: list[str] = []
    settings = _side(SETTINGS, b_rest, o_rest, t_rest, has_base, keep)
    if settings is None:
        conflicts.append(SETTINGS)
    sides: dict[str, str] = {}
    for ident in dict.fromkeys(o_order + t_order):
        side = _side(ident, b_jobs.get(ident), o_jobs.get(ident), t_jobs.get(ident), has_base, keep)
        if side is None:
            conflicts.append(f"job {ident}")
        else:
            sides[ident] = side
    if conflicts:
        raise Conflict(str(path), [f"{what} changed both here and in {where}: nothing was written{hint}" for what in conflicts])
    host_is_local = settings != "shared"
    host_order, other_order = (o_order, t_order) if host_is_local else (t_order, o_order)
    kept = {i for i, s in sides.items() if (o_jobs if s in ("same", "local") else t_jobs).get(i) is not None}
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
    text = _validated(path, _assemble(path, host, other, order, from_host, expected), f"{path} (merged with {where})")
    return Merged(text, from_shared=([SETTINGS] if settings == "shared" else []) + [i for i, s in sides.items() if s == "shared"],
                  from_local=([SETTINGS] if settings == "local" else []) + [i for i, s in sides.items() if s == "local"])


def _validated(path: Path, text: str, source: str) -> str:
    """``text`` if it is a valid stack file; errors name ``source`` (the shared copy, or the merge)."""
    config = stackfile.plain(stackfile._parse(path, text, shared=False).doc.get("config", {}))
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


# ---- the session: pull and push through the cloud ----------------------------------------------------


@dataclass
class Shared:
    """One stack file shared through ``bucket`` for the length of a command (``stackfile.sharing``)."""

    ref: stackfile.StackRef
    cloud: Any  # cli.cloud.Cloud (object_generation, read_object, write_object)
    bucket: str
    warn: Callable[[str], None]
    keep: str | None = None  # resolve conflicts with this side (``spotctl sync --keep``)
    keep_unsynced: str | None = None  # ... only while this machine never synced (the watcher VM's fresh clone)
    offline: bool = False
    pulled: list[Merged] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)  # the generations this session wrote

    @property
    def key(self) -> str:
        return shared_key(self.ref.name)

    def where(self, generation: str | None = None) -> str:
        scheme = "s3" if getattr(self.cloud.cfg, "cloud", "aws") == "aws" else "gs"
        return f"the shared copy {scheme}://{self.bucket}/{self.key}" + (f" (generation {generation})" if generation else "")

    def _unreachable(self, exc: CloudError) -> None:
        self.offline = True
        self.warn(f"{self.where()} cannot be reached ({exc}): {self.ref.path} is used as it is here, "
                  "and the next command that reaches it merges")

    def _record(self) -> Record | None:
        rec = read_record(self.ref.path)
        return rec if rec is not None and (rec.bucket, rec.key) == (self.bucket, self.key) else None

    def pull(self) -> Merged | None:
        """Merge a newer shared copy into the local file (the caller holds the stack file's lock)."""
        if self.offline:
            return None
        try:
            generation = self.cloud.object_generation(self.bucket, self.key)
            rec = self._record()
            if generation is None or (rec is not None and rec.generation == generation):
                if generation is None and rec is not None and rec.generation is not None:  # deleted: create it anew
                    write_record(self.ref.path, Record(self.bucket, self.key, None, rec.base))
                return None
            got = self.cloud.read_object(self.bucket, self.key)
        except CloudError as exc:
            self._unreachable(exc)
            return None
        if got is None:
            return None  # replaced or deleted between the two calls: the push finds out
        data, generation = got
        theirs = as_text(data, self.where(generation))
        ours = stackfile._read_text(self.ref.path)
        hint = (f" (keep one side: `spotctl sync --stack {self.ref.name} --keep local` or `--keep shared`, "
                "or make the job the same in both)")
        merged = merge(self.ref.path, rec.base if rec else None, ours, theirs,
                       keep=self.keep or (self.keep_unsynced if rec is None else None), where=self.where(generation), hint=hint)
        if merged.text != ours:
            stackfile.atomic_write(self.ref.path, merged.text)
            with contextlib.suppress(ConfigError):
                stackfile._index(self.ref.path, merged.text, stackfile._parse(self.ref.path, merged.text))
        write_record(self.ref.path, Record(self.bucket, self.key, generation, theirs))
        self.pulled.append(merged)
        return merged

    def push(self) -> str | None:
        """Write the local file to the shared copy if it changed since the last sync; the new generation.

        Raises:
            stackfile.SharedCopyMoved: someone else wrote the shared copy since this machine's pull.
        """
        if self.offline:
            return None
        local = stackfile._read_text(self.ref.path)
        rec = self._record()
        if rec is not None and rec.generation is not None and rec.base == local:
            return None
        data = Path(os.path.realpath(self.ref.path)).read_bytes()
        try:
            generation = self.cloud.write_object(self.bucket, self.key, data, rec.generation if rec else None)
        except PreconditionFailed:
            raise stackfile.SharedCopyMoved(self.where()) from None
        except CloudError as exc:
            self._unreachable(exc)
            return None
        write_record(self.ref.path, Record(self.bucket, self.key, generation, local))
        self.pushed.append(generation)
        return generation

    def behind(self) -> str | None:
        """A line saying the local file is behind the shared copy, or None (in sync, unreachable, none)."""
        try:
            generation = self.cloud.object_generation(self.bucket, self.key)
        except CloudError as exc:
            self._unreachable(exc)
            return None
        rec = self._record()
        if generation is None or (rec is not None and rec.generation == generation):
            return None
        synced = f", last synced {rec.generation}" if rec and rec.generation else ", never synced here"
        return (f"{self.ref.path} is behind {self.where(generation)}{synced}: the next command that changes it merges "
                f"it first, or run `spotctl sync --stack {self.ref.name}`")


@dataclass
class SyncReport:
    pulled: Merged | None
    pushed: str | None
    generation: str | None
    offline: bool


def sync(session: Shared, tries: int = stackfile.SYNC_TRIES) -> SyncReport:
    """``spotctl sync``: pull (merge) then push, under the stack file's lock; a push that loses a race
    pulls again."""
    with stackfile.sharing(session.ref.path, session), stackfile.locked(session.ref.path):  # pulls
        for _ in range(tries):
            try:
                pushed = session.push()
                break
            except stackfile.SharedCopyMoved:
                session.pull()
        else:
            raise ConfigError(str(session.ref.path), [f"{session.where()} kept changing ({tries} tries): run it again"])
    rec = session._record()
    return SyncReport(session.pulled[-1] if session.pulled else None, pushed, rec.generation if rec else None, session.offline)
