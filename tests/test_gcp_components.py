"""GCP components under Pulumi mocks: every property the issue asks for, from registered resources."""

from __future__ import annotations

import inspect
from functools import cache

import pulumi_gcp as gcp
import pytest

from cli.plan import mocks as planner
from infra.agent_artifact import artifact
from infra.config import validate
from infra.render import bootstrap_config
from tests.conftest import GCP_BASE, gcp_job, stack_config

INSTANCE = "gcp:compute/instance:Instance"
DISK = "gcp:compute/disk:Disk"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"

POOL = {
    "name": "l4", "machineType": "g2-standard-24", "accelerator": {"type": "nvidia-l4", "count": 2},
    "onDemand": 1, "spotMin": 1, "spotMax": 6, "agentCommand": "agent --pool l4", "diskGb": 150,
}


def raw_stack(**over) -> dict:
    return stack_config(GCP_BASE, **{"pools": [POOL], "jobs": [gcp_job()], **over})


@cache
def _plan(key: str, stack: str) -> planner.Plan:
    import json

    return planner.run(validate(json.loads(key), "test"), stack)


def plan_of(raw: dict, stack: str = "team-a") -> planner.Plan:
    import json

    return _plan(json.dumps(raw, sort_keys=True), stack)


def only(plan: planner.Plan, type_: str, name_part: str = "") -> planner.Resource:
    found = [r for r in plan.by_type(type_) if name_part in r.name]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


# ---- pools ----------------------------------------------------------------------------------------


def test_pool_static_on_demand_part():
    plan = plan_of(raw_stack())
    tmpl = only(plan, TEMPLATE, "ondemand").inputs
    assert tmpl["scheduling"]["provisioningModel"] == "STANDARD"
    assert tmpl["scheduling"]["preemptible"] is False
    assert tmpl["scheduling"]["onHostMaintenance"] == "TERMINATE"
    mig = only(plan, MIG, "ondemand").inputs
    assert mig["targetSize"] == 1.0
    assert mig["distributionPolicyZones"] == ["us-central1-a", "us-central1-b"]
    # The MIG follows the template's self_link_unique (a new template version rolls the group).
    link = mig["versions"][0]["instanceTemplate"]
    assert link.startswith("https://www.googleapis.com/compute/v1/projects/proj-1/global/instanceTemplates/team-a-l4-ondemand-")
    assert "?uniqueId=" in link


def test_pool_without_on_demand_has_no_static_part():
    pool = {**POOL, "onDemand": 0}
    plan = plan_of(stack_config(GCP_BASE, pools=[pool]))
    assert [r.name for r in plan.by_type(TEMPLATE)] == ["pool-l4-spot-template"]
    assert [r.name for r in plan.by_type(MIG)] == ["pool-l4-spot-mig"]


def test_pool_dynamic_spot_part():
    plan = plan_of(raw_stack())
    tmpl = only(plan, TEMPLATE, "spot").inputs
    assert tmpl["scheduling"] == {
        "automaticRestart": False,
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "preemptible": True,
        "provisioningModel": "SPOT",
    }
    # G2 brings its own L4s: no guestAccelerators (GCE attaches them with the machine type).
    assert "guestAccelerators" not in tmpl
    assert tmpl["machineType"] == "g2-standard-24"
    assert tmpl["region"] == "us-central1"
    mig = only(plan, MIG, "spot").inputs
    assert mig["distributionPolicyZones"] == ["us-central1-a", "us-central1-b"]
    # Autoscaled: BALANCED, the capacity-aware shape GCE autoscales (never ANY: gcp.autoscaled-mig-shape),
    # with proactive redistribution off as BALANCED requires (gcp.mig-shape-redistribution).
    assert mig["distributionPolicyTargetShape"] == "BALANCED"
    assert mig["updatePolicy"]["instanceRedistributionType"] == "NONE"
    assert "targetSize" not in mig  # the autoscaler owns the size
    scaler = only(plan, "gcp:compute/regionAutoscaler:RegionAutoscaler").inputs
    assert scaler["autoscalingPolicy"]["minReplicas"] == 1.0
    assert scaler["autoscalingPolicy"]["maxReplicas"] == 6.0
    assert scaler["target"] == "projects/proj-1/regions/us-central1/regionInstanceGroupManagers/team-a-l4-spot"


