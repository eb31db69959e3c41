"""Zone moves at their edges (an audit's findings): a move's new attempt that ends before it wrote
``started`` is resumed there (or handed to the failover), a finished job does not move, the VMs
are stopped by an update of their own before the snapshots are taken, snapshots wait long
enough, and regional disks only on the machine series that take them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from cli.lifecycle.events import Event
from cli.lifecycle.move import next_step
from cli.lifecycle.states import LifecycleError
from cli.plan import mocks as planner
from cli.watch.decide import JobMemory, decide_job, seen
from infra.config import ConfigError, Job, validate
from tests.conftest import GCP_BASE, gcp_job, pulumi_calls, stack_config
from tests.test_failover import refusing as _refusing
from tests.test_failover import run_watch, write_events
from tests.test_failover import the_job as failover_job

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)
MOVE = {"from": "us-central1-a", "to": "us-central1-b"}
AT_START = {"state": "running", "zone": "us-central1-b", "attempt": 2,
            "zoneHistory": [{"zone": "us-central1-a", "lastAttempt": 1, "moveBegan": "2026-11-22T03:00:00Z"}],
            "move": MOVE | {"step": "start", "began": "2026-11-22T03:00:00Z"}}


def job(**fields) -> Job:
    return validate(stack_config(GCP_BASE, jobs=[gcp_job(**fields)]), "t").jobs[0]


def ev(attempt: int, kind: str, node: int = 0, t: datetime = T0) -> Event:
    return Event(job="train", attempt=attempt, node=node, event=kind, time=t, details={})


def decide(j: Job, events: list[Event], memory: JobMemory = JobMemory(), now: datetime = T0):
    return decide_job(j, [seen(e, "bucket") for e in events], memory, set(), now)


refusing = _refusing  # test_failover's fixture, here too


# ---- D1: the move's new attempt ends before `started` ----------------------------------------------------


@pytest.mark.parametrize("kind", ["preempted", "stopped"])
def test_a_moves_attempt_that_ends_before_started_is_resumed_there(kind):
    action, _ = decide(job(**AT_START), [ev(2, kind)])
    assert (action.kind, action.attempt) == ("resume", 2), action
    assert f"node 0 of attempt 2 {kind}" in action.reason and "the move to us-central1-b stays at step start" in action.reason


def test_a_moves_attempt_that_fails_before_started_counts_against_max_failures():
    action, _ = decide(job(**AT_START, maxFailures=1), [ev(2, "failed")])
    assert (action.kind, action.force) == ("resume", True) and "failure 1 of maxFailures 1" in action.reason
    action, _ = decide(job(**AT_START), [ev(2, "failed")])  # maxFailures 0
    assert action.kind == "mark-failed" and "stays at step start" in action.reason


def test_a_moves_attempt_with_no_fact_waits_and_a_started_one_goes_on():
    assert decide(job(**AT_START), [])[0] is None  # nothing says it ended: wait for `started`
    assert decide(job(**AT_START), [ev(1, "preempted")])[0] is None  # the old attempt's end is stale
    action, _ = decide(job(**AT_START), [ev(2, "started")])
    assert (action.kind, action.zone) == ("move", "us-central1-b") and "step start recorded" in action.reason
    action, _ = decide(job(**AT_START), [ev(2, "completed")])  # its `started` lost: it did start
    assert action.kind == "move"


def test_a_due_retry_after_a_refusal_in_the_target_zone_still_asks_the_failover():
    memory = JobMemory(waiting_attempt=2, next_try=T0, tries=1)
    asked = []

    def failover(j, events, mem, now):
        asked.append(j.id)

    action, _ = decide_job(job(**AT_START), [], memory, set(), T0, failover)
    assert asked == ["train"] and action.kind == "retry-capacity" and "the zone the job is moving to" in action.reason


def test_watch_resumes_a_moves_attempt_preempted_before_started_then_finishes_the_move(refusing, project, fake_pulumi):
    """us-east-1a refuses, the watcher moves the job to us-east-1b (attempt 5 at step start); that
    attempt is preempted before it wrote `started`: attempt 6 starts in us-east-1b, the move stays
    at start with the old volume protected, and goes on once attempt 6 started."""
    clock, records = [T0 + timedelta(minutes=1)], []
    run_watch(refusing, clock, records)
    for _ in range(10):
        clock[0] = datetime.fromisoformat(records[-1]["next_try"])
        run_watch(refusing, clock, records)
        if records[-1]["action"] == "move":
            break
    j = failover_job()
    assert (j.zone, j.attempt, j.move.step) == ("us-east-1b", 5, "start")
    write_events(refusing, (5, "preempted", 200))
    clock[0] += timedelta(minutes=1)
    run_watch(refusing, clock, records)
    assert (records[-1]["action"], records[-1]["result"]) == ("resume", "applied"), records[-1]
    assert "stays at step start" in records[-1]["reason"]
    j = failover_job()
    assert (j.zone, j.attempt, j.state.value, j.move.step) == ("us-east-1b", 6, "running", "start")
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]  # the old volume kept
    write_events(refusing, (6, "started", 210))
    clock[0] += timedelta(minutes=1)
    run_watch(refusing, clock, records)
    assert (records[-1]["action"], records[-1]["result"]) == ("move", "moved"), records[-1]
    j = failover_job()
    assert (j.zone, j.attempt, j.move) == ("us-east-1b", 6, None)
    assert [c[2].split("::")[-1] for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]] == ["job-train-n0-m1-volume"]


# ---- D4: a finished job does not move --------------------------------------------------------------------


def test_a_job_whose_attempt_completed_does_not_move():
    with pytest.raises(LifecycleError, match="attempt 1 completed .*run `spotctl complete train`"):
        next_step(job(state="running"), "us-central1-b", [ev(1, "started"), ev(1, "completed")])
    with pytest.raises(LifecycleError, match="spotctl complete train"):  # nor is it converted to a regional disk
        next_step(job(state="running"), "us-central1-b", [ev(1, "completed")], replicas=["us-central1-a", "us-central1-b"])
    # an earlier attempt's completion (a job run again) does not stop it
    assert next_step(job(state="running", attempt=2), "us-central1-b", [ev(1, "completed")]).fields["move"]["step"] == "snapshot"


def test_move_command_refuses_a_completed_attempt_and_changes_nothing(project, runner, fake_pulumi):
    from cli.app import app

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    events = project / "events"
    events.mkdir()
    (events / "a1.jsonl").write_text("".join(
        json.dumps({"job": "llm-pretrain", "attempt": 1, "node": r, "event": kind, "time": f"2026-11-22T04:0{r}:00Z"}) + "\n"
        for r in range(2) for kind in ("started", "completed")))
    result = runner.invoke(app, ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes",
                                 "--events-dir", str(events)])
    assert result.exit_code == 1
    assert "run `spotctl complete llm-pretrain`" in " ".join(result.output.split())
    assert path.read_text() == before
    assert not [c for c in pulumi_calls(fake_pulumi) if "up" in c]


# ---- D5: regional disks only on the machine series that take them ---------------------------------------

REPLICAS = ["us-central1-a", "us-central1-b"]


@pytest.mark.parametrize("machine", ["a2-highgpu-1g", "a2-ultragpu-8g", "g2-standard-8", "a3-highgpu-8g", "g4-standard-48"])
def test_a_regional_disk_on_a_series_that_does_not_take_it_is_refused_naming_the_key(machine):
    """Compute Engine: "You can attach regional Persistent Disk only to VMs that use E2, N1, N2, and
    N2D machine types" (A2 and G2 were let through before that sentence was found)."""
    with pytest.raises(ConfigError) as exc:
        validate(stack_config(GCP_BASE, jobs=[gcp_job(machineType=machine, diskReplicaZones=REPLICAS)]), "t")
    text = " ".join(str(exc.value).split())
    assert f"jobs[0].diskReplicaZones: machineType {machine}: Compute Engine attaches a Regional Persistent Disk only to " \
           f"E2, N1, N2, N2D VMs, and {machine.split('-')[0].upper()} is not one of them" in text
    assert "moves between zones by snapshot" in text and "UNVERIFIED" not in text


