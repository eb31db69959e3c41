"""The event cache stays bounded as a job's attempts grow long (cli/lifecycle/eventstore.py ``_fold``):
a node folder's routine events read before its listing window fold to the first and the newest of
each kind, and every reader of a history (status, cost, the capacity choice, the watcher's decision)
gives what the whole history gives; old objects expiring from the bucket change nothing; a folded
key is never downloaded again (moto S3 in server mode, requests counted at the HTTP client)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.cost.ledger import job_ledger
from cli.lifecycle.bucketevents import BucketEvents, start_after
from cli.lifecycle.capacity import measure
from cli.lifecycle.events import Event, Timeline
from cli.lifecycle.eventstore import FOLD_AT, EventStore
from cli.lifecycle.states import attempt_outcome
from cli.lifecycle.status import job_status
from infra.config import Job
from tests.test_event_cache import Counting, cloud

T0 = (datetime.now(UTC) - timedelta(days=20)).replace(microsecond=0)
JOB = Job.model_validate({"id": "train", "instance_type": "g5.xlarge", "zone": "us-east-1a", "command": "t",
                          "attempt": 3, "state": "running"})
NOW = T0 + timedelta(days=10)


def history(attempts: int, checkpoints: int, every_s: int = 60) -> list[Event]:
    """A job's events: each attempt starts, progresses, checkpoints ``checkpoints`` times (with its step),
    and every attempt but the last is preempted between two checkpoints."""
    out, t, step = [], T0, 0
    for a in range(1, attempts + 1):
        out.append(Event("train", a, 0, "started", t, {"capacity": "spot", "machineType": "g5.xlarge"}))
        out.append(Event("train", a, 0, "progress", t + timedelta(seconds=30), {}))
        for _ in range(checkpoints):
            t += timedelta(seconds=every_s)
            step += 10
            out.append(Event("train", a, 0, "checkpoint", t, {"step": str(step)}))
        if a < attempts:
            t += timedelta(seconds=every_s // 2)
            out.append(Event("train", a, 0, "preempted", t, {"step": str(step + 5)}))
            t += timedelta(minutes=7)
    return out


def key(e: Event) -> str:
    return f"team/train/attempt-{e.attempt}/node-{e.node}/{e.time.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-{e.event}.json"


def put(s3, events: list[Event]) -> None:
    for e in events:
        s3.put_object(Bucket="team-ev", Key=key(e), Body=json.dumps(
            {"job": e.job, "attempt": e.attempt, "node": e.node, "event": e.event, "time": e.time.isoformat(),
             "details": dict(e.details), "stack": "team"}))


def read(attempts=None) -> list[Event]:
    parsed = BucketEvents("team")
    parsed.read(cloud(), "team-ev", "team/", attempts=attempts)
    found = parsed.events({"train"}, None, bucket="team-ev")
    for store in parsed.stores.values():
        store.close()
    return found


def figures(events: list[Event]) -> tuple:
    """What every reader of a history makes of it."""
    events = sorted(events, key=lambda e: (e.time, e.attempt, e.node))
    row = job_status(JOB, events, NOW)
    del row["last_event"]  # (compared below: the newest event is always kept)
    return (row, job_ledger(JOB, events, NOW), measure(events, NOW), Timeline.of(events, NOW),
            [attempt_outcome(events, a) for a in (1, 2, 3)], events[-1])


def rows() -> int:
    store = EventStore("bucket:team-ev")
    try:
        return store.count("team/")
    finally:
        store.close()


@pytest.fixture
def s3(moto_server):
    import boto3

    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket="team-ev")
    return client


def test_long_attempts_fold_to_a_bounded_cache_that_reads_as_the_whole_history(s3, monkeypatch):
    whole = history(attempts=3, checkpoints=70)
    counted = Counting(monkeypatch)
    put(s3, whole)
    folded = read({"train": 3})
    assert len(counted.gets) == len(whole) and len(folded) < len(whole) // 4
    assert figures(folded) == figures(whole)
    # per node folder: the lifecycle events, a first and a newest checkpoint, the listing window's (10 min)
    assert rows() <= 3 * (3 + 2 + 11)
    counted.reset()
    assert read({"train": 3}) == folded and counted.gets == []  # a folded key is never downloaded again
    assert read() == folded and counted.gets == []  # (nor by a read of every attempt, as `status JOB` does)


def test_a_job_checkpointing_for_days_keeps_a_bounded_cache_read_after_read(s3):
    """The current attempt grows while the watcher reads it: the cache stays under a bound that does
    not grow with the checkpoints, and its figures stay the whole history's."""
    whole = history(attempts=1, checkpoints=200)
    counts = []
    for part in range(0, len(whole), 40):
        put(s3, whole[part:part + 40])
        folded = read({"train": 1})
        counts.append(rows())
        assert figures(folded)[1:] == figures(whole[:part + 40])[1:]
    assert max(counts) <= FOLD_AT + 2 + 11 + 40 and counts[-1] < 60 and len(whole) > 200  # (a fold starts past FOLD_AT)


