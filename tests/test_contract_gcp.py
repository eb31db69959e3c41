"""The GCP rules of infra/contract/gcp.py: props that break each rule get its error, spotctl's own
resources pass (the example stacks are planned with every rule in tests/test_contract.py), and a
component that breaks a rule is stopped inside the real program under mocks."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.app import app
from infra import contract
from infra.contract import UNKNOWN, ContractError
from infra.contract import gcp as rules

runner = CliRunner()
VM, TMPL = rules.INSTANCE, rules.INSTANCE_TEMPLATE
SUB = "projects/p/regions/us-central1/subnetworks/default"
GOOD_VM = {
    "machine_type": "a3-highgpu-8g",
    "boot_disk": {"initialize_params": {"image": "projects/deeplearning-platform-release/global/images/family/x"}},
    "metadata": {"install-nvidia-driver": "True"},
    "scheduling": {"provisioning_model": "SPOT", "preemptible": True, "automatic_restart": False,
                   "on_host_maintenance": "TERMINATE"},
    "network_interfaces": [{"network": "default", "subnetwork": SUB, "nic_type": "GVNIC"}],
}


def broken(rule_id: str, type_: str, props: dict) -> str:
    with pytest.raises(ContractError) as err:
        contract.check(type_, "r", props)
    text = str(err.value)
    assert f"rule {rule_id}:" in text, text
    return text


def with_(base: dict, **over) -> dict:
    return {**base, **over}


def test_spotctls_own_vm_shape_passes():
    contract.check(VM, "vm", GOOD_VM)


@pytest.mark.parametrize(
    ("machine", "accs"),
    [
        ("g2-standard-8", [{"type": "nvidia-l4", "count": 2}]),
        ("a3-highgpu-8g", [{"type": "nvidia-h100-80gb", "count": 4}]),
        ("n2-standard-8", [{"type": "nvidia-tesla-t4", "count": 1}]),
        ("n1-standard-8", [{"type": "nvidia-tesla-t4", "count": 3}]),
        ("n1-standard-8", [{"type": "nvidia-tesla-t4", "count": 1}, {"type": "nvidia-tesla-p4", "count": 1}]),
    ],
)
def test_gpu_machine_pair(machine, accs):
    props = with_(GOOD_VM, machine_type=machine, guest_accelerators=accs,
                  network_interfaces=[{"network": "default", "subnetwork": SUB}])
    broken("gcp.gpu-machine-pair", VM, props)


def test_gpu_machine_pair_accepts_what_gce_sells():
    for machine, accs in [
        ("a3-highgpu-8g", None),
        ("a3-highgpu-8g", [{"type": "nvidia-h100-80gb", "count": 8}]),  # matching is accepted too
        ("n1-standard-8", [{"type": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", "count": 2}]),
        ("n1-standard-8", [{"type": "nvidia-tesla-t4", "count": 0}]),  # count 0 is dropped by the provider
    ]:
        contract.check(VM, "vm", with_(GOOD_VM, machine_type=machine, guest_accelerators=accs))
    contract.check(VM, "vm", with_(GOOD_VM, guest_accelerators=UNKNOWN))


def test_gpu_vms_terminate_on_host_maintenance():
    sched = {**GOOD_VM["scheduling"], "on_host_maintenance": "MIGRATE"}
    broken("gcp.gpu-terminate-on-maintenance", VM, with_(GOOD_VM, scheduling=sched))
    cpu = with_(GOOD_VM, machine_type="n1-standard-8", scheduling=sched, network_interfaces=[{"subnetwork": SUB}])
    contract.check(VM, "vm", cpu)


def test_spot_scheduling():
    sched = {**GOOD_VM["scheduling"], "automatic_restart": True}
    broken("gcp.spot-scheduling", VM, with_(GOOD_VM, scheduling=sched))


def test_template_region():
    tmpl = with_(GOOD_VM, network_interfaces=[{"network": "default", "subnetwork": "default", "nic_type": "GVNIC"}])
    text = broken("gcp.template-region", TMPL, tmpl)
    assert "fix: pass region=cfg.region" in text
    contract.check(TMPL, "t", with_(tmpl, region="us-central1"))
    contract.check(TMPL, "t", GOOD_VM)  # a full subnetwork path needs no region


def test_custom_network_subnetwork():
    nic = {"network": "ml-vpc", "subnetwork": SUB, "nic_type": "GVNIC"}
    broken("gcp.custom-network-subnetwork", VM, with_(GOOD_VM, network_interfaces=[nic]))
    broken("gcp.custom-network-subnetwork", VM, with_(GOOD_VM, network_interfaces=[{**nic, "subnetwork": None}]))
    contract.check(VM, "vm", with_(GOOD_VM, network_interfaces=[{**nic, "subnetwork": SUB.replace("default", "ml")}]))


def test_gvnic_on_third_generation_series():
    nic = {"network": "default", "subnetwork": SUB, "nic_type": "VIRTIO_NET"}
    broken("gcp.gvnic", VM, with_(GOOD_VM, network_interfaces=[nic]))
    broken("gcp.gvnic", VM, with_(GOOD_VM, network_interfaces=[{**nic, "nic_type": None}]))
    g2 = with_(GOOD_VM, machine_type="g2-standard-8", network_interfaces=[{**nic, "nic_type": None}])
    contract.check(VM, "vm", g2)
    assert [m for m in ("a2-highgpu-1g", "g2-standard-8", "n1-standard-8", "a3-megagpu-8g", "a4x-highgpu-4g", "g4-standard-48")
            if rules.needs_gvnic(m)] == ["a3-megagpu-8g", "a4x-highgpu-4g", "g4-standard-48"]


def test_dlvm_driver():
    broken("gcp.dlvm-driver", VM, with_(GOOD_VM, metadata={"startup-script": "x"}))
    tmpl = {"machine_type": "g2-standard-8", "region": "r", "metadata": {}, "scheduling": GOOD_VM["scheduling"],
            "disks": [{"boot": True, "source_image": "projects/deeplearning-platform-release/global/images/family/x"}]}
    broken("gcp.dlvm-driver", TMPL, tmpl)
    contract.check(TMPL, "t", with_(tmpl, disks=[{"boot": True, "source_image": "projects/acme/global/images/mine"}]))
    contract.check(TMPL, "t", with_(tmpl, machine_type="n1-standard-8"))  # no GPU, no driver needed


def test_kept_boot_disk_is_never_auto_deleted():
    vm = with_(GOOD_VM, boot_disk={"source": "projects/p/zones/z/disks/b"}, metadata={})
    broken("gcp.kept-boot-disk", VM, vm)
    broken("gcp.kept-boot-disk", VM, with_(vm, boot_disk={"source": "d", "auto_delete": True}))
    contract.check(VM, "vm", with_(vm, boot_disk={"source": "d", "auto_delete": False}))


@pytest.mark.parametrize("aid", ["short", "a" * 31, "Team-a-jobs", "team-a-jobs-", "1team-jobs", "team_a_jobs"])
def test_service_account_id(aid):
    broken("gcp.service-account-id", rules.ACCOUNT, {"account_id": aid})


def test_service_account_ids_spotctl_builds_are_valid():
    from infra.gcp import _account_id

    for slug, what in [("team-a", "job-x"), ("a-very-long-stack-n", "job-" + "j" * 30), ("s", "pool-p")]:
        aid = _account_id(slug, what)
        contract.check(rules.ACCOUNT, "sa", {"account_id": aid})
        assert 6 <= len(aid) <= 30


def test_bucket_ubla():
    broken("gcp.bucket-ubla", rules.BUCKET, {"uniform_bucket_level_access": False})
    broken("gcp.bucket-ubla", rules.BUCKET, {})
    contract.check(rules.BUCKET, "b", {"uniform_bucket_level_access": True})


@pytest.mark.parametrize("condition", [
    None,
    {"title": "t", "expression": 'resource.name.startsWith("projects/_/buckets/b/objects/team-a/train")'},
    {"title": "t", "expression": 'resource.name.startsWith("projects/_/buckets/b/objects/")'},
    {"title": "t", "expression": 'resource.name.startsWith("projects/_/buckets/b/objects/team-a/") || true'},
])
def test_event_writer_prefix(condition):
    props = {"role": "roles/storage.objectCreator", "member": "serviceAccount:x", "condition": condition}
    broken("gcp.event-writer-prefix", rules.BUCKET_IAM_MEMBER, props)


def test_event_writer_prefix_accepts_a_name_prefix():
    expr = 'resource.name.startsWith("projects/_/buckets/b/objects/team-a/train/")'
    contract.check(rules.BUCKET_IAM_MEMBER, "w", {"role": "roles/storage.objectCreator", "condition": {"expression": expr}})
    contract.check(rules.BUCKET_IAM_MEMBER, "w", {"role": "roles/storage.objectCreator", "condition": {"expression": UNKNOWN}})


def test_sink_filter_exact():
    base = 'resource.type="gce_instance" AND protoPayload.methodName="compute.instances.preempted" AND '
    broken("gcp.sink-filter-exact", rules.PROJECT_SINK, {"filter": base + 'protoPayload.resourceName:"/instances/team-a-"'})
    broken("gcp.sink-filter-exact", rules.PROJECT_SINK, {"filter": base + 'protoPayload.resourceName=~"/instances/team-a-"'})
    names = 'protoPayload.resourceName=~"/instances/(team-a-x-a[0-9]+-n[0-9]+)$"'
    log = 'logName=~"/logs/cloudaudit[.]googleapis[.]com%2Fsystem_event$" AND '
    contract.check(rules.PROJECT_SINK, "s", {"filter": base + log + names})
    # Without the System Event log restriction a job's own log entries could pass.
    broken("gcp.sink-filter-exact", rules.PROJECT_SINK, {"filter": base + names})
    broken("gcp.sink-filter-exact", rules.PROJECT_SINK,
           {"filter": base + 'logName=~"cloudaudit[.]googleapis[.]com%2Fsystem_event" AND ' + names})


def test_nat_subnetworks():
    broken("gcp.nat-subnetworks", rules.ROUTER_NAT, {"source_subnetwork_ip_ranges_to_nat": "ALL_SUBNETWORKS_ALL_IP_RANGES"})
    broken("gcp.nat-subnetworks", rules.ROUTER_NAT, {"source_subnetwork_ip_ranges_to_nat": "LIST_OF_SUBNETWORKS", "subnetworks": []})


def test_firewall_sources():
    broken("gcp.firewall-sources", rules.FIREWALL, {"network": "n", "allows": [{"protocol": "all"}]})
    mixed = {"network": "n", "source_service_accounts": ["a@x"], "target_tags": ["t"]}
    broken("gcp.firewall-sources", rules.FIREWALL, mixed)
    contract.check(rules.FIREWALL, "f", {"network": "n", "source_service_accounts": ["a@x"], "target_service_accounts": ["a@x"]})


def test_iam_display_names_and_titles_are_at_most_100_utf8_bytes():
    broken("gcp.iam-display-100-bytes", rules.ACCOUNT, {"account_id": "spotctl-a", "display_name": "x" * 101})
    broken("gcp.iam-display-100-bytes", rules.CUSTOM_ROLE, {"role_id": "r_1", "permissions": ["p"], "title": "é" * 51})
    contract.check(rules.ACCOUNT, "a", {"account_id": "spotctl-a", "display_name": "x" * 100})
    assert rules.iam_display("x" * 120) == "x" * 100
    cut = rules.iam_display("x" * 99 + "é")  # é is 2 bytes: it does not fit, and is not cut in half
    assert cut == "x" * 99 and len(rules.iam_display("é" * 60).encode()) == 100


def test_at_most_64_labels_on_a_resource_and_the_disks_it_creates():
    """64 with the one pulumi-gcp adds (goog-pulumi-provisioned): 63 declared at the most."""
    many = {f"k{i}": "v" for i in range(64)}
    broken("gcp.labels-64", rules.DISK, {"labels": many})
    broken("gcp.labels-64", VM, with_(GOOD_VM, boot_disk={"initialize_params": {"image": "x", "labels": many}}))
    broken("gcp.labels-64", TMPL, {"machine_type": "n2-standard-8", "disks": [{"labels": many}]})
    contract.check(rules.DISK, "d", {"labels": dict(list(many.items())[:63])})


def test_mig_wait_is_a_context_rule():
    r = contract.get("gcp.mig-no-wait-on-spot")
    assert r.types == () and r.check is None and "region_instance_group_manager.py" in r.source
    with pytest.raises(ContractError, match="gcp.mig-no-wait-on-spot"):
        contract.enforce("gcp.mig-no-wait-on-spot", "pool-x-spot-mig", "wait_for_instances on a spot group")


def test_autoscaled_mig_shape_is_a_context_rule():
    r = contract.get("gcp.autoscaled-mig-shape")
    assert r.types == () and r.check is None and "release-notes" in r.source
    assert rules.autoscaled_shape_problem("BALANCED") is None and rules.autoscaled_shape_problem("EVEN") is None
    assert rules.autoscaled_shape_problem(None) is None  # EVEN is GCE's default
    assert rules.autoscaled_shape_problem(UNKNOWN) is None
    for shape in ("ANY", "ANY_SINGLE_ZONE"):
        with pytest.raises(ContractError, match="gcp.autoscaled-mig-shape"):
            contract.enforce("gcp.autoscaled-mig-shape", "pool-x-spot-mig", rules.autoscaled_shape_problem(shape))


def test_balanced_shape_needs_redistribution_off():
    mig = {"distribution_policy_target_shape": "BALANCED", "update_policy": {"instance_redistribution_type": "NONE"}}
    contract.check(rules.REGION_MIG, "m", mig)
    contract.check(rules.REGION_MIG, "m", {"distribution_policy_target_shape": "EVEN"})
    broken("gcp.mig-shape-redistribution", rules.REGION_MIG, {"distribution_policy_target_shape": "BALANCED"})
    broken("gcp.mig-shape-redistribution", rules.REGION_MIG,
           {"distribution_policy_target_shape": "ANY_SINGLE_ZONE", "update_policy": {"instance_redistribution_type": "PROACTIVE"}})


def test_an_autoscaled_pool_part_with_shape_any_fails_plan(monkeypatch):
    """The pool's autoscaled parts are checked where the autoscaler and its MIG meet (infra/gcp.py)."""
    from infra import gcp

    monkeypatch.setattr(gcp, "autoscaled_shape_problem", lambda shape: rules.autoscaled_shape_problem("ANY"))
    result = runner.invoke(app, ["plan", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert "rule gcp.autoscaled-mig-shape" in result.output and "Traceback" not in result.output


def test_a_gcp_violation_in_the_program_fails_plan(monkeypatch):
    """A component that forgets gVNIC on an A3 is stopped at registration under the mocks."""
    from infra import gcp_common as gcp

    monkeypatch.setattr(gcp, "needs_gvnic", lambda machine: False)
    result = runner.invoke(app, ["plan", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert "rule gcp.gvnic" in result.output and "a3-highgpu-8g" in result.output
    assert "Traceback" not in result.output