def test_a_conversion_to_a_regional_disk_is_refused_on_such_a_series_too():
    move = {"from": "us-central1-a", "to": "us-central1-b", "step": "snapshot", "replicaZones": REPLICAS}
    with pytest.raises(ConfigError, match=r"jobs\[0\]\.move\.replicaZones: machineType a2-highgpu-1g: Compute Engine attaches"):
        validate(stack_config(GCP_BASE, jobs=[gcp_job(machineType="a2-highgpu-1g", state="stopped", move=move)]), "t")


@pytest.mark.parametrize("machine", ["n1-standard-8", "e2-standard-8", "n2-standard-8", "n2d-standard-8"])
def test_the_series_compute_engine_lists_keep_their_regional_disk(machine):
    extra = {"accelerator": {"type": "nvidia-tesla-t4", "count": 1}} if machine.startswith("n1") else {}
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(machineType=machine, diskReplicaZones=REPLICAS, **extra)]), "t")
    (disk,) = [r for r in planner.run(cfg, "team").resources if r.type.endswith("RegionDisk")]
    assert disk.inputs["type"].endswith("pd-balanced")


def test_the_program_refuses_a_regional_disk_on_such_a_series_whatever_the_config_let_through(monkeypatch):
    from infra import contract
    from infra.config import checks as config

    monkeypatch.setattr(config, "_regional_series", lambda *a: None)
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(machineType="a3-highgpu-8g", diskReplicaZones=REPLICAS)]), "t")
    with pytest.raises(contract.ContractError, match="gcp.regional-disk-machine-series"):
        planner.run(cfg, "team")


