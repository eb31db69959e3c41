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

Pure decisions (``merge``, in ``sync_merge``) are apart from I/O; what this machine records of the
last sync is in ``sync_record``; the cloud is the ``cli.cloud.Cloud`` object.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.cloud import CloudError, PreconditionFailed
from cli.lifecycle import stackfile
from cli.lifecycle.sync_merge import (  # noqa: F401
    SETTINGS,
    SIDES,
    Conflict,
    Merged,
    _assemble,
    _changed,
    _parse_as,
    _round_trip,
    _side,
    _split,
    _validated,
    as_text,
    merge,
)
from cli.lifecycle.sync_record import (  # noqa: F401
    RECORD_VERSION,
    Record,
    _say_unsealed,
    base_path,
    read_record,
    record_path,
    save_aside,
    write_record,
)
from infra.config import ConfigError, namespaced, validate
from infra.naming import shared_stack_file


def shared_key(stack: str) -> str:
    """The shared copy's object name in the stack's event bucket."""
    return shared_stack_file(stack)


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
