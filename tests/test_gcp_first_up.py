"""What a first real `pulumi up` of a GCP stack needs, checked on the plan (Pulumi mocks) and
through `spotctl validate` / `spotctl plan` on real stack files.

The "done when" stack: no `gcp:*` provider keys, a custom network, a G2 job, A3 jobs of 1 and 4 nodes,
a completed job and a pool."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from cli.app import app
from cli.lifecycle.apply import disk_urns
from tests.conftest import GCP_BASE, gcp_job, stack_config
from tests.test_gcp_components import DISK, INSTANCE, MIG, TEMPLATE, only, plan_of

FIREWALL = "gcp:compute/firewall:Firewall"
NAT = "gcp:compute/routerNat:RouterNat"
ROUTER = "gcp:compute/router:Router"
SUBNET = "projects/proj-1/regions/us-central1/subnetworks/ml-subnet"

DONE_WHEN = {
    **GCP_BASE,
    "network": {"network": "ml-vpc", "subnetwork": "ml-subnet"},
    "pools": [{"name": "l4", "machineType": "g2-standard-8", "onDemand": 1, "spotMax": 4, "agentCommand": "agent"}],
    "jobs": [
        gcp_job(id="g2", machineType="g2-standard-24", accelerator={"type": "nvidia-l4", "count": 2}),
        gcp_job(id="a3-one", machineType="a3-highgpu-1g"),
        gcp_job(id="a3-four", machineType="a3-highgpu-8g", accelerator={"type": "nvidia-h100-80gb", "count": 8},
                nodes=4, state="running", attempt=2),
        gcp_job(id="done", machineType="a2-highgpu-1g", state="completed", attempt=3),
    ],
}


def write_stack(tmp_path: Path, cfg: dict, name: str = "team-a") -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": {f"spotctl:{k}": v for k, v in cfg.items()}}, sort_keys=False))
    return path


# ---- validate / plan on real files ---------------------------------------------------------------


def test_done_when_stack_validates_and_plans_with_every_rule(runner, tmp_path):
    path = write_stack(tmp_path, DONE_WHEN)
    assert "gcp:region" not in path.read_text()
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["plan", "--stack-file", str(path), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    providers = [r for r in plan["resources"] if r["type"] == "pulumi:providers:gcp"]
    assert [p["inputs"] for p in providers] == [{"project": "proj-1", "region": "us-central1"}]
    provider_ref = f"{providers[0]['urn']}::gcp-id"
    clouds = [r for r in plan["resources"] if r["type"].startswith("gcp:")]
    assert clouds and all(r["options"]["provider"] == provider_ref for r in clouds)


def test_example_stack_lists_its_explicit_provider(runner, project):
    result = runner.invoke(app, ["plan", "--stack", "example-gcp", "--json"])
    assert result.exit_code == 0, result.output
    providers = [r for r in json.loads(result.output)["resources"] if r["type"] == "pulumi:providers:gcp"]
    assert [p["inputs"] for p in providers] == [{"project": "my-ml-project", "region": "us-central1"}]


@pytest.mark.parametrize(
    ("where", "machine", "acc", "says"),
    [
        ("pools", "g2-standard-8", {"type": "nvidia-l4", "count": 2},
         "spotctl:pools[0].accelerator: g2-standard-8 comes with 1 x nvidia-l4, not 2: for 2 x nvidia-l4 use g2-standard-24"),
        ("jobs", "a3-highgpu-8g", {"type": "nvidia-h100-80gb", "count": 4},
         "spotctl:jobs[0].accelerator: a3-highgpu-8g comes with 8 x nvidia-h100-80gb, not 4: for 4 x nvidia-h100-80gb use a3-highgpu-4g"),
        ("jobs", "a2-highgpu-1g", {"type": "nvidia-l4", "count": 1},
         "spotctl:jobs[0].accelerator: a2-highgpu-1g comes with 1 x nvidia-tesla-a100, not 'nvidia-l4'"),
        ("jobs", "n1-standard-16", {"type": "nvidia-tesla-t4", "count": 8},
         "spotctl:jobs[0].accelerator: nvidia-tesla-t4 on N1 comes in counts 1, 2, 4, got 8"),
        ("jobs", "n2-standard-8", {"type": "nvidia-tesla-t4", "count": 1},
         "spotctl:jobs[0].accelerator: GPUs cannot be attached to n2-standard-8"),
        ("jobs", "a3-highgpu-3g", None, "spotctl:jobs[0].machineType: unknown machine type 'a3-highgpu-3g' (did you mean 'a3-highgpu-8g'"),
    ],
)
def test_validate_refuses_impossible_machine_gpu_pairs(runner, tmp_path, where, machine, acc, says):
    item = (
        {"name": "p", "machineType": machine, "spotMax": 1} if where == "pools"
        else gcp_job(machineType=machine)
    )
    if acc:
        item["accelerator"] = acc
    path = write_stack(tmp_path, {**GCP_BASE, where: [item]})
    before = path.read_bytes()
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 1
    assert says in result.output
    assert path.read_bytes() == before


def test_validate_names_the_allowed_counts(runner, tmp_path):
    job = gcp_job(machineType="g2-standard-8", accelerator={"type": "nvidia-l4", "count": 3})
    path = write_stack(tmp_path, {**GCP_BASE, "jobs": [job]})
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 1
    assert "allowed counts per machine type: g2-standard-4: 1, g2-standard-8: 1," in result.output
    assert "g2-standard-24: 2, g2-standard-48: 4, g2-standard-96: 8" in result.output


def test_custom_network_needs_a_subnetwork(runner, tmp_path):
    path = write_stack(tmp_path, {**GCP_BASE, "network": {"network": "ml-vpc"}, "jobs": [gcp_job()]})
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 1
    assert "spotctl:network.subnetwork: required when network is 'ml-vpc'" in result.output


def test_a_pool_may_not_share_a_jobs_event_prefix(runner, tmp_path):
    pool = {"name": "train", "machineType": "g2-standard-8", "spotMax": 1}
    path = write_stack(tmp_path, {**GCP_BASE, "pools": [pool], "jobs": [gcp_job()]})
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 1
    assert "spotctl:pools[0].name: pool 'train' has the name of a job" in result.output


# ---- what the plan declares ------------------------------------------------------------------------


def test_templates_and_vms_name_their_subnetwork_by_full_path_and_region():
    plan = plan_of(DONE_WHEN)
    for tmpl in plan.by_type(TEMPLATE):
        assert tmpl.inputs["region"] == "us-central1"
        assert tmpl.inputs["networkInterfaces"][0]["subnetwork"] == SUBNET
    for vm in plan.by_type(INSTANCE):
        assert vm.inputs["networkInterfaces"][0]["subnetwork"] == SUBNET
        assert vm.inputs["networkInterfaces"][0]["network"] == "ml-vpc"
    assert only(plan, "gcp:compute/address:Address").inputs["subnetwork"] == SUBNET


def test_gpus_gvnic_and_driver_per_machine_type():
    plan = plan_of(DONE_WHEN)
    vms = {vm.name: vm.inputs for vm in plan.by_type(INSTANCE)}
    assert set(vms) == {"job-g2-n0-vm", "job-a3-one-n0-vm"} | {f"job-a3-four-n{r}-vm" for r in range(4)}
    for name, vm in vms.items():
        assert "guestAccelerators" not in vm, name  # G2 and A3 bring their GPUs
        assert vm["metadata"]["install-nvidia-driver"] == "True", name  # Deep Learning VM image
        nic = vm["networkInterfaces"][0]
        assert nic.get("nicType") == ("GVNIC" if "a3" in name else None), name
    for tmpl in plan.by_type(TEMPLATE):  # g2 pool: L4 + DLVM
        assert tmpl.inputs["metadata"]["install-nvidia-driver"] == "True"
        assert "nicType" not in tmpl.inputs["networkInterfaces"][0]


def test_n1_gets_guest_accelerators_and_custom_images_no_driver_flag():
    jobs = [
        gcp_job(id="t4", machineType="n1-standard-8", accelerator={"type": "nvidia-tesla-t4", "count": 2}),
        gcp_job(id="own", image="projects/acme/global/images/family/trainer"),
        gcp_job(id="cpu", machineType="n1-standard-8"),
    ]
    plan = plan_of(stack_config(GCP_BASE, jobs=jobs))
    t4 = only(plan, INSTANCE, "job-t4").inputs
    assert t4["guestAccelerators"] == [{"count": 2.0, "type": "nvidia-tesla-t4"}]
    assert t4["metadata"]["install-nvidia-driver"] == "True"
    assert "install-nvidia-driver" not in only(plan, INSTANCE, "job-own").inputs["metadata"]
    cpu = only(plan, INSTANCE, "job-cpu").inputs
    assert "install-nvidia-driver" not in cpu["metadata"] and "guestAccelerators" not in cpu


def test_cloud_nat_for_the_stacks_subnetwork_by_default():
    plan = plan_of(DONE_WHEN)
    router = only(plan, ROUTER).inputs
    assert router["network"] == "ml-vpc" and router["region"] == "us-central1"
    nat = only(plan, NAT)
    assert nat.inputs["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
    assert nat.inputs["subnetworks"] == [
        {"name": f"https://www.googleapis.com/compute/v1/{SUBNET}", "sourceIpRangesToNats": ["ALL_IP_RANGES"]}
    ]
    assert nat.inputs["natIpAllocateOption"] == "AUTO_ONLY"
    # VMs and templates wait for the NAT: their first event upload has a way out.
    for vm in plan.by_type(INSTANCE) + plan.by_type(TEMPLATE):
        assert nat.urn in vm.dependencies, vm.name


def test_egress_existing_declares_no_nat():
    cfg = {**DONE_WHEN, "network": {**DONE_WHEN["network"], "egress": "existing"}}
    plan = plan_of(cfg)
    assert plan.by_type(NAT) == [] and plan.by_type(ROUTER) == []


def test_every_job_and_pool_has_its_own_identity_limited_to_its_prefix():
    plan = plan_of(DONE_WHEN)
    bucket = plan.outputs["eventBucket"]
    members = plan.by_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    writers = {w.name: w.inputs for w in members if w.name.endswith("-events-writer")}
    readers = {r.name: r.inputs for r in members if not r.name.endswith("-events-writer")}
    assert set(readers) == {f"job-{n}-sa-reader" for n in ["g2", "a3-one", "a3-four", "done"]} | {"pool-l4-sa-reader"}
    assert {r["role"] for r in readers.values()} == {"roles/storage.objectViewer"}
    names = ["g2", "a3-one", "a3-four", "done"]
    assert set(writers) == {f"job-{n}-sa-events-writer" for n in names} | {"pool-l4-sa-events-writer"}
    for owner in [f"job-{n}" for n in names] + ["pool-l4"]:
        w = writers[f"{owner}-sa-events-writer"]
        prefix = f"team-a/{owner.split('-', 1)[1]}/"
        assert w["role"] == "roles/storage.objectCreator"
        assert w["condition"]["expression"] == f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}")'
        account = only(plan, "gcp:serviceaccount/account:Account", f"{owner}-sa").inputs
        assert w["member"] == f"serviceAccount:{account['accountId']}@proj-1.iam.gserviceaccount.com"
    for vm in plan.by_type(INSTANCE):
        job = vm.name.rsplit("-n", 1)[0].removeprefix("job-")
        assert vm.inputs["serviceAccount"]["email"].startswith(f"team-a-job-{job}@"), vm.name


def _sink_regex(plan) -> re.Pattern:
    filt = only(plan, "gcp:logging/projectSink:ProjectSink").inputs["filter"]
    return re.compile(re.search(r'protoPayload\.resourceName=~"([^"]+)"', filt).group(1))


def test_sink_filter_matches_this_stacks_name_prefix():
    """The prefix of every instance name the stack gives (not each job's name: the filter's size stays
    the same at any number of jobs); a VM of another stack sharing it is dropped by the watcher, which
    acts only on VMs Compute Engine lists under this stack's owner label (test_stack_identity.py)."""
    rx = _sink_regex(plan_of(DONE_WHEN))
    vm = "projects/proj-1/zones/us-central1-a/instances/"
    for mine in ("team-a-a3-four-a2-n3", "team-a-g2-a17-n0", "team-a-l4-spot-x7k2", "team-a-l4-ondemand-0abc"):
        assert rx.search(vm + mine), mine
    for theirs in ("team-ab-g2-a1-n0", "x-team-a-g2-a1-n0", "team-a-", "team-a-g2-a1-n0/other", "team-a-G2-a1-n0"):
        assert not rx.search(vm + theirs), theirs


