"""AWS components under Pulumi mocks: every property the issue asks for, from registered resources."""

from __future__ import annotations

import base64
import gzip
import inspect
import json
from functools import cache

import pulumi_aws as aws
import pytest

from cli.plan import mocks as planner
from infra.agent_artifact import artifact
from infra.config import validate
from infra.naming import owner_value
from infra.render import bootstrap_config
from tests.conftest import AWS_BASE, aws_job, stack_config

INSTANCE = "aws:ec2/instance:Instance"
VOLUME = "aws:ebs/volume:Volume"
ATTACH = "aws:ec2/volumeAttachment:VolumeAttachment"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"

POOL = {
    "name": "g5", "instanceTypes": ["g5.2xlarge", "g6.2xlarge", "g5.4xlarge"], "onDemand": 2, "spotMin": 1,
    "spotMax": 10, "agentCommand": "agent --pool g5", "diskGb": 300,
}
SUBNETS = {"us-east-1a": "subnet-aaaa", "us-east-1b": "subnet-bbbb"}


def raw_stack(**over) -> dict:
    return stack_config(AWS_BASE, **{"network": {"subnets": SUBNETS}, "pools": [POOL], "jobs": [aws_job()], **over})


@cache
def _plan(key: str, stack: str) -> planner.Plan:
    return planner.run(validate(json.loads(key), "test"), stack)


def plan_of(raw: dict, stack: str = "team-a") -> planner.Plan:
    return _plan(json.dumps(raw, sort_keys=True), stack)


def script_of(inputs: dict) -> str:
    """The script of an Instance (userDataBase64) or LaunchTemplate (userData): base64 of gzip."""
    raw = base64.b64decode(inputs.get("userDataBase64") or inputs["userData"])
    assert len(raw) <= 16 * 1024
    return gzip.decompress(raw).decode()


def only(plan, type_, part=""):
    found = [r for r in plan.by_type(type_) if part in r.name]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


# ---- pools ----------------------------------------------------------------------------------------


def test_launch_template():
    plan = plan_of(raw_stack())
    lt = only(plan, LT).inputs
    assert "instanceMarketOptions" not in lt  # AWS rejects spot market options inside a mixed-instances ASG
    assert lt["metadataOptions"] == {
        "httpEndpoint": "enabled", "httpPutResponseHopLimit": 2.0, "httpTokens": "required", "instanceMetadataTags": "disabled",
    }
    assert lt["blockDeviceMappings"] == [
        {"deviceName": "/dev/sda1", "ebs": {"deleteOnTermination": "true", "encrypted": "true", "volumeSize": 300.0, "volumeType": "gp3"}}
    ]
    assert lt["networkInterfaces"][0]["associatePublicIpAddress"] == "false"
    script = script_of(lt)
    assert script.startswith("#!/bin/bash") and bootstrap_config(script)["command"] == "agent --pool g5"
    assert lt["iamInstanceProfile"]["arn"].startswith("arn:aws:iam:")
    kinds = {spec["resourceType"]: spec["tags"] for spec in lt["tagSpecifications"]}
    assert set(kinds) == {"instance", "volume", "network-interface"}
    assert all(t["spotctl:stack"] == "team-a" and t["spotctl:pool"] == "g5" for t in kinds.values())


