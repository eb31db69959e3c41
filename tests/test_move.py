"""``spotctl move``: the program at each step of a zone move (both clouds, under Pulumi's mocks), the
pure step decisions, the stack-file edits, and moves applied and resumed against the fake `pulumi`."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.events import Event
from cli.lifecycle.move import next_step
from cli.lifecycle.states import LifecycleError, may_delete_disks
from cli.plan import mocks as planner
from infra.config import ConfigError, Job, validate
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, data_labels, gcp_job, pulumi_calls, stack_config

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)
MOVE = {"from": "us-central1-a", "to": "us-central1-b"}
HISTORY = [{"zone": "us-central1-a", "lastAttempt": 1}]
# The job's fields at each step, as `spotctl move` writes them (checked against next_step below).
GCP_STEPS = {
    "snapshot": {"state": "stopped", "move": MOVE | {"step": "snapshot"}},
    "restore": {"state": "stopped", "move": MOVE | {"step": "restore"}},
    "start": {"state": "running", "zone": "us-central1-b", "attempt": 2, "zoneHistory": HISTORY, "move": MOVE | {"step": "start"}},
    "release": {"state": "running", "zone": "us-central1-b", "attempt": 2, "zoneHistory": HISTORY, "move": MOVE | {"step": "release"}},
}


def gcp_plan(step: str | None, nodes: int = 1):
    fields = GCP_STEPS[step] if step else {"state": "running"}
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(nodes=nodes, **fields)]), "test")
    return planner.run(cfg, "team")


def job_resources(plan, kind: str):
    return {r.name: r for r in plan.resources if r.type.endswith(kind) and r.name.startswith("job-train")}


# ---- the program at each step ----------------------------------------------------------------------


def test_gcp_plan_at_each_step_of_a_move():
    before = job_resources(gcp_plan(None), "Disk")
    assert list(before) == ["job-train-n0-disk"]

    snap = gcp_plan("snapshot")
    assert not job_resources(snap, "Instance")  # no VM writes to the disk while it is snapshotted
    (s,) = job_resources(snap, "Snapshot").values()
    assert s.inputs["zone"] == "us-central1-a" and s.inputs["sourceDisk"] == "team-train-n0-disk"
    assert any(d.endswith("::job-train-n0-disk") for d in s.dependencies)
    assert list(job_resources(snap, "Disk")) == ["job-train-n0-disk"]

    restore = job_resources(gcp_plan("restore"), "Disk")
    old, new = restore["job-train-n0-disk"], restore["job-train-n0-m1-disk"]
    assert (old.inputs["zone"], new.inputs["zone"]) == ("us-central1-a", "us-central1-b")  # both zones
    assert old.protect and new.protect
    assert new.inputs["name"] == "team-train-n0-m1-disk" and new.inputs["snapshot"].endswith("/snapshots/team-train-n0-m1-snap")
    assert any(d.endswith("::job-train-n0-m1-snapshot") for d in new.dependencies)  # restored after the snapshot

    start = gcp_plan("start")
    disks = job_resources(start, "Disk")
    assert disks["job-train-n0-disk"].protect  # kept until the new attempt has started
    (vm,) = job_resources(start, "Instance").values()
    assert vm.inputs["zone"] == "us-central1-b" and vm.inputs["name"] == "team-train-a2-n0"
    assert "team-train-n0-m1-disk" in json.dumps(vm.inputs["attachedDisks"])  # the restored disk
    assert any(d.endswith("::job-train-n0-m1-disk") for d in vm.dependencies)

    release = gcp_plan("release")
    disks = job_resources(release, "Disk")
    assert list(disks) == ["job-train-n0-m1-disk"]  # the old disk is gone from the program
    assert not job_resources(release, "Snapshot")  # retained in the cloud (retain_on_delete), not deleted
    assert "snapshot" not in disks["job-train-n0-m1-disk"].inputs  # ignore_changes keeps it: no replacement
    assert disks["job-train-n0-m1-disk"].protect


def test_aws_move_restores_volumes_in_the_new_az_and_moves_the_master_eni():
    aws_move = {"from": "us-east-1a", "to": "us-east-1b"}
    history = [{"zone": "us-east-1a", "lastAttempt": 1}]

    def plan(fields):
        cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(nodes=2, **fields)]), "test")
        return planner.run(cfg, "team")

    restore = plan({"state": "stopped", "move": aws_move | {"step": "restore"}})
    vols = job_resources(restore, "Volume")
    assert vols["job-train-n1-m1-volume"].inputs["availabilityZone"] == "us-east-1b"
    assert vols["job-train-n1-m1-volume"].inputs["encrypted"] is True
    assert vols["job-train-n1-volume"].inputs["availabilityZone"] == "us-east-1a"
    snaps = job_resources(restore, "Snapshot")
    assert set(snaps) == {"job-train-n0-m1-snapshot", "job-train-n1-m1-snapshot"}
    assert vols["job-train-n1-m1-volume"].inputs["snapshotId"]
    before_eni = job_resources(plan({"state": "running"}), "NetworkInterface")["job-train-master-eni"]
    start = plan({"state": "running", "zone": "us-east-1b", "attempt": 2, "zoneHistory": history, "move": aws_move | {"step": "start"}})
    eni = job_resources(start, "NetworkInterface")["job-train-master-eni"]
    assert eni.inputs["subnetId"] != before_eni.inputs["subnetId"]  # a new ENI in the new AZ's subnet
    assert {r.inputs["availabilityZone"] for r in job_resources(start, ":Instance").values()} == {"us-east-1b"}
    release = plan({"state": "running", "zone": "us-east-1b", "attempt": 2, "zoneHistory": history, "move": aws_move | {"step": "release"}})
    assert set(job_resources(release, "Volume")) == {"job-train-n0-m1-volume", "job-train-n1-m1-volume"}


# ---- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields,message", [
    ({"move": MOVE | {"to": "us-central1-z", "step": "snapshot"}, "state": "stopped"}, "spotctl:jobs[0].move.to: expected one of"),
    ({"move": MOVE | {"step": "snapshot"}, "state": "completed"}, "jobs[0].move: a completed job cannot move"),
    ({"move": MOVE | {"step": "start"}, "state": "running"}, "jobs[0].zone: is 'us-central1-a' but the move's step 'start'"),
    ({"move": MOVE | {"step": "bogus"}}, "jobs[0].move.step"),
    ({"move": MOVE | {"step": "snapshot", "held": ["us-central1-c"]}, "state": "stopped"}, "jobs[0].move.held: names 1 zone(s)"),
])
def test_bad_move_records_are_refused_with_their_key(fields, message):
    with pytest.raises(ConfigError) as exc:
        validate(stack_config(GCP_BASE, jobs=[gcp_job(**fields)]), "Pulumi.t.yaml")
    assert message in str(exc.value)


# ---- decisions -------------------------------------------------------------------------------------


def as_job(**fields) -> Job:
    raw = {"id": "train", "machine_type": "a2-highgpu-1g", "zone": "us-central1-a", "command": "python t.py", "state": "running"}
    return Job.model_validate(raw | fields)


def test_next_step_walks_the_steps_and_waits_for_started():
    job = as_job()
    seen = []
    for _ in range(5):
        change = next_step(job, "us-central1-b", [])
        if change.noop:
            break
        seen.append(change.fields.get("move", {}) and change.fields["move"]["step"])
        job = Job.model_validate(job.model_dump(by_alias=True) | change.fields)
    assert seen == ["snapshot", "restore", "start"]
    assert "waiting for attempt 2 to start in us-central1-b" in change.reason
    assert next_step(job, "us-central1-b", [Event("train", 1, 0, "started", T0)]).noop  # an old attempt does not count
    release = next_step(job, "us-central1-b", [Event("train", 2, 0, "started", T0)])
    assert release.fields == {"move": MOVE | {"step": "release", "attempt": 1}}  # the attempt its snapshots hold


def test_a_gang_releases_only_when_every_node_started():
    job = as_job(nodes=2, **GCP_STEPS["start"])
    assert next_step(job, "us-central1-b", [Event("train", 2, 0, "started", T0)]).noop
    both = [Event("train", 2, r, "started", T0 + timedelta(seconds=r)) for r in (0, 1)]
    assert not next_step(job, "us-central1-b", both).noop


def test_a_move_whose_attempt_never_started_moves_on_and_holds_the_disks_it_left():
    job = as_job(**GCP_STEPS["start"])
    on = next_step(job, "us-central1-c", [], T0)
    assert on.fields == {"state": "stopped", "move": {"from": "us-central1-b", "to": "us-central1-c", "step": "snapshot",
                                                      "held": ["us-central1-a"], "began": "2026-11-22T04:00:00Z",
                                                      "attempt": 2}}
    assert "attempt 2 never started in us-central1-b; moving on to us-central1-c" in on.reason
    with pytest.raises(LifecycleError, match="its new attempt started there"):
        next_step(job, "us-central1-c", [Event("train", 2, 0, "started", T0)])


def test_the_plan_of_a_move_that_moved_on_keeps_every_left_disk_until_its_release():
    held = {"from": "us-central1-b", "to": "us-central1-c", "held": ["us-central1-a"]}
    history = HISTORY + [{"zone": "us-central1-b", "lastAttempt": 2}]

    def plan(fields):
        cfg = validate(stack_config(GCP_BASE | {"zones": ["us-central1-a", "us-central1-b", "us-central1-c"]},
                                    jobs=[gcp_job(**fields)]), "test")
        return job_resources(planner.run(cfg, "team"), "Disk")

    snap = plan({"state": "stopped", "zone": "us-central1-b", "attempt": 2, "zoneHistory": HISTORY, "move": held | {"step": "snapshot"}})
    assert {n: (d.inputs["zone"], d.protect) for n, d in snap.items()} == {
        "job-train-n0-disk": ("us-central1-a", True), "job-train-n0-m1-disk": ("us-central1-b", True)}
    start = plan({"state": "running", "zone": "us-central1-c", "attempt": 3, "zoneHistory": history, "move": held | {"step": "start"}})
    assert {n: d.inputs["zone"] for n, d in start.items()} == {
        "job-train-n0-disk": "us-central1-a", "job-train-n0-m1-disk": "us-central1-b", "job-train-n0-m2-disk": "us-central1-c"}
    assert all(d.protect for d in start.values())
    release = plan({"state": "running", "zone": "us-central1-c", "attempt": 3, "zoneHistory": history, "move": held | {"step": "release"}})
    assert list(release) == ["job-train-n0-m2-disk"]


def test_what_cannot_move():
    with pytest.raises(LifecycleError, match="is completed"):
        next_step(as_job(state="completed"), "us-central1-b", [])
    with pytest.raises(LifecycleError, match="failed"):
        next_step(as_job(state="failed"), "us-central1-b", [])
    with pytest.raises(LifecycleError, match="is moving to us-central1-b"):
        next_step(as_job(**GCP_STEPS["restore"]), "us-central1-c", [])
    assert next_step(as_job(), "us-central1-a", []).noop


def test_old_disks_go_only_with_the_ownership_label():
    job = as_job(**GCP_STEPS["release"])
    assert may_delete_disks(job, force=False, owned=True, moved_and_started=True)[0]
    assert not may_delete_disks(job, force=False, owned=False, moved_and_started=True)[0]
    assert not may_delete_disks(job, force=False, owned=True)[0]  # a running job's disk, no move: kept


# ---- the command, against the fake pulumi ------------------------------------------------------------


def started(project: Path, attempt: int, nodes: int = 2) -> Path:
    d = project / "events"
    d.mkdir(exist_ok=True)
    (d / f"a{attempt}.jsonl").write_text("".join(
        json.dumps({"job": "llm-pretrain", "attempt": attempt, "node": r, "event": "started", "time": f"2026-11-22T04:0{r}:00Z"}) + "\n"
        for r in range(nodes)))
    return d


def jobs_at_ups(log: Path, project: Path, job_id: str = "llm-pretrain") -> list[Job]:
    """The job as the stack file had it at every `pulumi up`."""
    out = []
    for text in (json.loads(line) for line in Path(str(log) + ".stackfiles").read_text().splitlines()):
        path = project / "snap" / "Pulumi.snap.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        out.append(stackfile.load(stackfile.resolve(None, path)).job(job_id))
    return out


def steps_applied(log: Path, project: Path) -> list[tuple[str | None, str, int]]:
    """(move step, zone, attempt) of the stack file at every `pulumi up`."""
    return [(j.move.step if j.move else None, j.zone, j.attempt) for j in jobs_at_ups(log, project)]


MOVE_ARGS = ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes"]


def test_move_applies_each_step_then_releases_after_started(project, runner, fake_pulumi, pulumi_state, gce):
    pulumi_state.seed("example-gcp")  # Pulumi's state (the release targets only what it holds)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    original = path.read_text()
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events-none")])
    assert result.exit_code == 1 and "--events-dir" in result.output  # a missing events dir is an error
    (project / "events").mkdir()
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events")])
    assert result.exit_code == 0, result.output
    assert "waiting for attempt 2 to start in us-central1-b" in result.stdout
    assert steps_applied(fake_pulumi, project) == [(None, "us-central1-a", 1),  # the VMs stopped before the snapshot
                                                   ("snapshot", "us-central1-a", 1), ("restore", "us-central1-a", 1),
                                                   ("start", "us-central1-b", 2)]
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]  # old disks still protected

    # Asked at a terminal and answered no: the old disks stay protected (approved only, never unprotected).
    import cli.commands as commands

    with pytest.MonkeyPatch.context() as tty:
        tty.setattr(commands, "interactive", lambda: True)
        asked = [a for a in MOVE_ARGS if a != "--yes"]
        # (yes to the start step applied again, as every rerun of a move does; no to the release)
        declined = runner.invoke(app, [*asked, "--events-dir", str(started(project, 2))], input="y\nn\n")
    assert declined.exit_code == 0, declined.output
    assert "move step release" in declined.stdout and "not confirmed: undone" in declined.stdout and not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]
    assert held_disks(pulumi_state, "llm-pretrain") == {"job-llm-pretrain-n0-disk": True, "job-llm-pretrain-n1-disk": True,
                                                        "job-llm-pretrain-n0-m1-disk": True, "job-llm-pretrain-n1-m1-disk": True}
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(started(project, 2))])
    assert result.exit_code == 0, result.output
    assert "the move is finished" in result.stdout
    calls = pulumi_calls(fake_pulumi)
    unprotected = [c[2] for c in calls if c[:2] == ["state", "unprotect"]]
    assert sorted(u.split("::")[-1] for u in unprotected) == ["job-llm-pretrain-n0-disk", "job-llm-pretrain-n1-disk"]
    last_up = [c for c in calls if "up" in c][-1]
    targets = [last_up[i + 1] for i, a in enumerate(last_up) if a == "--target"]
    assert set(unprotected) <= set(targets)  # the release update deletes exactly the old disks (and forgets the snapshots)
    assert any(t.endswith("::job-llm-pretrain-n0-m1-snapshot") for t in targets)
    final = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (final.zone, final.attempt, final.move, [z.zone for z in final.zone_history]) == ("us-central1-b", 2, None, ["us-central1-a"])
    # Only the job's lines changed; every comment is kept.
    new = path.read_text()
    assert [line for line in original.splitlines() if line.strip().startswith("#")] == \
        [line for line in new.splitlines() if line.strip().startswith("#")]
    assert "move: null" in new and re.search(r"zoneHistory: \[\{lastAttempt: 1, moveBegan: '20[0-9-]+T[0-9:.]+Z', zone: us-central1-a\}\]", new)
    assert final.zone_history[0].move_began is not None  # the move's changeover is measured from here


def held_disks(state, job: str) -> dict[str, bool]:
    """The job's disks in Pulumi's state: name -> protected."""
    return {u.rsplit("::", 1)[-1]: r["protect"] for u, r in state.resources().items()
            if f"job-{job}-" in u and u.endswith(("-disk", "-volume"))}


def test_a_moves_release_keeps_an_old_disk_relabelled_to_another_stack(project, runner, fake_pulumi, pulumi_state, gce):
    """Audit F4: the release checked the labels the program declares (which cannot fail), not the
    real disk's; it now decides through cleanup's rule on the cloud's disks, under the lock."""
    pulumi_state.seed("example-gcp")
    (project / "events").mkdir()
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events")])
    assert result.exit_code == 0 and "waiting for attempt 2" in result.stdout, result.output
    gce.add_disk("us-central1-a", "example-gcp-llm-pretrain-n1-disk", data_labels("team-b", "llm-pretrain", node=1))
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(started(project, 2))])
    assert result.exit_code == 1
    assert ("job llm-pretrain: the disks its move left are kept because its disk example-gcp-llm-pretrain-n1-disk is not "
            "among the disks labelled for stack example-gcp in the cloud") in result.output
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]] and gce.deleted == []
    assert held_disks(pulumi_state, "llm-pretrain") == {"job-llm-pretrain-n0-disk": True, "job-llm-pretrain-n1-disk": True,
                                                        "job-llm-pretrain-n0-m1-disk": True, "job-llm-pretrain-n1-m1-disk": True}
    assert stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain").move.step == "start"  # the file says so