def test_pool_templates_carry_scripts_labels_identity_and_no_external_ip():
    plan = plan_of(raw_stack())
    sa = only(plan, "gcp:serviceaccount/account:Account", "pool-l4").inputs
    for part in ("ondemand", "spot"):
        tmpl = only(plan, TEMPLATE, part).inputs
        meta = tmpl["metadata"]
        assert meta["startup-script"].startswith("#!/bin/bash")
        assert bootstrap_config(meta["startup-script"])["command"] == "agent --pool l4"
        assert 'exec "$python" -E -S "$run_dir/__main__.py" "${1:-shutdown}"' in meta["shutdown-script"]
        assert tmpl["labels"]["spotctl-stack"] == "team-a" and tmpl["labels"]["spotctl-pool"] == "l4"
        assert tmpl["disks"][0]["labels"]["spotctl-pool"] == "l4"
        assert "accessConfigs" not in tmpl["networkInterfaces"][0]
        assert tmpl["shieldedInstanceConfig"]["enableVtpm"] is True
        assert tmpl["serviceAccount"]["email"] == f"{sa['accountId']}@proj-1.iam.gserviceaccount.com"


def test_service_account_display_names_fit_iam_on_the_longest_names():
    """A 65-character stack and a 30-character job id: "spotctl job <id> of <stack>" would be 102
    bytes, over IAM's 100 (gcp.iam-display-100-bytes); every display name is cut to fit."""
    stack = "team-" + "x" * 60
    job = {**gcp_job(), "id": "j" * 30}
    plan = plan_of(stack_config(GCP_BASE, pools=[POOL], jobs=[job]), stack)
    names = [r.inputs["displayName"] for r in plan.by_type("gcp:serviceaccount/account:Account")]
    assert len(names) == 2 and all(len(n.encode()) <= 100 for n in names), names
    assert f"spotctl job {'j' * 30} of {stack}"[:100] in names


def _label_maps(value):
    """Every labels map in a resource's inputs (its own, a template's disks', a boot disk's)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "labels" and isinstance(v, dict):
                yield v
            else:
                yield from _label_maps(v)
    elif isinstance(value, list):
        for v in value:
            yield from _label_maps(v)


def test_the_most_labels_spotctl_adds_is_what_config_leaves_room_for():
    """infra/naming.py GCP_SPOTCTL_LABELS_MAX is the most spotctl-* labels any resource gets (jobs with
    a kept boot disk and a gang, a pool); with the most user labels validation allows, the fullest
    resource has exactly GCE's 64 with the label pulumi-gcp adds (and rule gcp.labels-64 passed at registration)."""
    from infra.naming import GCP_SPOTCTL_LABELS_MAX

    user = {f"k{i}": "v" for i in range(64 - GCP_SPOTCTL_LABELS_MAX - 1)}
    jobs = [gcp_job(bootDisk="keep"), gcp_job(id="gang", nodes=2)]
    plan = plan_of(stack_config(GCP_BASE, pools=[POOL], jobs=jobs, labels=user))
    maps = [m for r in plan.resources for m in _label_maps(r.inputs)]
    assert max(sum(k.startswith("spotctl-") for k in m) for m in maps) == GCP_SPOTCTL_LABELS_MAX
    assert max(len(m) for m in maps) == 63  # + goog-pulumi-provisioned, which the provider adds


def test_pool_external_ip_only_when_asked():
    plan = plan_of(stack_config(GCP_BASE, pools=[{**POOL, "externalIp": True}]))
    assert only(plan, TEMPLATE, "spot").inputs["networkInterfaces"][0]["accessConfigs"] == [{}]


# ---- jobs -----------------------------------------------------------------------------------------