def test_autoscaling_group_mixed_instances():
    plan = plan_of(raw_stack())
    asg = only(plan, ASG).inputs
    dist = asg["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist == {
        "onDemandBaseCapacity": 2.0, "onDemandPercentageAboveBaseCapacity": 0.0,
        "spotAllocationStrategy": "price-capacity-optimized",
    }  # no spotMaxPrice: capped at the on-demand price
    overrides = asg["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
    assert [o["instanceType"] for o in overrides] == POOL["instanceTypes"]
    assert asg["vpcZoneIdentifiers"] == ["subnet-aaaa", "subnet-bbbb"]
    assert asg["capacityRebalance"] is True
    assert asg["maxSize"] == 12.0 and asg["minSize"] == 3.0
    tags = {t["key"]: t for t in asg["tags"]}
    assert tags["spotctl:stack"] == {"key": "spotctl:stack", "propagateAtLaunch": True, "value": "team-a"}
    assert tags["spotctl:pool"]["value"] == "g5"


def test_default_vpc_subnets_when_none_configured():
    raw = raw_stack()
    del raw["network"]
    asg = only(plan_of(raw), ASG).inputs
    assert len(asg["vpcZoneIdentifiers"]) == 2 and all(s.startswith("subnet-0mock") for s in asg["vpcZoneIdentifiers"])


# ---- jobs -----------------------------------------------------------------------------------------


def test_job_volume_instance_attachment():
    plan = plan_of(raw_stack())
    vol = only(plan, VOLUME)
    assert vol.protect is True
    assert vol.inputs["availabilityZone"] == "us-east-1a" and vol.inputs["encrypted"] is True
    assert vol.inputs["type"] == "gp3" and vol.inputs["tags"]["spotctl:job"] == "train"
    vm = only(plan, INSTANCE)
    assert vm.delete_before_replace
    i = vm.inputs
    assert i["availabilityZone"] == "us-east-1a" and i["subnetId"] == "subnet-aaaa"
    assert i["instanceMarketOptions"] == {
        "marketType": "spot", "spotOptions": {"instanceInterruptionBehavior": "terminate", "spotInstanceType": "one-time"},
    }
    assert i["metadataOptions"]["httpTokens"] == "required"
    assert i["rootBlockDevice"]["encrypted"] is True
    assert i["associatePublicIpAddress"] is False
    assert i["userDataReplaceOnChange"] is True
    vol_id = plan.outputs["jobs"]["train"]["volumes"][0]
    assert bootstrap_config(script_of(i))["disk_device"] == f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{vol_id.replace('-', '')}"
    assert "userData" not in i  # gzip goes through userDataBase64 only
    att = only(plan, ATTACH).inputs
    assert att["volumeId"] == vol_id and att["instanceId"] == plan.outputs["jobs"]["train"]["instances"][0]
    assert att["deviceName"] == "/dev/sdf"
    # Xen instance types (no NVMe) show the volume as /dev/sdf or /dev/xvdf (EC2 device_naming.html).
    assert bootstrap_config(script_of(i))["disk_aliases"] == ["/dev/sdf", "/dev/xvdf"]


def test_new_attempt_new_instance_same_volume_same_zone():
    one = plan_of(raw_stack(jobs=[aws_job(attempt=1)]))
    two = plan_of(raw_stack(jobs=[aws_job(attempt=2)]))
    v1, v2 = only(one, VOLUME), only(two, VOLUME)
    assert v1.urn == v2.urn and v1.inputs == v2.inputs
    i1, i2 = only(one, INSTANCE).inputs, only(two, INSTANCE).inputs
    assert i1["userDataBase64"] != i2["userDataBase64"]  # replaces the instance (userDataReplaceOnChange)
    assert i1["availabilityZone"] == i2["availabilityZone"] == v2.inputs["availabilityZone"]
    assert i2["tags"]["Name"] == "team-a-train-a2-n0" and i1["tags"]["Name"] == "team-a-train-a1-n0"


def test_capacity_switch_changes_only_market_options():
    spot = only(plan_of(raw_stack(jobs=[aws_job(capacity="spot")])), INSTANCE).inputs
    od = only(plan_of(raw_stack(jobs=[aws_job(capacity="on-demand")])), INSTANCE).inputs
    assert {k for k in spot.keys() | od.keys() if spot.get(k) != od.get(k)} == {
        "instanceMarketOptions", "instanceInitiatedShutdownBehavior", "userDataBase64"}
    # The agent's self-stop ends billing: a one-time spot instance terminates, an on-demand one stops.
    assert (spot["instanceInitiatedShutdownBehavior"], od["instanceInitiatedShutdownBehavior"]) == ("terminate", "stop")
    assert "instanceMarketOptions" not in od
    # the script only learns the capacity its `started` event records (spotctl switches with a new attempt anyway)
    a, b = bootstrap_config(script_of(spot)), bootstrap_config(script_of(od))
    assert {k for k in a if a[k] != b[k]} == {"capacity"} and (a["capacity"], b["capacity"]) == ("spot", "on-demand")


@pytest.mark.parametrize("state", ["completed", "failed", "preempted"])
def test_job_not_running_keeps_volume_and_declares_no_instance(state):
    plan = plan_of(raw_stack(jobs=[aws_job(state=state)]))
    assert len(plan.by_type(VOLUME)) == 1 and plan.by_type(INSTANCE) == [] and plan.by_type(ATTACH) == []
    assert only(plan, VOLUME).protect is True  # a completed job's too: only `spotctl cleanup` lifts it (infra.common.PROTECT_DISKS)


@pytest.mark.parametrize("itype", ["g5.12xlarge", "p4d.24xlarge"])
def test_multi_node_master_keeps_its_address_on_an_eni(itype):
    """Without EFA the instance names its interface; with EFA (p4d) its launch template does."""
    plan = plan_of(raw_stack(jobs=[aws_job(nodes=2, instanceType=itype)]))
    eni = only(plan, "aws:ec2/networkInterface:NetworkInterface").inputs
    assert eni["subnetId"] == "subnet-aaaa"
    vms = plan.by_type(INSTANCE)
    ip = plan.outputs["jobs"]["train"]["masterAddress"]
    master, worker = vms
    if itype == "p4d.24xlarge":
        templates = {r.name: r.inputs["networkInterfaces"][0] for r in plan.by_type("aws:ec2/launchTemplate:LaunchTemplate")
                     if r.name.startswith("job-")}
        master_nic, worker_nic = templates["job-train-n0-efa-template"], templates["job-train-n1-efa-template"]
    else:
        master_nic, worker_nic = master.inputs["primaryNetworkInterface"], worker.inputs
    assert master_nic["networkInterfaceId"].startswith("eni-")
    assert "subnetId" not in master.inputs and worker_nic["subnetId"] == "subnet-aaaa"
    for rank, vm in enumerate(vms):
        script = script_of(vm.inputs)
        cfg = bootstrap_config(script)
        assert cfg["master_addr"] == ip and cfg["node_rank"] == rank and cfg["world_size"] == 2


EIP = "aws:ec2/eip:Eip"
EIP_ASSOCIATION = "aws:ec2/eipAssociation:EipAssociation"


@pytest.mark.parametrize("network,job", [({"subnets": SUBNETS, "egress": "public-ip"}, {}),
                                         ({"subnets": SUBNETS}, {"externalIp": True})])
def test_a_multi_node_master_reaches_out_through_an_elastic_ip_when_a_public_ip_is_asked(network, job):
    """RunInstances assigns a public IP only to a new interface (contract
    aws.public-ip-only-on-new-interface): the master, on its own interface, gets an Elastic IP on
    that interface, there before its first boot; its workers and a single-node job get one from the
    launch, and no Elastic IP. Without the ask, nothing public is declared."""
    plan = plan_of(raw_stack(network=network, pools=[], jobs=[aws_job(nodes=3, **job), aws_job(id="solo", **job)]))
    (eip,) = plan.by_type(EIP)
    assert eip.name == "job-train-master-ip" and eip.inputs["domain"] == "vpc"
    assert eip.inputs["tags"]["spotctl:owner"] == owner_value("team-a") and eip.inputs["tags"]["spotctl:job"] == "train"
    master, *workers = [vm for vm in plan.by_type(INSTANCE) if vm.name.startswith("job-train-")]
    # Associated by its own resource with the interface alone (aws_eip's Update would send the prior
    # instance id with a new interface id, which AssociateAddress refuses), disassociated before a new one.
    assert "networkInterface" not in eip.inputs and "instance" not in eip.inputs
    (assoc,) = plan.by_type(EIP_ASSOCIATION)
    assert assoc.inputs["networkInterfaceId"] == master.inputs["primaryNetworkInterface"]["networkInterfaceId"]
    assert assoc.inputs["allocationId"].startswith("eipalloc-") and eip.urn in assoc.dependencies
    assert "instanceId" not in assoc.inputs and assoc.delete_before_replace
    assert "associatePublicIpAddress" not in master.inputs and assoc.urn in master.dependencies
    solo = only(plan, INSTANCE, "job-solo-")
    assert len(workers) == 2 and all(vm.inputs["associatePublicIpAddress"] is True for vm in [*workers, solo])
    private = plan_of(raw_stack(pools=[], jobs=[aws_job(nodes=3), aws_job(id="solo")]))
    assert private.by_type(EIP) == [] and private.by_type(EIP_ASSOCIATION) == []
    assert all(vm.inputs.get("associatePublicIpAddress") in (None, False) for vm in private.by_type(INSTANCE))


def test_imdsv2_required_and_volumes_encrypted_everywhere():
    plan = plan_of(raw_stack(jobs=[aws_job(nodes=2), aws_job(id="b", capacity="on-demand")]))
    for r in plan.by_type(INSTANCE) + plan.by_type(LT):
        assert r.inputs["metadataOptions"]["httpTokens"] == "required"
    for vm in plan.by_type(INSTANCE):
        assert vm.inputs["rootBlockDevice"]["encrypted"] is True
    for v in plan.by_type(VOLUME):
        assert v.inputs["encrypted"] is True
    for lt in plan.by_type(LT):  # (a gang node's EFA template holds its interfaces only: the instance its disks)
        assert all(m["ebs"]["encrypted"] == "true" for m in lt.inputs.get("blockDeviceMappings", []))
    assert [lt.name for lt in plan.by_type(LT) if "blockDeviceMappings" not in lt.inputs] == [
        "job-train-n0-efa-template", "job-train-n1-efa-template"]


def test_names_never_collide():
    raw = raw_stack(jobs=[aws_job(id="a", nodes=2), aws_job(id="a-n1"), aws_job(id="b")])
    p1, p2 = plan_of(raw, "team-a"), plan_of(raw, "team-b")
    for plan in (p1, p2):
        urns = [r.urn for r in plan.resources]
        assert len(urns) == len(set(urns))
        names = [r.inputs["tags"]["Name"] for r in plan.resources if "Name" in r.inputs.get("tags", {})]
        assert len(names) == len(set(names))
    n1 = {r.inputs["tags"]["Name"] for r in p1.resources if "Name" in r.inputs.get("tags", {})}
    n2 = {r.inputs["tags"]["Name"] for r in p2.resources if "Name" in r.inputs.get("tags", {})}
    assert not n1 & n2
    assert only(p1, ASG).inputs["name"] != only(p2, ASG).inputs["name"]


def test_ownership_tags_on_everything_taggable():
    plan = plan_of(raw_stack(jobs=[aws_job(nodes=2)]))
    for r in plan.resources:
        if not r.custom or r.type.startswith("pulumi:providers:"):
            continue
        cls_tags = "tags" in inspect.signature(_class_of(r.type)._internal_init).parameters
        if cls_tags and r.type != ASG:
            assert r.inputs.get("tags", {}).get("spotctl:stack") == "team-a", r.name


def _class_of(type_: str):
    module, name = type_.split(":")[1].split("/")[0], type_.split(":")[-1]
    return getattr(getattr(aws, module), name)


# ---- shared per stack -----------------------------------------------------------------------------


def test_event_bucket_roles_and_interruption_queue():
    plan = plan_of(raw_stack())
    bucket = only(plan, "aws:s3/bucket:Bucket")
    block = only(plan, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    enc = only(plan, "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration").inputs
    assert enc["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    assert "bucketKeyEnabled" not in enc["rules"][0]  # bucket keys are for SSE-KMS only
    tls = only(plan, "aws:s3/bucketPolicy:BucketPolicy")
    statement = json.loads(tls.inputs["policy"])["Statement"][0]
    assert statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert only(plan, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").urn in tls.dependencies
    life = only(plan, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs
    assert life["rules"][0]["expiration"]["days"] == 30.0 and life["rules"][0]["status"] == "Enabled"
    bucket_name = plan.outputs["eventBucket"]
    arn = f"arn:aws:s3:us-east-1:123456789012:bucket/{bucket_name}"
    # One identity per job and per pool, each writing only under its own prefix.
    policies = {r.name: json.loads(r.inputs["policy"])["Statement"] for r in plan.by_type("aws:iam/rolePolicy:RolePolicy")
                if r.name.endswith("-events-policy")}
    assert policies == {
        "job-train-events-policy": [{"Sid": "PutOwnEvents", "Effect": "Allow", "Action": "s3:PutObject", "Resource": f"{arn}/team-a/train/*"},
                                    {"Sid": "ReadAgentAndOwnObjects", "Effect": "Allow", "Action": "s3:GetObject",
                                     "Resource": [f"{arn}/_spotctl/agent/*", f"{arn}/team-a/train/*"]}],
        "pool-g5-events-policy": [{"Sid": "PutOwnEvents", "Effect": "Allow", "Action": "s3:PutObject", "Resource": f"{arn}/team-a/g5/*"},
                                  {"Sid": "ReadAgentAndOwnObjects", "Effect": "Allow", "Action": "s3:GetObject",
                                   "Resource": [f"{arn}/_spotctl/agent/*", f"{arn}/team-a/g5/*"]}],
    }
    agent = only(plan, "aws:s3/bucketObjectv2:BucketObjectv2")
    assert agent.inputs["key"] == artifact().object_name and agent.retain_on_delete
    profiles = {r.name: r for r in plan.by_type("aws:iam/instanceProfile:InstanceProfile")}
    vm, lt = only(plan, INSTANCE).inputs, only(plan, LT).inputs
    assert set(profiles) == {"job-train-profile", "pool-g5-profile"}
    assert vm["iamInstanceProfile"].startswith("job-train-profile-")  # the mocks' physical name of that profile
    assert "pool-g5-profile" in lt["iamInstanceProfile"]["arn"]
    assert bootstrap_config(script_of(lt))["event_prefix"] == bootstrap_config(script_of(vm))["event_prefix"] == "team-a/"
    assert bucket.inputs["bucketPrefix"].startswith("spotctl-team-a-events-")
    # The job's rule matches its own instances only (EC2 events carry no tags); it feeds the stack's queue.
    rule = only(plan, "aws:cloudwatch/eventRule:EventRule").inputs
    assert json.loads(rule["eventPattern"]) == {"source": ["aws.ec2"], "detail-type": [
        "EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"],
        "detail": {"instance-id": plan.outputs["jobs"]["train"]["instances"]}}
    assert rule["name"] == "spotctl-team-a_train"
    target = only(plan, "aws:cloudwatch/eventTarget:EventTarget").inputs
    queue = only(plan, "aws:sqs/queue:Queue").inputs
    assert target["arn"].endswith(plan.outputs["interruptionQueue"]) and queue["sqsManagedSseEnabled"] is True
    qpolicy = json.loads(only(plan, "aws:sqs/queuePolicy:QueuePolicy").inputs["policy"])
    assert qpolicy["Statement"][0]["Principal"] == {"Service": "events.amazonaws.com"}
    # Only this account's rules of this stack: not another account's rule of the same name (aws:SourceAccount).
    assert qpolicy["Statement"][0]["Condition"] == {"ArnLike": {"aws:SourceArn": "arn:aws:events:us-east-1:123456789012:rule/spotctl-team-a_*"},
                                                    "StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_stack_outputs():
    plan = plan_of(raw_stack(jobs=[aws_job(nodes=2, attempt=3)]))
    job = plan.outputs["jobs"]["train"]
    assert len(job["volumes"]) == 2 and len(job["instances"]) == 2
    assert job["zone"] == "us-east-1a" and job["capacity"] == "spot" and job["attempt"] == 3
    assert plan.outputs["pools"] == {"g5": {"asg": "team-a-g5"}}


@pytest.mark.parametrize(
    ("cls", "prop", "values"),
    [
        (aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs, "spot_instance_type", ["one-time"]),
        (aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs, "instance_interruption_behavior", ["terminate"]),
        (aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs, "spot_allocation_strategy", ["price-capacity-optimized"]),
        (aws.ec2.LaunchTemplateMetadataOptionsArgs, "http_tokens", ["required"]),
    ],
)
def test_enum_values_we_use_are_documented_by_pulumi_aws(cls, prop, values):
    doc = inspect.getdoc(getattr(cls, prop)) or ""
    for v in values:
        assert v in doc, f"{cls.__name__}.{prop}: {v!r} not documented"


def test_workers_wait_for_the_new_master():
    plan = plan_of(raw_stack(jobs=[aws_job(nodes=3)]))
    master, *workers = plan.by_type(INSTANCE)
    assert master.inputs["tags"]["Name"].endswith("-n0")
    assert all(master.urn in w.dependencies for w in workers)
