"""`resume --yes` following the zone choice on the example GCP stack under the fake pulumi: the
move's steps are applied one targeted update each (snapshot, restore, start there on spot), and the
old disks wait for the new attempt's `started` (the move machinery's rule)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from cli.app import app
from cli.lifecycle import stackfile
from tests.test_move import steps_applied

NEIGHBOUR = """    - id: h100-probe
      machineType: a3-highgpu-8g
      accelerator: {type: nvidia-h100-80gb, count: 8}
      zone: us-central1-b
      capacity: spot
      attempt: 1
      state: running
      command: python3 -c pass
"""


def at(minutes_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")


def setup(project, pulumi_state):
    """example-gcp with an H100 spot VM up for 6 h in us-central1-b and llm-pretrain preempted in
    us-central1-a 5 minutes ago, with little slack; returns the events dir."""
    pulumi_state.seed("example-gcp")
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text().replace("  spotctl:jobs:\n", "  spotctl:jobs:\n" + NEIGHBOUR, 1)
    path.write_text(text.replace("      deadlineHours: 96\n", "      deadlineHours: 68\n", 1))  # little slack: waiting costs
    events = project / "events"
    events.mkdir()
    docs = [{"job": "llm-pretrain", "attempt": 1, "node": r, "event": e, "time": at(m), "details": {"capacity": "spot"}}
            for r in (0, 1) for e, m in (("started", 185), ("preempted", 5))]
    docs.append({"job": "h100-probe", "attempt": 1, "node": 0, "event": "started", "time": at(360), "details": {"capacity": "spot"}})
    (events / "all.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return events


def test_resume_yes_applies_the_move_steps_to_the_zone_where_spot_is_up(project, runner, fake_pulumi, pulumi_state, gce):
    events = setup(project, pulumi_state)
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--events-dir", str(events), "--yes",
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["applied"] and not out["finished"] and out["zone"]["to"] == "us-central1-b"
    assert [s["reason"].split(":")[0] for s in out["steps"]] == ["move step snapshot", "move step restore", "move step start"]
    assert "waiting for attempt 2 to start in us-central1-b" in out["waiting"]
    assert steps_applied(fake_pulumi, project) == [(None, "us-central1-a", 1),  # the VMs stopped before the snapshot
                                                   ("snapshot", "us-central1-a", 1), ("restore", "us-central1-a", 1),
                                                   ("start", "us-central1-b", 2)]
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.zone, job.attempt, job.state.value, job.capacity.value, job.move.step) == (
        "us-central1-b", 2, "running", "spot", "start")


def test_resume_preview_only_shows_the_move_and_changes_nothing(project, runner, fake_pulumi, pulumi_state, gce):
    events = setup(project, pulumi_state)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--events-dir", str(events),
                                 "--preview-only"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    assert "job llm-pretrain: zone us-central1-a -> us-central1-b (snapshot and restore of its disks)" in out
    assert "spot $101.22/h, on-demand $176.98/h" in out and "not confirmed: the move stops here" in out
    assert path.read_text() == before
