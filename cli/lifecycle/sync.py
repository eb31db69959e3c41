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
- Unreachable (no credentials, offline) when the lock is taken: one warning, then the local file alone
  for that command (or that watcher cycle; the next one tries again). Its edits are recorded as
  ``unpushed`` and pushed first by the next lock that reaches the bucket. A watcher (``strict``) holds
  back instead of acting on a file that may be stale. A push lost to a network error once the pull
  succeeded fails the command with the edit undone (``stackfile._commit``): nothing is applied on an
  edit the other machines cannot see.
- Never synced here (no merge base, e.g. the watcher VM's fresh clone): the shared copy is the team's
  live file, so a job only this file has is not merged in (a warning names it; the file as it was is
  kept beside the index), and a job both have differently is a conflict unless ``keep`` says.
- A shared copy that is not a valid stack file is named in the error (bucket and key), and
  ``spotctl sync --keep local`` replaces it with this file (conditional write) without reading it.
  The other way round, ``spotctl sync --keep shared`` replaces a local file that is not valid with the
  shared copy (the file as it was saved in ``stacks/.spotctl/<name>.broken``).

Pure decisions (``merge``) are apart from I/O; the cloud is the ``cli.cloud.Cloud`` object.
Longer than 420 lines because the merge and the session that pulls, pushes and marks unpushed edits
are one protocol (what the record means to one is what the other writes): split, each would be read
only with the other open.
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
from cli.lifecycle import cachefile, stackfile
from cli.lifecycle.jobmerge import check_forward, merge_fields
from cli.lifecycle.states import LifecycleError
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
    unpushed: bool = False  # the local file holds spotctl edits not yet in the shared copy


def read_record(path: Path) -> Record | None:
    """The record, or None (never synced; a damaged record counts as none: the next pull has no base).

    Sealed with this user's key (``cli.lifecycle.cachefile``), the merge base bound to it by its hash: a
    record or base a commit carried would otherwise name another bucket or pick the side of every job's
    merge. One not sealed by this key (an earlier version's, another user's after ``sudo``, a commit's)
    counts as none, and stderr names it and its bucket once, so a stack never stops being shared silently.
    Without a usable key, records are as earlier versions kept them (stderr has said the key is missing).
    """
    doc = cachefile.open_record(record_path(path), unsealed_without_key=True)
    if doc is None:
        _say_unsealed(path)
        return None
    try:
        if doc["version"] != RECORD_VERSION:
            return None
        bucket, key, generation = str(doc["bucket"]), str(doc["key"]), doc["generation"]
        unpushed, base_hash = bool(doc.get("unpushed", False)), doc.get("base")
    except (KeyError, TypeError):
        return None
    data = cachefile.read_bounded(base_path(path))
    base = None
    if data is not None and (base_hash is None and cachefile.key() is None
                             or base_hash == stackfile.sha256(data).hexdigest()):
        try:
            base = data.decode("utf-8")
        except UnicodeDecodeError:
            base = None
    return Record(bucket, key, None if generation is None else str(generation), base, unpushed)


def _say_unsealed(path: Path) -> None:
    """Name, once per process, a sync record this user's spotctl did not seal (and the bucket it names)."""
    where = record_path(path)
    if not os.path.lexists(where):
        return
    data = cachefile.read_bounded(where)
    try:
        named = json.loads(data or b"null")
        named = named.get("record", named)
        bucket = f" (it names bucket {str(named['bucket'])!r}, object {str(named['key'])!r})" if isinstance(named, dict) else ""  # (!r: no control characters of a forged file reach the terminal)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        bucket = ""
    cachefile.say_once(where, f"a sync record this user's spotctl did not seal (an earlier version's, another user's, or one a "
                              f"commit carried){bucket}: {path} is not synced with a shared copy until you run `spotctl sync "
                              f"--events-bucket BUCKET` for it (after checking which bucket is the team's)")


def write_record(path: Path, rec: Record) -> None:
    record_path(path).parent.mkdir(exist_ok=True)
    stackfile.refuse_linked_folder(record_path(path))  # (before anything there is touched)
    base_hash = None
    if rec.base is not None:
        base_path(path).unlink(missing_ok=True)  # written anew: nothing of a file found there is kept (its line ends),
        stackfile.atomic_write(base_path(path), rec.base)  # so the file holds exactly the text's UTF-8
        base_hash = stackfile.sha256(rec.base.encode("utf-8")).hexdigest()
    cachefile.save_record(record_path(path), {"version": RECORD_VERSION, "bucket": rec.bucket, "key": rec.key,
                                              "generation": rec.generation, "unpushed": rec.unpushed, "base": base_hash})


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
        if spliced is None or stackfile.plain(stackfile._parse(path, spliced, shared=False).doc) != expected:
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
    strict: bool = False  # unreachable is an error, never the local file alone (the watcher: it would act on it)
    offline: str | None = None  # why the bucket could not be reached: the local file alone until ``retry()``
    pulled: list[Merged] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)  # the generations this session wrote

    @property
    def key(self) -> str:
        return shared_key(self.ref.name)

    def url(self, key: str) -> str:
        """``s3://`` or ``gs://`` URL of an object of the shared bucket."""
        scheme = "s3" if getattr(self.cloud.cfg, "cloud", "aws") == "aws" else "gs"
        return f"{scheme}://{self.bucket}/{key}"

    def where(self, generation: str | None = None) -> str:
        return f"the shared copy {self.url(self.key)}" + (f" (generation {generation})" if generation else "")

    def retry(self) -> None:
        """Ask the bucket again at the next lock (a watcher's next cycle): unreachable is never for good."""
        self.offline = None

    def _unreachable(self, exc: Exception | str) -> None:
        first = self.offline is None
        self.offline = str(exc)
        if self.strict:
            raise stackfile.SharedCopyUnreachable(self.where(), [f"cannot be reached ({exc})"], reason=str(exc))
        if first:
            self.warn(f"{self.where()} cannot be reached ({exc}): {self.ref.path} is used as it is here, "
                      "and the next command that reaches it merges")

    def _record(self) -> Record | None:
        rec = read_record(self.ref.path)
        return rec if rec is not None and (rec.bucket, rec.key) == (self.bucket, self.key) else None

    def mark_unpushed(self, unpushed: bool = True) -> bool:
        """Record (before the stack file is written) that it holds an edit not yet pushed, or clear it
        again (the edit undone); the value it had. A kill -9 before the push leaves the mark, so the next
        lock pushes the edit first and ``status`` says so."""
        rec = self._record()
        was = bool(rec and rec.unpushed)
        if was != unpushed:
            rec = rec or Record(self.bucket, self.key, None, None)
            write_record(self.ref.path, Record(rec.bucket, rec.key, rec.generation, rec.base, unpushed))
        return was

    def pull(self) -> Merged | None:
        """Merge a newer shared copy into the local file (the caller holds the stack file's lock), then
        push the edits an earlier command could not (``Record.unpushed``).

        Raises:
            stackfile.SharedCopyUnreachable: ``strict``, and the bucket cannot be reached.
            ConfigError: a conflict, or a shared copy that is not a valid stack file (named as such).
        """
        if self.offline is not None:
            if self.strict:
                self._unreachable(self.offline)
            return None
        merged = self._pull()
        rec = self._record()
        if rec is not None and rec.unpushed:
            try:
                self.push()
            except stackfile.SharedCopyMoved:  # written meanwhile: this command's own push (or the next) finds out
                self.warn(self.unpushed_line())
            except stackfile.SharedCopyUnreachable as exc:
                self._unreachable(exc.reason)
        return merged

    def _pull(self) -> Merged | None:
        if self.keep == "shared":
            replaced = self._replace_broken_local()
            if replaced is not None:
                return replaced
        try:
            generation = self.cloud.object_generation(self.bucket, self.key)
            rec = self._record()
            if generation is None or (rec is not None and rec.generation == generation):
                if generation is None and rec is not None and rec.generation is not None:  # deleted: create it anew
                    write_record(self.ref.path, Record(self.bucket, self.key, None, rec.base, rec.unpushed))
                return None
            got = self.cloud.read_object(self.bucket, self.key)
        except CloudError as exc:
            self._unreachable(exc)
            return None
        if got is None:
            return None  # replaced or deleted between the two calls: the push finds out
        data, generation = got
        where = self.where(generation)
        ours = stackfile._read_text(self.ref.path)
        unsynced = rec is None or rec.base is None
        try:
            theirs = as_text(data, where)
            _validated(self.ref.path, theirs, where)
        except ConfigError as exc:
            if self.keep != "local":
                raise ConfigError(where, [*exc.problems, f"not a valid stack file: replace it with {self.ref.path} "
                                          f"by `spotctl sync --stack {self.ref.name} --keep local`"]) from None
            self.warn(f"{where} is not a valid stack file ({exc.problems[0]}): replaced with {self.ref.path}")
            merged = Merged(ours, from_local=[SETTINGS])
        else:
            hint = (f" (keep one side: `spotctl sync --stack {self.ref.name} --keep local` or `--keep shared`, "
                    "or make the job the same in both)")
            merged = merge(self.ref.path, None if unsynced else rec.base, ours, theirs,
                           keep=self.keep or (self.keep_unsynced if unsynced else None), where=where, hint=hint)
        if merged.dropped:
            saved = base_path(self.ref.path).with_name(f"{self.ref.path.name}.unsynced")
            stackfile.atomic_write(saved, ours)
            self.warn(f"{self.ref.path} was never synced with {where}: job(s) {', '.join(merged.dropped)} only in this file "
                      f"were not merged in (the shared copy is the team's live file: a job removed there stays removed); "
                      f"this file as it was is in {saved}: to add one, put it back and run `spotctl sync --stack {self.ref.name}`")
        if merged.text != ours:  # (a save made while merging is kept: nothing written, run it again)
            stackfile.write_stack(self.ref.path, merged.text, stackfile._read_state(ours))
            with contextlib.suppress(ConfigError):
                stackfile._index(self.ref.path, merged.text, stackfile._parse(self.ref.path, merged.text))
        write_record(self.ref.path, Record(self.bucket, self.key, generation, theirs, bool(rec and rec.unpushed)))
        self.pulled.append(merged)
        return merged

    def _replace_broken_local(self) -> Merged | None:
        """``--keep shared`` while the local file is not a valid stack file (a hand edit gone wrong):
        the shared copy replaces it whatever its generation, and the file as it was (bytes as they
        are) is saved beside the index first, never lost. None when the local file is valid."""
        path = self.ref.path
        local = None  # (the text read, when it could be: its state guards the replacement)
        try:
            local = stackfile._read_text(path)
            _validated(path, local, str(path))
            return None
        except ConfigError as exc:
            problem = exc.problems[0] if exc.problems else str(exc)
        try:
            got = self.cloud.read_object(self.bucket, self.key)
        except CloudError as exc:
            raise ConfigError(str(path), [problem, f"{self.where()} cannot be read ({exc}): this file stays as it is"]) from None
        if got is None:
            raise ConfigError(str(path), [problem, f"{self.where()} does not exist: nothing to replace this file with"])
        data, generation = got
        where = self.where(generation)
        theirs = as_text(data, where)
        try:
            _validated(path, theirs, where)
        except ConfigError as exc:
            raise ConfigError(where, [*exc.problems, f"not a valid stack file either: {path} stays as it is"]) from None
        saved = save_aside(path, "broken")
        stackfile.write_stack(path, theirs, stackfile._read_state(local))  # (a save since the read is kept)
        with contextlib.suppress(ConfigError):
            stackfile._index(path, theirs, stackfile._parse(path, theirs))
        # this file's unpushed edits (if any) are in the saved copy: nothing here is left to push
        write_record(path, Record(self.bucket, self.key, generation, theirs))
        self.warn(f"{path} is not a valid stack file ({problem}): replaced with {where}; the file as it was is in {saved}")
        merged = Merged(theirs, from_shared=[f"the whole file (this one was not valid: saved in {saved})"])
        self.pulled.append(merged)
        return merged

    def push(self, force: bool = False) -> str | None:
        """Write the local file to the shared copy if it changed since the last sync; the new generation
        (None: nothing to write, unreachable at this command's pull: the local file alone, marked unpushed,
        or an edit awaiting its confirmation in the file: ``stackfile.held_back``, unless ``force``, its confirmation).

        Raises:
            stackfile.SharedCopyMoved: someone else wrote the shared copy since this machine's pull.
            stackfile.SharedCopyUnreachable: the write failed for another reason (the network, the credentials).
        """
        if self.offline is not None:
            if self.strict:
                self._unreachable(self.offline)
            return None
        if not force and stackfile.held_back(self.ref.path):
            return None  # stays marked unpushed: pushed with the confirmed edit, or once it is undone
        data = Path(os.path.realpath(self.ref.path)).read_bytes()  # pushed as it is, CRLF and BOM kept
        local = stackfile.decode(data, str(self.ref.path))
        rec = self._record()
        if rec is not None and rec.generation is not None and rec.base == local:
            if rec.unpushed:
                write_record(self.ref.path, Record(rec.bucket, rec.key, rec.generation, rec.base))
            return None
        try:
            generation = self.cloud.write_object(self.bucket, self.key, data, rec.generation if rec else None)
        except PreconditionFailed:
            raise stackfile.SharedCopyMoved(self.where()) from None
        except CloudError as exc:
            raise stackfile.SharedCopyUnreachable(self.where(), [f"cannot be written ({exc})"], reason=str(exc)) from None
        write_record(self.ref.path, Record(self.bucket, self.key, generation, local))
        self.pushed.append(generation)
        return generation

    def unpushed_line(self) -> str:
        return (f"{self.ref.path} has edits not pushed to {self.where()} (it could not be reached, or spotctl stopped "
                f"before writing it): the next command that changes the file pushes them, or run `spotctl sync --stack {self.ref.name}`")

    def behind(self) -> str | None:
        """Lines saying the local file has unpushed edits or is behind the shared copy, or None."""
        rec = self._record()
        lines = [self.unpushed_line()] if rec is not None and rec.unpushed else []
        try:
            generation = self.cloud.object_generation(self.bucket, self.key)
        except CloudError as exc:
            self._unreachable(exc)
            return "\n".join(lines) or None
        if not (generation is None or (rec is not None and rec.generation == generation)):
            synced = f", last synced {rec.generation}" if rec and rec.generation else ", never synced here"
            lines.append(f"{self.ref.path} is behind {self.where(generation)}{synced}: the next command that changes it merges "
                         f"it first, or run `spotctl sync --stack {self.ref.name}`")
        return "\n".join(lines) or None


