"""`spotctl cleanup`: a disk goes only when its job completed (or failed, with --force) and it carries
this stack's ownership labels; the targeted update deletes exactly the job's resources."""

from __future__ import annotations

from pathlib import Path

import boto3
from hypothesis import given
from hypothesis import strategies as st
from moto import mock_aws

from cli.app import app
from cli.cloud import CloudDisk
from cli.cloud.aws import AwsInventory
from cli.lifecycle import stackfile
from cli.lifecycle.apply import job_urns
from cli.lifecycle.cleanup import deletable_orphans
from cli.plan import mocks as planner
from infra.config import validate
from tests.conftest import AWS_BASE, aws_job, pulumi_calls, stack_config

ROOT = Path(__file__).resolve().parent.parent






def test_cleanup_refuses_a_job_that_is_not_completed(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert result.output == "error: job vit-finetune: its disks are kept because its job is running\n"
    assert path.read_text() == before and pulumi_calls(fake_pulumi) == []


def test_failed_job_needs_force(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    path.write_text(path.read_text().replace("      state: completed", "      state: failed"))
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "its job is failed (use --force for a failed job)" in result.output
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes", "--force"])
    assert result.exit_code == 0, result.output


def test_cleanup_without_yes_is_a_dry_run(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp"])
    assert result.exit_code == 0
    assert "job-bert-eval-n0-disk" in result.output and result.output.endswith("dry run: nothing changed (re-run with --yes)\n")
    assert path.read_text() == before and pulumi_calls(fake_pulumi) == []


def test_cleanup_unprotects_removes_and_deletes_exactly_the_jobs_resources(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    expected = job_urns(planner.run(cfg, "example-gcp"), "bert-eval")
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    log = pulumi_calls(fake_pulumi)
    unprotected = [c[2] for c in log if c[:2] == ["state", "unprotect"]]
    assert unprotected == ["urn:pulumi:example-gcp::spotctl::spotctl:gcp:TrainingJob$gcp:compute/disk:Disk::job-bert-eval-n0-disk"]
    (up,) = [c for c in log if "up" in c]
    assert sorted(up[i + 1] for i, a in enumerate(up) if a == "--target") == expected
    after = stackfile.load(stackfile.resolve("example-gcp", None))
    assert [j.id for j in after.jobs] == ["llm-pretrain", "vit-finetune"]
    assert "# Two-node H100 pretraining" in path.read_text()  # other jobs' comments kept


def test_cleanup_that_cannot_start_puts_the_job_back(project, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_LOCKED", "1")
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "locked by another update" in result.output
    assert path.read_text() == before


# ---- orphans ------------------------------------------------------------------------------------------


def make_volume(ec2, zone: str, tags: dict[str, str]) -> str:
    spec = [{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}] if tags else []
    return ec2.create_volume(AvailabilityZone=zone, Size=10, TagSpecifications=spec)["VolumeId"]


def owned(job: str) -> dict[str, str]:
    return {"spotctl:stack": "example-aws", "spotctl:managed": "true", "spotctl:job": job}


@mock_aws
def test_orphans_with_moto(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    orphan = make_volume(ec2, "us-east-1a", owned("gone-job"))
    declared = make_volume(ec2, "us-east-1b", owned("diffusion"))
    foreign = make_volume(ec2, "us-east-1a", {"spotctl:stack": "example-aws", "spotctl:job": "gone-job"})  # not managed
    other_stack = make_volume(ec2, "us-east-1a", {**owned("gone-job"), "spotctl:stack": "team-b"})
    attached = make_volume(ec2, "us-east-1a", owned("old-job"))
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, Placement={"AvailabilityZone": "us-east-1a"})["Instances"][0]
    ec2.attach_volume(VolumeId=attached, InstanceId=instance["InstanceId"], Device="/dev/sdf")

    dry = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws"])
    assert dry.exit_code == 0, dry.output
    assert f"would delete {orphan} (us-east-1a): no job of this stack declares it" in dry.output
    assert f"keeping {foreign} (us-east-1a): it does not carry this stack's ownership label" in dry.output
    assert f"keeping {attached} (us-east-1a): it is attached to a VM" in dry.output
    assert declared not in dry.output and other_stack not in dry.output
    assert len(ec2.describe_volumes()["Volumes"]) == 5 + 1  # + the instance's root volume

    wet = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws", "--yes"])
    assert wet.exit_code == 0, wet.output
    left = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert orphan not in left and {declared, foreign, other_stack, attached} <= left


@mock_aws
def test_aws_inventory_reads_tags_and_attachment():
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vid = make_volume(ec2, "us-east-1a", owned("x"))
    (disk,) = AwsInventory("us-east-1", "example-aws", client=ec2).disks()
    assert disk == CloudDisk(vid, "us-east-1a", owned("x"), in_use=False)


labels = st.fixed_dictionaries({}, optional={
    "spotctl:stack": st.sampled_from(["team-a", "team-b"]), "spotctl:managed": st.sampled_from(["true", "false"]),
    "spotctl:job": st.sampled_from(["a", "b", "c", "zzz"]),
})
states = st.sampled_from(["pending", "running", "preempted", "stopped", "completed", "failed"])


@given(disks=st.lists(st.tuples(labels, st.booleans()), max_size=12), job_states=st.lists(states, min_size=3, max_size=3))
def test_orphan_selection_never_deletes_what_it_must_not(disks, job_states):
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(id=i, state=s) for i, s in zip("abc", job_states, strict=True)]), "t")
    inventory = [CloudDisk(f"vol-{n}", "us-east-1a", dict(tags), in_use=used) for n, (tags, used) in enumerate(disks)]
    for disk, ok, _ in deletable_orphans(inventory, cfg, "team-a"):
        if ok:
            assert disk.labels.get("spotctl:stack") == "team-a" and disk.labels.get("spotctl:managed") == "true"
            assert disk.labels.get("spotctl:job") not in {"a", "b", "c"}  # a declared job's disk is never an orphan
            assert not disk.in_use


def gcp_owned(job: str, stack: str = "example-gcp") -> dict[str, str]:
    return {"spotctl-stack": stack, "spotctl-managed": "true", "spotctl-job": job}


def test_gcp_orphans_through_the_compute_client(project, runner, monkeypatch):
    from tests.fixtures.fake_gce import FakeGce

    gce = FakeGce()
    try:
        monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
        gce.add_disk("us-central1-a", "example-gcp-old-n0-disk", gcp_owned("old"))
        gce.add_disk("us-central1-b", "example-gcp-vit-finetune-n0-disk", gcp_owned("vit-finetune"))
        gce.add_disk("us-central1-c", "example-gcp-busy-n0-disk", gcp_owned("busy"), users=["projects/p/zones/us-central1-c/instances/x"])
        gce.add_disk("us-central1-a", "hand-made", {"spotctl-stack": "example-gcp", "spotctl-job": "old"})
        gce.add_disk("us-central1-a", "other-stack-disk", gcp_owned("old", stack="team-b"))
        result = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-gcp", "--yes"])
        assert result.exit_code == 0, result.output
        assert gce.deleted == [("us-central1-a", "example-gcp-old-n0-disk")]
        assert "keeping example-gcp-busy-n0-disk (us-central1-c): it is attached to a VM" in result.output
        assert "keeping hand-made (us-central1-a): it does not carry this stack's ownership label" in result.output
        assert "other-stack-disk" not in result.output
        # The delete was waited on through our endpoint, never the public one.
        assert ("POST", "/compute/v1/projects/my-ml-project/zones/us-central1-a/operations/op-delete-example-gcp-old-n0-disk/wait") in gce.requests
    finally:
        gce.stop()
