"""validate says what a multi-node job's nodes talk over where spotctl does not give them the
cloud's fast fabric: AWS p4d/p5 gangs whose public IPv4 rules out EFA interfaces, GCP A3 gangs without GPUDirect-TCPX."""

from __future__ import annotations

from cli.app import app
from infra.config import validate
from infra.config.gangs import gang_warnings
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config


def test_an_efa_gang_gets_its_interfaces_and_no_warning(project, runner):
    result = runner.invoke(app, ["validate", "--stack", "example-aws"])
    assert result.exit_code == 0, result.output
    assert "EFA" not in result.output


def test_validate_warns_where_a_public_ip_keeps_an_efa_gang_on_one_interface():
    public = validate(stack_config(AWS_BASE, network={"egress": "public-ip"},
                                   jobs=[aws_job(id="gang", instanceType="p5.48xlarge", nodes=2)]), "t")
    [warning] = gang_warnings(public)
    assert warning.startswith("spotctl:jobs[0].instanceType: job gang's 2 nodes get no EFA interfaces: "
                              "spotctl:network.egress public-ip needs a public IPv4")
    own = validate(stack_config(AWS_BASE, jobs=[aws_job(id="gang", instanceType="p4d.24xlarge", nodes=2, externalIp=True)]), "t")
    assert "spotctl:jobs[0].externalIp needs a public IPv4" in gang_warnings(own)[0]


def test_a3_gangs_are_told_they_run_over_one_nic():
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(id="big", machineType="a3-highgpu-8g", nodes=2,
                                                        accelerator={"type": "nvidia-h100-80gb", "count": 8}),
                                                gcp_job(id="one", machineType="a3-highgpu-8g",
                                                        accelerator={"type": "nvidia-h100-80gb", "count": 8})]), "t")
    [warning] = gang_warnings(cfg)
    assert warning.startswith("spotctl:jobs[0].machineType: job big's 2 nodes have one NIC each, not GPUDirect-TCPX")


def test_no_warning_for_single_nodes_or_other_types():
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(), aws_job(id="g", instanceType="g5.12xlarge", nodes=2)]), "t")
    assert gang_warnings(cfg) == []


def test_each_decision_has_its_rule_and_source():
    from infra import contract

    for rule_id in ("aws.watcher-publishes-pool-demand", "aws.efa-cluster-placement", "aws.event-bucket-kept-at-destroy",
                    "aws.stack-name-once-per-account", "gcp.regional-disk-delete", "gcp.grown-disk-filesystem",
                    "gcp.first-write-after-iam-propagation", "gcp.a3-gang-one-nic", "aws.efa-interfaces",
                    "gcp.watcher-publishes-pool-demand", "gcp.gpu-maintenance-notice"):
        assert "https://" in contract.get(rule_id).source or "pulumi-aws" in contract.get(rule_id).source, rule_id
