"""Multi-node jobs on EFA types: the gang shares a cluster placement group and a security group that
admits and sends all traffic to itself (EFA's rule); other jobs get neither; an upgrade that adds the
group never replaces a running VM (the next attempt's VMs are placed)."""

from __future__ import annotations

import pytest

from cli.plan import mocks as planner
from infra import contract
from infra.config import validate
from infra.contract import ContractError
from infra.contract.aws_fleet import cluster_placement_problem, efa_interfaces
from tests.conftest import AWS_BASE, aws_job, stack_config

PG = "aws:ec2/placementGroup:PlacementGroup"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
VM = "aws:ec2/instance:Instance"


def _plan(*jobs):
    return planner.run(validate(stack_config(AWS_BASE, jobs=list(jobs)), "t"), "team")


def test_an_efa_gang_shares_a_cluster_placement_group():
    plan = _plan(aws_job(id="p5gang", instanceType="p5.48xlarge", nodes=2, state="running"),
                 aws_job(id="p4solo", state="running"), aws_job(id="g5gang", instanceType="g5.12xlarge", nodes=2, state="running"))
    groups = {r.name: r.inputs for r in plan.by_type(PG)}
    assert groups == {"job-p5gang-placement": groups["job-p5gang-placement"]}
    assert groups["job-p5gang-placement"]["strategy"] == "cluster"
    vms = {r.name: r for r in plan.by_type(VM)}
    placed = [n for n, r in vms.items() if r.inputs.get("placementGroup")]
    assert sorted(placed) == ["job-p5gang-n0-vm", "job-p5gang-n1-vm"]
    out = [r.inputs for r in plan.by_type(EGRESS) if r.inputs.get("referencedSecurityGroupId")]
    assert len(out) == 1 and out[0]["securityGroupId"] == out[0]["referencedSecurityGroupId"] and out[0]["ipProtocol"] == "-1"


def test_efa_types_and_interface_counts():
    assert (efa_interfaces("p5.48xlarge"), efa_interfaces("p4d.24xlarge"), efa_interfaces("g5.12xlarge")) == (32, 4, 0)
    with pytest.raises(ContractError, match="aws.efa-cluster-placement"):
        contract.enforce("aws.efa-cluster-placement", "x", cluster_placement_problem("g5.12xlarge", 2))
    assert cluster_placement_problem("p5.48xlarge", 1) == "1 node(s): a cluster placement group is for a gang"
    assert cluster_placement_problem("p5.48xlarge", 2) is None
    assert contract.get("aws.efa-cluster-placement").source.startswith("https://docs.aws.amazon.com/")


def test_an_upgrade_adding_the_group_leaves_running_vms_in_place():
    plan = _plan(aws_job(id="gang", nodes=2, state="running"))
    for vm in [r for r in plan.by_type(VM) if r.name.startswith("job-gang-")]:
        assert "placementGroup" in vm.ignore_changes  # ForceNew: an added group waits for the next attempt


# ---- the EFA interfaces ------------------------------------------------------------------------------

LT = "aws:ec2/launchTemplate:LaunchTemplate"


def _templates(plan) -> dict:
    return {r.name: r.inputs for r in plan.by_type(LT) if r.name.startswith("job-")}


@pytest.mark.parametrize(("itype", "cards"), [("p5.48xlarge", 32), ("p4d.24xlarge", 4)])
def test_each_gang_node_gets_one_efa_per_network_card(itype, cards):
    plan = _plan(aws_job(id="gang", instanceType=itype, nodes=3, state="running"), aws_job(id="solo", instanceType=itype, state="running"))
    templates = _templates(plan)
    assert sorted(templates) == [f"job-gang-n{r}-efa-template" for r in range(3)]  # a single node gets none
    for rank, (_name, t) in enumerate(sorted(templates.items())):
        primary, *efa = t["networkInterfaces"]
        assert (primary.get("networkCardIndex"), primary.get("deviceIndex"), primary.get("interfaceType")) == (0, 0, None)
        assert [(n["networkCardIndex"], n["deviceIndex"], n["interfaceType"]) for n in efa] == [(c, 1, "efa") for c in range(cards)]
        assert all(len(n["securityGroups"]) == 1 for n in efa)  # the gang's group only
        if rank == 0:  # the master keeps its own interface (its address across attempts)
            assert "networkInterfaceId" in primary and primary["deleteOnTermination"] == "false"
        else:
            assert primary["associatePublicIpAddress"] == "false" and len(primary["securityGroups"]) == 2
        assert t["metadataOptions"]["httpTokens"] == "required"
    vms = {r.name: r.inputs for r in plan.by_type(VM) if r.name.startswith("job-gang-")}
    for vm in vms.values():
        assert "launchTemplate" in vm
        assert not {"subnetId", "vpcSecurityGroupIds", "primaryNetworkInterface", "associatePublicIpAddress"} & set(vm)
    solo = next(r.inputs for r in plan.by_type(VM) if r.name.startswith("job-solo-"))
    assert "launchTemplate" not in solo and "subnetId" in solo