def test_a_moves_release_on_aws_keeps_a_volume_owned_by_a_twin_stack(project, runner, fake_pulumi, pulumi_state, monkeypatch):
    """The same rule on EC2 (moto): a volume tagged with another stack's owner value (example.aws has
    example-aws's slug) is kept; the release deletes nothing."""
    import boto3
    from moto import mock_aws

    from infra.naming import owner_value
    from tests.test_cleanup import make_volume

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    pulumi_state.seed("example-aws")
    args = ["move", "llm-pretrain", "--to-zone", "us-east-1b", "--stack", "example-aws", "--yes"]
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        for node, owner in ((0, owner_value("example-aws")), (1, owner_value("example.aws"))):
            tags = data_labels("example-aws", "llm-pretrain", "aws", node) | {"spotctl:owner": owner,
                                                                               "Name": f"example-aws-llm-pretrain-n{node}-disk"}
            make_volume(ec2, "us-east-1a", tags)
        (project / "events").mkdir()
        result = runner.invoke(app, [*args, "--events-dir", str(project / "events")])
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, [*args, "--events-dir", str(started(project, 5))])
        assert result.exit_code == 1
        (kept,) = [v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]
                   if {"Key": "spotctl:owner", "Value": owner_value("example.aws")} in v["Tags"]]
        assert (f"job llm-pretrain: the disks its move left are kept because its disk {kept} does not carry this stack's "
                "ownership labels") in result.output
        assert len(ec2.describe_volumes()["Volumes"]) == 2
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]
    assert held_disks(pulumi_state, "llm-pretrain")["job-llm-pretrain-n1-volume"] is True


