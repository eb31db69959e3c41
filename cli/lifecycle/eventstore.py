"""The durable local cache of parsed events (SQLite): every command and every ``watch --once`` run
shares it, so an event object is downloaded and parsed once per machine, not once per process.

One database file under the user's cache dir; rows are keyed by *source* (``s3://bucket``,
``gs://bucket``, ``dir:/abs/path``) and stack. It is only a cache: losing it costs one re-read.
- Concurrency and crashes: WAL mode, every write one transaction (SQLite's atomic commit: a process
  killed mid-write leaves the last committed state; https://www.sqlite.org/atomiccommit.html,
  https://www.sqlite.org/wal.html). Writers wait on each other (``busy_timeout``).
- Corruption (a truncated or overwritten file, a foreign file): any ``sqlite3.DatabaseError`` drops
  the file and starts empty, once per process.
- Expiry: an object the bucket's lifecycle rule deleted is never forgotten here, so a job's history
  (and what it folds to) never regresses when ``eventRetentionDays`` passes.
- Size: sources unused for ``STALE_DAYS`` are dropped on open; each source holds one row per object.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from cli.lifecycle.events import Event, _aware

SCHEMA = 3  # 2: a local directory's files and folders; events by kind; 3: its appended and warned files indexed
STALE_DAYS = 30
USED_EVERY_S = 3600
_TABLES = ("objects", "cursors", "files", "dirs")
_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (source TEXT PRIMARY KEY, used REAL NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
  source TEXT NOT NULL, key TEXT NOT NULL, generation TEXT NOT NULL,
  job TEXT, attempt INTEGER, node INTEGER, event TEXT, time TEXT, details TEXT,
  PRIMARY KEY (source, key));
CREATE INDEX IF NOT EXISTS objects_job ON objects (source, job, attempt);
CREATE INDEX IF NOT EXISTS objects_kind ON objects (source, job, event, attempt);
CREATE TABLE IF NOT EXISTS cursors (source TEXT NOT NULL, prefix TEXT NOT NULL, after TEXT NOT NULL,
  PRIMARY KEY (source, prefix));
CREATE TABLE IF NOT EXISTS files (source TEXT NOT NULL, path TEXT NOT NULL, dir TEXT NOT NULL,
  generation TEXT NOT NULL, warnings TEXT, copy INTEGER NOT NULL, appended INTEGER NOT NULL, warned INTEGER NOT NULL,
  PRIMARY KEY (source, path));
CREATE INDEX IF NOT EXISTS files_dir ON files (source, dir);
CREATE INDEX IF NOT EXISTS files_copy ON files (source, copy);
CREATE INDEX IF NOT EXISTS files_appended ON files (source, appended);
CREATE INDEX IF NOT EXISTS files_warned ON files (source, warned);
CREATE TABLE IF NOT EXISTS dirs (source TEXT NOT NULL, path TEXT NOT NULL, stamp TEXT NOT NULL, subdirs TEXT NOT NULL,
  PRIMARY KEY (source, path));
"""


