"""The durable event cache and the cursor reads of the event bucket (cli/lifecycle/eventstore.py,
cli/lifecycle/bucketevents.py): a second read with nothing new downloads nothing and lists only
folders (moto S3 in server mode, requests counted at the HTTP client), expired objects keep their
events, a corrupt cache is rebuilt (a kill at every write: tests/test_event_cache_kill.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from cli.lifecycle.bucketevents import BucketEvents, start_after
from cli.lifecycle.events import Event
from cli.lifecycle.eventstore import EventStore
from tests.test_watch import aws_stack  # noqa: F401 (the fixture: a stack team with job train at attempt 3)

T0 = (datetime.now(UTC) - timedelta(days=2)).replace(microsecond=0)


class Counting:
    """The requests spotctl's S3 client sends: LIST (ListObjectsV2) and GET (an object)."""

    def __init__(self, monkeypatch):
        import boto3

        from cli.cloud import aws

        self.lists, self.gets = [], []

        def client(region):
            s3 = boto3.client("s3", region_name=region)
            s3.meta.events.register("before-send.s3", self.saw)
            return s3

        monkeypatch.setattr(aws, "_s3", client)

    def saw(self, request, **_):
        if request.method == "GET":
            (self.lists if "list-type=2" in request.url else self.gets).append(request.url)

    def reset(self):
        self.lists, self.gets = [], []


def fill(s3, attempts: int, nodes: int, per_node: int, start: int = 0) -> int:
    """Event objects of job ``train`` (time-ordered keys, as the scripts name them) and log chunks."""
    n = 0
    for a in range(1, attempts + 1):
        for k in range(nodes):
            for i in range(start, start + per_node):
                t = T0 + timedelta(hours=a, seconds=i)
                key = f"team/train/attempt-{a}/node-{k}/{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-checkpoint.json"
                s3.put_object(Bucket="team-ev", Key=key, Body=json.dumps(
                    {"job": "train", "attempt": a, "node": k, "event": "checkpoint", "time": t.isoformat(), "stack": "team"}))
                s3.put_object(Bucket="team-ev", Key=f"team/train/attempt-{a}/node-{k}/logs/{i:012d}.log", Body=b"log\n")
                n += 1
    return n


@pytest.fixture
def s3(moto_server):
    import boto3

    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket="team-ev")
    return client


def cloud():
    """The stack's Cloud object (real S3 calls), as spotctl builds it."""
    from types import SimpleNamespace

    from cli.cloud import Cloud

    return Cloud(SimpleNamespace(cloud="aws", region="us-east-1"), "team")


def process_read(attempts=None):
    """What one spotctl process reads: a new BucketEvents over the shared cache."""
    parsed = BucketEvents("team")
    parsed.read(cloud(), "team-ev", "team/", attempts=attempts)
    return parsed.events({"train"}, None, bucket="team-ev")


def test_a_second_process_with_nothing_new_downloads_nothing_and_lists_the_same_whatever_the_history(s3, monkeypatch, tmp_path):
    counted = Counting(monkeypatch)
    objects = fill(s3, attempts=3, nodes=2, per_node=4)
    assert len(process_read({"train": 3})) == objects and len(counted.gets) == objects
    assert not [u for u in counted.lists if "logs" in u]  # the log chunks are a folder never listed
    counted.reset()
    assert len(process_read({"train": 3})) == objects
    small = (len(counted.lists), len(counted.gets))
    fill(s3, attempts=3, nodes=2, per_node=40, start=4)  # ten times the history, read by a new machine
    monkeypatch.setenv("SPOTCTL_EVENT_CACHE", str(tmp_path / "other.sqlite"))
    process_read({"train": 3})
    counted.reset()
    assert len(process_read({"train": 3})) == 3 * 2 * 44
    # stack, job, attempt-3 and its two nodes: the older attempts were read already
    assert (len(counted.lists), len(counted.gets)) == small == (5, 0)


def test_a_new_event_is_the_only_download(s3, monkeypatch):
    counted = Counting(monkeypatch)
    fill(s3, attempts=1, nodes=1, per_node=5)
    process_read({"train": 1})
    counted.reset()
    fill(s3, attempts=1, nodes=1, per_node=1, start=5)
    assert len(process_read({"train": 1})) == 6 and len(counted.gets) == 1


def test_expired_objects_keep_their_events(s3):
    fill(s3, attempts=2, nodes=1, per_node=3)
    before = process_read()
    for o in s3.list_objects_v2(Bucket="team-ev", Prefix="team/train/attempt-1/")["Contents"]:
        s3.delete_object(Bucket="team-ev", Key=o["Key"])  # the bucket's lifecycle rule (eventRetentionDays)
    after = process_read()
    assert after == before and {e.attempt for e in after} == {1, 2}


