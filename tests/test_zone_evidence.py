"""What the zone choice takes as evidence of other zones besides the jobs' events: the pools' VM
preemptions (by the zone each VM's events carry) and the learned file's history of jobs whose
events are no longer read; and a pool event's zone survives the bucket cache."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from cli.lifecycle.events import Event
from cli.lifecycle.eventstore import _columns, _event
from cli.lifecycle.zonechoice import zone_stats
from infra.config import Job, Pool

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
ZONES = ["us-east-1a", "us-east-1b"]


def pool_event(event: str, hours_ago: float, instance: str, zone: str) -> Event:
    return Event("gpus", 1, 0, event, NOW - timedelta(hours=hours_ago), {}, zone, instance)


def test_a_pool_vm_preempted_is_a_window_and_spot_down_now_in_its_zone():
    pool = Pool.model_validate({"name": "gpus", "instanceTypes": ["p3.2xlarge"], "spotMax": 2})
    events = {"gpus": [pool_event("busy", 4.0, "i-1", "us-east-1b"), pool_event("preempted", 0.5, "i-1", "us-east-1b"),
                       pool_event("busy", 9.0, "i-2", "us-east-1a"), pool_event("preempted", 6.0, "i-2", "us-east-1a"),
                       pool_event("busy", 1.0, "i-3", "us-east-1a")]}  # (i-3 runs: maybe the on-demand base)
    a, b = zone_stats([], events, "p3.2xlarge", ZONES, NOW, [pool])
    assert b.up_h == (3.5,) and b.now is False and b.age_h == 0.5
    assert a.up_h == (3.0,) and a.now is None  # preempted 6 h ago: no news of now; the running VM says nothing
    other = zone_stats([], events, "g5.xlarge", ZONES, NOW, [pool])
    assert all(not z.up_h and z.now is None for z in other)  # a pool of other types says nothing of this one


def test_the_learned_history_adds_the_windows_of_jobs_no_longer_read():
    job = Job.model_validate({"id": "now", "instanceType": "p3.2xlarge", "zone": "us-east-1a", "command": "x"})
    learned = {"pools": {"us-east-1b/p3.2xlarge": {"jobs": {"gone": {"windows_h": [5.0, 7.0], "censored_h": [2.0]},
                                                            "now": {"windows_h": [1.0]}}},
                         "us-east-1b/g5.xlarge": {"jobs": {"other": {"windows_h": [9.0]}}}}}
    a, b = zone_stats([job], {"now": []}, "p3.2xlarge", ZONES, NOW, (), learned)
    assert b.up_h == (5.0, 7.0) and b.open_up_h == (2.0,)  # the read job's own windows come from its events
    assert not a.up_h


def test_an_event_zone_and_instance_survive_the_bucket_cache_and_old_rows_still_read():
    e = pool_event("preempted", 1.0, "i-1", "us-east-1b")
    back = _event(*_columns(e))
    assert (back.zone, back.instance, back.event, back.time) == ("us-east-1b", "i-1", "preempted", e.time)
    old = _event("train", 1, 0, "started", NOW.isoformat(), json.dumps({"capacity": "spot"}))
    assert old.details == {"capacity": "spot"} and old.zone == ""
    parsed = Event.parse({"job": "gpus", "attempt": 1, "event": "preempted", "time": "2026-11-28T11:00:00Z",
                          "zone": "us-east-1b", "instance": "i-1"})
    assert parsed.zone == "us-east-1b" and parsed == Event("gpus", 1, 0, "preempted", parsed.time, {})


def test_a_capacity_refusal_says_spot_is_down_in_its_zone_for_a_while():
    refused = [("p3.2xlarge", "us-east-1b", NOW - timedelta(minutes=20)), ("p3.2xlarge", "us-east-1a", NOW - timedelta(hours=3)),
               ("g5.xlarge", "us-east-1a", NOW - timedelta(minutes=5))]
    a, b = zone_stats([], {}, "p3.2xlarge", ZONES, NOW, refused=refused)
    assert b.now is False and round(b.age_h, 3) == 0.333
    assert a.now is None  # an old refusal, and another machine type's, say nothing of now