def test_sink_filter_takes_only_compute_engines_system_event_log():
    filt = only(plan_of(DONE_WHEN), "gcp:logging/projectSink:ProjectSink").inputs["filter"]
    rx = re.compile(re.search(r'logName=~"([^"]+)"', filt).group(1))
    assert rx.search("projects/proj-1/logs/cloudaudit.googleapis.com%2Fsystem_event")
    for forged in ("projects/proj-1/logs/spotctl", "projects/proj-1/logs/cloudaudit.googleapis.com%2Fsystem_event-x",
                   "projects/proj-1/logs/cloudaudit.googleapis.com%2Factivity",
                   "projects/proj-1/logs/cloudauditXgoogleapis.com%2Fsystem_event"):
        assert not rx.search(forged), forged


def test_sink_filter_with_nothing_declared_matches_nothing():
    rx = _sink_regex(plan_of(stack_config(GCP_BASE)))
    assert not rx.search("projects/p/zones/z/instances/team-a-x-a1-n0")


def test_multi_node_job_on_a_custom_network_gets_its_gang_firewall():
    plan = plan_of(DONE_WHEN)
    fw = only(plan, FIREWALL).inputs
    email = "team-a-job-a3-four@proj-1.iam.gserviceaccount.com"
    assert fw["network"] == "ml-vpc" and fw["direction"] == "INGRESS"
    assert fw["allows"] == [{"protocol": "all"}]
    assert fw["sourceServiceAccounts"] == [email] and fw["targetServiceAccounts"] == [email]
    # On the default network (default-allow-internal) none is declared.
    plan = plan_of(stack_config(GCP_BASE, jobs=[gcp_job(nodes=2)]))
    assert plan.by_type(FIREWALL) == []


