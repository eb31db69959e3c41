"""`resume` follows the zone choice (every job's and pool's events in the stack's zones): when a move
pays it starts the next attempt there through the move steps (GCP regional disks: one step), after a
line with the move's time and expected cost; `--no-move` resumes in place and says the move command."""

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


def resume(stack: Path, events: Path, *extra: str) -> dict:
    result = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events),
                                      "--no-apply", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_resume_moves_the_job_where_spot_is_up_through_the_move_steps(tmp_path):
    stack, events = write(tmp_path)
    out = resume(stack, events)
    assert out["changed"] and not out["applied"] and not out["finished"]
    (step,) = out["steps"]  # --no-apply: the move's first step is written, nothing else
    assert step["fields"]["state"] == "stopped" and step["fields"]["move"]["to"] == "us-east-1b"
    assert step["reason"].startswith("move step snapshot")
    zone = out["zone"]
    assert (zone["from"], zone["to"], zone["move_hours"], zone["measured_moves"]) == ("us-east-1a", "us-east-1b", 1.0, 0)
    assert zone["how"] == "snapshot and restore of its disks"
    assert zone["expected_there_spot_hours"] < zone["expected_staying_spot_hours"]
    assert re.search(r"spot up for 6\.\d\d h", zone["reason"])  # (the clock runs on while the test does)
    text = stack.read_text()
    assert "state: stopped" in text and "step: snapshot" in text and "to: us-east-1b" in text and "attempt: 1\n" in text


def test_resume_again_leaves_the_move_it_began_to_spotctl_move(tmp_path):
    stack, events = write(tmp_path)
    resume(stack, events)
    before = stack.read_text()
    again = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events),
                                     "--no-apply", "--json"])
    assert again.exit_code == 1 and "`spotctl move train --to-zone us-east-1b` continues the move" in again.output
    assert stack.read_text() == before


def test_resume_no_move_resumes_in_place_and_says_the_move_command(tmp_path):
    stack, events = write(tmp_path)
    result = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events),
                                      "--no-apply", "--no-move", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["changed"] and out["fields"]["attempt"] == 2
    assert "zone: moves to us-east-1b (the move: 1.00 h)" in out["reason"], out["reason"]
    assert "--no-move keeps it here: `spotctl move train --to-zone us-east-1b` moves it" in out["reason"]
    text = stack.read_text()
    assert "zone: us-east-1a" in text and "attempt: 2" in text and "move:" not in text


def test_resume_stays_when_nothing_says_spot_is_up_elsewhere(tmp_path):
    stack, events = write(tmp_path, neighbour_zone="us-east-1a")
    out = resume(stack, events)
    assert out["fields"]["attempt"] == 2 and "zone" not in out["fields"]
    assert re.search(r"zone: stays in us-east-1a: spot down for 0\.\d\d h", out["reason"]), out["reason"]
    assert "spotctl move" not in out["reason"] and "zone: us-east-1a" in stack.read_text()


def test_a_pool_vm_preempted_in_the_other_zone_keeps_the_job_where_it_is(tmp_path):
    """The neighbour's spot VM in us-east-1b started 6 h ago; a pool VM of the same type was preempted
    there 10 minutes ago (its event carries its zone): spot is down there now, no paid move."""
    stack, events = write(tmp_path)
    stack.write_text(stack.read_text().replace("  spotctl:jobs:\n", "  spotctl:pools:\n    - name: gpus\n"
                                               "      instanceTypes: [p3.2xlarge]\n      spotMax: 4\n  spotctl:jobs:\n", 1))
    pool = [{"stack": "team", "kind": "pool", "job": "gpus", "attempt": 1, "node": 0, "event": event, "time": at(minutes),
             "instance": "i-0123456789abcdef0", "zone": "us-east-1b", "details": {}}
            for event, minutes in (("busy", 200), ("preempted", 10))]
    (events / "gpus.jsonl").write_text("\n".join(json.dumps(d) for d in pool) + "\n")
    out = resume(stack, events)
    assert out["fields"]["attempt"] == 2 and "zone" not in out["fields"], out
    assert "zone: stays in us-east-1a" in out["reason"], out["reason"]
    assert "state: running" in stack.read_text().split("- id: neighbour")[0]


def test_resume_of_a_job_kept_in_its_zone_says_nothing_about_zones(tmp_path):
    stack, events = write(tmp_path, extra="\n      moveOnCapacity: false")
    out = resume(stack, events)
    assert out["changed"] and "zone:" not in out["reason"]


def test_resume_text_preview_shows_the_move_its_time_and_its_expected_cost(tmp_path):
    stack, events = write(tmp_path)
    result = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events),
                                      "--no-apply"])
    assert result.exit_code == 0, result.output
    assert ("job train: zone us-east-1a -> us-east-1b (snapshot and restore of its disks): the move takes 1.00 h "
            "(none measured yet: assumed)") in " ".join(result.stdout.split())
    assert "spot-hours there, move included, against" in result.stdout
    assert f"written to {stack}" in result.stdout


