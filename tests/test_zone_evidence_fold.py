"""The zone choice's evidence folded once per job (``cli.lifecycle.attemptfold``) is the evidence the
straightforward reading gives: per zone, ``measure`` over the job's attempts there and a timeline of
its spot attempts, on random histories (ties in time, several nodes, moot stops, moves, machine types)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.lifecycle.capacity import _hours, attempt_pools, measure
from cli.lifecycle.events import Event, Timeline
from cli.lifecycle.zonechoice import FRESH_H, zone_stats
from infra.config import Job

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
KINDS = ("started", "started", "progress", "checkpoint", "preempted", "stopped", "failed", "completed",
         "preemption-notice", "busy")


def straightforward(jobs, events_of, machine, now):
    """The evidence as read before the fold: per job and zone, ``measure`` and a second timeline."""
    windows = {z: [] for z in ZONES}
    censored = {z: [] for z in ZONES}
    latest = {}
    for job in jobs:
        events = job.mine(list(events_of.get(job.id, [])))
        by_zone: dict[str, set[int]] = {}
        for attempt, pool in attempt_pools(job, events).items():
            zone, _, kind = pool.partition("/")
            if kind == machine and zone in windows:
                by_zone.setdefault(zone, set()).add(attempt)
        for zone, attempts in by_zone.items():
            m = measure(events, now, attempts=attempts)
            windows[zone] += m.windows_h
            censored[zone] += m.censored_h
            spot = {e.attempt for e in events if e.event == "started" and e.details.get("capacity") == "spot"}
            for begun, ended, how in Timeline.of([e for e in events if e.attempt in attempts & spot], now).runs:
                seen = (begun, True, _hours(begun, now)) if how == "running" else (
                    (ended, False, _hours(ended, now)) if how == "preempted" and _hours(ended, now) < FRESH_H else None)
                if seen is not None and (zone not in latest or seen[0] > latest[zone][0]):
                    latest[zone] = seen
    return [(tuple(windows[z]), tuple(censored[z]), latest.get(z, (None, None, 0.0))[1:]) for z in ZONES]


event = st.builds(
    lambda attempt, node, kind, minutes, cap, machine: Event(
        "j", attempt, node, kind, NOW - timedelta(minutes=minutes),
        {k: v for k, v in (("capacity", cap), ("machineType", machine)) if v} if kind == "started" else {}),
    st.integers(1, 6), st.integers(0, 1), st.sampled_from(KINDS), st.sampled_from([0, 5, 30, 50, 90, 200, 600]),
    st.sampled_from(["", "spot", "spot", "on-demand"]), st.sampled_from(["", "", "p3.2xlarge", "g5.xlarge"]))
job_spec = st.tuples(st.sampled_from(ZONES), st.lists(st.tuples(st.sampled_from(ZONES), st.integers(1, 5)), max_size=2),
                     st.lists(event, max_size=30))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(job_spec, min_size=1, max_size=3))
def test_the_folded_evidence_is_the_straightforward_one(specs):
    jobs, events_of = [], {}
    for i, (zone, stays, events) in enumerate(specs):
        doc = {"id": f"j{i}", "instanceType": "p3.2xlarge", "zone": zone, "command": "x",
               "zoneHistory": [{"zone": z, "lastAttempt": a} for z, a in stays]}
        job = Job.model_validate(doc)
        jobs.append(job)
        events_of[job.id] = [Event(job.id, e.attempt, e.node, e.event, e.time, e.details) for e in events]
    for machine in ("p3.2xlarge", "g5.xlarge"):
        got = [(z.up_h, z.open_up_h, (z.now, z.age_h)) for z in zone_stats(jobs, events_of, machine, ZONES, NOW)]
        assert got == straightforward(jobs, events_of, machine, NOW)