def test_expired_objects_change_nothing_once_folded(s3):
    whole = history(attempts=3, checkpoints=60)
    put(s3, whole)
    before = read({"train": 3})
    for o in s3.list_objects_v2(Bucket="team-ev", Prefix="team/train/")["Contents"]:
        s3.delete_object(Bucket="team-ev", Key=o["Key"])  # eventRetentionDays passed for all of it
    after = read({"train": 3})
    assert after == before and figures(after) == figures(whole)


def test_a_fold_keeps_the_listing_window(tmp_path):
    """What the next listing may list again stays known (never downloaded twice), and the first."""
    folder = "team/train/attempt-1/node-0/"
    evs = [Event("train", 1, 0, "checkpoint", T0 + timedelta(seconds=60 * i), {"step": str(i)}) for i in range(100)]
    keys = [key(e) for e in evs]
    store = EventStore("bucket:team-ev", tmp_path / "c.sqlite")
    before = start_after(keys[-1], folder)
    store.put([(k, "g", e) for k, e in zip(keys, evs, strict=True)], {folder: keys[-1]}, {folder: before})
    kept = store.generations(folder)
    assert {k for k in keys if k >= before} <= set(kept) and keys[0] in kept and len(kept) == 1 + 11
    assert [e for _, e in store.events(["train"])] == [evs[0]] + evs[-11:]
    store.close()


def test_a_cursor_never_goes_back(tmp_path):
    """Two processes read one folder at once: the one whose listing began first writes last; the
    cursor stays at the later key (going back, the next listing would download what was folded)."""
    store = EventStore("bucket:team-ev", tmp_path / "c.sqlite")
    folder = "team/train/attempt-1/node-0/"
    store.put([], {folder: folder + "2026-11-02T00:00:00.000Z-checkpoint.json"})
    store.put([], {folder: folder + "2026-11-01T00:00:00.000Z-checkpoint.json"})
    assert store.cursor(folder) == folder + "2026-11-02T00:00:00.000Z-checkpoint.json"
    store.close()


ATTEMPT = st.tuples(st.integers(0, 90), st.integers(1, 600), st.booleans(), st.sampled_from(["spot", "on-demand"]),
                    st.integers(1, 7200))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attempts=st.lists(ATTEMPT, min_size=1, max_size=4), batch=st.integers(1, 50))
def test_folding_never_changes_what_a_history_says(tmp_path_factory, attempts, batch):
    """Any run of attempts (checkpoint counts and spacing, preempted or not and when, spot or on-demand) put in
    batches as a reader would (cursor and fold after each): the cache's events give every reader's
    figures of the whole history."""
    path = tmp_path_factory.mktemp("fold") / "c.sqlite"
    whole, t, step = [], T0, 0
    for a, (n, every, preempted, capacity, quiet) in enumerate(attempts, 1):
        whole.append(Event("train", a, 0, "started", t, {"capacity": capacity}))
        for _ in range(n):
            t += timedelta(seconds=every)
            step += 1
            whole.append(Event("train", a, 0, "checkpoint", t, {"step": str(step)}))
        t += timedelta(seconds=quiet)  # (training on after its newest checkpoint)
        if preempted or a < len(attempts):
            whole.append(Event("train", a, 0, "preempted", t, {"step": str(step + 1)}))
        t += timedelta(minutes=5)
    store = EventStore("bucket:team-ev", path)
    by_folder: dict[str, list[Event]] = {}
    for e in whole:
        by_folder.setdefault(key(e).rsplit("/", 1)[0] + "/", []).append(e)
    for folder, evs in by_folder.items():
        for i in range(0, len(evs), batch):
            chunk = evs[i:i + batch]
            newest = key(chunk[-1])
            store.put([(key(e), "g", e) for e in chunk], {folder: newest}, {folder: start_after(newest, folder)})
    folded = [e for _, e in store.events(["train"])]
    store.close()
    job = JOB.model_copy(update={"attempt": len(attempts)})
    assert {e.event for e in folded} >= {e.event for e in whole}
    for reader in (lambda evs: job_ledger(job, evs, NOW), lambda evs: measure(evs, NOW), lambda evs: Timeline.of(evs, NOW)):
        assert reader(sorted(folded, key=lambda e: e.time)) == reader(whole)
