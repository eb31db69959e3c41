"""GCP regional persistent disks (a job's ``diskReplicaZones``): the config rules, the program under
Pulumi's mocks (one RegionDisk in two zones, forceAttach on the failover attempt), the contract
rules with their sources, and a move to the other replica zone without a snapshot."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.capacity import decide_zone_failover
from cli.lifecycle.move import next_step
from cli.lifecycle.states import LifecycleError
from cli.plan import mocks as planner
from infra import contract
from infra.config import Capacity, ConfigError, Job, validate
from tests import conftest
from tests.conftest import AWS_BASE, GCP_BASE, N1_T4, aws_job, pulumi_calls, stack_config

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)
REPLICAS = ["us-central1-a", "us-central1-b"]
BASE = GCP_BASE | {"zones": ["us-central1-a", "us-central1-b", "us-central1-c"]}


def gcp_job(**over) -> dict:
    """A GCP job on N1 + T4, a machine series that takes a regional disk."""
    return conftest.gcp_job(**N1_T4 | over)


def plan(**fields):
    cfg = validate(stack_config(BASE, jobs=[gcp_job(diskReplicaZones=REPLICAS, state="running", **fields)]), "test")
    return planner.run(cfg, "team")


def job_resources(p, kind: str):
    return {r.name: r for r in p.resources if r.type.endswith(kind) and r.name.startswith("job-train")}


@pytest.mark.parametrize("base,job,key,message", [
    (AWS_BASE, aws_job(diskReplicaZones=["us-east-1a", "us-east-1b"]), "jobs[0].diskReplicaZones", "a GCP option"),
    (BASE, gcp_job(diskReplicaZones=["us-central1-a"]), "jobs[0].diskReplicaZones", "exactly two different zones"),
    (BASE, gcp_job(diskReplicaZones=["us-central1-a", "us-central1-a"]), "jobs[0].diskReplicaZones", "exactly two different"),
    (BASE, gcp_job(diskReplicaZones=["us-central1-a", "us-central1-f"]), "jobs[0].diskReplicaZones", "us-central1-f"),
    (BASE, gcp_job(zone="us-central1-c", diskReplicaZones=REPLICAS), "jobs[0].zone", "not one of its disk's replica zones"),
])
def test_bad_replica_zones_are_refused_with_their_key(base, job, key, message):
    with pytest.raises(ConfigError) as err:
        validate(stack_config(base, jobs=[job]), "test")
    assert any(key in p and message in p for p in err.value.problems), err.value.problems


def test_the_program_declares_one_regional_disk_in_both_zones():
    p = plan()
    assert not job_resources(p, ":Disk")  # no zonal job disk
    (disk,) = job_resources(p, "RegionDisk").values()
    assert disk.name == "job-train-n0-disk" and disk.protect
    assert disk.inputs["replicaZones"] == REPLICAS and disk.inputs["region"] == "us-central1"
    assert disk.inputs["type"] == "pd-balanced" and disk.inputs["labels"]["spotctl-managed"] == "true"
    (vm,) = job_resources(p, "Instance").values()
    attached = vm.inputs["attachedDisks"][0]
    assert "team-train-n0-disk" in json.dumps(attached) and "forceAttach" not in attached  # first attempt: no force


def test_the_failover_attempt_force_attaches_the_same_disk_in_the_other_zone():
    p = plan(zone="us-central1-b", attempt=2, zoneHistory=[{"zone": "us-central1-a", "lastAttempt": 1, "sameDisk": True}])
    (disk,) = job_resources(p, "RegionDisk").values()
    assert disk.inputs["name"] == "team-train-n0-disk"  # the same disk: no new generation
    (vm,) = job_resources(p, "Instance").values()
    assert vm.inputs["zone"] == "us-central1-b" and vm.inputs["attachedDisks"][0]["forceAttach"] is True
    later = plan(zone="us-central1-b", attempt=3, zoneHistory=[{"zone": "us-central1-a", "lastAttempt": 1, "sameDisk": True}])
    (vm,) = job_resources(later, "Instance").values()
    assert "forceAttach" not in vm.inputs["attachedDisks"][0]  # only the failover attempt forces


# ---- the contract rules -------------------------------------------------------------------------------------


REGION_DISK = "gcp:compute/regionDisk:RegionDisk"
GOOD = {"region": "us-central1", "replica_zones": REPLICAS, "type": "pd-balanced", "size": 200}


@pytest.mark.parametrize("props,rule_id", [
    (GOOD | {"replica_zones": ["us-central1-a"]}, "gcp.regional-disk-replica-zones"),
    (GOOD | {"replica_zones": ["us-central1-a", "us-east1-b"]}, "gcp.regional-disk-replica-zones"),
    (GOOD | {"type": "pd-extreme"}, "gcp.regional-disk-type"),
    (GOOD | {"type": "pd-standard", "size": 100}, "gcp.regional-pd-standard-size"),
    (GOOD | {"image": "projects/deeplearning-platform-release/global/images/family/x"}, "gcp.regional-disk-not-from-image"),
])
def test_regional_disk_rules(props, rule_id):
    assert contract.violations(REGION_DISK, GOOD) == []
    assert [r.id for r, _ in contract.violations(REGION_DISK, props)] == [rule_id]
    assert contract.get(rule_id).source.startswith(("https://cloud.google.com/", "https://docs.cloud.google.com/"))


def test_a_vm_outside_the_replica_zones_is_refused(monkeypatch):
    from infra import common

    real = common.node_disks

    def elsewhere(slug, job, rank):
        disks, snaps = real(slug, job, rank)
        return tuple(common.DiskPlan(d.gen, d.name, d.zone, d.protect, d.attached, d.restored, d.snapshot,
                                     ("us-central1-b", "us-central1-c")) for d in disks), snaps

    monkeypatch.setattr(common, "node_disks", elsewhere)
    with pytest.raises(contract.ContractError, match="gcp.regional-disk-attach-in-replica-zone"):
        plan()


def test_force_attach_is_never_declared_on_a_zonal_disk(monkeypatch):
    raw = stack_config(BASE, jobs=[gcp_job(zone="us-central1-b", attempt=2, state="running",
                                           zoneHistory=[{"zone": "us-central1-a", "lastAttempt": 1, "sameDisk": True}])])
    # The config refuses it first (the zone history says the disk is regional) ...
    with pytest.raises(ConfigError, match=r"jobs\[0\].diskReplicaZones: job train has run on a regional disk"):
        validate(raw, "test")
    # ... and the contract still stops a program that would declare it.
    from infra.config import checks as config

    monkeypatch.setattr(config, "_disk_kind_checks", lambda *a: None)
    with pytest.raises(contract.ContractError, match="gcp.force-attach-regional-only"):
        planner.run(validate(raw, "test"), "team")


# ---- moving: one step, no snapshot ------------------------------------------------------------------------


def as_job(**fields) -> Job:
    raw = {"id": "train", "machine_type": "n1-standard-8", "zone": "us-central1-a", "command": "t", "state": "running",
           "diskReplicaZones": REPLICAS}
    return Job.model_validate(raw | fields)


def test_a_regional_move_is_one_step_to_the_other_replica_zone():
    change = next_step(as_job(), "us-central1-b", [], T0)
    assert change.fields == {"zone": "us-central1-b", "attempt": 2, "state": "running",
                             "zoneHistory": [{"zone": "us-central1-a", "lastAttempt": 1, "moveBegan": "2026-11-22T04:00:00Z",
                                              "sameDisk": True}]}
    assert "no snapshot" in change.reason
    with pytest.raises(LifecycleError, match=r"replicated in \['us-central1-a', 'us-central1-b'\]"):
        next_step(as_job(), "us-central1-c", [], T0)


def test_the_watchers_failover_for_a_regional_disk_moves_at_once_and_only_to_its_replica():
    job = as_job()
    decision = decide_zone_failover(job, [], zones=["us-central1-a", "us-central1-c", "us-central1-b"], refused={}, refusals=1,
                                    refused_since=T0, next_wait_h=0.01, in_place=lambda: Capacity.SPOT, now=T0)
    assert (decision.choice, decision.zone) == ("move", "us-central1-b")  # no snapshot: nothing to wait for


def n1_gang(project: Path) -> Path:
    """The example's llm-pretrain gang on N1 with four V100s: a series that takes a regional disk
    (gcp.regional-disk-machine-series; the example's A3 does not)."""
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text()
    old = "      machineType: a3-highgpu-8g\n      accelerator: {type: nvidia-h100-80gb, count: 8}\n"
    assert old in text
    path.write_text(text.replace(old, "      machineType: n1-standard-16\n      accelerator: {type: nvidia-tesla-v100, count: 4}\n", 1))
    return path


def test_spotctl_move_of_a_regional_job_snapshots_nothing_and_deletes_nothing(project, runner, fake_pulumi):
    path = n1_gang(project)
    text = path.read_text()
    head, sep, rest = text.partition("    - id: llm-pretrain\n")
    path.write_text(head + sep + "      diskReplicaZones: [us-central1-a, us-central1-b]\n" + rest)
    before = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert before.zone == "us-central1-a"
    result = runner.invoke(app, ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes",
                                 "--events-dir", str(project)])
    assert result.exit_code == 0, result.output
    ups = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    # The gang's old attempt stops first (as on every new attempt of a gang), then it starts in us-central1-b.
    assert ups and not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]
    at_ups = [json.loads(line) for line in Path(str(fake_pulumi) + ".stackfiles").read_text().splitlines()]
    assert not any("move: {" in text for text in at_ups) and "zone: us-central1-b" in at_ups[-1]  # never a snapshot step
    after = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (after.zone, after.attempt, after.move) == ("us-central1-b", before.attempt + 1, None)
    assert after.zone_history[-1].same_disk and after.zone_history[-1].zone == "us-central1-a"
    assert "waiting" not in result.stdout


