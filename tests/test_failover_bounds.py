"""Zone moves are bounded: a move whose target zone refuses too asks the failover again (retry
there, on-demand, or move on to a zone that did not refuse), at most ``MOVE_BUDGET`` moves per
``MOVE_WINDOW_H``, and never straight back to a zone the job left (hysteresis). The pure rules, a
regional job between two refusing replica zones over two days of an injected clock, and `spotctl
watch` against the fake pulumi refusing two and then three zones."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.lifecycle import stackfile
from cli.lifecycle.move import next_step
from cli.policy.failover import LEFT_QUIET_H, MOVE_BUDGET, MOVE_WINDOW_H, FailoverObservation, eligible_zones, make_failover
from cli.watch.decide import JobMemory, decide_job, mean_backoff
from cli.watch.watcher import zone_failover
from infra.config import Capacity, Job
from tests.conftest import pulumi_calls
from tests.test_failover import obs as failover_obs
from tests.test_failover import refusing as _refusing
from tests.test_failover import run_watch, write_events

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def obs(**over) -> FailoverObservation:
    return failover_obs(**{"waited_h": 2.0, "next_wait_h": 0.5, "candidates": ("us-east-1c",)} | over)


# ---- the pure rules -----------------------------------------------------------------------------------------


def test_a_zone_the_job_left_needs_longer_quiet_than_one_that_only_refused():
    ok, blocked = eligible_zones("us-east-1b", ["us-east-1a", "us-east-1b", "us-east-1c"],
                                 refused_ago_h={"us-east-1a": 2.0, "us-east-1c": 2.0}, left_ago_h={"us-east-1a": 2.0})
    assert ok == ("us-east-1c",)  # refused 2 h ago: tried again after RECENT_REFUSAL_H
    assert blocked == (f"us-east-1a: left 2.00 h ago, refused 2.00 h ago; back only after {LEFT_QUIET_H:g} h quiet",)
    ok, _ = eligible_zones("us-east-1b", ["us-east-1a", "us-east-1b"], {"us-east-1a": LEFT_QUIET_H + 1}, {"us-east-1a": LEFT_QUIET_H + 2})
    assert ok == ("us-east-1a",)  # quiet long enough: back again
    _, blocked = eligible_zones("us-east-1b", ["us-east-1a", "us-east-1b"], {"us-east-1a": 0.5}, {"us-east-1a": LEFT_QUIET_H + 2})
    assert "refused 0.50 h ago" in blocked[0]  # left long ago but refused again since: not quiet


def test_a_spent_move_budget_stays_and_says_which_and_why():
    spent = make_failover().decide(obs(moves_in_window=MOVE_BUDGET))
    assert spent.choice == "wait" and spent.zone is None
    assert f"the move budget is spent ({MOVE_BUDGET} move(s) in the last {MOVE_WINDOW_H:g} h, at most {MOVE_BUDGET})" in spent.reason
    assert "the job's policy waits for spot: retry here in 0.50 h" in spent.reason
    paying = make_failover().decide(obs(moves_in_window=MOVE_BUDGET, in_place="on-demand"))
    assert paying.choice == "on-demand" and "pays on-demand rather than wait" in paying.reason
    assert make_failover().decide(obs(moves_in_window=MOVE_BUDGET - 1)).choice == "move"


def test_every_other_zone_excluded_goes_on_demand_when_a_wait_would_eat_the_deadline_slack():
    blocked = ("us-east-1a: left 1.00 h ago; back only after 6 h quiet",)
    tight = make_failover().decide(obs(candidates=(), blocked=blocked, slack_h=0.8, work_left_h=3.0))
    assert tight.choice == "on-demand" and "would eat the deadline's slack (0.80 h)" in tight.reason
    assert "us-east-1a: left 1.00 h ago" in tight.reason
    loose = make_failover().decide(obs(candidates=(), blocked=blocked, slack_h=5.0, work_left_h=3.0))
    assert loose.choice == "wait"
    assert make_failover().decide(obs(candidates=(), blocked=())).choice == "stay"  # no other zone at all


@given(moves=st.integers(0, 5), waited=st.floats(0, 10), slack=st.floats(0, 50), blocked=st.booleans(),
       in_place=st.sampled_from(["spot", "on-demand"]), candidates=st.booleans())
def test_no_move_past_the_budget_or_to_an_excluded_zone_and_every_stay_says_which(moves, waited, slack, blocked, in_place, candidates):
    o = obs(moves_in_window=moves, waited_h=waited, slack_h=slack, work_left_h=2.0, in_place=in_place,
            candidates=("us-east-1c",) if candidates else (), blocked=("us-east-1a: left 1.00 h ago",) if blocked else ())
    d = make_failover().decide(o)
    assert d.reason
    if d.choice == "move":
        assert moves < MOVE_BUDGET and d.zone == "us-east-1c"
    if moves >= MOVE_BUDGET and (candidates or blocked):
        assert d.choice in ("wait", "on-demand") and "the move budget is spent" in d.reason


# ---- (c) a regional job whose two replica zones both refuse, over two days ---------------------------------

REPLICAS = ["us-central1-a", "us-central1-b"]


def test_a_regional_job_between_two_refusing_zones_moves_at_most_the_budget_and_never_straight_back():
    """The watcher's decisions and the move core, with the act step's bookkeeping of each refusal
    (both zones always refuse) replayed on an injected clock: without the bounds the job moved
    back and forth once an hour (the old RECENT_REFUSAL_H); now twice a day at most, each return
    only after LEFT_QUIET_H quiet, and every other retry says why it stays."""
    job = Job.model_validate({"id": "train", "machine_type": "n1-standard-8", "zone": REPLICAS[0], "command": "t",
                              "state": "running", "attempt": 1, "diskReplicaZones": REPLICAS})
    failover = zone_failover(["us-central1-a", "us-central1-b", "us-central1-c"], lambda j, e: Capacity.SPOT)
    now, memory = T0, JobMemory(1, T0, 0, None, T0, {REPLICAS[0]: T0})  # attempt 1 refused in us-central1-a at T0
    moves: list[tuple[datetime, str]] = []
    stays: list[str] = []
    while now < T0 + timedelta(hours=48):
        action, _ = decide_job(job, [], memory, set(), now, failover)
        assert action is not None and action.kind in ("move", "retry-capacity"), action
        if action.kind == "move":
            change = next_step(job, action.zone, [], now)
            job = Job.model_validate(job.model_dump(by_alias=True, mode="json") | change.fields)
            moves.append((now, job.zone))
            memory = JobMemory(job.attempt, None, 0, None, None, memory.refused)
        else:
            stays.append(action.reason)
        # The zone refuses again (act's bookkeeping): the next try after the backoff's mean.
        tries = memory.tries + 1
        memory = JobMemory(job.attempt, now + mean_backoff(tries), tries, None, memory.refused_since or now,
                           {**memory.refused, job.zone: now})
        now = memory.next_try
    assert [z for _, z in moves] == ["us-central1-b", "us-central1-a", "us-central1-b", "us-central1-a"]
    for (t, _), (later, _) in zip(moves, moves[MOVE_BUDGET:], strict=False):
        assert later - t >= timedelta(hours=MOVE_WINDOW_H)  # never more than the budget in a window
    for (t, _), (back, _) in zip(moves, moves[1:], strict=False):
        assert back - t >= timedelta(hours=LEFT_QUIET_H)  # back only after the quiet time
    assert any("us-central1-a: left" in r and "back only after 6 h quiet" in r for r in stays)
    assert any("the move budget is spent (2 move(s) in the last 24 h" in r for r in stays)
    assert all("the job's policy waits for spot: retry here" in r for r in stays)


# ---- (a) with the fake pulumi: the move's target zone refuses too --------------------------------------------

refusing = _refusing  # test_failover's fixture, here too


@pytest.fixture
def stack(request, project: Path):
    """``test_failover``'s stack (attempt 3 preempted, a policy that always wants spot, mocked AWS for
    the snapshot pruning) without its past move: three zones, none left yet."""
    events = request.getfixturevalue("refusing")
    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text(re.sub(r"      zoneHistory: .*\n", "", path.read_text()))
    assert "zoneHistory" not in path.read_text() and "us-east-1c]" in path.read_text()
    request.getfixturevalue("pulumi_state").seed("team")
    return events


def drive(events: Path, records: list[dict], until, cycles: int = 40) -> datetime:
    """Run the watcher at each next try until ``until(records)``; returns the clock."""
    now = T0 + timedelta(minutes=1)
    for _ in range(cycles):
        run_watch(events, [now], records)
        if until(records):
            return now
        now = datetime.fromisoformat(records[-1]["next_try"]) if records[-1].get("next_try") else now + timedelta(minutes=1)
    raise AssertionError(f"never reached: {records[-3:]}")


def at_ups(log: Path, project: Path) -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(zone, move step or '-', attempt, held zones) of the job at every `pulumi up`."""
    out = []
    for text in (json.loads(line) for line in Path(str(log) + ".stackfiles").read_text().splitlines()):
        path = project / "snap" / "Pulumi.snap.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        j = stackfile.load(stackfile.resolve(None, path)).job("train")
        out.append((j.zone, j.move.step if j.move else "-", j.attempt, tuple(j.move.held) if j.move else ()))
    return out