def test_an_interrupted_move_continues_from_the_recorded_step(project, runner, fake_pulumi, monkeypatch):
    events = project / "events"
    events.mkdir()
    monkeypatch.setenv("FAKE_PULUMI_UP_FAIL_AT", "3")  # the restore step's update fails midway (after the stop, the snapshot)
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(events)])
    assert result.exit_code == 1 and "pulumi up failed" in result.output
    cfg = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert cfg.move.step == "restore" and cfg.zone == "us-central1-a"  # the file says where the move stands
    monkeypatch.delenv("FAKE_PULUMI_UP_FAIL_AT")
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(events)])
    assert result.exit_code == 0, result.output
    assert "continuing a move that may have been interrupted" in result.stdout
    assert steps_applied(fake_pulumi, project) == [
        (None, "us-central1-a", 1), ("snapshot", "us-central1-a", 1), ("restore", "us-central1-a", 1),  # the failed one
        ("restore", "us-central1-a", 1), ("start", "us-central1-b", 2),  # applied again, then on
    ]


def test_no_apply_writes_one_step_per_run(project, runner):
    args = [a for a in MOVE_ARGS if a != "--yes"] + ["--no-apply", "--json"]
    steps = []
    for _ in range(3):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        steps += [s["fields"]["move"]["step"] for s in json.loads(result.stdout)["steps"]]
    assert steps == ["snapshot", "restore", "start"]


