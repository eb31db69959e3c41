"""Event history at scale: what a read costs as the history grows (ratios measured in one run).

1. The event bucket (moto S3 in server mode, objects put through moto's backend to save time): the
   watcher's read (``BucketEvents`` over the durable cache, as ``watch --once`` does it) with nothing
   new, in a fresh process-like reader, at SMALL and at BIG events: the reader thread's CPU, LIST+GET
   requests and the Python memory the reader holds after its cycle (tracemalloc, moto's frames left out:
   the server runs in this process). History lies in older attempts (a long-lived job) or all in the
   current attempt (the worst case: the cycle still folds that attempt's events).
2. An ``--events-dir`` (a bucket's copy, 10 jobs, 50 events per attempt, history in older attempts):
   ``spotctl watch --once`` with nothing new, a whole process (CPU and peak RSS of the child), and the
   watcher's read alone (``dir_events`` as a cycle calls it: CPU, Python memory held), at SMALL and BIG.
3. ``status`` and ``cost`` of 200 jobs at 10k event files in an ``--events-dir`` (CPU of the child;
   first run, which fills the cache, and the next).
4. ``status JOB`` at 10 and at 5,000 jobs (CPU of the child).

Run: ``uv run python bench/event_history.py [--big 100000] [--parts dir,bucket,commands]``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._stacks import write_stack  # noqa: E402

T0 = datetime.now(UTC) - timedelta(days=30)
PER_ATTEMPT = 50


def key_of(job: str, attempt: int, i: int) -> tuple[str, bytes]:
    t = T0 + timedelta(seconds=i)
    key = f"team/{job}/attempt-{attempt}/node-0/{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-checkpoint.json"
    return key, json.dumps({"job": job, "attempt": attempt, "node": 0, "event": "checkpoint",
                            "time": t.isoformat(), "stack": "team"}).encode()


def fill_bucket(bucket: str, events: int, jobs: int, in_current: bool) -> dict[str, int]:
    """``events`` event objects over ``jobs`` jobs; -> {job: current attempt}."""
    import boto3
    from moto.s3.models import s3_backends

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=bucket)
    backend = s3_backends["123456789012"]["aws"]
    per_job = events // jobs
    attempts = 1 if in_current else max(1, per_job // PER_ATTEMPT)  # the current attempt: the same size at any history
    for j in range(jobs):
        for i in range(per_job):
            attempt = 1 if in_current else 1 + i * attempts // per_job
            key, body = key_of(f"job{j}", attempt, i)
            backend.put_object(bucket, key, body)
    return {f"job{j}": attempts for j in range(jobs)}


def cycle(bucket: str, attempts: dict[str, int]) -> tuple[float, int, int, int, int]:
    """(CPU s, LIST, GET, bytes held, events) of one watcher read by a new reader over the shared cache."""
    import boto3

    from cli.cloud import Cloud, aws
    from cli.lifecycle.bucketevents import BucketEvents

    counts = {"list": 0, "get": 0}

    def client(region):
        s3 = boto3.client("s3", region_name=region)
        s3.meta.events.register("before-send.s3", lambda request, **_: counts.__setitem__(
            "list" if "list-type=2" in request.url else "get", counts["list" if "list-type=2" in request.url else "get"] + 1))
        return s3

    aws._s3 = client
    from types import SimpleNamespace

    cloud = Cloud(SimpleNamespace(cloud="aws", region="us-east-1"), "team")
    tracemalloc.start()
    t = time.thread_time()  # this thread's: moto's server threads run in this process
    parsed = BucketEvents("team")
    parsed.read(cloud, bucket, "team/", attempts=attempts)
    got = parsed.events(set(attempts), None, bucket=bucket, attempts=attempts)
    cpu = time.thread_time() - t
    # what the reader holds at the end of its cycle (moto's and werkzeug's allocations left out)
    kept = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, "*moto*"), tracemalloc.Filter(False, "*werkzeug*")])
    peak = sum(stat.size for stat in kept.statistics("filename"))
    tracemalloc.stop()
    for store in parsed.stores.values():
        store.close()
    return cpu, counts["list"], counts["get"], peak, len(got)


def bucket_part(small: int, big: int, jobs: int, worst: bool) -> None:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "x",
                       "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        for in_current in (False, True) if worst else (False,):
            got = {}
            for n in (small, big):
                name = f"b{n}-{int(in_current)}"
                attempts = fill_bucket(name, n, jobs, in_current)
                cycle(name, attempts)  # the first read fills the cache
                got[n] = min((cycle(name, attempts) for _ in range(3)), key=lambda r: r[0])
            (c1, l1, g1, m1, _), (c2, l2, g2, m2, _) = got[small], got[big]
            where = "all in the current attempt" if in_current else "in older attempts"
            print(f"watch read, nothing new, history {where}: {small} events {c1:.3f} s CPU {l1} LIST + {g1} GET "
                  f"{m1 >> 10} KiB; {big} events {c2:.3f} s {l2} LIST + {g2} GET {m2 >> 10} KiB; "
                  f"ratio CPU {c2 / c1:.2f} requests {(l2 + g2) / max(1, l1 + g1):.2f} memory {m2 / m1:.2f}")
    finally:
        server.stop()


def child(argv: list[str], cwd: Path) -> tuple[float, int]:
    """(CPU s, peak RSS in KiB) of one child process."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # (1: watch --once says a cycle had a warning)
        raise SystemExit(f"{argv}: exit {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def child_cpu(argv: list[str], cwd: Path) -> float:
    return child(argv, cwd)[0]


def dir_history(root: Path, events: int, jobs: int) -> dict[str, int]:
    """A bucket's copy: ``events`` event files over ``jobs`` jobs, ``PER_ATTEMPT`` per attempt (each older
    attempt started, checkpointed, preempted; the current one started and checkpoints); -> {job: attempt}."""
    per_job = events // jobs
    attempts = {}
    for j in range(jobs):
        job = f"job-{j:04d}"
        last = (per_job - 1) // PER_ATTEMPT + 1
        attempts[job] = last
        for i in range(per_job):
            attempt = i // PER_ATTEMPT + 1
            k = i % PER_ATTEMPT
            kind = "started" if k == 0 else "preempted" if k == PER_ATTEMPT - 1 and attempt < last else "checkpoint"
            t = T0 + timedelta(seconds=i)
            p = root / "bench" / job / f"attempt-{attempt}" / "node-0" / f"{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-{kind}.json"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps({"job": job, "attempt": attempt, "node": 0, "event": kind, "time": t.isoformat(),
                                     "stack": "bench"}))
    return attempts