def test_job_disk_and_instance():
    plan = plan_of(raw_stack())
    disk = only(plan, DISK, "job-train")
    assert disk.protect is True
    assert disk.inputs["zone"] == "us-central1-a" and disk.inputs["size"] == 200.0
    assert disk.inputs["labels"]["spotctl-job"] == "train" and disk.inputs["labels"]["spotctl-stack"] == "team-a"
    vm = only(plan, INSTANCE, "job-train")
    assert vm.delete_before_replace is True
    inputs = vm.inputs
    assert inputs["zone"] == "us-central1-a"
    assert inputs["attachedDisks"] == [
        {"deviceName": "spotctl-data", "mode": "READ_WRITE", "source": f"https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a/disks/{disk.inputs['name']}"}
    ]
    assert inputs["bootDisk"]["autoDelete"] is True  # per attempt; the job disk is the attached one
    assert inputs["scheduling"]["provisioningModel"] == "SPOT"
    assert inputs["scheduling"]["instanceTerminationAction"] == "STOP"
    assert inputs["scheduling"]["automaticRestart"] is False
    assert "accessConfigs" not in inputs["networkInterfaces"][0]
    assert inputs["labels"]["spotctl-stack"] == "team-a" and inputs["labels"]["spotctl-job"] == "train"
    script = inputs["metadata"]["startup-script"]
    assert bootstrap_config(script)["disk_device"] == "/dev/disk/by-id/google-spotctl-data"
    assert bootstrap_config(script)["command"] == "python train.py"


def test_new_attempt_changes_the_instance_name_but_not_the_disk():
    one = plan_of(raw_stack(jobs=[gcp_job(attempt=1, state="running")]))
    two = plan_of(raw_stack(jobs=[gcp_job(attempt=2, state="running")]))
    d1, d2 = only(one, DISK, "job-train"), only(two, DISK, "job-train")
    assert d1.urn == d2.urn and d1.inputs == d2.inputs
    v1, v2 = only(one, INSTANCE, "job-train"), only(two, INSTANCE, "job-train")
    assert v1.inputs["name"] == "team-a-train-a1-n0" and v2.inputs["name"] == "team-a-train-a2-n0"
    # Same logical resource, so the change is a delete-before-replace of the VM.
    assert v1.urn == v2.urn and v2.delete_before_replace
    assert bootstrap_config(v2.inputs["metadata"]["startup-script"])["attempt"] == 2
    # Same master address, new rendezvous port: a leftover of attempt 1 cannot join attempt 2.
    assert bootstrap_config(v1.inputs["metadata"]["startup-script"])["master_port"] == 29501
    assert bootstrap_config(v2.inputs["metadata"]["startup-script"])["master_port"] == 29502


def test_switching_capacity_changes_only_the_scheduling():
    spot = only(plan_of(raw_stack(jobs=[gcp_job(capacity="spot")])), INSTANCE).inputs
    od = only(plan_of(raw_stack(jobs=[gcp_job(capacity="on-demand")])), INSTANCE).inputs
    assert {k for k in spot.keys() | od.keys() if spot.get(k) != od.get(k)} == {"scheduling", "metadata"}
    # the scripts only learn the capacity their `started` event records (spotctl switches with a new attempt anyway)
    for key in ("startup-script", "shutdown-script"):
        a, b = bootstrap_config(spot["metadata"][key]), bootstrap_config(od["metadata"][key])
        assert {k for k in a if a[k] != b[k]} == {"capacity"} and (a["capacity"], b["capacity"]) == ("spot", "on-demand")
    assert od["scheduling"] == {
        "automaticRestart": True, "onHostMaintenance": "TERMINATE", "preemptible": False, "provisioningModel": "STANDARD",
    }


@pytest.mark.parametrize("state", ["completed", "failed", "preempted", "stopped"])
def test_job_not_running_declares_its_disk_and_no_instance(state):
    plan = plan_of(raw_stack(jobs=[gcp_job(state=state, nodes=2)]))
    assert [r.name for r in plan.by_type(DISK)] == ["job-train-n0-disk", "job-train-n1-disk"]
    assert plan.by_type(INSTANCE) == []
    assert all(d.protect is True for d in plan.by_type(DISK))  # a completed job's too (infra.common.PROTECT_DISKS)
    assert plan.outputs["jobs"]["train"]["instances"] == []