def test_a_watcher_carries_on_a_move_written_with_no_apply(project, runner, fake_pulumi, pulumi_state):
    """Audit S1, as README says: a ``move:`` in the file is a move under way, whoever wrote it; the
    watcher applies its recorded step and the next ones, and keeps the old disks until attempt 2 started."""
    pulumi_state.seed("example-gcp")
    (project / "events").mkdir()
    r = runner.invoke(app, [a for a in MOVE_ARGS if a != "--yes"] + ["--no-apply"])
    assert r.exit_code == 0, r.output
    written = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (written.move.step, written.attempt) == ("snapshot", 1) and pulumi_calls(fake_pulumi) == []
    w = runner.invoke(app, ["watch", "--stack", "example-gcp", "--once", "--no-poll", "--json", "--events-dir", "events"])
    assert w.exit_code == 0, w.output
    (record,) = [json.loads(line) for line in w.stdout.splitlines() if '"llm-pretrain"' in line]
    assert (record["action"], record["result"]) == ("move", "moving")
    assert steps_applied(fake_pulumi, project) == [("snapshot", "us-central1-a", 1), ("snapshot", "us-central1-a", 1),
                                                   ("restore", "us-central1-a", 1), ("start", "us-central1-b", 2)]
    first, second = [[c[i + 1].split("::")[-1] for i, a in enumerate(c) if a == "--target"]
                     for c in pulumi_calls(fake_pulumi) if "up" in c][:2]
    # the VMs --no-apply left running go by an update of their own, before any snapshot is taken
    assert {"job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"} <= set(first) and not [t for t in first if "snapshot" in t]
    assert "job-llm-pretrain-n0-m1-snapshot" in second and "job-llm-pretrain-n0-vm" not in second
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]  # no release before it started


