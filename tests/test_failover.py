"""A zone failover after capacity refusals: the pure decision (wait, on-demand in place, move) and
`spotctl watch` acting on it through the move core, against the fake pulumi refusing one zone."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from moto import mock_aws

from cli.lifecycle import stackfile
from cli.lifecycle.capacity import DEFAULT_MOVE_H, decide_zone_failover, move_changeover_h
from cli.lifecycle.events import Event
from cli.policy.failover import FailoverObservation, make_failover
from infra.config import Capacity, Job
from tests.conftest import data_labels, pulumi_calls
from tests.test_cleanup import make_volume

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def obs(**over) -> FailoverObservation:
    base = dict(refusals=3, waited_h=0.5, next_wait_h=0.1, move_h=0.25, changeover_h=0.2, price_ratio=3.0,
                work_left_h=math.inf, slack_h=math.inf, in_place="spot", candidates=("us-east-1b",))
    return FailoverObservation(**(base | over))


def test_waiting_wins_until_it_has_cost_as_much_time_as_a_move():
    first = make_failover().decide(obs(refusals=1, waited_h=0.0, next_wait_h=0.01))
    assert first.choice == "wait" and "shorter than a move" in first.reason
    later = make_failover().decide(obs(refusals=4, waited_h=0.2, next_wait_h=0.1))
    assert (later.choice, later.zone) == ("move", "us-east-1b") and "spot in us-east-1b" in later.reason


def test_a_deadline_that_cannot_absorb_the_move_takes_on_demand_in_place():
    tight = make_failover().decide(obs(slack_h=0.4, work_left_h=5.0))
    assert tight.choice == "on-demand" and "slack" in tight.reason
    assert make_failover().decide(obs(slack_h=3.0, work_left_h=5.0)).choice == "move"


def test_when_the_policy_would_pay_on_demand_a_cheaper_move_wins_and_a_dearer_one_does_not():
    assert make_failover().decide(obs(in_place="on-demand", waited_h=0.0, work_left_h=4.0)).choice == "move"
    assert make_failover().decide(obs(in_place="on-demand", waited_h=0.0)).choice == "move"  # open-ended work
    # Little work left: (3 - 1) * (0.1 + 0.2) < 3 * 0.25 h of move priced at on-demand.
    little = make_failover().decide(obs(in_place="on-demand", waited_h=0.0, work_left_h=0.1))
    assert little.choice == "on-demand" and "would save nothing" in little.reason
    # On-demand priced like spot: nothing to save by moving.
    assert make_failover().decide(obs(in_place="on-demand", waited_h=0.0, price_ratio=1.0)).choice == "on-demand"


def test_no_other_zone_or_moves_turned_off_stays():
    assert make_failover().decide(obs(candidates=())).choice == "stay"
    assert make_failover().decide(obs(allowed=False)).choice == "stay"


@given(waited=st.floats(0, 10), nxt=st.floats(0, 1), move=st.floats(0.01, 5), slack=st.floats(0, 20),
       ratio=st.floats(0.5, 10), in_place=st.sampled_from(["spot", "on-demand"]))
def test_a_move_never_eats_the_slack_on_demand_needs(waited, nxt, move, slack, ratio, in_place):
    o = obs(waited_h=waited, next_wait_h=nxt, move_h=move, slack_h=slack, price_ratio=ratio, work_left_h=5.0, in_place=in_place)
    d = make_failover().decide(o)
    assert d.reason
    if d.choice == "move":
        assert slack - move - o.changeover_h > o.tick_h and d.zone == "us-east-1b"
    if in_place == "spot" and d.choice != "on-demand":  # the rent-or-buy rule
        assert (d.choice == "move") == (waited + nxt >= move)


def job(**over) -> Job:
    base = {"id": "train", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "command": "t", "state": "running", "attempt": 4}
    return Job.model_validate(base | over)


def test_the_move_changeover_is_measured_from_past_moves_else_the_default():
    assert move_changeover_h(job(), []) == (DEFAULT_MOVE_H, 0)
    moved = job(zoneHistory=[{"zone": "us-east-1b", "lastAttempt": 2, "moveBegan": T0.isoformat()}])
    started = [Event("train", 3, 0, "started", T0 + timedelta(minutes=12)), Event("train", 3, 1, "started", T0 + timedelta(minutes=20))]
    assert move_changeover_h(moved, started) == (pytest.approx(0.2), 1)  # the first node's start


def test_zones_that_refused_recently_are_no_target():
    j = job()
    now = T0 + timedelta(hours=2)
    kwargs = dict(zones=["us-east-1a", "us-east-1b", "us-east-1c"], refusals=5, refused_since=T0, next_wait_h=0.5,
                  in_place=lambda: Capacity.SPOT, now=now)
    assert decide_zone_failover(j, [], refused={"us-east-1b": now - timedelta(minutes=5)}, **kwargs).zone == "us-east-1c"
    assert decide_zone_failover(j, [], refused={"us-east-1b": now - timedelta(hours=3)}, **kwargs).zone == "us-east-1b"
    gone = decide_zone_failover(j, [], refused={z: now for z in ("us-east-1b", "us-east-1c")}, **kwargs)
    # Every other zone refused just now: no move, and the choice in place is said (the policy waits for spot).
    assert gone.choice == "wait" and "us-east-1b: refused capacity 0.00 h ago" in gone.reason, gone
    assert "the job's policy waits for spot: retry here" in gone.reason


# ---- the watcher against the fake pulumi: us-east-1a has no capacity ---------------------------------------

STACK = """config:
  aws:region: us-east-1
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b, us-east-1c]
  spotctl:jobs:
    - id: train
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: python train.py
      attempt: 3
      state: running
      zoneHistory: [{zone: us-east-1c, lastAttempt: 2, moveBegan: '2026-11-21T08:00:00Z'}]