def test_a_listing_starts_a_window_before_the_newest_key():
    folder = "team/train/attempt-1/node-0/"
    assert start_after(folder + "2026-11-28T18:20:00.123Z-started.json", folder) == folder + "2026-11-28T18:10:00"
    assert start_after(folder + "x.json", folder) is None and start_after(None, folder) is None


def event(i: int) -> Event:
    return Event("train", 1, 0, "checkpoint", T0 + timedelta(seconds=i), {"i": str(i)})


@pytest.mark.parametrize("damage", [b"not a database at all" * 100, b"", "truncate"])
def test_a_corrupt_cache_is_rebuilt(tmp_path, damage):
    path = tmp_path / "events.sqlite"
    store = EventStore("bucket:team-ev", path)
    store.put([(f"k{i}", "g", event(i)) for i in range(500)], {"p/": "k499"})
    store.close()
    if damage == "truncate":
        with path.open("r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
            fh.seek(0)
            fh.write(b"\0" * 100)  # the header too
    else:
        path.write_bytes(damage)
    store = EventStore("bucket:team-ev", path)
    assert store.events(["train"]) == [] and store.cursor("p/") is None  # rebuilt empty: read again
    store.put([("k1", "g", event(1))])
    assert [e for _, e in store.events(["train"])] == [event(1)]


def test_gcs_lists_from_the_cursor_and_skips_the_log_chunks(monkeypatch):
    """On GCS (the drill's emulator of the JSON API): ``startOffset`` and ``delimiter``; a second
    reader with one new object downloads that object only, the cursor's own name is not read again."""
    from types import SimpleNamespace

    from cli.cloud import Cloud
    from cli.drill.emulator import Emulator
    from tests.test_events_keys import gcs_put

    def put(i: int) -> None:
        t = T0 + timedelta(seconds=i)
        gcs_put(emu.url, f"team/train/attempt-1/node-0/{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-checkpoint.json",
                {"job": "train", "attempt": 1, "node": 0, "event": "checkpoint", "time": t.isoformat(), "stack": "team"})

    def read():
        parsed = BucketEvents("team")
        parsed.read(Cloud(SimpleNamespace(cloud="gcp", region="us-central1"), "team"), "gcs-evts", "team/")
        return parsed.events({"train"}, None)

    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        for i in range(4):
            put(i)
        gcs_put(emu.url, "team/train/attempt-1/node-0/logs/000000000000.log", {"not": "an event"})
        assert len(read()) == 4
        put(4)
        emu.state.requests.clear()
        assert len(read()) == 5
        downloads = [p for m, p in emu.state.requests if "alt=media" in p]
        assert len(downloads) == 1 and "logs" not in "".join(p for _, p in emu.state.requests)
        node = [p for _, p in emu.state.requests if "node-0%2F" in p and "alt=media" not in p]
        assert len(node) == 1 and "startOffset=" in node[0] and "delimiter=%2F" in node[0]


@pytest.mark.usefixtures("aws_stack")
def test_a_second_watch_once_with_nothing_new_downloads_nothing(runner, fake_pulumi, moto_server, monkeypatch):
    """``watch --once`` twice (cron's way): the second run lists the same folders and downloads
    nothing, however many events the first one read."""
    import boto3

    from tests.test_watch import T0 as WATCH_T0
    from tests.test_watch import watch

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="team-events")
    counted = Counting(monkeypatch)
    lists = []
    for batch in (range(0, 3), range(3, 40)):
        for i in batch:
            t = WATCH_T0 + timedelta(seconds=i)
            s3.put_object(Bucket="team-events", Key=f"team/train/attempt-3/node-0/{t.strftime('%Y-%m-%dT%H:%M:%S.000Z')}-x.json",
                          Body=json.dumps({"job": "train", "attempt": 3, "node": 0, "event": "started" if i == 0 else "checkpoint",
                                           "time": t.isoformat()}))
        result, _ = watch(runner, "--no-poll", "--events-bucket", "team-events")
        assert result.exit_code == 0, result.output
        assert len(counted.gets) == len(batch)  # each object once, by whichever run saw it first
        counted.reset()
        result, _ = watch(runner, "--no-poll", "--events-bucket", "team-events")
        assert result.exit_code == 0, result.output
        lists.append(len(counted.lists))
        assert counted.gets == []
        counted.reset()
    assert lists[0] == lists[1]