def dir_part(small: int, big: int, jobs: int) -> None:
    from cli.lifecycle.direvents import dir_events
    from cli.watch.decide import PAST_FACTS

    spotctl = [sys.executable, "-m", "cli"]
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (small, big):
            root = Path(tmp) / f"d{n}"
            attempts = dir_history(root / "events", n, jobs)
            stack = write_stack(root / "p", jobs)
            text = stack.read_text().replace("state: preempted", "state: running")
            lines, current = [], None  # each job at its current attempt
            for line in text.splitlines(keepends=True):
                if line.startswith("    - id: "):
                    current = line.split()[-1]
                if line.strip() == "attempt: 2" and current in attempts:
                    line = line.replace("2", str(attempts[current]))
                lines.append(line)
            stack.write_text("".join(lines))
            watch = spotctl + ["watch", "--once", "--no-poll", "--no-apply", "--json", "--stack-file", str(stack),
                               "--events-dir", str(root / "events")]
            child(watch, ROOT)  # the first run fills the cache
            whole = min((child(watch, ROOT) for _ in range(3)), key=lambda r: r[0])
            cpus = []
            for _ in range(3):  # (the first in this process also opens the cache file as a new process does)
                t = time.process_time()
                evs = dir_events(root / "events", set(attempts), "bench", None, None, attempts, PAST_FACTS)
                cpus.append(time.process_time() - t)
            tracemalloc.start()  # (its own read: tracemalloc slows every allocation)
            dir_events(root / "events", set(attempts), "bench", None, None, attempts, PAST_FACTS)
            held = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            got[n] = (*whole, min(cpus), held, len(evs))
    (w1, r1, c1, m1, e1), (w2, r2, c2, m2, e2) = got[small], got[big]
    print(f"watch --once, nothing new, --events-dir: {small} events {w1:.2f} s CPU {r1 >> 10} MB RSS; {big} events "
          f"{w2:.2f} s {r2 >> 10} MB: ratio CPU {w2 / w1:.2f} (goal <= 1.3) memory {r2 / r1:.2f} (goal <= 1.2)")
    print(f"  its read alone: {small} events {c1 * 1000:.1f} ms {m1 >> 10} KiB peak ({e1} events); {big} events "
          f"{c2 * 1000:.1f} ms {m2 >> 10} KiB ({e2} events): ratio CPU {c2 / c1:.2f} memory {m2 / m1:.2f}")


