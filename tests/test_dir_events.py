"""An ``--events-dir`` read by what changed (cli/lifecycle/direvents.py): after any sequence of
changes a copy of the bucket, a stack's prefix, a job's prefix or a job disk goes through, the
incremental read gives what a full read gives (``read_dir`` + ``keyed_events``), warnings included;
a folder left as it was is not listed again."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.lifecycle import direvents
from cli.lifecycle.direvents import DirEvents
from cli.lifecycle.events import keyed_events, read_dir

NOW = datetime(2026, 11, 1, tzinfo=UTC)
JOBS = ["train", "eval", "attempt-2"]

# where a file may be: the layouts vouched_locally reads, and ones it refuses
FOLDERS = ["", ".spotctl/", "team/train/attempt-1/node-0/", "team/train/attempt-2/node-0/", "team/eval/attempt-1/node-1/",
           "train/attempt-1/node-0/", "attempt-1/node-0/", "other/train/attempt-1/node-0/", "team/train/x/",
           "team/attempt-2/attempt-1/node-0/"]
NAMES = ["a.json", "b.json", "events.jsonl", "c.txt", "..json"]


def body(job: str, attempt: int, node: int, event: str, hours: int, stack: str | None) -> dict:
    doc = {"job": job, "attempt": attempt, "node": node, "event": event,
           "time": (NOW - timedelta(hours=hours)).isoformat()}
    return doc | ({"stack": stack} if stack else {})


docs = st.builds(body, st.sampled_from([*JOBS, "ghost"]), st.integers(1, 2), st.integers(0, 1),
                 st.sampled_from(["started", "preempted", "checkpoint"]), st.sampled_from([1, 2, -5, 24 * 365 * 10]),
                 st.sampled_from([None, "team", "other"]))
contents = st.one_of(
    st.lists(docs, min_size=1, max_size=3).map(lambda ds: "\n".join(json.dumps(d) for d in ds)),
    st.sampled_from(["not json", '{"job": 7, "attempt": 1, "event": "x", "time": "2026-10-01T00:00:00"}',
                     "[" * 200 + "]" * 200, ""]))
ops = st.lists(st.one_of(
    st.tuples(st.just("write"), st.sampled_from(FOLDERS), st.sampled_from(NAMES), contents),
    st.tuples(st.just("append"), st.sampled_from(FOLDERS), st.sampled_from(NAMES), contents),
    st.tuples(st.just("remove"), st.sampled_from(FOLDERS), st.sampled_from(NAMES), st.just("")),
    st.tuples(st.just("rmtree"), st.sampled_from(FOLDERS), st.just(""), st.just("")),
    st.tuples(st.just("link"), st.sampled_from(FOLDERS), st.sampled_from(NAMES), st.just("")),
), min_size=1, max_size=12)


class Clock:
    """Folder and file times set by the test, one tick per change (as time moving on between reads)."""

    def __init__(self):
        self.t = 1_700_000_000 * 10**9

    def stamp(self, *paths: Path) -> None:
        self.t += 10**9
        for p in paths:
            if p.exists() and not p.is_symlink():
                os.utime(p, ns=(self.t, self.t))


def apply(root: Path, op: tuple, clock: Clock | None) -> None:
    kind, folder, name, text = op
    target = root / folder / name if name else root / folder
    touched = [target.parent]
    if kind in ("write", "append"):
        target.parent.mkdir(parents=True, exist_ok=True)
        touched += [p for p in target.parents if root in p.parents or p == root]
        if target.is_symlink() or target.is_dir():
            return
        if kind == "write":  # as a sync writes: beside, then renamed into place
            tmp = target.parent / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, target)
        else:  # a job disk's agent appends in place
            with open(target, "a") as fh:
                fh.write("\n" + text)
        touched.append(target)
    elif kind == "remove" and (target.is_file() or target.is_symlink()):
        target.unlink()
    elif kind == "rmtree" and target.is_dir() and folder:
        shutil.rmtree(target)
    elif kind == "link" and target.parent.is_dir() and not target.exists() and not target.is_symlink():
        target.symlink_to(root / "team" if (root / "team").is_dir() else root / "nowhere")
    if clock is not None:
        clock.stamp(*touched)


def full(root: Path, jobs: list[str]) -> tuple[list, list[str]]:
    said: list[str] = []
    return keyed_events(read_dir(root, said.append), set(jobs), "team", said.append, now=NOW), said


def incremental(root: Path, jobs: list[str], cache: Path, clock_ns) -> tuple[list, list[str]]:
    said: list[str] = []
    reader = DirEvents(root, "team", cache, clock_ns=clock_ns)
    try:
        reader.read()
        return reader.events(jobs, NOW, said.append), said
    finally:
        reader.close()


@pytest.mark.parametrize("clocked", [True, False], ids=["folders-settled", "all-racy"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops, jobs=st.sampled_from([JOBS, ["train"], ["eval", "attempt-2"]]))
def test_an_incremental_read_equals_a_full_read(tmp_path_factory, clocked, steps, jobs):
    """``folders-settled``: each change an own tick in the past (folders are trusted and skipped);
    ``all-racy``: the real clock, every change within the racy window (everything compared again)."""
    tmp = tmp_path_factory.mktemp("dir")
    root, cache = tmp / "events", tmp / "events.sqlite"
    root.mkdir()
    clock = Clock() if clocked else None
    clock_ns = (lambda: 2_000_000_000 * 10**9) if clocked else direvents.time.time_ns
    for op in steps:
        apply(root, op, clock)
        assert incremental(root, jobs, cache, clock_ns) == full(root, jobs)


def test_an_unchanged_folder_is_not_listed_again(tmp_path, monkeypatch):
    root = tmp_path / "events"
    for a in range(1, 4):
        f = root / "team" / "train" / f"attempt-{a}" / "node-0" / "a.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(body("train", a, 0, "started", 1, "team")))
    clock = Clock()
    clock.stamp(*[p for p in root.rglob("*")], root)
    listed: list[str] = []
    real = DirEvents._list
    monkeypatch.setattr(DirEvents, "_list", lambda self, folder: listed.append(folder) or real(self, folder))
    cache = tmp_path / "c.sqlite"
    assert len(incremental(root, ["train"], cache, lambda: 2_000_000_000 * 10**9)[0]) == 3
    assert len(listed) == 9  # the root, team, train, 3 attempts and their node folders
    listed.clear()
    new = root / "team" / "train" / "attempt-3" / "node-0" / "b.json"
    new.write_text(json.dumps(body("train", 3, 0, "preempted", 0, "team")))
    clock.stamp(new.parent)
    got, _ = incremental(root, ["train"], cache, lambda: 2_000_000_000 * 10**9)
    assert listed == ["team/train/attempt-3/node-0/"]
    assert [e.event for e in got] == ["started", "started", "started", "preempted"]


WRITER = """
import json, sys
from pathlib import Path
from cli.lifecycle.direvents import DirEvents
cache, root = Path(sys.argv[1]), Path(sys.argv[2])
folder = root / "team" / "train" / "attempt-1" / "node-0"
folder.mkdir(parents=True, exist_ok=True)
print("ready", flush=True)
i = len(list(folder.iterdir()))
while True:
    (folder / f"{i:06d}.json").write_text(json.dumps({"job": "train", "attempt": 1, "node": 0, "event": "checkpoint",
                                                      "time": f"2026-10-01T00:{i // 60 % 60:02d}:{i % 60:02d}+00:00"}))
    i += 1
    reader = DirEvents(root, "team", cache)
    reader.read()
    reader.close()
"""


def test_a_reader_killed_at_any_point_leaves_a_cache_that_reads_as_the_dir(tmp_path):
    """SIGKILL anywhere in a read (parsing, the one transaction, opening the cache): the next read
    still gives what a full read gives."""
    import signal
    import subprocess
    import sys
    import time

    root, cache = tmp_path / "events", tmp_path / "events.sqlite"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for n, delay in enumerate([0.0, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.13, 0.21] * 2):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(cache), str(root)], stdout=subprocess.PIPE, env=env)
        if n % 2:
            assert writer.stdout.readline() == b"ready\n"
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        assert incremental(root, ["train"], cache, time.time_ns) == full(root, ["train"])