def test_multi_node_job_reserves_the_master_address():
    plan = plan_of(raw_stack(jobs=[gcp_job(nodes=3)]))
    addr = only(plan, "gcp:compute/address:Address")
    assert addr.inputs["addressType"] == "INTERNAL" and addr.inputs["region"] == "us-central1"
    ip = plan.outputs["jobs"]["train"]["masterAddress"]
    vms = plan.by_type(INSTANCE)
    assert [v.inputs["name"] for v in vms] == [f"team-a-train-a1-n{r}" for r in range(3)]
    assert vms[0].inputs["networkInterfaces"][0]["networkIp"] == ip
    assert all("networkIp" not in v.inputs["networkInterfaces"][0] for v in vms[1:])
    for rank, vm in enumerate(vms):
        script = vm.inputs["metadata"]["startup-script"]
        cfg = bootstrap_config(script)
        assert cfg["master_addr"] == ip and cfg["node_rank"] == rank and cfg["world_size"] == 3
    # Disks per node, each its own.
    assert len({d.inputs["name"] for d in plan.by_type(DISK)}) == 3


def test_names_never_collide_across_jobs_or_stacks():
    raw = raw_stack(jobs=[gcp_job(id="a", nodes=2), gcp_job(id="a-n1"), gcp_job(id="b")], pools=[POOL, {**POOL, "name": "a-n0"}])
    p1, p2 = plan_of(raw, "team-a"), plan_of(raw, "team-b")
    for plan in (p1, p2):
        urns = [r.urn for r in plan.resources]
        assert len(urns) == len(set(urns))
    # (An object's name is its bucket's: the agent has one name per digest in every stack's own bucket.)
    physical = lambda plan: {  # noqa: E731
        (r.type, r.inputs["name"]) for r in plan.resources if r.custom and "name" in r.inputs
        and r.type != "gcp:storage/bucketObject:BucketObject"
    }
    assert not physical(p1) & physical(p2)
    assert len(physical(p1)) == len([r for r in p1.resources if r.custom and "name" in r.inputs]) - 1


def test_every_vm_has_ownership_labels_and_no_external_ip_by_default():
    plan = plan_of(raw_stack(jobs=[gcp_job(nodes=2), gcp_job(id="ext", externalIp=True)]))
    for vm in plan.by_type(INSTANCE) + plan.by_type(TEMPLATE):
        assert vm.inputs["labels"]["spotctl-stack"] == "team-a"
        assert vm.inputs["labels"]["spotctl-managed"] == "true"
        has_ip = "accessConfigs" in vm.inputs["networkInterfaces"][0]
        assert has_ip == (vm.name == "job-ext-n0-vm")


# ---- shared per stack -----------------------------------------------------------------------------


def test_event_bucket_sink_and_identities():
    plan = plan_of(raw_stack())
    bucket = only(plan, "gcp:storage/bucket:Bucket").inputs
    assert bucket["uniformBucketLevelAccess"] is True
    assert bucket["versioning"] == {"enabled": False}
    assert bucket["publicAccessPrevention"] == "enforced"
    # events and logs expire; the stack file's shared copy beside them (team-a.spotctl/...) does not
    assert bucket["lifecycleRules"] == [{"action": {"type": "Delete"}, "condition": {"age": 30.0, "matchesPrefixes": ["team-a/"]}}]
    members = plan.by_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert {w.inputs["role"] for w in members} == {"roles/storage.objectCreator", "roles/storage.objectViewer"}
    assert len(members) == 4  # the job's own account and the pool's own account: each writes and reads
    for reader in (m for m in members if m.inputs["role"] == "roles/storage.objectViewer"):
        # the agent and its own prefix only
        expr = reader.inputs["condition"]["expression"]
        assert expr.startswith('resource.name.startsWith("projects/_/buckets/') and "/objects/_spotctl/agent/\")" in expr
        assert expr.endswith(('/objects/team-a/train/")', '/objects/team-a/l4/")')), expr
    agent = only(plan, "gcp:storage/bucketObject:BucketObject")
    assert agent.inputs["name"] == artifact().object_name and agent.retain_on_delete
    project_roles = {r.inputs["role"] for r in plan.by_type("gcp:projects/iAMMember:IAMMember")}
    assert project_roles == {"roles/logging.logWriter"}
    sink = only(plan, "gcp:logging/projectSink:ProjectSink").inputs
    assert 'protoPayload.methodName="compute.instances.preempted"' in sink["filter"]
    # the stack's instance-name prefix: the same size at any number of jobs (gcp.sink-filter-size)
    assert 'protoPayload.resourceName=~"/instances/team-a-[a-z0-9-]*[a-z0-9]$"' in sink["filter"]
    assert sink["destination"] == "pubsub.googleapis.com/projects/proj-1/topics/team-a-preemptions"
    pub = only(plan, "gcp:pubsub/topicIAMMember:TopicIAMMember").inputs
    assert pub["role"] == "roles/pubsub.publisher" and pub["member"].startswith("serviceAccount:")