def test_validate_names_the_key(project, runner):
    from cli.app import app

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text()
    assert "      machineType: a3-highgpu-8g\n" in text  # llm-pretrain, jobs[0]
    path.write_text(text.replace("      machineType: a3-highgpu-8g\n",
                                 "      machineType: a3-highgpu-8g\n      diskReplicaZones: [us-central1-a, us-central1-b]\n", 1))
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert "spotctl:jobs[0].diskReplicaZones: machineType a3-highgpu-8g: Compute Engine attaches a Regional Persistent Disk only to" \
        in " ".join(result.output.split())


# ---- D3: a move's snapshots (and the disks restored from them) wait hours, not the providers' minutes ---


def move_plan(cloud: str, step: str):
    from tests.conftest import AWS_BASE, aws_job

    if cloud == "gcp":
        base, make, frm, to = GCP_BASE, gcp_job, "us-central1-a", "us-central1-b"
    else:
        base, make, frm, to = AWS_BASE, aws_job, "us-east-1a", "us-east-1b"
    fields = {"state": "stopped", "move": {"from": frm, "to": to, "step": step}}
    if step == "start":
        fields = {"state": "running", "zone": to, "attempt": 2, "zoneHistory": [{"zone": frm, "lastAttempt": 1}],
                  "move": {"from": frm, "to": to, "step": step}}
    return planner.run(validate(stack_config(base, jobs=[make(**fields)]), "t"), "team")


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_every_move_snapshot_and_restored_disk_is_given_hours_to_be_created(cloud):
    from infra.common import MOVE_CREATE_TIMEOUT
    from infra.contract import MOVE_CREATE_MIN_H, duration_h

    assert duration_h(MOVE_CREATE_TIMEOUT) >= MOVE_CREATE_MIN_H
    for step in ("snapshot", "restore", "start"):
        plan = move_plan(cloud, step)
        snaps = [r for r in plan.resources if r.type.endswith("/snapshot:Snapshot")]
        restored = [r for r in plan.resources if r.inputs.get("snapshot" if cloud == "gcp" else "snapshotId")]
        assert snaps and (step == "snapshot" or restored)
        assert all(r.timeouts == {"create": MOVE_CREATE_TIMEOUT} for r in snaps + restored), step
        assert "customTimeouts" in json.dumps([r.as_json() for r in snaps])
    other = [r for r in move_plan(cloud, "restore").resources if r.type.endswith(("/disk:Disk", "/volume:Volume"))
             and not r.inputs.get("snapshot" if cloud == "gcp" else "snapshotId")]
    assert other and all(not r.timeouts for r in other)  # the job's first disk: the provider's defaults


@pytest.mark.parametrize("cloud,module,attr", [("gcp", "infra.gcp", "_MOVE_TIMEOUTS"), ("aws", "infra.aws", "MOVE_CREATE_TIMEOUT")])
def test_a_program_whose_move_snapshot_waits_minutes_is_stopped_at_registration(cloud, module, attr, monkeypatch):
    import importlib

    import pulumi

    from infra.contract import ContractError

    short = pulumi.CustomTimeouts(create="20m") if attr == "_MOVE_TIMEOUTS" else "20m"
    monkeypatch.setattr(importlib.import_module(module), attr, short)
    with pytest.raises(ContractError, match=f"{cloud}.move-create-timeout") as exc:
        move_plan(cloud, "snapshot")
    assert "waits only 20m to be created (< 6 h)" in str(exc.value)