# ---- a job that has run never changes disk kind by hand; the conversion is a move ---------------------------


@pytest.mark.parametrize("fields,said", [
    ({"diskKind": "zonal", "diskReplicaZones": REPLICAS}, "has run on a zonal disk (diskKind: zonal): adding diskReplicaZones"),
    ({"zoneHistory": [{"zone": "us-central1-c", "lastAttempt": 1}], "attempt": 2, "diskReplicaZones": REPLICAS},
     "has run on a zonal disk (as its zoneHistory shows)"),  # no record: a snapshot move says the disk was zonal
    ({"diskKind": "regional"}, "has run on a regional disk (diskKind: regional): removing diskReplicaZones"),
])
def test_changing_the_disk_kind_of_a_job_that_has_run_is_refused_naming_the_job_and_key(fields, said):
    with pytest.raises(ConfigError) as err:
        validate(stack_config(BASE, jobs=[gcp_job(state="running", **fields)]), "Pulumi.t.yaml")
    (problem,) = err.value.problems
    assert problem.startswith("spotctl:jobs[0].diskReplicaZones: job train ") and said in problem, problem
    if "adding" in said:
        assert "`spotctl move train --to-zone us-central1-a --replica-zones us-central1-a,us-central1-b`" in problem
    # A job that has not run (no record, no history) may choose either kind.
    validate(stack_config(BASE, jobs=[gcp_job(state="pending", diskReplicaZones=REPLICAS)]), "t")