def the_job() -> Job:
    return stackfile.load(stackfile.resolve("team", None)).job("train")


def unprotected(log: Path) -> list[str]:
    return sorted(c[2].split("::")[-1] for c in pulumi_calls(log) if c[:2] == ["state", "unprotect"])


def test_a_move_refused_in_its_target_zone_moves_on_to_a_third_zone_and_releases_both(stack, project, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_ZONE", "us-east-1a,us-east-1b")
    records: list[dict] = []
    now = drive(stack, records, lambda r: the_job().zone == "us-east-1c")
    on = records[-1]
    assert (on["action"], on["result"]) == ("move", "moving"), on
    assert "after a capacity refusal in us-east-1b, the zone the job is moving to" in on["reason"]
    assert "spot in us-east-1c" in on["reason"], on["reason"]
    assert on["detail"].endswith("(move step snapshot, move step restore, move step start)"), on["detail"]
    retried = [r for r in records if r.get("action") == "retry-capacity" and "zone the job is moving to" in r.get("reason", "")]
    assert retried and all(r["result"] == "waiting-for-capacity" for r in retried)  # it retried in us-east-1b first
    ups = [u for u in at_ups(fake_pulumi, project) if u[1] != "-"]
    moved_on = ups.index(("us-east-1b", "snapshot", 5, ("us-east-1a",)))
    assert ups[:3] == [("us-east-1a", "snapshot", 4, ()), ("us-east-1a", "restore", 4, ()), ("us-east-1b", "start", 5, ())]
    assert set(ups[3:moved_on]) == {("us-east-1b", "start", 5, ())}  # the start retried in us-east-1b, refused
    assert ups[moved_on:] == [("us-east-1b", "snapshot", 5, ("us-east-1a",)), ("us-east-1b", "restore", 5, ("us-east-1a",)),
                              ("us-east-1c", "start", 6, ("us-east-1a",))]
    # The update that moved on also targets the refused move's snapshot, which left the program (Pulumi
    # forgets it; the cloud keeps it: retain_on_delete) — and no disk.
    ups_calls = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    targeted = [[c[i + 1].split("::")[-1] for i, a in enumerate(c) if a == "--target"] for c in ups_calls]
    on_step = next(t for t in targeted if "job-train-n0-m2-snapshot" in t)
    assert "job-train-n0-m1-snapshot" in on_step and "job-train-n0-m1-volume" in on_step and "job-train-n0-volume" in on_step
    j = the_job()
    assert (j.attempt, j.move.step, j.move.from_, j.move.held) == (6, "start", "us-east-1b", ["us-east-1a"])
    assert [(z.zone, z.last_attempt) for z in j.zone_history] == [("us-east-1a", 4), ("us-east-1b", 5)]
    assert unprotected(fake_pulumi) == []  # every old disk stays protected until attempt 6 started
    from typer.testing import CliRunner

    from cli.app import app

    shown = CliRunner().invoke(app, ["status", "train", "--stack", "team"])
    assert "train: moving from us-east-1b to us-east-1c, step start written (the disks left in us-east-1a stay protected " \
           "until it started)" in " ".join(shown.stdout.split()), (shown.output, shown.exception)

    write_events(stack, (6, "started", (now - T0).total_seconds() / 60 + 5))
    run_watch(stack, [now + timedelta(minutes=10)], records)
    assert (records[-1]["action"], records[-1]["result"]) == ("move", "moved"), records[-1]
    assert unprotected(fake_pulumi) == ["job-train-n0-m1-volume", "job-train-n0-volume"]  # both left disks go
    j = the_job()
    assert (j.zone, j.attempt, j.move) == ("us-east-1c", 6, None)


def test_three_refusing_zones_spend_the_move_budget_then_wait_and_the_move_stays_resumable(stack, project, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_ZONE", "us-east-1a,us-east-1b,us-east-1c")
    records: list[dict] = []
    drive(stack, records, lambda r: "the move budget is spent" in r[-1].get("reason", ""), cycles=60)
    spent = records[-1]
    assert (spent["action"], spent["result"]) == ("retry-capacity", "waiting-for-capacity")
    assert "the move budget is spent (2 move(s) in the last 24 h, at most 2); the job's policy waits for spot" in spent["reason"]
    for _ in range(3):  # it keeps waiting in us-east-1c: no third move
        run_watch(stack, [datetime.fromisoformat(records[-1]["next_try"])], records)
        assert records[-1]["action"] == "retry-capacity" and "the move budget is spent" in records[-1]["reason"]
    moves = [u for u in at_ups(fake_pulumi, project) if u[1] == "snapshot"]
    assert [(z, held) for z, _, _, held in moves] == [("us-east-1a", ()), ("us-east-1b", ("us-east-1a",))]
    j = the_job()
    assert (j.zone, j.move.step, j.move.held, j.state.value) == ("us-east-1c", "start", ["us-east-1a"], "running")
    assert unprotected(fake_pulumi) == []

    # Capacity comes back in us-east-1c: the next retry starts there, then the move is released.
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_ZONE", "us-east-1a,us-east-1b")
    now = datetime.fromisoformat(records[-1]["next_try"])
    run_watch(stack, [now], records)
    assert (records[-1]["action"], records[-1]["result"]) == ("retry-capacity", "applied"), records[-1]
    write_events(stack, (j.attempt, "started", (now - T0).total_seconds() / 60 + 5))
    run_watch(stack, [now + timedelta(minutes=10)], records)
    assert (records[-1]["action"], records[-1]["result"]) == ("move", "moved"), records[-1]
    assert unprotected(fake_pulumi) == ["job-train-n0-m1-volume", "job-train-n0-volume"]


# ---- the decide step during a move whose start was refused ---------------------------------------------------


def moving_job(**over) -> Job:
    raw = {"id": "train", "instance_type": "p4d.24xlarge", "zone": "us-east-1b", "command": "t", "state": "running", "attempt": 5,
           "zoneHistory": [{"zone": "us-east-1a", "lastAttempt": 4, "moveBegan": T0.isoformat()}],
           "move": {"from": "us-east-1a", "to": "us-east-1b", "step": "start", "began": T0.isoformat()}}
    return Job.model_validate(raw | over)


@pytest.mark.parametrize("choice,kind,capacity,zone", [
    ("wait", "retry-capacity", "spot", None), ("on-demand", "retry-capacity", "on-demand", None),
    ("move", "move", None, "us-east-1c"), ("stay", "retry-capacity", None, None),
])
def test_a_refused_start_of_a_move_asks_the_failover_again(choice, kind, capacity, zone):
    from cli.policy.failover import FailoverDecision

    asked = []

    def failover(job, events, memory, now):
        asked.append(job.zone)
        return FailoverDecision(choice, f"because {choice}", zone)

    due = JobMemory(5, T0 + timedelta(minutes=5), 2, None, T0, {"us-east-1a": T0, "us-east-1b": T0})
    action, _ = decide_job(moving_job(), [], due, set(), T0 + timedelta(minutes=6), failover)
    assert asked == ["us-east-1b"] and (action.kind, action.capacity, action.zone) == (kind, capacity, zone)
    assert "after a capacity refusal in us-east-1b, the zone the job is moving to" in action.reason
    # Not due yet: nothing; no refusal, started: the move continues to its release, no failover asked.
    assert decide_job(moving_job(), [], due, set(), T0 + timedelta(minutes=1), failover)[0] is None
    from cli.lifecycle.events import Event
    from cli.watch.decide import seen

    started = [seen(Event("train", 5, 0, "started", T0 + timedelta(minutes=3)), "bucket")]
    action, _ = decide_job(moving_job(), started, JobMemory(), set(), T0 + timedelta(minutes=6), failover)
    assert action.kind == "move" and action.zone == "us-east-1b" and asked == ["us-east-1b"]