@pytest.mark.parametrize("type_,props,problem", [
    ("gcp:compute/snapshot:Snapshot", {}, "declares no create timeout"),
    ("gcp:compute/snapshot:Snapshot", {"_custom_timeouts": {"create": "5h59m"}}, "waits only 5h59m"),
    ("gcp:compute/snapshot:Snapshot", {"_custom_timeouts": {"create": "6h"}}, None),
    ("gcp:compute/disk:Disk", {"snapshot": "projects/p/global/snapshots/s"}, "a disk restored from a move's snapshot"),
    ("gcp:compute/disk:Disk", {"image": "debian"}, None),  # not restored
    ("gcp:compute/regionDisk:RegionDisk", {"snapshot": "s", "_custom_timeouts": {"create": "30m"}}, "waits only 30m"),
    ("aws:ebs/snapshot:Snapshot", {"_custom_timeouts": {"create": "10m"}}, "waits only 10m"),
    ("aws:ebs/volume:Volume", {"snapshot_id": "snap-1", "encrypted": True}, "a volume restored"),
    ("aws:ebs/volume:Volume", {"encrypted": True}, None),
])
def test_move_create_timeout_rules(type_, props, problem):
    from infra import contract

    found = [(r.id, p) for r, p in contract.violations(type_, props) if r.id.endswith("move-create-timeout")]
    assert (found[0][1] if found else None) is None if problem is None else problem in found[0][1]


def test_durations_read_as_pulumi_writes_them():
    from infra.contract import duration_h

    assert [duration_h(t) for t in ("12h", "90m", "1h30m", "3600s", "", None, "1d", "12 h")] == [12, 1.5, 1.5, 1, None, None, None, None]


def test_a_snapshot_that_exists_in_the_cloud_but_not_in_the_state_says_how_to_adopt_it(project, runner, fake_pulumi, monkeypatch):
    """GCP's answer when the snapshot step is applied again after a create that outlived the
    provider's wait: the name exists. The error says how to check it and adopt it, exactly."""
    (project / "events").mkdir()
    from cli.lifecycle import stackfile

    # Stopped already (its VMs gone): the snapshot step is the move's first update, the one GCP answers.
    stackfile.update_job(stackfile.resolve("example-gcp", None).path, "llm-pretrain", lambda current, written: {"state": "stopped"})
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_FAILS", "9")
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_MESSAGE", "error: 1 error occurred:\n    * Error creating Snapshot: googleapi: "
                       "Error 409: The resource 'projects/proj-1/global/snapshots/example-gcp-llm-pretrain-n1-m1-snap' "
                       "already exists, alreadyExists\n")
    result = runner.invoke(app_(), ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes",
                                    "--events-dir", str(project / "events")])
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "snapshot example-gcp-llm-pretrain-n1-m1-snap exists in project" in out
    assert "gcloud compute snapshots describe example-gcp-llm-pretrain-n1-m1-snap" in out
    assert ("pulumi import gcp:compute/snapshot:Snapshot job-llm-pretrain-n1-m1-snapshot "
            "projects/my-ml-project/global/snapshots/example-gcp-llm-pretrain-n1-m1-snap --parent parent=urn:pulumi:example-gcp::spotctl::spotctl:gcp:TrainingJob::job-llm-pretrain ") in out
    assert "--provider gcp=urn:pulumi:example-gcp::spotctl::pulumi:providers:gcp::gcp " in out and "--protect=false --stack example-gcp --yes" in out
    assert "spotctl-job=llm-pretrain" in out and "spotctl move llm-pretrain --to-zone us-central1-b" in out
    assert "n0-m1-snap" not in out  # only the snapshot GCP named


def app_():
    from cli.app import app

    return app


# ---- D2: the VMs go by an update of their own before the snapshots (resumable in between) ----------------


def test_moving_on_from_a_job_already_stopped_at_step_start_continues():
    """The stop before moving on was applied, then the command was interrupted: the file says
    stopped at step start; running the move again moves on (it was refused: stopped -> stopped)."""
    j = validate(stack_config(GCP_BASE | {"zones": ["us-central1-a", "us-central1-b", "us-central1-c"]},
                              jobs=[gcp_job(**(AT_START | {"state": "stopped"}))]), "t").jobs[0]
    on = next_step(j, "us-central1-c", [], T0)
    assert on.fields["move"] == {"from": "us-central1-b", "to": "us-central1-c", "step": "snapshot",
                                    "held": ["us-central1-a"], "began": "2026-11-22T04:00:00Z", "attempt": 2}
    assert on.fields["state"] == "stopped"


def stack_at_ups(log, project) -> list[tuple[str | None, str, str, int]]:
    """(move step, state, zone, attempt) of llm-pretrain in the stack file at every `pulumi up`."""
    from tests.test_move import jobs_at_ups

    return [(j.move.step if j.move else None, j.state.value, j.zone, j.attempt) for j in jobs_at_ups(log, project)]


