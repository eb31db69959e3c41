"""`resume`'s preview says where the zone choice would run the job, from every job's events in the
stack's zones, and why; the stack file is changed only by the resume itself (a move is `spotctl move`)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from cli.app import app
from cli.lifecycle.events import Event
from cli.lifecycle.zonechoice import zone_stats
from infra.config import Job

STACK = """config:
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b]
  spotctl:jobs:
    - id: train
      instanceType: p3.2xlarge
      zone: us-east-1a
      capacity: spot
      attempt: 1
      state: preempted
      jobHours: 20
      deadlineHours: 24{extra}
      command: python train.py
    - id: neighbour
      instanceType: p3.2xlarge
      zone: {neighbour_zone}
      capacity: spot
      attempt: 1
      state: running
      command: python train.py
"""


def at(minutes_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")


def write(tmp_path: Path, neighbour_zone: str = "us-east-1b", extra: str = "") -> tuple[Path, Path]:
    stack = tmp_path / "stacks" / "Pulumi.team.yaml"
    stack.parent.mkdir(parents=True)
    stack.write_text(STACK.format(neighbour_zone=neighbour_zone, extra=extra))
    events = tmp_path / "events"
    events.mkdir()
    train = [  # 3 h of spot in us-east-1a, preempted 5 minutes ago
        {"job": "train", "attempt": 1, "node": 0, "event": "started", "time": at(185), "details": {"capacity": "spot"}},
        {"job": "train", "attempt": 1, "node": 0, "event": "progress", "time": at(180), "details": {}},
        {"job": "train", "attempt": 1, "node": 0, "event": "preempted", "time": at(5), "details": {}},
    ]
    neighbour = [  # spot up in its zone for 6 h, still running
        {"job": "neighbour", "attempt": 1, "node": 0, "event": "started", "time": at(360), "details": {"capacity": "spot"}},
    ]
    (events / "train.jsonl").write_text("\n".join(json.dumps(d) for d in train) + "\n")
    (events / "neighbour.jsonl").write_text("\n".join(json.dumps(d) for d in neighbour) + "\n")
    return stack, events


def resume(stack: Path, events: Path) -> dict:
    result = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events),
                                      "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_resume_preview_names_the_zone_where_spot_is_up_and_the_move_command(tmp_path):
    stack, events = write(tmp_path)
    out = resume(stack, events)
    assert out["changed"] and out["fields"]["attempt"] == 2
    assert "zone: moves to us-east-1b (the move: 1.00 h)" in out["reason"], out["reason"]
    assert re.search(r"spot up for 6\.\d\d h", out["reason"])  # (the clock runs on while the test does)
    assert "staying in us-east-1a is expected to cost" in out["reason"]
    assert "`spotctl move train --to-zone us-east-1b` moves it" in out["reason"]
    text = stack.read_text()
    assert "zone: us-east-1a" in text and "attempt: 2" in text  # the resume itself, in place: the move is said, not made


def test_resume_stays_when_nothing_says_spot_is_up_elsewhere(tmp_path):
    stack, events = write(tmp_path, neighbour_zone="us-east-1a")
    out = resume(stack, events)
    assert re.search(r"zone: stays in us-east-1a: spot down for 0\.\d\d h", out["reason"]), out["reason"]
    assert "spotctl move" not in out["reason"]


def test_resume_of_a_job_kept_in_its_zone_says_nothing_about_zones(tmp_path):
    stack, events = write(tmp_path, extra="\n      moveOnCapacity: false")
    out = resume(stack, events)
    assert out["changed"] and "zone:" not in out["reason"]


def test_resume_text_preview_shows_the_zone_line(tmp_path):
    stack, events = write(tmp_path)
    result = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events),
                                      "--no-apply"])
    assert result.exit_code == 0, result.output
    assert "zone: moves to us-east-1b" in result.stdout


def test_zone_stats_count_every_job_windows_in_the_zone_they_ran_in():
    now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    a = Job.model_validate({"id": "a", "instanceType": "p3.2xlarge", "zone": "us-east-1a", "command": "x", "state": "running",
                            "attempt": 2, "zoneHistory": [{"zone": "us-east-1b", "lastAttempt": 1}]})
    ev = [Event("a", 1, 0, "started", now - timedelta(hours=5), {"capacity": "spot"}),
          Event("a", 1, 0, "preempted", now - timedelta(hours=3), {}),
          Event("a", 2, 0, "started", now - timedelta(hours=1), {"capacity": "spot"})]
    z1, z2 = zone_stats([a], {"a": ev}, "p3.2xlarge", ["us-east-1a", "us-east-1b"], now)
    assert z2.up_h == (2.0,) and z2.now is None  # preempted 3 h ago: no longer news of now
    assert z1.now is True and z1.age_h == 1.0 and z1.open_up_h == (1.0,)
    other = zone_stats([a], {"a": ev}, "g5.xlarge", ["us-east-1a", "us-east-1b"], now)
    assert all(z.now is None and not z.up_h for z in other)  # another machine type's spot says nothing


def trace_file(path: Path, gap: int, data: list[int]) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def test_simulate_zones_replays_the_zone_choice_against_staying(tmp_path):
    dead = trace_file(tmp_path / "a.json", 600, [1] * 3 + [0] * 400)  # zone a loses spot for good
    alive = trace_file(tmp_path / "b.json", 600, [1] * 403)
    result = CliRunner().invoke(app, ["simulate", "--zones", "--trace", str(dead), "--trace", str(alive), "--policy",
                                      "uniform-progress", "--job-hours", "20", "--deadline-hours", "30", "--starts", "3",
                                      "--move-hours", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = {r["knowledge"]: r for r in doc["results"]}
    assert doc["zones"] == ["a", "b"] and doc["move_hours"] == 0.5
    assert rows["probe"]["mean_norm_cost"] < rows["stay"]["mean_norm_cost"] and rows["stay"]["moves"] == 0
    assert all(r["misses"] == 0 and r["runs"] == 3 for r in rows.values())
    text = CliRunner().invoke(app, ["simulate", "--zones", "--trace", str(dead), "--trace", str(alive), "--policy",
                                    "greedy", "--job-hours", "20", "--deadline-hours", "30", "--starts", "2"])
    assert text.exit_code == 0 and "greedy               probe" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 80


def test_simulate_zones_refuses_one_trace_or_traces_of_different_ticks(tmp_path):
    a = trace_file(tmp_path / "a.json", 600, [1] * 400)
    b = trace_file(tmp_path / "b.json", 300, [1] * 400)
    one = CliRunner().invoke(app, ["simulate", "--zones", "--trace", str(a)])
    assert one.exit_code == 1 and "--zones needs at least two --trace files" in one.output
    odd = CliRunner().invoke(app, ["simulate", "--zones", "--trace", str(a), "--trace", str(b), "--job-hours", "10",
                                   "--deadline-hours", "12"])
    assert odd.exit_code == 1 and "--zones: b: a tick of 300 s, not 600 s like a: not aligned" in odd.output


def test_a_job_that_never_ran_is_placed_for_free_and_told_to_edit_its_zone(tmp_path):
    stack, events = write(tmp_path)
    text = stack.read_text().replace("      attempt: 1\n      state: preempted\n", "      attempt: 1\n      state: pending\n", 1)
    stack.write_text(text)
    (events / "train.jsonl").write_text("")
    out = resume(stack, events)
    assert "zone: moves to us-east-1b (the move: free (the disk is empty))" in out["reason"], out["reason"]
    assert "set the job's `zone: us-east-1b` in the stack file before it starts" in out["reason"]
    assert "zone: us-east-1a" in stack.read_text()


def test_a_file_spotctl_indexed_still_gives_every_job_events_to_the_zone_choice(tmp_path):
    stack, events = write(tmp_path)
    first = resume(stack, events)  # spotctl writes the file: from now on one job's lines are read alone
    assert first["fields"]["attempt"] == 2
    with (events / "train.jsonl").open("a") as fh:
        for event, minutes in (("started", 4), ("preempted", 2)):
            fh.write(json.dumps({"job": "train", "attempt": 2, "node": 0, "event": event, "time": at(minutes),
                                 "details": {"capacity": "spot"} if event == "started" else {}}) + "\n")
    again = resume(stack, events)
    assert again["fields"]["attempt"] == 3
    assert "zone: moves to us-east-1b" in again["reason"] and re.search(r"spot up for 6\.\d\d h", again["reason"])