def test_a_gang_needing_a_public_ip_keeps_one_interface():
    raw = stack_config(AWS_BASE, network={"egress": "public-ip"}, jobs=[aws_job(id="gang", instanceType="p5.48xlarge", nodes=2, state="running")])
    plan = planner.run(validate(raw, "t"), "team")
    assert _templates(plan) == {}
    assert all("launchTemplate" not in r.inputs for r in plan.by_type(VM))


def test_the_contract_rule_on_efa_templates():
    from infra.contract.aws_fleet import efa_template_interfaces as check

    def nic(card, device, kind=None, **more):
        return {"network_card_index": card, "device_index": device, "interface_type": kind, "security_groups": ["sg-1"], **more}

    good = [nic(0, 0), *[nic(c, 1, "efa") for c in range(4)]]
    assert check(LT, {"instance_type": "p4d.24xlarge", "network_interfaces": good}) is None
    assert "cards 0..3" in check(LT, {"instance_type": "p4d.24xlarge", "network_interfaces": good[:-1]})
    assert "not an EFA type" in check(LT, {"instance_type": "g5.12xlarge", "network_interfaces": good})
    assert "one primary at (0, 0)" in check(LT, {"instance_type": "p4d.24xlarge", "network_interfaces": good[1:]})
    public = [nic(0, 0, associate_public_ip_address="true"), *good[1:]]
    assert "public IPv4" in check(LT, {"instance_type": "p4d.24xlarge", "network_interfaces": public})
    bare = [*good[:-1], {**good[-1], "security_groups": []}]
    assert "without a security group" in check(LT, {"instance_type": "p4d.24xlarge", "network_interfaces": bare})
    assert check(LT, {"instance_type": "g5.2xlarge", "network_interfaces": [nic(0, 0)]}) is None  # no EFA asked: not this rule's


def test_a_running_gang_of_an_older_spotctl_keeps_its_interfaces_until_the_next_attempt():
    from infra import render

    older = _plan(aws_job(id="gang", instanceType="p5.48xlarge", nodes=2, state="running", scriptsDigest="0" * 16))
    assert all("launchTemplate" in r.ignore_changes for r in older.by_type(VM))  # ForceNew: would replace it
    current = _plan(aws_job(id="gang", instanceType="p5.48xlarge", nodes=2, state="running", scriptsDigest=render.scripts_digest()))
    assert all("launchTemplate" not in r.ignore_changes for r in current.by_type(VM))


def test_the_watcher_may_manage_only_its_stacks_efa_templates():
    import json

    from infra.naming import owner_value
    from tests.iam_eval import allowed
    from tests.test_watcher_iam import AWS_WATCHER, NAT, only

    def policy(jobs):
        raw = {**stack_config(AWS_BASE, network=NAT, jobs=jobs), "watcher": AWS_WATCHER}
        p = planner.run(validate(raw, "t"), "team")
        return json.loads(only(p, "aws:iam/rolePolicy:RolePolicy", "watcher-policy").inputs["policy"])

    arn = "arn:aws:ec2:us-east-1:123456789012:launch-template/lt-0abc"
    mine, other = owner_value("team"), owner_value("team-b")
    gang = policy([aws_job(id="gang", instanceType="p5.48xlarge", nodes=2)])
    assert allowed(gang, "ec2:CreateLaunchTemplate", arn, **{"aws:RequestTag/spotctl:owner": mine})
    assert not allowed(gang, "ec2:CreateLaunchTemplate", arn, **{"aws:RequestTag/spotctl:owner": other})
    assert allowed(gang, "ec2:CreateLaunchTemplateVersion", arn, **{"aws:ResourceTag/spotctl:owner": mine})
    assert not allowed(gang, "ec2:DeleteLaunchTemplate", arn, **{"aws:ResourceTag/spotctl:owner": other})
    solo = policy([aws_job()])
    assert not allowed(solo, "ec2:CreateLaunchTemplate", arn, **{"aws:RequestTag/spotctl:owner": mine})
