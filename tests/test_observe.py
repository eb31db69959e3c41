"""What the cloud says about a job's VMs, through boto3 (moto, Stubber) and google-cloud-compute
(a local fake endpoint), and how status/resume use it."""

from __future__ import annotations

import json

import boto3
from botocore.stub import Stubber
from moto import mock_aws

from cli.app import app
from cli.cloud.aws import AwsObserver
from cli.cloud.gcp import GcpObserver
from infra.naming import owner_value
from tests.fixtures.fake_gce import FakeGce


def vm_tags(job: str, node: int, attempt: int) -> list[dict]:
    tags = {"spotctl:stack": "example-aws", "spotctl:job": job, "spotctl:node": str(node), "spotctl:attempt": str(attempt),
            "Name": f"example-aws-{job}-a{attempt}-n{node}"}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def test_aws_spot_termination_is_a_preemption():
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(ec2)
    stub.add_response("describe_instances", {"Reservations": [{"Instances": [{
        "InstanceId": "i-0abc", "State": {"Code": 48, "Name": "terminated"},
        "StateReason": {"Code": "Server.SpotInstanceTermination", "Message": "Server.SpotInstanceTermination: Spot instance termination"},
        "Tags": vm_tags("diffusion", 0, 2)}]}]})
    with stub:
        (vm,) = AwsObserver("us-east-1", "example-aws", client=ec2).vms("diffusion")
    assert (vm.preempted, vm.status, vm.attempt, vm.node) == (True, "terminated", 2, 0)


@mock_aws
def test_resume_observe_sees_a_stopped_instance_on_aws(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    spec = [{"ResourceType": "instance", "Tags": vm_tags("llm-pretrain", n, 4)} for n in (0,)]
    i0 = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=spec)["Instances"][0]["InstanceId"]
    spec1 = [{"ResourceType": "instance", "Tags": vm_tags("llm-pretrain", 1, 4)}]
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=spec1)
    # Both running: nothing to resume.
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-aws", "--observe", "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["changed"] is False
    ec2.terminate_instances(InstanceIds=[i0])  # one node of the gang is gone
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-aws", "--observe", "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["changed"] is True and doc["fields"]["attempt"] == 5  # the whole gang gets the new attempt
    status = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-aws", "--observe", "--json"])
    (row,) = json.loads(status.stdout)  # (stderr: the warning that no events source was given)
    assert sorted(vm["status"] for vm in row["cloud"]) == ["running", "terminated"]


def test_gcp_preemption_through_the_compute_client(project, runner, monkeypatch):
    gce = FakeGce()
    try:
        monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
        labels = {"spotctl-stack": "example-gcp", "spotctl-owner": owner_value("example-gcp"), "spotctl-job": "vit-finetune",
                  "spotctl-attempt": "3", "spotctl-node": "0"}
        gce.add_instance("us-central1-b", "example-gcp-vit-finetune-a3-n0", labels)
        gce.add_instance("us-central1-b", "example-gcp-vit-finetune-a3-n0-other", {**labels, "spotctl-job": "other"})
        gce.preempt("us-central1-b", "example-gcp-vit-finetune-a3-n0-other")  # a longer name: `targetLink:` contains it too
        observer = GcpObserver("my-ml-project", "example-gcp", ["us-central1-a", "us-central1-b"], endpoint=gce.url)
        (vm,) = observer.vms("vit-finetune")
        assert (vm.status, vm.preempted) == ("RUNNING", False)
        gce.preempt("us-central1-b", "example-gcp-vit-finetune-a3-n0")
        (vm,) = observer.vms("vit-finetune")
        assert (vm.status, vm.preempted, vm.attempt) == ("TERMINATED", True, 3)
        status = runner.invoke(app, ["status", "vit-finetune", "--stack", "example-gcp", "--observe"])
        assert "example-gcp-vit-finetune-a3-n0: TERMINATED PREEMPTED (attempt 3, node 0)" in status.output
        result = runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--observe", "--no-apply", "--capacity", "spot"])
        assert result.exit_code == 0, result.output
        assert result.output.startswith("job vit-finetune: attempt=4, state=running, capacity=spot (resume: a new attempt")
    finally:
        gce.stop()


def test_cloud_errors_are_one_clear_line(project, runner, monkeypatch):
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    result = runner.invoke(app, ["status", "--stack", "example-gcp", "--observe"])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot ask the cloud: ") and len(result.output.splitlines()) == 1


@mock_aws
def test_events_from_the_s3_bucket(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="evts")
    for attempt, event, t in [(2, "started", "2026-11-21T10:00:00.000Z"), (2, "preempted", "2026-11-21T11:00:00.000Z")]:
        body = json.dumps({"job": "diffusion", "attempt": attempt, "node": 0, "event": event, "time": t, "details": {}})
        s3.put_object(Bucket="evts", Key=f"example-aws/diffusion/attempt-{attempt}/node-0/{t}-{event}.json", Body=body)
    s3.put_object(Bucket="evts", Key="example-aws/other/x.json", Body=b"{}")
    result = runner.invoke(app, ["events", "diffusion", "--stack", "example-aws", "--events-bucket", "evts", "--json"])
    assert result.exit_code == 0, result.output
    assert [e["event"] for e in json.loads(result.output)] == ["started", "preempted"]


def test_events_from_gcs_as_the_scripts_wrote_them(project, runner, monkeypatch, tmp_path):
    """The real GCP scripts upload to the emulator's bucket; `spotctl events` reads them back."""
    import sys

    from cli.drill.emulator import Emulator
    from cli.drill.localvm import LocalVM, local_context
    from infra.render import ScriptContext

    with Emulator() as emu:
        ctx = ScriptContext(cloud="gcp", stack="example-gcp", kind="job", name="vit-finetune", command=f"{sys.executable} -c 'print(1)'",
                            event_bucket="example-gcp-events", region="us-central1", attempt=3)
        with LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm") as vm:
            vm.boot()
            assert vm.wait_for(lambda: len(emu.events()) == 2, 20)
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        result = runner.invoke(app, ["events", "vit-finetune", "--stack", "example-gcp", "--events-bucket", "example-gcp-events", "--json"])
    assert result.exit_code == 0, result.output
    assert [(e["attempt"], e["event"]) for e in json.loads(result.output)] == [(3, "started"), (3, "completed")]


def test_events_of_another_stack_with_the_same_job_id_are_not_this_jobs(tmp_path):
    """A synced bucket (or a shared events dir) holds every stack; job ids may coincide across them."""
    from cli.lifecycle.events import keyed_events, load_events, read_dir

    def doc(stack, attempt):
        return {"stack": stack, "job": "train", "attempt": attempt, "node": 0, "event": "preempted",
                "time": "2026-11-21T10:00:00Z", "details": {}}

    other = tmp_path / "other" / "train" / "attempt-9" / "node-0"  # another stack's folder of a synced bucket
    other.mkdir(parents=True)
    (other / "e.json").write_text(json.dumps(doc("other", 9)))
    (tmp_path / "e.json").write_text(json.dumps(doc("team-a", 2)))
    unstamped = {k: v for k, v in doc("x", 3).items() if k != "stack"}  # older events carry no stack: kept
    (tmp_path / "u.json").write_text(json.dumps(unstamped))
    assert sorted(e.attempt for e in load_events(tmp_path, "train", "team-a")) == [2, 3]
    assert sorted(e.attempt for e in load_events(tmp_path, "train")) == [2, 3, 9]
    assert sorted(e.attempt for e in keyed_events(read_dir(tmp_path), {"train"}, "team-a")) == [2, 3]