def add_replicas(path: Path) -> None:
    text = path.read_text()
    head, sep, rest = text.partition("    - id: llm-pretrain\n")
    path.write_text(head + sep + "      diskReplicaZones: [us-central1-a, us-central1-b]\n" + rest)


def test_an_applied_update_records_the_disk_kind_and_validate_and_every_apply_then_refuse_a_new_kind(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--force", "--yes"])
    assert result.exit_code == 0, result.output
    assert stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain").disk_kind == "zonal"
    add_replicas(path)
    edited = path.read_text()
    for args in (["validate", "--stack", "example-gcp"], ["resume", "llm-pretrain", "--stack", "example-gcp", "--force", "--yes"],
                 ["plan", "--stack", "example-gcp"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert "spotctl:jobs[0].diskReplicaZones: job llm-pretrain has run on a zonal disk" in result.output
        assert "spotctl move llm-pretrain --to-zone us-central1-a --replica-zones us-central1-a,us-central1-b" in result.output
        assert path.read_text() == edited  # nothing written
    assert len([c for c in pulumi_calls(fake_pulumi) if "up" in c]) == 2  # only the first resume's (a gang: stop, then start)


def conversion_plan(step: str, nodes: int = 1):
    move = {"from": "us-central1-a", "to": "us-central1-a", "step": step, "replicaZones": REPLICAS}
    history = [{"zone": "us-central1-a", "lastAttempt": 1}]
    fields = ({"state": "stopped", "move": move} if step in ("snapshot", "restore") else
              {"state": "running", "attempt": 2, "zoneHistory": history, "move": move, "diskReplicaZones": REPLICAS,
               "diskKind": "regional"})
    if step == "done":
        fields = {"state": "running", "attempt": 2, "zoneHistory": history, "diskReplicaZones": REPLICAS, "diskKind": "regional"}
    return planner.run(validate(stack_config(BASE, jobs=[gcp_job(nodes=nodes, **{"diskKind": "zonal"} | fields)]), "test"), "team")


def test_the_conversion_restores_a_regional_disk_from_the_snapshot_under_the_next_generations_name():
    restore = conversion_plan("restore")
    (old,) = job_resources(restore, ":Disk").values()
    (new,) = job_resources(restore, "RegionDisk").values()
    assert (old.name, old.inputs["zone"]) == ("job-train-n0-disk", "us-central1-a")
    assert new.name == "job-train-n0-m1-disk" and new.inputs["name"] == "team-train-n0-m1-disk"  # never the old name
    assert new.inputs["replicaZones"] == REPLICAS and new.inputs["snapshot"].endswith("/snapshots/team-train-n0-m1-snap")
    assert any(d.endswith("::job-train-n0-m1-snapshot") for d in new.dependencies) and old.protect and new.protect
    start = conversion_plan("start")
    (vm,) = job_resources(start, "Instance").values()
    assert "team-train-n0-m1-disk" in json.dumps(vm.inputs["attachedDisks"]) and "forceAttach" not in vm.inputs["attachedDisks"][0]
    assert job_resources(start, ":Disk")["job-train-n0-disk"].protect  # the zonal disk stays until attempt 2 started
    for step in ("release", "done"):
        p = conversion_plan(step)
        assert not job_resources(p, ":Disk")  # the zonal disk is gone from the program
        (disk,) = job_resources(p, "RegionDisk").values()
        assert disk.name == "job-train-n0-m1-disk" and "snapshot" not in disk.inputs and disk.protect  # ignore_changes: kept


def test_spotctl_move_converts_a_zonal_disk_into_a_regional_one_then_moves_it_without_a_snapshot(project, runner, fake_pulumi, gce,
                                                                                                 pulumi_state):
    pulumi_state.seed("example-gcp")  # the release unprotects and deletes what Pulumi's state holds
    args = ["move", "llm-pretrain", "--to-zone", "us-central1-a", "--replica-zones", "us-central1-a,us-central1-b",
            "--stack", "example-gcp", "--yes"]
    n1_gang(project)
    (project / "events").mkdir()
    result = runner.invoke(app, [*args, "--events-dir", str(project / "events")])
    assert result.exit_code == 0, result.output
    assert "restored as regional disks replicated in us-central1-a, us-central1-b" in result.stdout
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.move.step, job.disk_replica_zones, job.disk_kind, job.attempt) == ("start", REPLICAS, "regional", 2)
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]
    events = project / "events" / "n1.jsonl"
    events.write_text("".join(json.dumps({"job": "llm-pretrain", "attempt": 2, "node": r, "event": "started",
                                          "time": f"2026-11-22T04:0{r}:00Z"}) + "\n" for r in range(2)))
    result = runner.invoke(app, [*args, "--events-dir", str(project / "events")])
    assert result.exit_code == 0, result.output
    assert "the move is finished" in result.stdout
    unprotected = sorted(c[2].split("::")[-1] for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"])
    assert unprotected == ["job-llm-pretrain-n0-disk", "job-llm-pretrain-n1-disk"]  # the zonal disks went
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.move, job.zone, job.disk_replica_zones) == (None, "us-central1-a", REPLICAS)
    again = runner.invoke(app, [*args, "--events-dir", str(project / "events")])
    assert again.exit_code == 0 and "runs on a regional disk replicated in us-central1-a, us-central1-b" in again.stdout
    # Now a regional job: its move to the other replica zone is one step on the same disk.
    result = runner.invoke(app, ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes",
                                 "--events-dir", str(project / "events")])
    assert result.exit_code == 0, result.output
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.zone, job.attempt, job.zone_history[-1].same_disk) == ("us-central1-b", 3, True)
    p = planner.run(stackfile.load(stackfile.resolve("example-gcp", None)), "example-gcp")
    assert {r.inputs["name"] for r in p.resources if r.type.endswith("RegionDisk")} == {
        "example-gcp-llm-pretrain-n0-m1-disk", "example-gcp-llm-pretrain-n1-m1-disk"}