"""


def write_events(path: Path, *docs: tuple) -> None:
    with path.open("a") as fh:
        for attempt, event, minute in docs:
            fh.write(json.dumps({"job": "train", "attempt": attempt, "node": 0, "event": event,
                                 "time": (T0 + timedelta(minutes=minute)).isoformat(), "details": {}}) + "\n")


@pytest.fixture
def refusing(project: Path, fake_pulumi: Path, pulumi_state, monkeypatch, tmp_path):
    """The stack (in Pulumi's state too), its events (a past move that took 6 minutes; attempt 3
    preempted) and a watcher whose policy always wants spot in place, with us-east-1a out of capacity."""
    from cli.lifecycle import capacity

    (project / "stacks" / "Pulumi.team.yaml").write_text(STACK)
    pulumi_state.seed("team")
    events = tmp_path / "ev.jsonl"
    write_events(events, (3, "started", -114), (3, "preempted", 0))
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_ZONE", "us-east-1a")
    monkeypatch.setattr(capacity, "policy_capacity", lambda now, **_: lambda j, ev: Capacity.SPOT)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():  # the stack's snapshots, listed once a move finished (none expired here)
        # The job's volumes in the cloud, every generation its moves may leave: a move's release
        # checks their ownership tags there.
        for name in ("team-train-n0-disk", *(f"team-train-n0-m{gen}-disk" for gen in range(1, 5))):
            make_volume(boto3.client("ec2", region_name="us-east-1"), "us-east-1a", data_labels("team", "train", "aws") | {"Name": name})
        yield events


def run_watch(events: Path, clock: list[datetime], records: list[dict]) -> None:
    from cli.commands import applier_for, cloud_for
    from cli.watch import observe, watcher

    ref = stackfile.resolve("team", None)
    report = watcher.Report(emit=records.append, warn=lambda w: records.append({"warning": w}), out=lambda line: None)
    settings = watcher.Settings(ref, observe.Sources(events_dir=events, poll=False), applier_for(ref, False), once=True)
    watcher.run(settings, report, cloud_for=lambda c: cloud_for(c, ref), now=lambda: clock[0], rng=random.Random(1))


def stack_at_ups(log: Path, project: Path) -> list[tuple[str, str, int]]:
    """(zone, move step or '-', attempt) of the job in the stack file at every `pulumi up`."""
    out = []
    for text in (json.loads(line) for line in Path(str(log) + ".stackfiles").read_text().splitlines()):
        path = project / "snap" / "Pulumi.snap.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        j = stackfile.load(stackfile.resolve(None, path)).job("train")
        out.append((j.zone, j.move.step if j.move else "-", j.attempt))
    return out


def the_job() -> Job:
    return stackfile.load(stackfile.resolve("team", None)).job("train")


def test_watch_waits_then_moves_the_job_once_waiting_cost_a_moves_time(refusing, project, fake_pulumi):
    clock, records = [T0 + timedelta(minutes=1)], []
    run_watch(refusing, clock, records)
    assert (records[-1]["action"], records[-1]["result"]) == ("resume", "waiting-for-capacity")
    for _ in range(10):  # retry at each next try until the watcher decides to move
        clock[0] = datetime.fromisoformat(records[-1]["next_try"])
        run_watch(refusing, clock, records)
        if records[-1]["action"] == "move":
            break
        assert records[-1]["action"] == "retry-capacity" and "shorter than a move (0.10 h)" in records[-1]["reason"]
        assert records[-1]["result"] == "waiting-for-capacity"
    move = records[-1]
    assert move["result"] == "moving" and "spot in us-east-1b" in move["reason"], move
    waits = [r for r in records if r.get("action") == "retry-capacity"]
    assert len(waits) >= 2  # it waited first: a move (0.1 h, measured) only once waiting cost as much
    ups = stack_at_ups(fake_pulumi, project)
    assert all(u == ("us-east-1a", "-", 4) for u in ups[: len(waits) + 1])  # every refused try stayed in place
    assert ups[len(waits) + 1:] == [("us-east-1a", "-", 4),  # its VM stopped before the snapshot
                                    ("us-east-1a", "snapshot", 4), ("us-east-1a", "restore", 4), ("us-east-1b", "start", 5)]
    j = the_job()
    assert (j.zone, j.attempt, j.move.step, j.move.began) == ("us-east-1b", 5, "start", clock[0])
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]  # old volume protected

    n = len(records)
    clock[0] += timedelta(minutes=1)
    run_watch(refusing, clock, records)
    assert len(records) == n  # nothing to do until the new attempt has started
    write_events(refusing, (5, "started", 60))
    clock[0] += timedelta(minutes=1)
    run_watch(refusing, clock, records)
    assert (records[-1]["action"], records[-1]["result"]) == ("move", "moved"), records[-1]
    assert "snapshot" not in records[-1].get("detail", "")  # the expired snapshots were checked: none
    assert [c[2].split("::")[-1] for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]] == ["job-train-n0-m1-volume"]
    j = the_job()
    assert (j.zone, j.attempt, j.move) == ("us-east-1b", 5, None)
    assert [(z.zone, z.last_attempt) for z in j.zone_history] == [("us-east-1c", 2), ("us-east-1a", 4)]


def test_watch_takes_on_demand_in_place_when_the_deadline_cannot_absorb_a_move(refusing, project, fake_pulumi):
    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text(path.read_text().replace("      attempt: 3\n", "      attempt: 3\n      jobHours: 10\n      deadlineHours: 10.5\n")
                    .replace("zoneHistory: [{zone: us-east-1c, lastAttempt: 2, moveBegan: '2026-11-21T08:00:00Z'}]",
                             "zoneHistory: []"))
    assert "zoneHistory: []" in path.read_text()  # no past move: the default changeover (1 h)
    clock, records = [T0 + timedelta(minutes=1)], []
    run_watch(refusing, clock, records)
    clock[0] = datetime.fromisoformat(records[-1]["next_try"])
    run_watch(refusing, clock, records)
    retry = records[-1]
    assert (retry["action"], retry["result"]) == ("retry-capacity", "waiting-for-capacity")
    assert "on-demand in place loses no time" in retry["reason"], retry
    ups = stack_at_ups(fake_pulumi, project)
    assert ups[-1] == ("us-east-1a", "-", 4) and all(step == "-" for _, step, _ in ups)  # never a move
    assert the_job().capacity.value == "on-demand" and the_job().move is None
