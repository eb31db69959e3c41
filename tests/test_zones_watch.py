"""`spotctl watch` after a preemption: the zone choice moves the job where spot is up (another job's
spot VM runs there) through the move core, or resumes it in place when nothing says so."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
from moto import mock_aws

from cli.lifecycle import stackfile
from infra.config import Capacity
from tests.conftest import data_labels
from tests.test_cleanup import make_volume

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)

STACK = """config:
  aws:region: us-east-1
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b]
  spotctl:jobs:
    - id: train
      instanceType: p3.2xlarge
      zone: us-east-1a
      command: python train.py
      attempt: 1
      state: running
      jobHours: 20
      deadlineHours: 24
    - id: neighbour
      instanceType: p3.2xlarge
      zone: {neighbour}
      command: python train.py
      attempt: 1
      state: running
"""


def write_events(path: Path, *docs: tuple) -> None:
    with path.open("a") as fh:
        for job, event, minute, capacity in docs:
            fh.write(json.dumps({"job": job, "attempt": 1, "node": 0, "event": event,
                                 "time": (T0 + timedelta(minutes=minute)).isoformat(),
                                 "details": {"capacity": capacity} if capacity else {}}) + "\n")


POOL = """  spotctl:pools:
    - name: gpus
      instanceTypes: [p3.2xlarge]
      spotMax: 4
"""


def watch_once(project: Path, pulumi_state, monkeypatch, tmp_path, neighbour: str, pool: list[dict] = ()) -> list[dict]:
    from cli.commands import applier_for, cloud_for
    from cli.lifecycle import capacity
    from cli.watch import observe, watcher

    text = STACK.format(neighbour=neighbour)
    (project / "stacks" / "Pulumi.team.yaml").write_text(text.replace("  spotctl:jobs:\n", POOL + "  spotctl:jobs:\n") if pool else text)
    pulumi_state.seed("team")
    events = tmp_path / "ev.jsonl"
    write_events(events, ("train", "started", -180, "spot"), ("train", "progress", -175, None),
                 ("train", "preempted", -5, None), ("neighbour", "started", -360, "spot"))
    with events.open("a") as fh:
        fh.writelines(json.dumps(d) + "\n" for d in pool)
    monkeypatch.setattr(capacity, "policy_capacity", lambda now, **_: lambda j, ev: Capacity.SPOT)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    records: list[dict] = []
    with mock_aws():
        make_volume(boto3.client("ec2", region_name="us-east-1"), "us-east-1a",
                    data_labels("team", "train", "aws") | {"Name": "team-train-n0-disk"})
        ref = stackfile.resolve("team", None)
        report = watcher.Report(emit=records.append, warn=lambda w: records.append({"warning": w}), out=lambda line: None)
        settings = watcher.Settings(ref, observe.Sources(events_dir=events, poll=False), applier_for(ref, False), once=True)
        watcher.run(settings, report, cloud_for=lambda c: cloud_for(c, ref), now=lambda: T0, rng=random.Random(1))
    return [r for r in records if r.get("job") == "train"]


def test_watch_moves_a_preempted_job_to_the_zone_where_spot_is_up(project, fake_pulumi, pulumi_state, monkeypatch, tmp_path):
    records = watch_once(project, pulumi_state, monkeypatch, tmp_path, neighbour="us-east-1b")
    move = records[-1]
    assert move["action"] == "move" and move["result"] == "moving", records
    assert "node 0 of attempt 1 preempted" in move["reason"] and "moves to us-east-1b" in move["reason"]
    assert "spot up for 6.00 h" in move["reason"]
    j = stackfile.load(stackfile.resolve("team", None)).job("train")
    assert (j.zone, j.move.to, j.move.step) == ("us-east-1b", "us-east-1b", "start")


def test_watch_resumes_in_place_when_nothing_says_spot_is_up_elsewhere(project, fake_pulumi, pulumi_state, monkeypatch,
                                                                       tmp_path):
    records = watch_once(project, pulumi_state, monkeypatch, tmp_path, neighbour="us-east-1a")
    assert records[-1]["action"] == "resume", records
    j = stackfile.load(stackfile.resolve("team", None)).job("train")
    assert (j.zone, j.attempt, j.move) == ("us-east-1a", 2, None)



def test_watch_takes_a_pool_vm_preempted_elsewhere_as_spot_down_there(project, fake_pulumi, pulumi_state, monkeypatch,
                                                                      tmp_path):
    """The neighbour's spot VM runs in us-east-1b; a pool VM of the same type was preempted there 10
    minutes ago (its events carry its zone): the watcher resumes the job in place instead of moving it."""
    pool = [{"stack": "team", "kind": "pool", "job": "gpus", "attempt": 1, "node": 0, "event": event,
             "time": (T0 + timedelta(minutes=minute)).isoformat(), "instance": "i-0123456789abcdef0",
             "zone": "us-east-1b", "details": {}} for event, minute in (("busy", -200), ("preempted", -10))]
    records = watch_once(project, pulumi_state, monkeypatch, tmp_path, neighbour="us-east-1b", pool=pool)
    assert records[-1]["action"] == "resume", records
    j = stackfile.load(stackfile.resolve("team", None)).job("train")
    assert (j.zone, j.attempt, j.move) == ("us-east-1a", 2, None)