def test_moving_to_an_unknown_zone_changes_nothing(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["move", "llm-pretrain", "--to-zone", "us-central1-q", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert "--to-zone 'us-central1-q' is not in spotctl:zones" in result.output
    assert path.read_text() == before


def test_status_shows_the_move(project, runner):
    args = [a for a in MOVE_ARGS if a != "--yes"] + ["--no-apply"]
    assert runner.invoke(app, args).exit_code == 0
    result = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-gcp", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["move"] == MOVE | {"step": "snapshot"} and row["zone_history"] == []
    result = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-gcp"])
    assert "moving from us-central1-a to us-central1-b, step snapshot written" in " ".join(result.stdout.split())


# ---- the clouds' rules a move relies on --------------------------------------------------------------


def test_a_restored_volume_must_be_encrypted():
    from infra import contract
    from infra.contract import ContractError

    waits = {contract.TIMEOUTS: {"create": "12h"}}  # aws.move-create-timeout: test_move_edges
    contract.check("aws:ebs/volume:Volume", "v", {"snapshot_id": "snap-1", "encrypted": True} | waits)
    contract.check("aws:ebs/volume:Volume", "v", {"encrypted": False})  # not restored: another matter
    with pytest.raises(ContractError, match="aws.restored-volume-encrypted"):
        contract.check("aws:ebs/volume:Volume", "v", {"snapshot_id": "snap-1", "encrypted": False} | waits)


@pytest.mark.parametrize("cloud,rule", [("gcp", "gcp.zonal-disk-same-zone"), ("aws", "aws.volume-az-bound")])
def test_a_disk_in_another_zone_than_its_vm_is_refused(cloud, rule, monkeypatch):
    """A program that would attach the old zone's disk to the new zone's VM is stopped at registration."""
    from infra import common
    from infra.contract import ContractError

    real = common.node_disks

    def stale(slug, job, rank):
        disks, snaps = real(slug, job, rank)
        return tuple(d if not d.attached else common.DiskPlan(d.gen, d.name, "elsewhere-1z", d.protect, True, d.restored, d.snapshot)
                     for d in disks), snaps

    monkeypatch.setattr(common, "node_disks", stale)
    base, job = (GCP_BASE, gcp_job()) if cloud == "gcp" else (AWS_BASE, aws_job())
    with pytest.raises(ContractError, match=rule):
        planner.run(validate(stack_config(base, jobs=[job]), "test"), "team")


def test_a_moves_release_is_decided_again_after_the_question(project, runner, fake_pulumi, pulumi_state, gce, monkeypatch):
    """The ownership decision is made under the lock before the preview; a hand edit at the question
    (it takes no lock: here someone resumed the job by hand) makes the release refuse right before the
    unprotect: nothing unprotected or deleted, the release step undone, the hand edit kept."""
    import cli.commands as commands

    pulumi_state.seed("example-gcp")
    (project / "events").mkdir()
    assert runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events")]).exit_code == 0
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    asked = []

    def ask(question):
        asked.append(question)
        if len(asked) == 2:  # the release's question: the file is edited by hand meanwhile
            text = path.read_text()
            at = text.index("id: llm-pretrain")
            assert "attempt: 2" in text[at:]
            path.write_text(text[:at] + text[at:].replace("attempt: 2", "attempt: 3", 1))
        return True

    monkeypatch.setattr(commands, "interactive", lambda: True)
    monkeypatch.setattr(commands, "_ask", ask)
    result = runner.invoke(app, [a for a in MOVE_ARGS if a != "--yes"] + ["--events-dir", str(started(project, 2))])
    assert len(asked) == 2 and result.exit_code == 1, result.output
    assert ("job llm-pretrain changed while the disks its move left were being released (now running, attempt 3, "
            "us-central1-b); nothing deleted") in result.output
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]] and gce.deleted == []
    assert held_disks(pulumi_state, "llm-pretrain") == {"job-llm-pretrain-n0-disk": True, "job-llm-pretrain-n1-disk": True,
                                                        "job-llm-pretrain-n0-m1-disk": True, "job-llm-pretrain-n1-m1-disk": True}
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.attempt, job.move.step, job.applying) == (3, "start", None)  # the hand edit kept, the release undone