def test_a_conversion_is_refused_where_it_cannot_be(project, runner):
    base = ["move", "llm-pretrain", "--stack", "example-gcp", "--no-apply"]
    result = runner.invoke(app, [*base, "--to-zone", "us-central1-c", "--replica-zones", "us-central1-a,us-central1-b"])
    assert result.exit_code == 1 and "--to-zone us-central1-c is not one of --replica-zones" in result.output
    result = runner.invoke(app, ["move", "diffusion", "--stack", "example-aws", "--no-apply", "--to-zone", "us-east-1b",
                                 "--replica-zones", "us-east-1a,us-east-1b"])
    assert result.exit_code == 1 and "regional persistent disks are a GCP option" in result.output


def test_a_conversion_whose_start_is_refused_does_not_move_on_and_says_so():
    job = Job.model_validate({"id": "train", "machine_type": "n1-standard-8", "zone": "us-central1-b", "command": "t",
                              "state": "running", "attempt": 2, "diskReplicaZones": REPLICAS, "diskKind": "regional",
                              "zoneHistory": [{"zone": "us-central1-a", "lastAttempt": 1, "moveBegan": T0.isoformat()}],
                              "move": {"from": "us-central1-a", "to": "us-central1-b", "step": "start", "replicaZones": REPLICAS}})
    decision = decide_zone_failover(job, [], zones=["us-central1-a", "us-central1-b", "us-central1-c"], refused={"us-central1-b": T0},
                                    refusals=3, refused_since=T0, next_wait_h=0.2, in_place=lambda: Capacity.SPOT, now=T0)
    assert decision.choice == "wait" and "being converted to a regional one in us-central1-b" in decision.reason
    with pytest.raises(LifecycleError, match="a conversion does not move on"):
        next_step(job, "us-central1-a", [], T0)