def test_on_demand_mig_waits_spot_mig_does_not():
    plan = plan_of(DONE_WHEN | {"pools": [{**DONE_WHEN["pools"][0], "onDemand": 2}]})
    od, spot = only(plan, MIG, "ondemand").inputs, only(plan, MIG, "spot").inputs
    assert od["waitForInstances"] is True and od["waitForInstancesStatus"] == "STABLE"
    assert spot["waitForInstances"] is False and "waitForInstancesStatus" not in spot


# ---- bootDisk: keep --------------------------------------------------------------------------------


def test_kept_boot_disk_is_protected_and_every_attempt_boots_from_it():
    keep = [gcp_job(bootDisk="keep", nodes=2, state="running", attempt=1)]
    one = plan_of(stack_config(GCP_BASE, jobs=keep))
    two = plan_of(stack_config(GCP_BASE, jobs=[{**keep[0], "attempt": 2}]))
    for plan in (one, two):
        boots = [d for d in plan.by_type(DISK) if "boot" in d.name]
        assert [d.name for d in boots] == ["job-train-n0-boot-disk", "job-train-n1-boot-disk"]
        assert all(d.protect for d in boots)
        assert boots[0].inputs["name"] == "team-a-train-n0-boot"
        assert boots[0].inputs["image"].startswith("projects/deeplearning-platform-release/")
        assert boots[0].inputs["labels"]["spotctl-job"] == "train"
        vms = plan.by_type(INSTANCE)
        for rank, vm in enumerate(vms):
            boot = vm.inputs["bootDisk"]
            assert boot["autoDelete"] is False and "initializeParams" not in boot
            assert boot["source"].endswith(f"/disks/team-a-train-n{rank}-boot")
    assert [d.urn for d in one.by_type(DISK)] == [d.urn for d in two.by_type(DISK)]
    assert one.outputs["jobs"]["train"]["disks"] == [
        "team-a-train-n0-disk", "team-a-train-n0-boot", "team-a-train-n1-disk", "team-a-train-n1-boot",
    ]


def test_kept_boot_disk_of_a_completed_job_stays_protected_and_is_cleaned_up_with_it():
    plan = plan_of(stack_config(GCP_BASE, jobs=[gcp_job(bootDisk="keep", state="completed")]))
    assert plan.by_type(INSTANCE) == []
    boots = [d for d in plan.by_type(DISK) if "boot" in d.name]
    assert len(boots) == 1 and boots[0].protect is True  # protected as every declared job disk (infra.common.PROTECT_DISKS); cleanup lifts it
    assert boots[0].urn in disk_urns(plan, "train")


def test_boot_disk_keep_is_refused_on_aws(runner, tmp_path):
    from tests.conftest import AWS_BASE, aws_job

    path = write_stack(tmp_path, {**AWS_BASE, "jobs": [aws_job(bootDisk="keep")]})
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 1
    assert "spotctl:jobs[0].bootDisk: 'keep' is supported on GCP only" in result.output