def events_dir(root: Path, jobs: int, events: int) -> Path:
    d = root / "events"
    for i in range(events):
        job = f"job-{i % jobs:04d}"
        t = T0 + timedelta(seconds=i)
        p = d / "bench" / job / "attempt-2" / "node-0" / f"{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-checkpoint.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"job": job, "attempt": 2, "node": 0, "event": "started" if i < jobs else "checkpoint",
                                 "time": t.isoformat(), "stack": "bench"}))
    return d


def commands_part() -> None:
    spotctl = [sys.executable, "-m", "cli"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stack = write_stack(root / "p", 200)
        ev = events_dir(root, 200, 10_000)
        for cmd in ("status", "cost"):
            argv = spotctl + [cmd, "--stack-file", str(stack), "--events-dir", str(ev), "--json"]
            first = child_cpu(argv, ROOT)
            cpu = min(child_cpu(argv, ROOT) for _ in range(3))
            print(f"{cmd} of 200 jobs at 10k event files: {cpu:.2f} s CPU (goal <= 2 s; the first run, filling the "
                  f"cache: {first:.2f} s)")
        stacks = {jobs: write_stack(root / f"p{jobs}", jobs) for jobs in (10, 5000)}
        for stack in stacks.values():  # the first status validates the file and writes its cache, once
            child_cpu(spotctl + ["status", "--stack-file", str(stack)], ROOT)
        one: dict[int, list[float]] = {10: [], 5000: []}
        for _ in range(7):  # the sizes in turn, so a change in the host's load hits both
            for jobs, stack in stacks.items():
                one[jobs].append(child_cpu(spotctl + ["status", "job-0001", "--stack-file", str(stack)], ROOT))
        (a, b) = (sorted(one[10]), sorted(one[5000]))
        print(f"status JOB: 10 jobs {a[0]:.3f} s, 5000 jobs {b[0]:.3f} s CPU (min of 7): ratio {b[0] / a[0]:.2f}, "
              f"of the medians {b[3] / a[3]:.2f} (goal <= 1.2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--parts", default="dir,commands,bucket")
    parser.add_argument("--worst", action="store_true", help="the bucket part also with all history in the current attempt")
    args = parser.parse_args()
    os.environ["SPOTCTL_EVENT_CACHE"] = str(Path(tempfile.mkdtemp()) / "events.sqlite")
    parts = args.parts.split(",")
    if "dir" in parts:
        dir_part(args.small, args.big, args.jobs)
    if "commands" in parts:
        commands_part()
    if "bucket" in parts:
        bucket_part(args.small, args.big, args.jobs, args.worst)


if __name__ == "__main__":
    main()
