"""Reading an ``--events-dir`` by what changed: the files' parsed events live in the durable cache
(:mod:`cli.lifecycle.eventstore`), so a read costs a ``stat`` per folder plus what is new, not a
read of every file. What it returns equals a full read (:func:`cli.lifecycle.events.read_dir` and
:func:`cli.lifecycle.events.keyed_events`), warnings included.

A folder whose entries changed gets a new mtime (adding, removing or renaming a name sets it), and
the copies ``aws s3 sync``, ``gcloud storage rsync`` and ``rsync`` make write each file beside the
folder's entries and rename it into place, so an unchanged folder's files are the ones read before:
only a changed folder is listed and its files' states compared. A ``.jsonl`` file is appended in place
(a job disk's ``.spotctl/events.jsonl``), so its state is compared at every read. A folder or file
changed within ``RACY_NS`` of the read may change again within its timestamp's tick: it is not trusted
until a later read (as git does with its index, "racy git"). What is NOT seen: a ``.json`` file
rewritten in place, in a folder whose names did not change (delete the cache file to read all again).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from agent.schema import JOB_COPY_FILE
from cli.lifecycle.events import EVENT_LOG_LIMIT, EVENT_OBJECT_LIMIT, Event, claims, plausible
from cli.lifecycle.eventstore import EventStore

RACY_NS = 2_000_000_000
_COPY = "\0job-copy"  # the cursor that records whether the files were parsed as a copy of one job's prefix


def _suffix(name: str) -> str:
    """``PurePath(name).suffix``, without a path object per name."""
    i = name.rfind(".")
    return name[i:] if 0 < i < len(name) - 1 else ""


def _state(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"


class DirEvents:
    """The events of one ``--events-dir`` (a folder, or one file) read for ``stack``."""

    def __init__(self, root: Path, stack: str | None, store_path: Path | None = None,
                 clock_ns: Callable[[], int] = time.time_ns):
        self.root, self.stack, self.clock_ns = Path(root), stack, clock_ns
        self.single = False
        self.fresh: set[str] = set()  # the files parsed by the last read
        self.store = EventStore(f"dir:{stack or ''}:{os.path.abspath(root)}", store_path)

    def close(self) -> None:
        self.store.close()

    # ---- read what changed ------------------------------------------------------------------------
    def read(self) -> None:
        """Bring the cache up to the directory's present content (one transaction)."""
        self.single = self.root.is_file()
        self._read(self.single)

    def _read(self, single: bool, whole: bool = False) -> None:
        store, now = self.store, self.clock_ns()
        known = {} if whole else store.folders()
        folders: dict[str, tuple[str, list[str]]] = {}  # read again
        visited: set[str] = set()
        changed: dict[str, tuple[str, str]] = {}  # file -> (folder, state)
        gone: list[str] = []
        if single:
            here = self._stats("", [self.root.name])
            before = {} if whole else store.files("")
            changed.update({p: ("", g) for p, g in here.items() if before.get(p) != g})
            gone += [p for p in before if p not in here]
            visited.add("")
        else:
            pending = [""]
            while pending:
                folder = pending.pop()
                try:
                    st = os.stat(os.path.join(self.root, folder) if folder else self.root)
                except OSError:
                    continue
                visited.add(folder)
                stamp = f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"
                old = known.get(folder)
                if old is not None and old[0] == stamp:
                    subs = old[1]
                else:
                    subs, here = self._list(folder)
                    before = {} if whole else store.files(folder)
                    changed.update({p: (folder, g) for p, g in here.items() if before.get(p) != g})
                    gone += [p for p in before if p not in here]
                    folders[folder] = ("" if now - st.st_mtime_ns < RACY_NS else stamp, subs)
                pending += [f"{folder}{sub}/" for sub in subs]
            # appended in place: a .jsonl file in a folder whose names did not change
            for path, old_state in ({} if whole else store.files()).items():
                folder = path[:path.rfind("/") + 1]
                if folder in visited and folder not in folders:
                    state = self._stat(path)
                    if state is None:
                        gone.append(path)
                    elif state != old_state:
                        changed[path] = (folder, state)
        gone_folders = [f for f in known if f not in visited]
        for folder in gone_folders:
            gone += store.files(folder)  # (a gone folder was never listed above: no file twice)
        gone_set = set(gone)
        copy = any(JOB_COPY_FILE.fullmatch(p) for p in changed) or (not whole and any(
            p not in gone_set for p in store.copies(len(gone) + 1)))
        was = store.cursor(_COPY)
        if not whole and (was or "0") != str(int(copy)):
            return self._read(single, whole=True)  # every file's vouching changes with it
        parsed = {p: self._parse(p, folder, state, copy, now) for p, (folder, state) in changed.items()}
        store.put_dir(folders, gone_folders, parsed, gone, {_COPY: str(int(copy))} if was != str(int(copy)) else None, whole=whole)
        self.fresh = set(parsed)

    def _list(self, folder: str) -> tuple[list[str], dict[str, str]]:
        """(subfolders, {file: state}) of a folder, as ``Path.rglob`` walks it (a linked folder is not
        entered, a linked file is read) and ``read_dir`` keeps its files."""
        subs, names = [], []
        try:
            with os.scandir(os.path.join(self.root, folder)) as it:
                entries = list(it)
        except OSError:
            return [], {}
        for entry in entries:
            try:
                if entry.is_dir() and not entry.is_symlink():
                    subs.append(entry.name)
                    continue
            except OSError:
                continue
            if _suffix(entry.name) in (".json", ".jsonl"):
                names.append(entry.name)
        return sorted(subs), self._stats(folder, names)

    def _stats(self, folder: str, names: Iterable[str]) -> dict[str, str]:
        return {folder + name: state for name in names if (state := self._stat(folder + name)) is not None}

    def _stat(self, path: str) -> str | None:
        """A regular file's state (a link followed), else None."""
        try:
            st = os.stat(self._file(path))
        except OSError:
            return None
        return _state(st) if stat.S_ISREG(st.st_mode) else None

    def _file(self, path: str) -> Path:
        return self.root if self.single else self.root / path

    def _parse(self, path: str, folder: str, state: str, copy: bool, now: int) -> tuple[str, str, list, list, bool]:
        """(folder, state, warnings, events, a job copy's) of one file."""
        from cli.lifecycle.cachefile import read_bounded

        warnings: list = []
        file = self._file(path)
        limit = EVENT_LOG_LIMIT if _suffix(path) == ".jsonl" else EVENT_OBJECT_LIMIT
        data = read_bounded(file, limit, follow=True)
        found: list[tuple[Event, str | None]] = []
        if data is None:
            size = int(state.split(":")[0])
            if size > limit:
                warnings.append([0, None, f"event file {file}: skipped: {size} bytes, over the {limit >> 20} MiB "
                                 "an events file may be", path])
        else:
            found = claims(path, data, self.stack, lambda text: warnings.append([1, None, text, path]), job_copy=copy)
        mtime = int(state.split(":")[1])
        fresh = now - mtime < RACY_NS  # may change again within its tick: compared again next time
        return folder, ("racy:" if fresh else "") + state, warnings, found, bool(JOB_COPY_FILE.fullmatch(path))

    # ---- what was read ------------------------------------------------------------------------------
    def events(self, job_ids: Iterable[str], now: datetime | None, warn: Callable[[str], None] | None = None,
               attempts: dict[str, int] | None = None, older: Iterable[str] = ()) -> list[Event]:
        """The events of ``job_ids``, sorted by time, with the warnings a full read gives; with ``attempts``,
        of each job's attempts before ``attempts[job]`` only the kinds in ``older`` and what the last read
        parsed (a straggler of an ended attempt is seen once)."""
        ids = set(job_ids)
        said: dict[str, list] = {}
        for phase, job, text, path in sorted(self.store.warnings(), key=lambda w: (w[0], w[3].split("/"))):
            if phase == 0 and warn is not None:
                warn(text)  # (read_dir's, before any file is parsed)
            elif job is None or job in ids:
                said.setdefault(path, []).append(text)
        rows: dict[str, list] = {}
        found = self.store.rows(ids, attempts, older=older)
        if attempts:
            found += [r for r in self.store.rows_in((p + "\0", p + "\1") for p in sorted(self.fresh))
                      if r[2].job in ids and r[2].attempt < attempts.get(r[2].job, 0) and r[2].event not in older]
        for key, why, event in found:
            path, _, line = key.partition("\0")
            rows.setdefault(path, []).append((int(line), why, event))
        keyed = []
        for path in sorted({*said, *rows}, key=lambda p: p.split("/")):  # sorted(Path)'s order, as read_dir's
            for text in said.get(path, []):
                if warn is not None:
                    warn(text)
            for _, why, event in sorted(rows.get(path, []), key=lambda r: r[0]):
                if why:  # a job's events of a file end at its first refused one (``vouched``)
                    if warn is not None:
                        warn(why)
                    break
                keyed.append((path, event))
        return plausible(keyed, now, warn)


def dir_events(root: Path | None, job_ids: Iterable[str], stack: str | None, warn: Callable[[str], None] | None = None,
               now: datetime | None = None, attempts: dict[str, int] | None = None, older: Iterable[str] = ()) -> list[Event]:
    """What :func:`cli.lifecycle.events.load_events` reads of ``job_ids``, read by what changed since the
    last read on this machine."""
    if root is None:
        return []
    reader = DirEvents(root, stack)  # (the cache's file: SPOTCTL_EVENT_CACHE or the user's cache dir)
    try:
        reader.read()
        return reader.events(job_ids, now, warn, attempts, older)
    finally:
        reader.close()