def save_aside(path: Path, what: str) -> Path:
    """Copy the stack file's bytes as they are beside the index (``stacks/.spotctl/<name>.<what>``,
    numbered when one is there already), before spotctl replaces it; the copy's path."""
    folder = base_path(path).parent
    folder.mkdir(exist_ok=True)
    data = Path(os.path.realpath(path)).read_bytes()
    saved, n = folder / f"{path.name}.{what}", 1
    while saved.exists():
        saved, n = folder / f"{path.name}.{what}.{n}", n + 1
    tmp = saved.with_name(f".{saved.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, saved)
    return saved


def last_synced_config(path: Path) -> Any:
    """The ``StackConfig`` of the copy this machine last synced (the merge base), or None: what says
    where the shared copy is (cloud, region) when the local file cannot be read."""
    rec = read_record(path)
    if rec is None or rec.base is None:
        return None
    where = f"{path} (last synced copy)"
    try:
        return validate(namespaced(stackfile.plain(_parse_as(path, rec.base, where).doc.get("config", {})), where), where)
    except ConfigError:
        return None


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
            except stackfile.SharedCopyUnreachable as exc:
                session.warn(str(exc))
                session.offline, pushed = exc.problems[0], None
                break
        else:
            raise ConfigError(str(session.ref.path), [f"{session.where()} kept changing ({tries} tries): run it again"])
    rec = session._record()
    return SyncReport(session.pulled[-1] if session.pulled else None, pushed, rec.generation if rec else None, session.offline is not None)
