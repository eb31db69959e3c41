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
