"""`spotctl cleanup`: a disk goes only when its job completed (or failed, with --force) and it carries
this stack's ownership labels; the targeted update deletes exactly the job's resources."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from moto import mock_aws

from cli.app import app
from cli.cloud import CloudDisk
from cli.cloud.aws import AwsInventory
from cli.lifecycle import stackfile
from cli.lifecycle.apply import Held, job_urns
from cli.lifecycle.orphans import deletable_orphans
from cli.plan import mocks as planner
from infra.config import validate
from infra.naming import aws_tags, owner_value
from tests.conftest import AWS_BASE, aws_job, data_labels, pulumi_calls, stack_config

ROOT = Path(__file__).resolve().parent.parent


def test_cleanup_refuses_a_job_that_is_not_completed(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert result.output == "error: job vit-finetune: its disks are kept because its job is running\n"
    assert path.read_text() == before and pulumi_calls(fake_pulumi) == []


def test_failed_job_needs_force(project, runner, fake_pulumi, gce):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    path.write_text(path.read_text().replace("      state: completed", "      state: failed"))
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "its job is failed (use --force for a failed job)" in result.output
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes", "--force"])
    assert result.exit_code == 0, result.output


def test_cleanup_without_yes_is_a_dry_run(project, runner, fake_pulumi, pulumi_state):
    pulumi_state.seed("example-gcp")
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp"])
    assert result.exit_code == 0
    assert "job-bert-eval-n0-disk" in result.output and result.output.endswith("dry run: nothing changed (re-run with --yes)\n")
    # Only the state was read (what the update would delete is what it holds of the job).
    assert path.read_text() == before and ["--non-interactive", "stack", "export", "--stack", "example-gcp"] in pulumi_calls(fake_pulumi)
    assert not [c for c in pulumi_calls(fake_pulumi) if "up" in c or "unprotect" in c]


def test_a_dry_run_without_pulumi_lists_what_the_plan_names(project, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTCTL_PULUMI_ROOT", str(tmp_path / "no-pulumi"))
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    assert "  - delete gcp:compute:Disk job-bert-eval-n0-disk\n" in result.output


def test_cleanup_unprotects_removes_and_deletes_exactly_the_jobs_resources(project, runner, fake_pulumi, pulumi_state, gce):
    pulumi_state.seed("example-gcp")
    state = json.loads(pulumi_state.path.read_text())  # protected, as a job's disk is until its completion is applied
    for r in state["deployment"]["resources"]:
        r["protect"] = r["protect"] or r["urn"].endswith("::job-bert-eval-n0-disk")
    pulumi_state.path.write_text(json.dumps(state))
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    expected = job_urns(planner.run(cfg, "example-gcp"), "bert-eval")
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    assert f"job bert-eval: 1 disk and its other resources deleted; removed from {path.relative_to(project)}" in result.output
    log = pulumi_calls(fake_pulumi)
    unprotected = [c[2] for c in log if c[:2] == ["state", "unprotect"]]
    assert unprotected == ["urn:pulumi:example-gcp::spotctl::spotctl:gcp:TrainingJob$gcp:compute/disk:Disk::job-bert-eval-n0-disk"]
    (up,) = [c for c in log if "up" in c]
    assert sorted(up[i + 1] for i, a in enumerate(up) if a == "--target") == expected
    after = stackfile.load(stackfile.resolve("example-gcp", None))
    assert [j.id for j in after.jobs] == ["llm-pretrain", "vit-finetune"]
    assert "# Two-node H100 pretraining" in path.read_text()  # other jobs' comments kept
    assert not [u for u in pulumi_state.resources() if "bert-eval" in u]  # Pulumi deleted every resource of the job


def protected_bert_eval_disk(pulumi_state) -> None:
    pulumi_state.seed("example-gcp")
    state = json.loads(pulumi_state.path.read_text())  # protected, as a job's disk is until its completion is applied
    for r in state["deployment"]["resources"]:
        r["protect"] = r["protect"] or r["urn"].endswith("::job-bert-eval-n0-disk")
    pulumi_state.path.write_text(json.dumps(state))


DISK = "urn:pulumi:example-gcp::spotctl::spotctl:gcp:TrainingJob$gcp:compute/disk:Disk::job-bert-eval-n0-disk"


def test_cleanup_interrupted_during_its_update_puts_the_job_back_and_protects_the_disk(project, runner, fake_pulumi,
                                                                                         pulumi_state, gce, monkeypatch):
    """Ctrl-C (or SIGTERM/SIGHUP) during the update: the job back in the file, its disk protected
    again, exit 130 naming what to run; the same command then finishes the cleanup."""
    from cli.lifecycle import apply

    protected_bert_eval_disk(pulumi_state)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    real_up = apply.Applier.up

    def interrupted(self, targets, on_output):
        raise KeyboardInterrupt

    monkeypatch.setattr(apply.Applier, "up", interrupted)
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 130, result.output
    assert "interrupted (SIGINT)" in result.stderr and "run `spotctl cleanup bert-eval --yes` again" in result.stderr
    assert path.read_text() == before and pulumi_state.resources()[DISK]["protect"] is True
    monkeypatch.setattr(apply.Applier, "up", real_up)
    again = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert again.exit_code == 0, again.output
    assert not [u for u in pulumi_state.resources() if "bert-eval" in u]


def test_cleanup_killed_during_its_update_is_finished_by_the_same_command(project, runner, fake_pulumi, pulumi_state,
                                                                          gce, monkeypatch):
    """kill -9 cannot be caught: the job is out of the file and its disk unprotected, but a record
    says so, and the next `cleanup JOB --yes` puts the job back, decides again and finishes."""
    from cli.lifecycle import apply

    class Killed(BaseException):
        """The process ends here: nothing after it runs (not even `finally`, in the real kill)."""

    protected_bert_eval_disk(pulumi_state)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    real_up = apply.Applier.up

    def killed(self, targets, on_output):
        raise Killed

    monkeypatch.setattr(apply.Applier, "up", killed)
    with pytest.raises(Killed):
        runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"], catch_exceptions=False)
    assert "bert-eval" not in path.read_text() and pulumi_state.resources()[DISK]["protect"] is False
    assert runner.invoke(app, ["status", "--stack", "example-gcp"]).exit_code == 0
    monkeypatch.setattr(apply.Applier, "up", real_up)
    again = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert again.exit_code == 0, again.output
    assert "a cleanup of it was interrupted during its update: the job is back" in again.output
    assert not [u for u in pulumi_state.resources() if "bert-eval" in u]
    assert stackfile.read_config(path)["spotctl:retiredJobs"] == {"bert-eval": 2}  # out of the jobs, retired after attempt 2
    assert "id: bert-eval" not in path.read_text()
    assert not (project / "stacks" / ".spotctl" / "Pulumi.example-gcp.yaml.cleanup.json").exists()


def test_cleanup_that_cannot_start_puts_the_job_back(project, runner, fake_pulumi, pulumi_state, gce, monkeypatch):
    pulumi_state.seed("example-gcp")
    monkeypatch.setenv("FAKE_PULUMI_LOCKED", "1")
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "locked by another update" in result.output
    assert path.read_text() == before


def complete_without_apply(runner, job: str) -> None:
    """The job written completed while Pulumi's state still holds its VMs (audit F2's start)."""
    result = runner.invoke(app, ["complete", job, "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 0, result.output


def test_cleanup_of_a_completion_never_applied_deletes_its_vms_in_the_same_update(project, runner, fake_pulumi, pulumi_state, gce):
    """Audit F2: the VMs the state holds under the job were not targeted, so Pulumi refused the
    update after the disks were unprotected and the job was dropped from the file."""
    pulumi_state.seed("example-gcp")
    complete_without_apply(runner, "llm-pretrain")
    dry = runner.invoke(app, ["cleanup", "llm-pretrain", "--stack", "example-gcp"])
    assert dry.exit_code == 0, dry.output
    assert "job-llm-pretrain-n0-vm (in Pulumi's state: the job's completion was never applied)" in " ".join(dry.output.split())
    result = runner.invoke(app, ["cleanup", "llm-pretrain", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    assert "job-llm-pretrain-n0-vm, job-llm-pretrain-n1-vm" in result.output and "deleted by the same update" in result.output
    assert not [u for u in pulumi_state.resources() if "llm-pretrain" in u]
    assert [j.id for j in stackfile.load(stackfile.resolve("example-gcp", None)).jobs] == ["vit-finetune", "bert-eval"]
    deleted = [o.rsplit("::", 1)[-1] for o in pulumi_state.ops()[-1] if o.startswith("delete")]
    assert {"job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm", "job-llm-pretrain-n0-disk"} <= set(deleted)


def test_a_cleanup_whose_update_fails_midway_keeps_the_job_and_protection_and_a_rerun_finishes(
        project, runner, fake_pulumi, pulumi_state, gce, monkeypatch):
    pulumi_state.seed("example-gcp")
    complete_without_apply(runner, "llm-pretrain")
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    held = [u for u in pulumi_state.resources() if "llm-pretrain" in u]
    monkeypatch.setenv("FAKE_PULUMI_UP_DELETES", "1")  # Pulumi deletes one resource, then fails
    result = runner.invoke(app, ["cleanup", "llm-pretrain", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert "the cleanup's update failed midway: the job is kept in the stack file; the disks not deleted are protected again" in result.output
    assert "run `spotctl cleanup llm-pretrain --yes` again to finish it" in result.output
    assert path.read_text() == before  # the job is back, as it was
    state = pulumi_state.resources()
    disks = [u for u in state if "llm-pretrain" in u and u.endswith("-disk")]
    assert disks and all(state[u]["protect"] for u in disks)  # a plain `pulumi up` cannot delete them
    assert len([u for u in state if "llm-pretrain" in u]) == len(held) - 1  # one went

    monkeypatch.delenv("FAKE_PULUMI_UP_DELETES")
    again = runner.invoke(app, ["cleanup", "llm-pretrain", "--stack", "example-gcp", "--yes"])
    assert again.exit_code == 0, again.output
    assert not [u for u in pulumi_state.resources() if "llm-pretrain" in u]
    assert "id: llm-pretrain" not in path.read_text() and stackfile.read_config(path)["spotctl:retiredJobs"] == {"llm-pretrain": 1}


def test_cleanup_keeps_a_disk_only_the_state_names(project, runner, fake_pulumi, pulumi_state, gce):
    """A disk Pulumi's state holds under the job that the job does not declare (no name to check its
    labels by) is never among what the update deletes: the cleanup is refused before any change."""
    pulumi_state.seed("example-gcp")
    state = json.loads(pulumi_state.path.read_text())
    root = next(r["urn"] for r in state["deployment"]["resources"] if r["urn"].endswith("::job-bert-eval"))
    state["deployment"]["resources"].append({"urn": root.replace("spotctl:gcp:TrainingJob::job-bert-eval",
                                             "spotctl:gcp:TrainingJob$gcp:compute/disk:Disk::job-bert-eval-n0-m1-disk"),
                                             "type": "gcp:compute/disk:Disk", "parent": root, "protect": False})
    pulumi_state.path.write_text(json.dumps(state))
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert "Pulumi's state holds disk(s) job-bert-eval-n0-m1-disk the job does not declare" in result.output
    assert path.read_text() == before and not [c for c in pulumi_calls(fake_pulumi) if "up" in c or "unprotect" in c]


def test_cleanup_refuses_before_any_change_a_disk_relabelled_to_another_stack(project, runner, fake_pulumi, pulumi_state, gce):
    pulumi_state.seed("example-gcp")
    gce.add_disk("us-central1-c", "example-gcp-bert-eval-n0-disk", data_labels("team-b", "bert-eval"))
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert result.output.startswith("error: job bert-eval: its disks are kept because its disk example-gcp-bert-eval-n0-disk "
                                    "is not among the disks labelled for stack example-gcp in the cloud")
    assert path.read_text() == before and not [c for c in pulumi_calls(fake_pulumi) if "up" in c or "unprotect" in c]


# ---- orphans ------------------------------------------------------------------------------------------


def make_volume(ec2, zone: str, tags: dict[str, str]) -> str:
    spec = [{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []
    return ec2.create_volume(AvailabilityZone=zone, Size=10, TagSpecifications=spec)["VolumeId"]


def owned(job: str) -> dict[str, str]:
    return data_labels("example-aws", job, "aws")


def completed_event(events: Path, job: str, stack: str = "example-aws", time: str | None = None) -> None:
    """A ``completed`` event of ``job``, by default now (after the disks the test made)."""
    events.mkdir(exist_ok=True)
    line = {"job": job, "attempt": 1, "node": 0, "event": "completed", "stack": stack,
            "time": time or datetime.now(UTC).isoformat()}
    (events / f"{job}.jsonl").write_text(json.dumps(line) + "\n")


@mock_aws
def test_orphans_with_moto(project, runner, monkeypatch, fake_pulumi):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    orphan = make_volume(ec2, "us-east-1a", owned("gone-job"))
    declared = make_volume(ec2, "us-east-1b", owned("diffusion"))
    foreign = make_volume(ec2, "us-east-1a", {**owned("gone-job"), "spotctl:managed": "false"})
    other_stack = make_volume(ec2, "us-east-1a", {**owned("gone-job"), "spotctl:stack": "team-b"})
    attached = make_volume(ec2, "us-east-1a", owned("old-job"))
    pool_root = make_volume(ec2, "us-east-1a", aws_tags("example-aws", {}, pool="g5"))
    unfinished = make_volume(ec2, "us-east-1a", owned("renamed-by-hand"))  # no completed event
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, Placement={"AvailabilityZone": "us-east-1a"})["Instances"][0]
    ec2.attach_volume(VolumeId=attached, InstanceId=instance["InstanceId"], Device="/dev/sdf")
    events = project / "events"
    for job in ("gone-job", "old-job"):
        completed_event(events, job)

    dry = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--events-dir", str(events)])
    assert dry.exit_code == 0, dry.output
    assert f"would delete {orphan} (us-east-1a): job gone-job completed and is in neither the stack file nor the Pulumi state" in dry.output
    assert f"keeping {foreign} (us-east-1a): it does not carry this stack's ownership label" in dry.output
    assert f"keeping {attached} (us-east-1a): it is attached to a VM" in dry.output
    assert f"keeping {unfinished} (us-east-1a): job renamed-by-hand recorded no `completed` event" in dry.output
    assert declared not in dry.output and other_stack not in dry.output and pool_root not in dry.output
    assert len(ec2.describe_volumes()["Volumes"]) == 7 + 1  # + the instance's root volume

    wet = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--yes", "--events-dir", str(events)])
    assert wet.exit_code == 0, wet.output
    left = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert orphan not in left and {declared, foreign, other_stack, attached, pool_root, unfinished} <= left


@mock_aws
def test_an_orphan_made_after_its_jobs_completion_is_kept(project, runner, monkeypatch, fake_pulumi):
    """A completion older than the disk is not its job's: an earlier job of that id (retired and
    reused), or a job of another deployment of a stack of the same name in this account (same
    ownership tags): a live job's preempted (unattached) volume stays."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    live = make_volume(ec2, "us-east-1a", owned("train"))
    completed_event(project / "events", "train", time="2026-01-05T10:00:00Z")  # the earlier `train`
    wet = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--yes", "--events-dir", "events"])
    assert wet.exit_code == 0, wet.output
    assert (f"keeping {live} (us-east-1a): job train's last `completed` event (2026-01-05T10:00:00+00:00) is older than "
            "the disk") in wet.output
    assert live in {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    completed_event(project / "events", "train")  # now it completed after the disk was made: it goes
    again = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--yes", "--events-dir", "events"])
    assert again.exit_code == 0 and f"{live} (us-east-1a): job train completed" in again.output, again.output
    assert live not in {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}


@mock_aws
def test_orphans_never_delete_what_pulumi_still_holds(project, runner, monkeypatch, fake_pulumi, tmp_path):
    """A volume of a job removed from the file but still in the Pulumi state
    (protected: deleting it would make the next `up` fail) is listed, never deleted."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    in_state = make_volume(ec2, "us-east-1a", owned("gone-job"))
    by_id = make_volume(ec2, "us-east-1a", owned("other-gone"))
    state = {"version": 3, "deployment": {"resources": [
        {"urn": "urn:pulumi:example-aws::spotctl::spotctl:aws:TrainingJob::job-gone-job", "type": "spotctl:aws:TrainingJob"},
        {"urn": "urn:pulumi:example-aws::spotctl::spotctl:aws:TrainingJob$aws:ebs/volume:Volume::job-x-n0-volume",
         "type": "aws:ebs/volume:Volume", "id": by_id, "protect": True}]}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    monkeypatch.setenv("FAKE_PULUMI_STATE", str(tmp_path / "state.json"))
    events = project / "events"
    for job in ("gone-job", "other-gone"):
        completed_event(events, job)
    wet = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--yes", "--events-dir", str(events)])
    assert wet.exit_code == 0, wet.output
    assert f"keeping {in_state} (us-east-1a): Pulumi's state still holds it (job gone-job)" in wet.output
    assert f"keeping {by_id} (us-east-1a): Pulumi's state still holds it (job other-gone)" in wet.output
    assert {in_state, by_id} <= {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert ["--non-interactive", "stack", "export", "--stack", "example-aws"] in pulumi_calls(fake_pulumi)


@mock_aws
def test_orphans_without_the_pulumi_state_delete_nothing(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vol = make_volume(ec2, "us-east-1a", owned("gone-job"))
    completed_event(project / "events", "gone-job")
    wet = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--yes", "--no-apply", "--events-dir", "events"])
    assert wet.exit_code == 0, wet.output
    assert f"keeping {vol} (us-east-1a): the Pulumi state could not be read" in wet.output
    assert vol in {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}


def test_orphans_cloud_error_is_one_line(project, runner, monkeypatch, fake_pulumi):
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    result = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot ask the cloud: ") and "Traceback" not in result.output
    assert len(result.output.splitlines()) == 1


@mock_aws
def test_aws_inventory_reads_tags_and_attachment():
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vid = make_volume(ec2, "us-east-1a", owned("x"))
    (disk,) = AwsInventory("us-east-1", "example-aws", client=ec2).disks()
    made = ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0]["CreateTime"]
    assert disk == CloudDisk(vid, "us-east-1a", owned("x"), in_use=False, created=made) and made.tzinfo is not None


labels = st.fixed_dictionaries({}, optional={
    "spotctl:stack": st.sampled_from(["team-a", "team-b"]), "spotctl:managed": st.sampled_from(["true", "false"]),
    "spotctl:owner": st.sampled_from([owner_value("team-a"), owner_value("team-b"), owner_value("team.a"), "team-a"]),
    "spotctl:job": st.sampled_from(["a", "b", "c", "zzz", "yyy"]), "spotctl:node": st.just("0"),
    "spotctl:pool": st.just("g5"),
})
states = st.sampled_from(["pending", "running", "preempted", "stopped", "completed", "failed"])


DAYS = st.none() | st.integers(1, 9).map(lambda day: datetime(2026, 11, day, tzinfo=UTC))


@given(disks=st.lists(st.tuples(labels, st.booleans(), DAYS), max_size=12), job_states=st.lists(states, min_size=3, max_size=3),
       in_state=st.sets(st.sampled_from(["a", "zzz", "yyy"])),
       done=st.dictionaries(st.sampled_from(["a", "b", "zzz", "yyy"]), DAYS.filter(bool)))
def test_orphan_selection_never_deletes_what_it_must_not(disks, job_states, in_state, done):
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(id=i, state=s) for i, s in zip("abc", job_states, strict=True)]), "t")
    inventory = [CloudDisk(f"vol-{n}", "us-east-1a", dict(tags), in_use=used, created=made)
                 for n, (tags, used, made) in enumerate(disks)]
    held = Held(frozenset(in_state), frozenset())
    for disk, ok, _ in deletable_orphans(inventory, cfg, "team-a", held, done):
        assert "spotctl:pool" not in disk.labels and "spotctl:node" in disk.labels  # data volumes only
        if ok:
            assert disk.labels.get("spotctl:owner") == owner_value("team-a") and disk.labels.get("spotctl:managed") == "true"
            job = disk.labels.get("spotctl:job")
            assert job not in {"a", "b", "c"} and job not in in_state and job in done
            assert not disk.in_use and disk.created is not None and done[job] > disk.created


def test_owner_value_tells_lossy_slugs_apart():
    names = ["team-a", "team.a", "Team-A", "team_a", "x" * 63 + "1", "x" * 63 + "2"]
    values = [owner_value(n) for n in names]
    assert len(set(values)) == len(names)
    assert all(len(v) <= 63 and v == v.lower() for v in values)


def gcp_owned(job: str, stack: str = "example-gcp") -> dict[str, str]:
    return data_labels(stack, job)


def test_gcp_orphans_through_the_compute_client(project, runner, monkeypatch, fake_pulumi):
    from tests.fixtures.fake_gce import FakeGce

    gce = FakeGce()
    try:
        monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
        gce.add_disk("us-central1-a", "example-gcp-old-n0-disk", gcp_owned("old"))
        gce.add_disk("us-central1-b", "example-gcp-vit-finetune-n0-disk", gcp_owned("vit-finetune"))
        gce.add_disk("us-central1-c", "example-gcp-busy-n0-disk", gcp_owned("busy"), users=["projects/p/zones/us-central1-c/instances/x"])
        gce.add_disk("us-central1-a", "hand-made", {"spotctl-stack": "example-gcp", "spotctl-job": "old", "spotctl-node": "0"})
        gce.add_disk("us-central1-a", "other-stack-disk", gcp_owned("old", stack="team-b"))
        gce.add_disk("us-central1-a", "example-gcp-twin-n0-disk", gcp_owned("twin", stack="example.gcp"))  # same slug label
        for job in ("old", "busy", "twin"):
            completed_event(project / "events", job, "example-gcp")
        result = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-gcp", "--yes", "--events-dir", "events"])
        assert result.exit_code == 0, result.output
        # A twin stack's disk (example.gcp: the same stack label) is not even listed: the look-up names the owner.
        assert "example-gcp-twin-n0-disk" not in result.output and ("us-central1-a", "example-gcp-twin-n0-disk") not in gce.deleted
        assert gce.deleted == [("us-central1-a", "example-gcp-old-n0-disk")]
        assert "keeping example-gcp-busy-n0-disk (us-central1-c): it is attached to a VM" in result.output
        assert "hand-made" not in result.output  # no owner label: not this stack's, not listed
        assert "other-stack-disk" not in result.output
        # The delete was waited on through our endpoint, never the public one.
        assert ("POST", "/compute/v1/projects/my-ml-project/zones/us-central1-a/operations/op-delete-example-gcp-old-n0-disk/wait") in gce.requests
    finally:
        gce.stop()


# ---- move snapshots follow the event retention --------------------------------------------------------


def make_snapshot(ec2, tags: dict[str, str]) -> str:
    volume = ec2.create_volume(AvailabilityZone="us-east-1a", Size=10)["VolumeId"]
    spec = [{"ResourceType": "snapshot", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    return ec2.create_snapshot(VolumeId=volume, TagSpecifications=spec)["SnapshotId"]


def test_expired_snapshots_only_this_stacks_and_not_while_their_job_moves():
    from datetime import UTC, datetime, timedelta

    from cli.cloud import CloudSnapshot
    from cli.lifecycle.orphans import expired_snapshots

    cfg = stackfile.load(stackfile.resolve(None, ROOT / "stacks" / "Pulumi.example-aws.yaml"))
    now = datetime(2026, 11, 22, tzinfo=UTC)
    old, young = now - timedelta(days=31), now - timedelta(days=3)
    moving = cfg.model_copy(update={"jobs": [j.model_copy(update={"move": None}) for j in cfg.jobs]})
    job = cfg.jobs[0].id
    snaps = [CloudSnapshot("old", "", owned(job), created=old), CloudSnapshot("young", "", owned(job), created=young),
             CloudSnapshot("foreign", "", {**owned(job), "spotctl:managed": "false"}, created=old),
             CloudSnapshot("twin", "", {**owned(job), "spotctl:owner": owner_value("example.aws")}, created=old),
             CloudSnapshot("unknown", "", owned(job), created=None),
             CloudSnapshot("not-a-move", "", {"spotctl:stack": "example-aws"}, created=old)]
    verdict = {s.id: (ok, why) for s, ok, why in expired_snapshots(snaps, moving, "example-aws", now)}
    assert verdict["old"] == (True, "made 2026-10-22, older than eventRetentionDays (30)")
    assert verdict["young"] == (False, "made 2026-11-19: kept 27 more day(s) (eventRetentionDays 30)")
    assert not verdict["foreign"][0] and not verdict["twin"][0] and not verdict["unknown"][0]
    assert "not-a-move" not in verdict
    from infra.config import Move

    in_move = cfg.model_copy(update={"jobs": [j.model_copy(update={"move": Move.model_validate(
        {"from": j.zone, "to": j.zone, "step": "snapshot"})}) if j.id == job else j for j in cfg.jobs]})
    ok, why = next((ok, why) for s, ok, why in expired_snapshots(snaps, in_move, "example-aws", now) if s.id == "old")
    assert not ok and why == f"job {job} is moving (the move restores from its snapshots)"


@mock_aws
def test_cleanup_snapshots_deletes_only_expired_owned_ones(project, runner, monkeypatch):
    from datetime import UTC, datetime, timedelta

    from cli.lifecycle.orphans import prune_snapshots

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    ours = make_snapshot(ec2, owned("gone-job"))
    foreign = make_snapshot(ec2, {**owned("gone-job"), "spotctl:managed": "false"})
    other_stack = make_snapshot(ec2, {**data_labels("team-b", "gone-job", "aws")})

    dry = runner.invoke(app, ["cleanup", "--snapshots", "--stack", "example-aws", "--yes"])
    assert dry.exit_code == 0, dry.output
    assert f"keeping snapshot {ours}: made " in dry.output and "kept 29 more day(s)" in dry.output
    assert f"keeping snapshot {foreign}: it does not carry this stack's ownership labels" in dry.output
    assert other_stack not in dry.output

    ref = stackfile.resolve("example-aws", None)
    later = datetime.now(UTC) + timedelta(days=31)
    found = prune_snapshots(ref, lambda cfg: AwsInventory("us-east-1", "example-aws"), later, delete=None)
    assert [s.id for s, ok, _ in found if ok] == [ours]
    left = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert ours not in left and {foreign, other_stack} <= left


def test_cleanup_wants_exactly_one_target(project, runner):
    result = runner.invoke(app, ["cleanup", "bert-eval", "--snapshots", "--stack", "example-gcp"])
    assert result.exit_code == 1 and "give a JOB, --orphans or --snapshots" in result.output


def test_a_new_job_cannot_reuse_a_cleaned_up_jobs_id_and_attempts(project, runner, fake_pulumi, pulumi_state, gce):
    """The old job's events stay in the bucket, filed by id and attempt: a new `bert-eval` at attempt 1
    would be completed (its VMs deleted, its disk then deletable) by the old one's `completed` event."""
    protected_bert_eval_disk(pulumi_state)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    comments = [line for line in path.read_text().splitlines() if line.strip().startswith("#")]
    assert runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"]).exit_code == 0
    # Every comment stays where it was (the job's own went with its lines) after the retiredJobs edit.
    assert [line for line in path.read_text().splitlines() if line.strip().startswith("#")] == \
        [line for line in comments if "bert-eval" not in line]
    new_job = ("    - id: bert-eval\n      machineType: a2-highgpu-1g\n      zone: us-central1-a\n"
               "      command: python eval2.py\n      attempt: 1\n      state: running\n")
    text = path.read_text()
    at = text.index("  spotctl:jobs:\n") + len("  spotctl:jobs:\n")
    path.write_text(text[:at] + new_job + text[at:])
    refused = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert refused.exit_code == 1
    assert ("spotctl:jobs[0].attempt: job id 'bert-eval' belonged to a job `spotctl cleanup` removed after its attempt 2 "
            "(spotctl:retiredJobs)") in refused.output and "start it at attempt: 3" in refused.output
    path.write_text(text[:at] + new_job.replace("attempt: 1", "attempt: 3") + text[at:])
    assert runner.invoke(app, ["validate", "--stack", "example-gcp"]).exit_code == 0



@pytest.mark.parametrize("apply_it", [True, False])
def test_a_kill_between_dropping_the_job_and_retiring_its_id_is_finished_by_the_next_cleanup(
        project, runner, fake_pulumi, pulumi_state, gce, monkeypatch, apply_it):
    """Cleanup's last two writes (the job out of the file, its id retired) are two: a kill -9 between
    them left a job gone whose id a new job could reuse, its attempts counted as the new one's. The
    record of the retirement to come is written first; the next cleanup (of any job) finishes it."""

    class Killed(BaseException):
        """The process ends here: nothing after it runs (not even `finally`, in the real kill)."""

    protected_bert_eval_disk(pulumi_state)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    real = stackfile.retire

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(stackfile, "retire", killed)
    with pytest.raises(Killed):
        runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes", *([] if apply_it else ["--no-apply"])],
                      catch_exceptions=False)
    assert "id: bert-eval" not in path.read_text() and "spotctl:retiredJobs" not in stackfile.read_config(path)
    monkeypatch.setattr(stackfile, "retire", real)
    again = runner.invoke(app, ["cleanup", "vit-finetune", "--stack", "example-gcp"])  # any cleanup, even a dry run
    assert "job bert-eval: an earlier cleanup was stopped before it retired the id: retired after attempt 2 now" in again.output
    assert stackfile.read_config(path)["spotctl:retiredJobs"] == {"bert-eval": 2}
    assert not (project / "stacks" / ".spotctl" / "Pulumi.example-gcp.yaml.cleanup.json").exists()
