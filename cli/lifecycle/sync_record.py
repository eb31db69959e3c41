"""What this machine records of the shared copy it last synced with (the merge base, its generation,
whether edits wait to be pushed), sealed beside the job index; and copies of a stack file set aside."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cli.lifecycle import cachefile, stackfile

RECORD_VERSION = 1


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