def test_stack_outputs():
    plan = plan_of(raw_stack(jobs=[gcp_job(nodes=2, capacity="on-demand", attempt=4)]))
    job = plan.outputs["jobs"]["train"]
    assert job["disks"] == ["team-a-train-n0-disk", "team-a-train-n1-disk"]
    assert job["instances"] == ["team-a-train-a4-n0", "team-a-train-a4-n1"]
    assert job["zone"] == "us-central1-a" and job["capacity"] == "on-demand"
    assert job["masterAddress"].startswith("10.")
    assert plan.outputs["pools"]["l4"]["migs"] == {"ondemand": "team-a-l4-ondemand", "spot": "team-a-l4-spot"}
    assert plan.outputs["eventBucket"].startswith("team-a-events-")


def test_components_are_canonical():
    plan = plan_of(raw_stack(jobs=[gcp_job(nodes=2)]))
    components = [r for r in plan.resources if not r.custom]
    assert {c.type for c in components} == {
        "spotctl:gcp:StackBase", "spotctl:gcp:GpuPool", "spotctl:gcp:TrainingJob", "spotctl:gcp:ServiceAccount",
        "spotctl:gcp:Egress",
    }
    by_urn = {r.urn: r for r in plan.resources}
    for r in plan.resources:
        if r.parent is not None:
            assert r.name.startswith(by_urn[r.parent].name + "-"), (r.name, by_urn[r.parent].name)
        else:
            assert not r.custom or r.type == "pulumi:providers:gcp", f"{r.name} is not inside a component"


# ---- inputs against the provider's schema ---------------------------------------------------------


def _doc(cls, prop: str) -> str:
    return inspect.getdoc(getattr(cls, prop)) or ""


@pytest.mark.parametrize(
    ("cls", "prop", "values"),
    [
        (gcp.compute.InstanceSchedulingArgs, "provisioning_model", ["SPOT", "STANDARD"]),
        (gcp.compute.InstanceSchedulingArgs, "instance_termination_action", ["STOP", "DELETE"]),
        (gcp.compute.InstanceSchedulingArgs, "on_host_maintenance", ["TERMINATE"]),
        (gcp.compute.InstanceAttachedDiskArgs, "mode", ["READ_WRITE"]),
        (gcp.compute.Address, "address_type", ["INTERNAL"]),
        (gcp.compute.Address, "purpose", ["GCE_ENDPOINT"]),
        (gcp.storage.Bucket, "public_access_prevention", ["enforced"]),
    ],
)
def test_enum_values_we_use_are_documented_by_pulumi_gcp(cls, prop, values):
    # distributionPolicyTargetShape (BALANCED/EVEN) is not enumerated in the SDK; it is checked against
    # GCP's documentation in ../shared/reference and remains unverifiable without a real preview.
    doc = _doc(cls, prop)
    for value in values:
        assert value in doc, f"{cls.__name__}.{prop}: {value!r} not in its docstring"


def test_workers_wait_for_the_new_master():
    plan = plan_of(raw_stack(jobs=[gcp_job(nodes=3)]))
    master, *workers = plan.by_type(INSTANCE)
    assert master.inputs["name"].endswith("-n0")
    assert all(master.urn in w.dependencies for w in workers)
    assert master.urn not in master.dependencies