GCP_MOVE = ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes"]


def test_the_running_job_is_stopped_by_an_update_of_its_own_before_the_snapshot_step(project, runner, fake_pulumi):
    """The audit's reproduction: the first update of a move was the snapshot step itself."""
    (project / "events").mkdir()
    result = runner.invoke(app_(), [*GCP_MOVE, "--events-dir", str(project / "events")])
    assert result.exit_code == 0, result.output
    assert stack_at_ups(fake_pulumi, project) == [
        (None, "stopped", "us-central1-a", 1),  # the stop only: no move record, no snapshot declared yet
        ("snapshot", "stopped", "us-central1-a", 1), ("restore", "stopped", "us-central1-a", 1),
        ("start", "running", "us-central1-b", 2)]


def test_a_move_whose_snapshot_step_failed_after_the_stop_continues_without_a_second_stop(project, runner, fake_pulumi, monkeypatch):
    from cli.lifecycle import stackfile

    events = project / "events"
    events.mkdir()
    monkeypatch.setenv("FAKE_PULUMI_UP_FAIL_AT", "2")  # the stop applied, the snapshot step's update failed
    assert runner.invoke(app_(), [*GCP_MOVE, "--events-dir", str(events)]).exit_code == 1
    j = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (j.state.value, j.move.step) == ("stopped", "snapshot")
    monkeypatch.delenv("FAKE_PULUMI_UP_FAIL_AT")
    result = runner.invoke(app_(), [*GCP_MOVE, "--events-dir", str(events)])
    assert result.exit_code == 0, result.output
    assert stack_at_ups(fake_pulumi, project)[2:] == [
        ("snapshot", "stopped", "us-central1-a", 1), ("restore", "stopped", "us-central1-a", 1),
        ("start", "running", "us-central1-b", 2)]


def test_vms_a_failed_stop_left_go_by_their_own_update_before_the_snapshot(project, runner, fake_pulumi, pulumi_state, monkeypatch):
    """The stop update failed midway: the file says stopped, the state still holds the VMs. Run
    again, the move deletes them by an update of their own, then snapshots."""
    pulumi_state.seed("example-gcp")
    events = project / "events"
    events.mkdir()
    monkeypatch.setenv("FAKE_PULUMI_UP_FAIL_AT", "1")
    result = runner.invoke(app_(), [*GCP_MOVE, "--events-dir", str(events)])
    assert result.exit_code == 1 and "left stopped at attempt 1" in " ".join(result.output.split())
    assert [n for n in pulumi_state.named("-vm") if "llm-pretrain" in n] == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]
    monkeypatch.delenv("FAKE_PULUMI_UP_FAIL_AT")
    result = runner.invoke(app_(), [*GCP_MOVE, "--events-dir", str(events)])
    assert result.exit_code == 0, result.output
    assert "deleting 2 VM(s) a failed stop left before its disks are snapshotted" in result.output
    ops = pulumi_state.ops()
    stop = next(up for up in ops if any(o.startswith("delete") and "llm-pretrain-n0-vm" in o for o in up))
    assert not [o for o in stop if "snapshot" in o]  # the VMs went by themselves
    assert ops.index(stop) < min(i for i, up in enumerate(ops) if any(o.startswith("create") and o.endswith("-snapshot") for o in up))


def test_moving_on_from_a_partly_started_gang_stops_it_first(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text()
    old = "      zone: us-central1-a\n      capacity: spot\n      attempt: 1\n      state: running\n"
    assert old in text
    path.write_text(text.replace(old, "      zone: us-central1-b\n      capacity: spot\n      attempt: 2\n      state: running\n"
                                 "      zoneHistory: [{zone: us-central1-a, lastAttempt: 1}]\n"
                                 "      move: {from: us-central1-a, to: us-central1-b, step: start}\n", 1))
    events = project / "events"
    events.mkdir()
    (events / "a2.jsonl").write_text(json.dumps({"job": "llm-pretrain", "attempt": 2, "node": 0, "event": "started",
                                                 "time": "2026-11-22T04:00:00Z"}) + "\n")  # node 1 never started
    result = runner.invoke(app_(), ["move", "llm-pretrain", "--to-zone", "us-central1-c", "--stack", "example-gcp", "--yes",
                                    "--events-dir", str(events)])
    assert result.exit_code == 0, result.output
    assert stack_at_ups(fake_pulumi, project)[:2] == [
        ("start", "stopped", "us-central1-b", 2),  # node 0's VM goes before its disk is snapshotted
        ("snapshot", "stopped", "us-central1-b", 2)]
