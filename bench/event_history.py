"""Event history at scale: what a read costs as the history grows (ratios measured in one run).

1. The event bucket (moto S3 in server mode, run in this process; objects put through moto's backend):
   ``spotctl watch --once`` with nothing new, a whole process talking to the server over HTTP, at SMALL
   and at BIG events (10 jobs, 50 checkpoints a minute apart per attempt, history in older attempts, log
   chunks beside the events): CPU and peak RSS (VmHWM) of the child, LIST+GET counted at the server; a
   long-running watcher's cycles (LIST, GET each); the cache's rows of the bucket. The first read, which
   fills the cache, is spotctl's reader with each GET taken from moto's backend (100k GETs over HTTP
   took more than 25 min on this host).
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
    t = T0 + timedelta(minutes=i)  # (a checkpoint a minute: the cache folds what is older than the listing window)
    key = f"team/{job}/attempt-{attempt}/node-0/{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-checkpoint.json"
    return key, json.dumps({"job": job, "attempt": attempt, "node": 0, "event": "checkpoint",
                            "time": t.isoformat(), "stack": "team"}).encode()


def fill_bucket(bucket: str, events: int, jobs: int) -> dict[str, int]:
    """``events`` event objects over ``jobs`` jobs, ``PER_ATTEMPT`` per attempt (a long-lived job: the current
    attempt the same size at any history), and a trainer log chunk per ten events (``node-0/logs/``), put
    through moto's backend; -> {job: current attempt}."""
    import boto3
    from moto.s3.models import s3_backends

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=bucket)
    backend = s3_backends["123456789012"]["aws"]
    per_job = events // jobs
    attempts = max(1, per_job // PER_ATTEMPT)
    for j in range(jobs):
        for i in range(per_job):
            attempt = 1 + i * attempts // per_job
            key, body = key_of(f"job{j}", attempt, i)
            backend.put_object(bucket, key, body)
            if i % 10 == 0:
                backend.put_object(bucket, f"team/job{j}/attempt-{attempt}/node-0/logs/{i:012d}.log", b"step\n" * 100)
    return {f"job{j}": attempts for j in range(jobs)}


class Counted:
    """The requests moto's server answers, by kind (LIST: ListObjectsV2; GET: an object; other), counted at
    the server, so a child process's requests count too."""

    def __init__(self):
        self.n = {"list": 0, "get": 0, "other": 0}

    def wrap(self, app):
        def counted(environ, start_response):
            query = environ.get("QUERY_STRING", "")
            kind = "other" if environ["REQUEST_METHOD"] != "GET" else "list" if "list-type=2" in query else "get"
            self.n[kind] += 1
            return app(environ, start_response)
        return counted

    def take(self) -> tuple[int, int]:
        got = (self.n["list"], self.n["get"])
        self.n = {k: 0 for k in self.n}
        return got


def serve(counted: Counted):
    """moto's S3 in server mode in this process (its backend filled in-process), every request counted."""
    import logging

    from moto.moto_server import threaded_moto_server
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    plain = threaded_moto_server.DomainDispatcherApplication
    threaded_moto_server.DomainDispatcherApplication = lambda *a, **k: counted.wrap(plain(*a, **k))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    threaded_moto_server.DomainDispatcherApplication = plain
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def aws_stack(directory: Path, attempts: dict[str, int]) -> Path:
    """stacks/Pulumi.team.yaml: an AWS stack whose jobs run at ``attempts``."""
    (directory / "stacks").mkdir(parents=True, exist_ok=True)
    (directory / "Pulumi.yaml").write_text("name: spotctl\nruntime: python\nmain: infra/\nstackConfigDir: stacks\n")
    jobs = "".join(f"    - id: {job}\n      instanceType: g5.xlarge\n      zone: us-east-1a\n      command: python train.py\n"
                   f"      attempt: {a}\n      state: running\n" for job, a in attempts.items())
    path = directory / "stacks" / "Pulumi.team.yaml"
    path.write_text("config:\n  aws:region: us-east-1\n  spotctl:cloud: aws\n  spotctl:region: us-east-1\n"
                    "  spotctl:zones: [us-east-1a]\n  spotctl:jobs:\n" + jobs)
    return path


def first_read(bucket: str, attempts: dict[str, int]) -> None:
    """The first read, which fills the cache, by spotctl's reader: LISTs through moto's server, each object's
    GET taken from moto's backend in this process (100k GETs over HTTP took more than 25 min here)."""
    from types import SimpleNamespace

    from moto.s3.models import s3_backends

    from cli.cloud import Cloud, aws
    from cli.lifecycle.bucketevents import BucketEvents

    backend = s3_backends["123456789012"]["aws"]

    def direct(s3, name, limit):
        return lambda key, generation: (backend.get_object(name, key).value[:limit + 1], generation)

    plain, aws._s3_fetcher = aws._s3_fetcher, direct
    try:
        parsed = BucketEvents("team")
        parsed.read(Cloud(SimpleNamespace(cloud="aws", region="us-east-1"), "team"), bucket, "team/", attempts=attempts)
        for store in parsed.stores.values():
            store.close()
    finally:
        aws._s3_fetcher = plain


def cached(bucket: str) -> int:
    from cli.lifecycle.eventstore import EventStore

    store = EventStore(f"bucket:{bucket}")
    try:
        return store.count()
    finally:
        store.close()


def long_running(bucket: str, attempts: dict[str, int], counted: Counted, cycles: int = 3) -> list[tuple[int, int]]:
    """LIST+GET of each cycle of a long-running watcher's reader (one ``BucketEvents`` kept across cycles,
    as ``cli.watch.watcher.run`` keeps it), nothing new."""
    from types import SimpleNamespace

    from cli.cloud import Cloud
    from cli.lifecycle.bucketevents import BucketEvents
    from cli.watch.decide import PAST_FACTS

    cloud = Cloud(SimpleNamespace(cloud="aws", region="us-east-1"), "team")
    reader, out = BucketEvents("team"), []
    counted.take()
    for _ in range(cycles):
        reader.read(cloud, bucket, "team/", attempts=attempts)
        reader.events(set(attempts), None, bucket=bucket, attempts=attempts, older=PAST_FACTS)
        out.append(counted.take())
    for store in reader.stores.values():
        store.close()
    return out


def bucket_part(small: int, big: int, jobs: int) -> None:
    counted = Counted()
    server, url = serve(counted)
    os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    spotctl = SPOTCTL
    got = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in (small, big):
                bucket = f"team-events-{n}"
                t = time.time()
                attempts = fill_bucket(bucket, n, jobs)
                first_read(bucket, attempts)
                stack = aws_stack(Path(tmp) / f"p{n}", attempts)
                watch = spotctl + ["watch", "--once", "--no-poll", "--no-apply", "--json", "--stack-file", str(stack),
                                   "--events-bucket", bucket]
                counted.take()
                child(watch, ROOT)  # (the first process: what the first read left, checked)
                first = counted.take()
                runs = []
                for _ in range(3):
                    cpu, rss = child(watch, ROOT)
                    runs.append((cpu, rss, *counted.take()))
                cpu, rss, lists, gets = min(runs)
                got[n] = (cpu, rss, lists, gets, first, long_running(bucket, attempts, counted), cached(bucket))
                print(f"  ({n} events: filled and first read in {time.time() - t:.0f} s)", file=sys.stderr)
    finally:
        server.stop()
    (c1, r1, l1, g1, f1, k1, n1), (c2, r2, l2, g2, f2, k2, n2) = got[small], got[big]
    print(f"watch --once, nothing new, S3 (moto server): {small} events {c1:.2f} s CPU {r1 >> 10} MB RSS {l1} LIST + {g1} GET; "
          f"{big} events {c2:.2f} s {r2 >> 10} MB {l2} LIST + {g2} GET: ratio CPU {c2 / c1:.2f} (goal <= 1.3) requests "
          f"{(l2 + g2) / max(1, l1 + g1):.2f} (goal <= 1.3) memory {r2 / r1:.2f} (goal <= 1.2)")
    print(f"  the first process after the first read: {small} events {f1[0]} LIST + {f1[1]} GET, {big} events "
          f"{f2[0]} LIST + {f2[1]} GET")
    print(f"  a long-running watcher's cycles (LIST, GET): {small} events {k1}, {big} events {k2}")
    print(f"  the cache's rows of the bucket: {small} events {n1}, {big} events {n2} (node folders {small // PER_ATTEMPT}, "
          f"{big // PER_ATTEMPT}: {n1 / (small // PER_ATTEMPT):.1f} and {n2 / (big // PER_ATTEMPT):.1f} a folder)")


# ``python -m cli`` that writes its peak RSS (VmHWM) at exit: a child's ru_maxrss also counts the pages of
# this process it was forked from (and this one holds moto's objects).
SPOTCTL = [sys.executable, "-c", """import atexit, os, runpy, sys
def peak():
    with open('/proc/self/status') as fh, open(os.environ['BENCH_PEAK'], 'w') as out:
        out.write(next(line.split()[1] for line in fh if line.startswith('VmHWM:')))
atexit.register(peak)
sys.argv = ['spotctl', *sys.argv[1:]]
runpy.run_module('cli', run_name='__main__')
"""]


def child(argv: list[str], cwd: Path) -> tuple[float, int]:
    """(CPU s, peak RSS in KiB) of one child process."""
    with tempfile.NamedTemporaryFile() as peak:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "BENCH_PEAK": peak.name})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):  # (1: watch --once says a cycle had a warning)
            raise SystemExit(f"{argv}: exit {proc.returncode}")
        return usage.ru_utime + usage.ru_stime, int(Path(peak.name).read_text() or 0)


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

    spotctl = SPOTCTL
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
    spotctl = SPOTCTL
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
    args = parser.parse_args()
    os.environ["SPOTCTL_EVENT_CACHE"] = str(Path(tempfile.mkdtemp()) / "events.sqlite")
    parts = args.parts.split(",")
    if "dir" in parts:
        dir_part(args.small, args.big, args.jobs)
    if "commands" in parts:
        commands_part()
    if "bucket" in parts:
        bucket_part(args.small, args.big, args.jobs)


if __name__ == "__main__":
    main()