def test_resume_without_yes_off_a_terminal_changes_nothing(tmp_path):
    stack, events = write(tmp_path)
    before = stack.read_text()
    result = CliRunner().invoke(app, ["resume", "train", "--stack-file", str(stack), "--events-dir", str(events)])
    assert result.exit_code == 1 and "pass --yes" in result.output
    assert stack.read_text() == before


GCP_STACK = """config:
  spotctl:cloud: gcp
  spotctl:project: demo-project
  spotctl:region: us-central1
  spotctl:zones: [us-central1-a, us-central1-b]
  spotctl:jobs:
    - id: train
      machineType: n1-standard-8
      zone: us-central1-a
      diskReplicaZones: [us-central1-a, us-central1-b]
      capacity: spot
      attempt: 1
      state: preempted
      jobHours: 20
      deadlineHours: 24
      command: python train.py
    - id: neighbour
      machineType: n1-standard-8
      zone: us-central1-b
      capacity: spot
      attempt: 1
      state: running
      command: python train.py
"""


def test_gcp_regional_disk_moves_in_one_step_force_attached(tmp_path):
    stack, events = write(tmp_path)
    stack.write_text(GCP_STACK)
    out = resume(stack, events)
    (step,) = out["steps"]
    assert step["fields"]["zone"] == "us-central1-b" and step["fields"]["attempt"] == 2
    assert step["fields"]["state"] == "running" and step["fields"]["zoneHistory"][-1]["sameDisk"] is True
    assert out["zone"]["how"] == "force-attach of its regional disk" and out["zone"]["move_hours"] == 0.0
    assert out["finished"]
    text = stack.read_text()
    assert "zone: us-central1-b" in text and "attempt: 2" in text and "move:" not in text


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


def test_a_job_that_never_ran_is_placed_for_free_in_its_first_launch(tmp_path):
    stack, events = write(tmp_path)
    text = stack.read_text().replace("      attempt: 1\n      state: preempted\n", "      attempt: 1\n      state: pending\n", 1)
    stack.write_text(text)
    (events / "train.jsonl").write_text("")
    out = resume(stack, events)
    assert out["fields"] == {"state": "running", "zone": "us-east-1b"}, out
    assert "zone: moves to us-east-1b (the move: free (the disk is empty))" in out["reason"], out["reason"]
    assert "zone: us-east-1b" in stack.read_text().split("- id: neighbour")[0]


def test_a_file_spotctl_indexed_still_gives_every_job_events_to_the_zone_choice(tmp_path):
    stack, events = write(tmp_path)
    first = resume(stack, events, "--no-move")  # spotctl writes the file: from now on one job's lines are read alone
    assert first["fields"]["attempt"] == 2
    with (events / "train.jsonl").open("a") as fh:
        for event, minutes in (("started", 4), ("preempted", 2)):
            fh.write(json.dumps({"job": "train", "attempt": 2, "node": 0, "event": event, "time": at(minutes),
                                 "details": {"capacity": "spot"} if event == "started" else {}}) + "\n")
    again = resume(stack, events, "--no-move")
    assert again["fields"]["attempt"] == 3
    assert "zone: moves to us-east-1b" in again["reason"] and re.search(r"spot up for 6\.\d\d h", again["reason"])


def test_resume_weighs_the_watchers_capacity_refusals_and_leaves_its_journal_alone(tmp_path):
    from cli.watch.journal import Journal, holder_path, journal_path

    stack, events = write(tmp_path)
    journal = Journal.load(stack)  # the watcher refused a launch in us-east-1b 10 minutes ago (any job of the type)
    journal.job("neighbour").update({"status": "waiting-for-capacity", "refused": {"us-east-1b": at(10)}})
    journal.save(datetime.now(UTC))
    before = journal_path(stack).read_bytes()
    out = resume(stack, events)
    assert out["fields"]["attempt"] == 2 and "zone" not in out["fields"]  # no move to a zone that just refused
    assert re.search(r"zone: stays in us-east-1a: spot down for 0\.\d\d h", out["reason"]), out["reason"]
    assert "zone: us-east-1a" in stack.read_text() and "move:" not in stack.read_text()
    assert journal_path(stack).read_bytes() == before  # read only: not rewritten, and no lease taken
    assert not holder_path(stack).exists() and not journal_path(stack).with_suffix(".json.bad").exists()


def test_a_journal_resume_cannot_trust_says_nothing_and_stays_where_it_is(tmp_path):
    from cli.watch.journal import journal_path

    stack, events = write(tmp_path)
    forged = json.dumps({"jobs": {"neighbour": {"refused": {"us-east-1b": at(10)}}}, "handled": {}})
    journal_path(stack).write_text(forged)  # (not sealed by this user's spotctl: a commit can carry it)
    out = resume(stack, events)
    assert out["steps"][0]["fields"]["move"]["to"] == "us-east-1b"  # the refusal it claims is not taken
    assert journal_path(stack).read_text() == forged  # and the file is left where it is, as it is