def test_a_watcher_finishes_a_release_whose_update_was_killed(project, runner, fake_pulumi, pulumi_state, gce, monkeypatch):
    """A release killed after its `applying` mark and before its old disks were unprotected used to be
    applied again as a plain pending update, which refuses a protected disk, every cycle; the watcher
    now carries on the move, whose release decides on the disks again under the lock and unprotects them."""
    from datetime import UTC, datetime, timedelta

    from cli.lifecycle import apply, applying

    pulumi_state.seed("example-gcp")
    (project / "events").mkdir()
    assert runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events")]).exit_code == 0
    began = datetime.now(UTC) - timedelta(minutes=11)  # older than the grace a watcher gives a live update
    monkeypatch.setattr(applying, "_now", lambda: began)

    real_up, ups = apply.Applier.up, []

    def killed(self, targets, out):  # the start step applied again (as every rerun of a move does), then the release
        ups.append(targets)
        if len(ups) == 2:
            raise KeyboardInterrupt  # stands for kill -9 during the release's `pulumi up`: nothing after it runs
        return real_up(self, targets, out)

    with monkeypatch.context() as m:
        m.setattr(apply.Applier, "up", killed)
        assert runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(started(project, 2))]).exit_code != 0
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert job.move.step == "release" and job.applying and "(since" in job.applying
    # As a kill between the mark and the unprotect leaves it: the old disks protected still.
    from cli.commands import applier_for

    old = [u for u in pulumi_state.resources() if u.endswith(("::job-llm-pretrain-n0-disk", "::job-llm-pretrain-n1-disk"))]
    applier_for(stackfile.resolve("example-gcp", None), False).protect(sorted(old))
    assert held_disks(pulumi_state, "llm-pretrain") == {"job-llm-pretrain-n0-disk": True, "job-llm-pretrain-n1-disk": True,
                                                        "job-llm-pretrain-n0-m1-disk": True, "job-llm-pretrain-n1-m1-disk": True}
    # A watcher that applies nothing (--no-apply) writes no next step over the pending release (it
    # used to write the move's end, `move: null`, leaving the old disks unreleased for good).
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    pending = path.read_bytes()
    w = runner.invoke(app, ["watch", "--stack", "example-gcp", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", "events"])
    assert w.exit_code == 0, w.output
    assert path.read_bytes() == pending
    w = runner.invoke(app, ["watch", "--stack", "example-gcp", "--once", "--no-poll", "--json", "--events-dir", "events"])
    assert w.exit_code == 0, w.output
    (record,) = [json.loads(line) for line in w.stdout.splitlines() if '"llm-pretrain"' in line and '"record"' not in line]
    assert (record["action"], record["result"]) == ("move", "moved"), record
    assert held_disks(pulumi_state, "llm-pretrain") == {"job-llm-pretrain-n0-m1-disk": True, "job-llm-pretrain-n1-m1-disk": True}
    final = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (final.zone, final.move, final.applying) == ("us-central1-b", None, None)


@pytest.mark.parametrize("step", ["snapshot", "restore", "start", "release"])
def test_a_pending_move_step_is_carried_on_by_the_move_only_at_its_release(step):
    """Only the release drops protected disks (approved by the move's own release): the other steps'
    pending updates are applied again as they are."""
    from datetime import UTC, datetime, timedelta

    from cli.watch.decide import JobMemory, decide_job

    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    job = Job.model_validate({"id": "train", "instance_type": "n1-standard-8", "zone": "us-central1-a", "command": "t",
                              "state": "running", "attempt": 2, "applying": "move step: x (since 2026-11-22T11:40:00Z)",
                              "move": {"from": "us-central1-a", "to": "us-central1-b", "step": step,
                                       "began": (now - timedelta(hours=1)).isoformat()}})
    action, _ = decide_job(job, [], JobMemory(), set(), now)
    assert (action.kind, action.zone) == (("move", "us-central1-b") if step == "release" else ("reapply", None)), action


def test_a_move_continued_after_another_spotctl_finished_it_does_nothing():
    """A watcher read the move before waiting for the update lock; another spotctl finished the move
    meanwhile: applying the recorded step again is nothing (it was an AssertionError that ended watch)."""
    from cli.lifecycle.move import reapply

    job = Job.model_validate({"id": "train", "instance_type": "n1-standard-8", "zone": "us-central1-b", "command": "t",
                              "state": "running", "attempt": 2})
    change = reapply(job)
    assert change.noop and change.fields == {} and "finished meanwhile" in change.reason
