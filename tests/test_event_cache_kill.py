"""SIGKILL at every point where a cache write changes the file (cli/lifecycle/eventstore.py): each
``write``, ``pwrite64``, ``fsync``, ``fdatasync``, ``ftruncate`` and ``unlink`` the writer makes, the
schema's creation, three writes, a fold, the close that moves the WAL into the file. The signal is delivered by strace on entering the N-th such
call (``--inject``: man 1 strace), so every kill point is the same in every run, whatever the load; the
file is the same between two such calls, so these points are every state a kill can leave. Each one
leaves a cache that is whole (integrity check, every table) and reads as it was after some number of
whole writes (none to all): a usable cache, or an empty one."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

CALLS = "write,pwrite64,fsync,fdatasync,ftruncate,unlink"
WRITER = """
import json, sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from cli.lifecycle.events import Event
from cli.lifecycle.eventstore import EventStore

store = EventStore("bucket:team-ev", Path(sys.argv[1]))
t = datetime(2026, 1, 1, tzinfo=UTC)
folder = "team/train/attempt-1/node-0/"
for lo, hi in ((0, 50), (50, 56), (56, 57)):  # the first write folds: 50 checkpoints, a minute apart
    rows = [(f"{folder}{(t + timedelta(minutes=i)).strftime('%Y-%m-%dT%H:%M:%S')}.000Z-checkpoint.json", "g",
             Event("train", 1, 0, "checkpoint", t + timedelta(minutes=i), {"i": i})) for i in range(lo, hi)]
    before = folder + (t + timedelta(minutes=hi - 11)).strftime("%Y-%m-%dT%H:%M:%S")
    store.put(rows, {folder: rows[-1][0]}, {folder: before})
    print(json.dumps([sorted(k for k, _ in store.events(["train"])), store.cursor(folder)]), flush=True)
store.close()  # (the last connection: SQLite moves the WAL into the file and deletes it)
"""
TABLES = {"meta", "sources", "objects", "cursors", "files", "dirs"}


def run(path: Path, kill_at: tuple[str, int] | None = None, trace: Path | None = None) -> subprocess.CompletedProcess:
    """The writer; ``kill_at`` (call, n): SIGKILL on entering the n-th such call (strace counts each call
    on its own)."""
    argv = [sys.executable, "-c", WRITER, str(path)]
    if kill_at is not None:
        call, n = kill_at
        argv = ["strace", "-f", "-o", os.devnull, "-e", f"trace={CALLS}", "-e", f"inject={call}:signal=KILL:when={n}", *argv]
    elif trace is not None:
        argv = ["strace", "-f", "-o", str(trace), "-e", f"trace={CALLS}", *argv]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    return subprocess.run(argv, capture_output=True, env=env, timeout=120, check=False)


def left(path: Path) -> list | None:
    """What the killed writer left: [keys, cursor] as the cache reads, None for no cache file."""
    from cli.lifecycle.eventstore import EventStore

    if not path.exists() or path.stat().st_size == 0:
        return None
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables in (TABLES, set()), tables  # the schema whole, or not there at all
    finally:
        db.close()
    store = EventStore("bucket:team-ev", path)
    try:
        got = [sorted(k for k, _ in store.events(["train"])), store.cursor("team/train/attempt-1/node-0/")]
        assert not store._rebuilt  # read as it is, not dropped as damaged
        return got
    finally:
        store.close()


def _strace() -> str | None:
    """Why strace cannot be had (None: it is on PATH). Installed as the boot tier installs its tools
    (Debian's package, as root) rather than skipping: a skipped kill test proves nothing."""
    if shutil.which("strace") is None and shutil.which("apt-get") is not None and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "strace"], check=False, env=env,
                       capture_output=True)
    return None if shutil.which("strace") else "needs strace (Debian's strace package), and it could not be installed"


def test_a_kill_at_every_write_of_the_cache_leaves_a_whole_cache(tmp_path):
    if why := _strace():
        pytest.skip(why)
    trace = tmp_path / "trace.txt"
    whole = run(tmp_path / "whole.sqlite", trace=trace)
    assert whole.returncode == 0, whole.stderr.decode()
    states = [[[], None]] + [json.loads(line) for line in whole.stdout.decode().splitlines()]
    assert len(states[1][0]) < 50  # the first write folded
    calls = [line.split()[1].split("(")[0] for line in trace.read_text().splitlines()]
    points = [(c, calls[:i + 1].count(c)) for i, c in enumerate(calls) if c in CALLS.split(",")]
    assert len(points) > 50 and {"pwrite64", "fdatasync", "ftruncate", "unlink"} <= {c for c, _ in points}
    seen = set()
    for n, point in enumerate(points, 1):
        path = tmp_path / f"k{n}.sqlite"
        killed = run(path, kill_at=point)
        assert killed.returncode != 0, f"kill point {n} of {len(points)} ({point}) was not reached"
        got = left(path)
        assert got is None or got in states, f"kill point {n}: {got}"
        seen.add(json.dumps(got))
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    # the kills landed before, between and after the writes: no cache, an empty one, and every whole write
    assert {json.dumps(s) for s in states[1:]} <= seen and ("null" in seen or json.dumps(states[0]) in seen)