def default_path() -> Path:
    """``$SPOTCTL_EVENT_CACHE``, else ``$XDG_CACHE_HOME/spotctl/events.sqlite`` (``~/.cache``)."""
    if os.environ.get("SPOTCTL_EVENT_CACHE"):
        return Path(os.environ["SPOTCTL_EVENT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "spotctl" / "events.sqlite"


class EventStore:
    """Parsed events of one source, with the listing cursors that say what was read already."""

    def __init__(self, source: str, path: Path | None = None):
        self.source = source
        self.path = path or default_path()
        self._db: sqlite3.Connection | None = None
        self._rebuilt = False

    # ---- connection, with corruption detected and rebuilt ----------------------------------------
    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                db.execute("PRAGMA busy_timeout = 30000")
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: consistent after a crash, may lose the last commit
                if not _has_schema(db):
                    db.executescript(_SCHEMA_SQL)  # (IF NOT EXISTS: two processes may both run it)
                found = db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
                if found is not None and found[0] != str(SCHEMA):
                    raise sqlite3.DatabaseError(f"schema {found[0]}")
                used = db.execute("SELECT used FROM sources WHERE source = ?", (self.source,)).fetchone()
                if found is None or used is None or used[0] < time.time() - USED_EVERY_S:
                    self._mark_used(db)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _mark_used(self, db: sqlite3.Connection) -> None:
        """Record the schema and that this source is in use; drop the sources unused for ``STALE_DAYS``
        (a write: at most once per ``USED_EVERY_S`` per source, so a read with nothing new writes nothing)."""
        with _tx(db):
            found = db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone()
            if found is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
            elif found[0] != str(SCHEMA):
                raise sqlite3.DatabaseError(f"schema {found[0]}")
            for table in _TABLES:
                db.execute(f"DELETE FROM {table} WHERE source IN (SELECT source FROM sources WHERE used < ?)",
                           (time.time() - STALE_DAYS * 86400,))
            db.execute("DELETE FROM sources WHERE used < ?", (time.time() - STALE_DAYS * 86400,))
            db.execute("INSERT OR REPLACE INTO sources VALUES (?, ?)", (self.source, time.time()))

    def _run(self, fn):
        """``fn(db)``; a damaged cache file is removed and ``fn`` run once more on a new one."""
        try:
            return fn(self._open())
        except sqlite3.DatabaseError:
            if self._rebuilt:
                raise
            self._rebuilt = True
            self.close()
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self.path}{suffix}")
            return fn(self._open())

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # ---- reads ------------------------------------------------------------------------------------
    def generations(self, prefix: str, start: str | None = None) -> dict[str, str]:
        """{key: generation} of the objects read under ``prefix`` (from key ``start`` on)."""
        return self._run(lambda db: dict(db.execute(
            "SELECT key, generation FROM objects WHERE source = ? AND key >= ? AND key < ?",
            (self.source, max(prefix, start or prefix), prefix + "\U0010ffff"))))

    def cursor(self, prefix: str) -> str | None:
        row = self._run(lambda db: db.execute("SELECT after FROM cursors WHERE source = ? AND prefix = ?",
                                              (self.source, prefix)).fetchone())
        return row[0] if row else None

    def events(self, jobs: Iterable[str], min_attempt: dict[str, int] | None = None,
               prefix: str = "", older: Iterable[str] = ()) -> list[tuple[str, Event]]:
        """``(key, event)`` of the given jobs (from ``min_attempt[job]`` on, when given, and of the
        attempts before it only the events named in ``older``), keys under ``prefix``."""
        return [(k, e) for k, _, e in self.rows(jobs, min_attempt, prefix, older)]

    def rows(self, jobs: Iterable[str], min_attempt: dict[str, int] | None = None,
             prefix: str = "", older: Iterable[str] = ()) -> list[tuple[str, str, Event]]:
        """:meth:`events` with each row's generation: ``(key, generation, event)``."""
        older = sorted(set(older))
        # (the indexes named: a key range over the whole source would lead SQLite to scan the primary key)
        under, args = ("AND key >= ? AND key < ?", (prefix, prefix + "\U0010ffff")) if prefix else ("", ())

        def query(db):
            out = []
            for job in sorted(set(jobs)):
                since = (min_attempt or {}).get(job, 0)
                rows = db.execute(f"SELECT {_FIELDS} FROM objects INDEXED BY objects_job WHERE source = ? AND job = ? "
                                  f"AND attempt >= ? {under}", (self.source, job, since, *args))
                out += [(k, g, _event(*rest)) for k, g, *rest in rows]
                for kind in older if since else ():  # (as many rows as there are such events)
                    rows = db.execute(f"SELECT {_FIELDS} FROM objects INDEXED BY objects_kind WHERE source = ? AND job = ? "
                                      f"AND event = ? AND attempt < ? {under}", (self.source, job, kind, since, *args))
                    out += [(k, g, _event(*rest)) for k, g, *rest in rows]
            return out
        return self._run(query)

    def rows_in(self, ranges: Iterable[tuple[str, str]]) -> list[tuple[str, str, Event]]:
        """``(key, generation, event)`` of the events whose keys are in any ``[low, high)`` range."""
        def query(db):
            out = []
            for low, high in ranges:
                rows = db.execute(f"SELECT {_FIELDS} FROM objects WHERE source = ? AND key >= ? AND key < ? "
                                  "AND job IS NOT NULL", (self.source, low, high))
                out += [(k, g, _event(*rest)) for k, g, *rest in rows]
            return out
        return self._run(query)

    # ---- writes (each one transaction) -----------------------------------------------------------
    def put(self, rows: Iterable[tuple[str, str, Event | None]], cursors: dict[str, str] | None = None) -> None:
        """Record ``(key, generation, event or None)`` rows and move cursors, atomically."""
        rows = list(rows)

        def write(db):
            with _tx(db):
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [(self.source, k, g, *(_columns(e))) for k, g, e in rows])
                db.executemany("INSERT OR REPLACE INTO cursors VALUES (?, ?, ?)",
                               [(self.source, p, a) for p, a in (cursors or {}).items()])
        if rows or cursors:
            self._run(write)


    # ---- a local directory (``cli.lifecycle.direvents``): its folders and files as last read --------
    def folders(self) -> dict[str, tuple[str, list[str]]]:
        """{folder: (stamp, its subfolders)} as last read ("" is the root)."""
        return self._run(lambda db: {p: (s, d.split("/") if d else []) for p, s, d in db.execute(
            "SELECT path, stamp, subdirs FROM dirs WHERE source = ?", (self.source,))})

    def files(self, folder: str | None = None) -> dict[str, str]:
        """{file: generation} of the files read in ``folder`` (None: of the ``.jsonl`` files, appended in place)."""
        where, arg = ("dir = ?", folder) if folder is not None else ("appended = ?", 1)
        return self._run(lambda db: dict(db.execute(
            f"SELECT path, generation FROM files WHERE source = ? AND {where}", (self.source, arg))))

    def warnings(self) -> list[list]:
        """What reading the files said: ``[phase, job or None, text, file]`` each."""
        return self._run(lambda db: [w for (ws,) in db.execute(
            "SELECT warnings FROM files WHERE source = ? AND warned = 1", (self.source,))
            for w in json.loads(ws)])

    def copies(self, limit: int) -> list[str]:
        """Up to ``limit`` files marked as a copy of one job's prefix."""
        return self._run(lambda db: [p for (p,) in db.execute(
            "SELECT path FROM files WHERE source = ? AND copy = 1 LIMIT ?", (self.source, limit))])

    def put_dir(self, folders: dict[str, tuple[str, list[str]]], gone_folders: Iterable[str],
                files: dict[str, tuple[str, str, list, list[tuple[Event, str | None]], bool]], gone_files: Iterable[str],
                cursors: dict[str, str] | None = None, whole: bool = False) -> None:
        """One read's changes, atomically: folders ({folder: (stamp, subfolders)}) and files ({file: (folder,
        generation, warnings, (event, why refused or None) each, a job copy's)}) read again, the ones gone, cursors moved; ``whole``:
        everything else is gone."""
        def write(db):
            with _tx(db):
                if whole:
                    for table in ("objects", "files", "dirs"):
                        db.execute(f"DELETE FROM {table} WHERE source = ?", (self.source,))
                for path in [*gone_files, *files]:
                    db.execute("DELETE FROM objects WHERE source = ? AND key >= ? AND key < ?",
                               (self.source, path + "\0", path + "\1"))
                db.executemany("DELETE FROM files WHERE source = ? AND path = ?", [(self.source, p) for p in gone_files])
                db.executemany("DELETE FROM dirs WHERE source = ? AND path = ?", [(self.source, p) for p in gone_folders])
                db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               [(self.source, p, d, g, json.dumps(w) if w else None, int(c), int(p.endswith(".jsonl")), int(bool(w)))
                                for p, (d, g, w, _, c) in files.items()])
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [(self.source, f"{p}\0{i}", why or "", *_columns(e))
                                for p, (_, _, _, evs, _) in files.items() for i, (e, why) in enumerate(evs)])
                db.executemany("INSERT OR REPLACE INTO dirs VALUES (?, ?, ?, ?)",
                               [(self.source, p, s, "/".join(sub)) for p, (s, sub) in folders.items()])  # (no name holds a /)
                db.executemany("INSERT OR REPLACE INTO cursors VALUES (?, ?, ?)",
                               [(self.source, p, a) for p, a in (cursors or {}).items()])
        if folders or files or gone_files or gone_folders or cursors or whole:
            self._run(write)


class _tx:
    """One IMMEDIATE transaction (the write lock taken up front: no deadlock between two writers)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind, *_):
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


def _has_schema(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'cursors'").fetchone()[0] == 1


_FIELDS = "key, generation, job, attempt, node, event, time, details"


def _columns(e: Event | None) -> tuple:
    if e is None:
        return (None,) * 6
    # (where the VM ran rides in the details column as [details, zone, instance]: rows written
    # before hold the details object alone, and still read)
    where = [dict(e.details), e.zone, e.instance] if e.zone or e.instance else dict(e.details)
    return (e.job, e.attempt, e.node, e.event, e.time.isoformat(), json.dumps(where))


def _event(job, attempt, node, event, when, details) -> Event:
    doc = json.loads(details)
    found, zone, instance = (doc, "", "") if isinstance(doc, dict) else doc
    return Event(job, attempt, node, event, _aware(datetime.fromisoformat(when)), found, zone, instance)

