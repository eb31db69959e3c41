"""AWS security groups scoped as GCP's firewalls are: node-to-node traffic only among one job's gang
members (a group of the job referencing itself), nothing between pools' VMs or other jobs, the
interface endpoints HTTPS from the stack's VMs only."""

from __future__ import annotations

from cli.plan import mocks as planner
from infra.config import validate
from tests.conftest import AWS_BASE, aws_job, stack_config

SG = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
POOL = {"name": "g5", "instanceTypes": ["g5.2xlarge"], "onDemand": 1, "spotMax": 2, "agentCommand": "agent"}


def test_only_a_gangs_members_reach_each_other():
    raw = stack_config(AWS_BASE, jobs=[aws_job(id="gang", nodes=2, state="running"), aws_job(id="solo", state="running")],
                       pools=[POOL])
    plan = planner.run(validate(raw, "t"), "team")
    groups = {r.name: r for r in plan.by_type(SG)}
    nodes_id = next(r for r in plan.resources if r.name == "stack-nodes-sg")
    assert set(groups) >= {"stack-nodes-sg", "job-gang-gang-sg"} and "job-solo-gang-sg" not in groups
    rules = [r.inputs for r in plan.by_type(INGRESS)]
    selfish = [r for r in rules if r["securityGroupId"] == r["referencedSecurityGroupId"]]
    assert len(selfish) == 1 and selfish[0]["ipProtocol"] == "-1"  # the gang's, and no stack-wide one
    gang_vms = [r for r in plan.by_type("aws:ec2/instance:Instance") if r.name.startswith("job-gang-")]
    solo_vm = next(r for r in plan.by_type("aws:ec2/instance:Instance") if r.name.startswith("job-solo-"))
    eni = next(r for r in plan.by_type("aws:ec2/networkInterface:NetworkInterface") if r.name == "job-gang-master-eni")
    gang_group = selfish[0]["securityGroupId"]
    assert gang_group in eni.inputs["securityGroups"]  # the master's ENI
    assert all(gang_group in (vm.inputs.get("vpcSecurityGroupIds") or eni.inputs["securityGroups"]) for vm in gang_vms)
    assert gang_group not in (solo_vm.inputs["vpcSecurityGroupIds"] or [])
    lt = plan.by_type("aws:ec2/launchTemplate:LaunchTemplate")[0]
    assert gang_group not in lt.inputs["networkInterfaces"][0]["securityGroups"]
    assert nodes_id is not None
