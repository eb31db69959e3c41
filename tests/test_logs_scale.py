"""`spotctl logs` at scale and on hostile files (cli/lifecycle/logs.py): `--follow` reads only the
chunks that are new (a synced bucket's copy and the bucket itself), a job disk's log is read a block
at a time (memory bounded whatever its size), and a FIFO in a log's place is refused at once. How
the time grows with the number of chunks is measured in bench/logs.py (not asserted here)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

from cli.lifecycle import logs
from cli.lifecycle.events import Event

ROOT = Path(__file__).resolve().parent.parent
KEY = logs.LogKey(1, 0)


def chunk_dir(root: Path) -> Path:
    folder = root / "team" / "train" / "attempt-1" / "node-0" / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def put_chunks(folder: Path, first: int, n: int) -> None:
    for i in range(first, first + n):
        (folder / f"{i * 8:012d}.log").write_bytes(f"line{i:03d}\n".encode())


def ended_after(polls: int):
    count = [0]

    def events(key):
        count[0] += 1
        return [Event("train", 1, 0, "completed", datetime(2026, 11, 21, tzinfo=UTC), {})] if count[0] > polls else []

    return events


def test_follow_reads_only_the_new_chunks_of_a_synced_copy(tmp_path, monkeypatch):
    folder = chunk_dir(tmp_path)
    put_chunks(folder, 0, 50)
    read: list[str] = []
    real = logs._read
    monkeypatch.setattr(logs, "_read", lambda path: read.append(path.name) or real(path))
    source = logs.DirLogs(tmp_path, "train", "team")
    source.events = ended_after(3)
    added = iter([(50, 10), (60, 5), (65, 0)])
    per_poll: list[int] = []

    def sleep(_):
        per_poll.append(len(read))
        put_chunks(folder, *next(added))

    out: list[str] = []
    logs.show(source, None, 0, out.append, follow=True, sleep=sleep)
    text = "".join(out)
    assert text == "".join(f"line{i:03d}\n" for i in range(65))
    reads = [b - a for a, b in zip([0, *per_poll], [*per_poll, len(read)], strict=True)]
    assert reads == [50, 10, 5, 0], reads  # the first read, then only what each poll found new


class Bucket:
    """``cli.cloud.Cloud``'s two listing calls over a dict, counting the objects downloaded."""

    stack = "team"

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.downloads = 0

    def bucket_objects(self, bucket, prefix, skip=frozenset(), suffix=""):
        out = {}
        for name, data in self.objects.items():
            if name.startswith(prefix) and name.endswith(suffix):
                out[name] = None if name in skip else data
                self.downloads += name not in skip
        return out

    def bucket_names(self, bucket, prefix):
        return [n for n in self.objects if n.startswith(prefix)]


def test_follow_downloads_only_the_new_chunks_and_the_last_again():
    cloud = Bucket()

    def put(first, n):
        for i in range(first, first + n):
            cloud.objects[f"team/train/attempt-1/node-0/logs/{i * 8:012d}.log"] = f"line{i:03d}\n".encode()

    put(0, 40)
    source = logs.BucketLogs(cloud, "evts", "train")
    source.events = ended_after(2)
    seen: list[int] = []
    more = iter([(40, 7), (47, 0)])

    def sleep(_):
        seen.append(cloud.downloads)
        put(*next(more))

    out: list[str] = []
    logs.show(source, None, 0, out.append, follow=True, sleep=sleep)
    assert "".join(out) == "".join(f"line{i:03d}\n" for i in range(47))
    assert [b - a for a, b in zip([0, *seen], [*seen, cloud.downloads], strict=True)] == [41, 8, 1]  # +1: the last chunk, each poll


def test_a_huge_disk_log_is_shown_with_bounded_memory(tmp_path):
    log = tmp_path / ".spotctl" / "logs" / "attempt-1-node-0.log"
    log.parent.mkdir(parents=True)
    with log.open("wb") as fh:  # sparse: 300 MiB of zeros on no disk space
        fh.truncate(300 << 20)
        fh.seek(300 << 20)
        fh.write(b"the end\n")
    shown = [0, ""]

    def write(text: str) -> None:
        shown[0] += len(text)
        shown[1] = text[-8:]

    tracemalloc.start()
    try:
        logs.show(logs.DirLogs(tmp_path, "train"), None, 0, write)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert shown == [(300 << 20) + 8, "the end\n"]
    assert peak < 32 << 20, peak  # a few blocks, never the log


def test_a_fifo_in_a_logs_place_is_refused_at_once(project, tmp_path):
    folder = tmp_path / "disk" / ".spotctl" / "logs"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "attempt-1-node-0.log")
    done = subprocess.run([sys.executable, "-m", "cli", "logs", "llm-pretrain", "--stack", "example-aws", "--events-dir",
                           str(tmp_path / "disk" / ".spotctl")], cwd=project, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "attempt-1-node-0.log is not a regular file" in done.stderr, done.stderr
