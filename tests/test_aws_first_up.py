"""What a first real `pulumi up` on AWS needs, under mocks that answer like the account
would (cli/plan/mocks.py MockAccount): explicit provider, one VPC, egress, image, disks, user data."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cli.app import app
from cli.plan import mocks as planner
from infra import contract
from infra.aws import regional_dns_name
from infra.config import ConfigError, validate
from infra.contract import ContractError
from infra.render import bootstrap_config
from tests.conftest import AWS_BASE, aws_job, stack_config
from tests.test_aws_components import ASG, ATTACH, INSTANCE, LT, VOLUME, only, script_of

SUBNETS = {"us-east-1a": "subnet-0aaa0001", "us-east-1b": "subnet-0aaa0002"}


def plan(raw: dict, account: planner.MockAccount | None = None, stack: str = "team-a") -> planner.Plan:
    return planner.run(validate(raw, "test"), stack, account)


def stack(**over) -> dict:
    return stack_config(AWS_BASE, **{"network": {"subnets": SUBNETS}, "jobs": [aws_job()], **over})


# ---- provider and region ----------------------------------------------------------------------


def test_plan_json_lists_the_explicit_provider_with_its_region(runner, project):
    result = runner.invoke(app, ["plan", "--stack", "example-aws", "--json"])
    assert result.exit_code == 0, result.output
    resources = json.loads(result.output)["resources"]
    providers = [r for r in resources if r["type"] == "pulumi:providers:aws"]
    assert len(providers) == 1 and providers[0]["inputs"]["region"] == "us-east-1"


def test_an_invoke_on_the_default_provider_fails_the_plan(monkeypatch):
    """Invokes do not inherit a component's provider: the mocks refuse one that reaches the default."""
    import pulumi_aws as aws

    from infra import aws as infra_aws

    real = aws.ec2.get_ami
    monkeypatch.setattr(infra_aws.aws.ec2, "get_ami", lambda **kw: real(**{**kw, "opts": None}))
    with pytest.raises(Exception, match="default provider"):
        plan(stack())


def _write_stack(project: Path, name: str, config: dict) -> None:
    (project / "stacks" / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}))


def test_validate_rejects_a_conflicting_aws_region_naming_both_keys(runner, project):
    cfg = {f"spotctl:{k}": v for k, v in stack().items()}
    _write_stack(project, "t", {**cfg, "aws:region": "eu-west-1"})
    result = runner.invoke(app, ["validate", "--stack", "t"])
    assert result.exit_code != 0
    assert "aws:region: 'eu-west-1' conflicts with spotctl:region 'us-east-1'" in result.output
    _write_stack(project, "t", {**cfg, "aws:region": "us-east-1"})
    assert runner.invoke(app, ["validate", "--stack", "t"]).exit_code == 0


def test_a_stack_without_aws_region_or_subnets_plans_every_kind_of_job(runner, project):
    jobs = [
        aws_job(id="one", capacity="spot"),
        aws_job(id="two", capacity="spot", nodes=2, zone="us-east-1b"),
        aws_job(id="done", state="completed"),
    ]
    _write_stack(project, "bare", {f"spotctl:{k}": v for k, v in stack_config(AWS_BASE, jobs=jobs).items()})
    result = runner.invoke(app, ["plan", "--stack", "bare", "--json"])
    assert result.exit_code == 0, result.output
    resources = json.loads(result.output)["resources"]
    assert sum(r["type"] == INSTANCE for r in resources) == 3
    assert sum(r["type"] == VOLUME for r in resources) == 4


# ---- subnets: one VPC --------------------------------------------------------------------------


def test_a_partial_subnet_list_is_refused_by_validate():
    raw = stack(network={"subnets": {"us-east-1a": "subnet-0aaa0001"}})
    with pytest.raises(ConfigError, match=r"spotctl:network.subnets: has no subnet for zone\(s\) us-east-1b"):
        validate(raw, "test")


def test_subnets_in_two_vpcs_are_refused_before_any_api_call():
    account = planner.MockAccount(subnet_vpcs={"subnet-0aaa0002": "vpc-0other"})
    with pytest.raises(ContractError, match="aws.subnets-one-vpc") as err:
        plan(stack(), account)
    assert "vpc-0other" in str(err.value)


def test_a_subnet_in_another_zone_is_refused():
    account = planner.MockAccount(subnet_zones={"subnet-0aaa0002": "us-east-1c"})
    with pytest.raises(ContractError, match="aws.subnet-in-its-zone"):
        plan(stack(), account)


def test_no_default_vpc_and_no_subnets_names_the_key():
    raw = stack_config(AWS_BASE, jobs=[aws_job()])
    with pytest.raises(ContractError, match="aws.default-vpc-or-subnets") as err:
        plan(raw, planner.MockAccount(default_vpc=False))
    assert "spotctl:network.subnets" in str(err.value)
    assert plan(raw).by_type(INSTANCE)  # with a default VPC it plans


def test_security_group_in_the_subnets_vpc_and_egress_as_a_rule():
    p = plan(stack())
    sg = only(p, "aws:ec2/securityGroup:SecurityGroup").inputs
    assert "egress" not in sg and "ingress" not in sg
    assert sg["vpcId"] == planner._vpc_of("subnet-0aaa0001", planner.MockAccount())
    egress = only(p, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule").inputs
    assert egress["ipProtocol"] == "-1" and egress["cidrIpv4"] == "0.0.0.0/0"


# ---- egress ------------------------------------------------------------------------------------


def test_default_egress_is_a_free_s3_gateway_endpoint_on_the_subnets_route_tables_only():
    """A route table takes one S3 gateway-endpoint route (RouteAlreadyExists, eksctl-io/eksctl #4377):
    the endpoint goes on the tables this stack's subnets use, each subnet's explicit one or else the
    VPC's main one, never the VPC's other tables (another stack's, or its NAT's private one)."""
    vpc = planner._vpc_of("subnet-0aaa0001", planner.MockAccount())
    main = planner.mock_main_route_table(vpc)
    p = plan(stack())  # neither subnet has an explicit association: both use the main table
    ep = only(p, "aws:ec2/vpcEndpoint:VpcEndpoint").inputs
    assert ep["serviceName"] == "com.amazonaws.us-east-1.s3" and ep["vpcEndpointType"] == "Gateway"
    assert ep["routeTableIds"] == [main]
    assert only(p, INSTANCE).inputs["associatePublicIpAddress"] is False
    # One subnet explicitly associated (another team's NAT table in the same VPC is not this stack's).
    account = planner.MockAccount(subnet_route_tables={"subnet-0aaa0002": "rtb-0own000000000002",
                                                       "subnet-0bbb0001": "rtb-0theirs0000000001"})
    ep = only(plan(stack(), account), "aws:ec2/vpcEndpoint:VpcEndpoint").inputs
    assert ep["routeTableIds"] == sorted([main, "rtb-0own000000000002"])
    # Both explicit: the main table is left alone.
    account = planner.MockAccount(subnet_route_tables={"subnet-0aaa0001": "rtb-0own000000000001",
                                                       "subnet-0aaa0002": "rtb-0own000000000001"})
    assert only(plan(stack(), account), "aws:ec2/vpcEndpoint:VpcEndpoint").inputs["routeTableIds"] == ["rtb-0own000000000001"]


def test_s3_endpoint_existing_keeps_the_interface_endpoints_and_declares_no_s3_route():
    """A VPC whose route tables already send S3 through a gateway endpoint (the platform's, another
    team's): `network.s3Endpoint: existing` declares no second one, and unlike egress `existing` still
    the SSM and Auto Scaling interface endpoints, so pools and secret env need no NAT."""
    p = plan(stack(network={"subnets": SUBNETS, "s3Endpoint": "existing"}, jobs=[SECRET_JOB], pools=[POOL]))
    assert sorted(ep.inputs["serviceName"] for ep in p.by_type(ENDPOINT)) == [
        "com.amazonaws.us-east-1.autoscaling", "com.amazonaws.us-east-1.ssm"]
    p = plan(stack(network={"subnets": SUBNETS, "egress": "public-ip", "s3Endpoint": "existing"}))
    assert p.by_type(ENDPOINT) == []


@pytest.mark.parametrize(("network", "message"), [
    ({"s3Endpoint": "exsting"}, "network.s3Endpoint: expected one of 'own', 'existing', got 'exsting' (did you mean 'existing'?)"),
    ({"egress": "existing", "s3Endpoint": "existing"},
     "network.s3Endpoint: only used with egress 's3-endpoint' or 'public-ip' (egress 'existing' declares no S3 endpoint)"),
    ({"egress": "nat", "natSubnet": "subnet-0aaa0009", "s3Endpoint": "own"}, "egress 'nat' puts its S3 endpoint"),
])
def test_s3_endpoint_is_validated_with_its_key(network, message):
    with pytest.raises(ConfigError) as e:
        validate(stack(network={"subnets": SUBNETS, **network}), "test")
    assert message in str(e.value)


def test_s3_endpoint_is_aws_only():
    from tests.conftest import GCP_BASE

    with pytest.raises(ConfigError, match=r"network.s3Endpoint: AWS only"):
        validate(stack_config(GCP_BASE, network={"s3Endpoint": "existing"}), "test")


def test_egress_existing_declares_nothing_and_public_ip_gives_addresses():
    p = plan(stack(network={"subnets": SUBNETS, "egress": "existing"}))
    assert p.by_type("aws:ec2/vpcEndpoint:VpcEndpoint") == []
    pool = {"name": "g5", "instanceTypes": ["g5.xlarge"], "spotMax": 2}
    p = plan(stack(network={"subnets": SUBNETS, "egress": "public-ip"}, pools=[pool]))
    assert only(p, INSTANCE).inputs["associatePublicIpAddress"] is True
    assert only(p, LT).inputs["networkInterfaces"][0]["associatePublicIpAddress"] == "true"
    assert len(p.by_type("aws:ec2/vpcEndpoint:VpcEndpoint")) == 1


def test_egress_nat_routes_the_subnets_through_a_nat_gateway():
    p = plan(stack(network={"subnets": SUBNETS, "egress": "nat", "natSubnet": "subnet-0aaa0009"}))
    nat = only(p, "aws:ec2/natGateway:NatGateway").inputs
    assert nat["subnetId"] == "subnet-0aaa0009"
    table = only(p, "aws:ec2/routeTable:RouteTable")
    assert table.inputs["routes"][0]["cidrBlock"] == "0.0.0.0/0"
    assocs = sorted(a.inputs["subnetId"] for a in p.by_type("aws:ec2/routeTableAssociation:RouteTableAssociation"))
    assert assocs == sorted(SUBNETS.values())
    # The S3 route goes only on the stack's own private table: the subnets' former (main) table and
    # the VPC's other tables are not its to change.
    assert only(p, "aws:ec2/vpcEndpoint:VpcEndpoint").inputs["routeTableIds"] == [
        planner._mock_outputs(table.type, table.name, table.inputs, "aws-account", "us-east-1")[0]]


ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
POOL = {"name": "g5", "instanceTypes": ["g5.2xlarge"], "spotMax": 3}


def test_pools_under_the_default_egress_reach_auto_scaling_through_an_interface_endpoint():
    """A pool VM protects itself from scale-in and records busy/idle through the Auto Scaling API
    (agent/storage.py Cloud.protect), which the S3 gateway endpoint does not reach and a
    pool VM without a public IP reaches only through an interface endpoint, by the endpoint's own name."""
    p = plan(stack(pools=[POOL]))
    ep = only(p, ENDPOINT, "autoscaling").inputs
    assert ep["serviceName"] == "com.amazonaws.us-east-1.autoscaling" and ep["vpcEndpointType"] == "Interface"
    assert ep["privateDnsEnabled"] is False
    assert bootstrap_config(script_of(only(p, LT).inputs))["autoscaling_url"] == f"https://{endpoint_name(p, 'autoscaling')}"
    assert sorted(ep["subnetIds"]) == sorted(SUBNETS.values())
    assert ep["vpcId"] == planner._vpc_of("subnet-0aaa0001", planner.MockAccount())
    # In a group of its own that admits HTTPS (443) from the VMs' group, and nothing else.
    group = only(p, LT).inputs["networkInterfaces"][0]["securityGroups"]
    (ep_group,) = ep["securityGroupIds"]
    assert ep_group not in group
    ingress = only(p, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule").inputs
    assert (ingress["securityGroupId"], ingress["referencedSecurityGroupId"]) == (ep_group, group[0])
    assert (ingress["ipProtocol"], ingress["fromPort"], ingress["toPort"]) == ("tcp", 443, 443)
    assert only(p, LT).inputs["networkInterfaces"][0]["associatePublicIpAddress"] == "false"


SECRET_JOB = aws_job(env={"HF_TOKEN": {"secure": "v1:cipher"}})


def endpoint_name(p: planner.Plan, service: str) -> str:
    """The Regional DNS name of the plan's ``service`` endpoint: what the mocks answered for it."""
    ep = only(p, ENDPOINT, f"-{service}-")
    _, out = planner._mock_outputs(ep.type, ep.name, ep.inputs, "aws-account", "us-east-1", ("us-east-1a", "us-east-1b"),
                                   p.stack)
    (name,) = [e["dnsName"] for e in out["dnsEntries"] if not e["dnsName"].split(".")[0].endswith(("-us-east-1a", "-us-east-1b"))]
    return name


def test_two_stacks_in_one_vpc_declare_endpoints_without_private_dns_and_call_their_own():
    """A VPC takes one private-DNS interface endpoint per service (terraform-provider-aws #17535): two
    stacks in one VPC (the same subnets) each declare theirs without it, and each stack's scripts call
    its own endpoint's Regional name, never the public one nor the other stack's."""
    urls = {}
    for name in ("team-a", "team-b"):
        p = plan(stack(jobs=[SECRET_JOB], pools=[POOL]), stack=name)
        endpoints = [e for e in p.by_type(ENDPOINT) if e.inputs["vpcEndpointType"] == "Interface"]
        assert sorted(e.inputs["serviceName"].split(".")[-1] for e in endpoints) == ["autoscaling", "ssm"]
        assert all(e.inputs["privateDnsEnabled"] is False for e in endpoints)
        assert not contract.violations(ENDPOINT, {"vpc_endpoint_type": "Interface", "private_dns_enabled": False})
        pool, job = script_of(only(p, LT).inputs), script_of(only(p, INSTANCE).inputs)
        urls[name] = (endpoint_name(p, "autoscaling"), endpoint_name(p, "ssm"))
        assert bootstrap_config(pool)["autoscaling_url"] == f"https://{urls[name][0]}"
        assert bootstrap_config(job)["secrets_url"] == f"https://{urls[name][1]}"
        assert "autoscaling.us-east-1.amazonaws.com" not in pool and "ssm.us-east-1.amazonaws.com" not in job
    assert set(urls["team-a"]).isdisjoint(urls["team-b"])


@pytest.mark.parametrize("network", [{"subnets": SUBNETS, "egress": "public-ip"}, {"subnets": SUBNETS, "egress": "existing"},
                                     {"subnets": SUBNETS, "egress": "nat", "natSubnet": "subnet-0aaa0009"}])
def test_without_interface_endpoints_the_scripts_call_the_public_regional_names(network):
    p = plan(stack(network=network, jobs=[SECRET_JOB], pools=[POOL]))
    assert bootstrap_config(script_of(only(p, LT).inputs))["autoscaling_url"] == "https://autoscaling.us-east-1.amazonaws.com"
    assert bootstrap_config(script_of(only(p, INSTANCE).inputs))["secrets_url"] == "https://ssm.us-east-1.amazonaws.com"


def test_a_private_dns_interface_endpoint_breaks_the_contract():
    problem = contract.violations(ENDPOINT, {"vpc_endpoint_type": "Interface", "private_dns_enabled": True,
                                             "service_name": "com.amazonaws.us-east-1.ssm"})
    assert [(r.id, why) for r, why in problem] == [
        ("aws.interface-endpoint-private-dns-per-vpc", "interface endpoint of com.amazonaws.us-east-1.ssm has private_dns_enabled True")]
    # Left out counts too (the provider was seen to turn it on); a gateway endpoint has no private DNS.
    assert contract.violations(ENDPOINT, {"vpc_endpoint_type": "Interface"})
    assert not contract.violations(ENDPOINT, {"vpc_endpoint_type": "Gateway"})


REGIONAL = "vpce-0fe5b17a0707d6abc-29p5708s.ec2.us-east-1.vpce.amazonaws.com"


@given(st.permutations([REGIONAL] + [REGIONAL.replace(".ec2", f"-us-east-1{z}.ec2") for z in "abcdf"]), st.integers(0, 5))
def test_the_regional_name_is_chosen_by_form_not_position(names, keep):
    assert regional_dns_name("vpce-0fe5b17a0707d6abc", [n for n in names if n == REGIONAL or keep]) == REGIONAL


def test_no_regional_name_is_an_error_naming_the_endpoint():
    zonal = [REGIONAL.replace(".ec2", f"-us-east-1{z}.ec2") for z in "ab"]
    for names in ([], zonal, [REGIONAL.replace("vpce-0fe5", "vpce-0aaa")]):
        with pytest.raises(ValueError, match="interface endpoint vpce-0fe5b17a0707d6abc: no single Regional DNS name"):
            regional_dns_name("vpce-0fe5b17a0707d6abc", names)


def test_no_auto_scaling_endpoint_without_pools_or_under_another_egress():
    assert [e.inputs["serviceName"] for e in plan(stack()).by_type(ENDPOINT)] == ["com.amazonaws.us-east-1.s3"]
    for network in ({"subnets": SUBNETS, "egress": "public-ip"}, {"subnets": SUBNETS, "egress": "existing"},
                    {"subnets": SUBNETS, "egress": "nat", "natSubnet": "subnet-0aaa0009"}):
        services = [e.inputs["serviceName"] for e in plan(stack(network=network, pools=[POOL])).by_type(ENDPOINT)]
        assert not any(s.endswith(".autoscaling") for s in services), network


def test_an_interface_endpoint_in_a_vpc_without_dns_support_is_refused_before_any_api_call():
    """The VMs, without a way to the internet, resolve the endpoints' own names through the VPC's
    Amazon-provided DNS server (botocore ec2 ModifyVpcAttributeRequest.EnableDnsSupport): configured
    subnets may be in a VPC without it. DNS hostnames only mattered to private DNS, which is off."""
    vpc = planner._vpc_of("subnet-0aaa0001", planner.MockAccount())
    account = planner.MockAccount(vpc_dns={vpc: (False, True)})
    with pytest.raises(ContractError, match="aws.endpoint-names-need-vpc-dns") as err:
        plan(stack(pools=[POOL]), account)
    assert f"{vpc} has enableDnsSupport off" in str(err.value) and "spotctl:network.subnets" in str(err.value)
    assert plan(stack(pools=[POOL]), planner.MockAccount(vpc_dns={vpc: (True, False)})).by_type(LT)
    # Without an interface endpoint the VPC's DNS settings do not matter.
    account = planner.MockAccount(vpc_dns={vpc: (False, False)})
    assert plan(stack(), account).by_type(ENDPOINT)
    assert plan(stack(network={"subnets": SUBNETS, "egress": "existing"}, pools=[POOL]), account).by_type(LT)


@pytest.mark.parametrize(
    ("network", "message"),
    [
        ({"subnets": SUBNETS, "egress": "nat"}, "spotctl:network.natSubnet: required with egress 'nat'"),
        ({"egress": "nat", "natSubnet": "subnet-1"}, "spotctl:network.subnets: egress 'nat' needs private subnets"),
        ({"subnets": SUBNETS, "egress": "nats"}, "spotctl:network.egress: expected one of"),
        ({"subnets": SUBNETS, "natSubnet": "subnet-1"}, "spotctl:network.natSubnet: only used with egress 'nat'"),
    ],
)
def test_egress_config_errors_name_the_key(network, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(stack(network=network), "test")


def test_nat_subnet_in_another_vpc_is_refused():
    account = planner.MockAccount(subnet_vpcs={"subnet-0bbb0009": "vpc-0other"})
    with pytest.raises(ContractError, match="aws.subnets-one-vpc"):
        plan(stack(network={"subnets": SUBNETS, "egress": "nat", "natSubnet": "subnet-0bbb0009"}), account)


# ---- lifecycle safety: detach, image, root volume ----------------------------------------------


def test_attachment_is_skip_destroy_and_never_stops_the_instance():
    att = only(plan(stack()), ATTACH).inputs
    assert att["skipDestroy"] is True
    assert "stopInstanceBeforeDetaching" not in att and "forceDetach" not in att


def test_a_newer_image_never_replaces_a_running_vm():
    p = plan(stack())
    vm = only(p, INSTANCE)
    assert vm.ignore_changes[0] == "ami"  # (and its scripts while no digest is recorded: test_upgrade_keeps_vms.py)
    assert p.outputs["jobs"]["train"]["images"] == [vm.inputs["ami"]]


def test_root_volumes_are_sized_from_the_image():
    pool = {"name": "small", "instanceTypes": ["g5.xlarge"], "spotMax": 1, "diskGb": 50}
    p = plan(stack(pools=[pool]), planner.MockAccount(root_snapshot_gb=150))
    assert only(p, INSTANCE).inputs["rootBlockDevice"]["volumeSize"] == 150
    assert only(p, LT).inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 150
    p = plan(stack(pools=[{**pool, "diskGb": 400}]), planner.MockAccount(root_snapshot_gb=30))
    assert only(p, INSTANCE).inputs["rootBlockDevice"]["volumeSize"] == 100  # BOOT_DISK_GB
    assert only(p, LT).inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 400


# ---- job disks: checkpoint throughput ----------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "throughput", "iops"),
    [
        ({}, 125, 3000),
        ({"instanceType": "g5.2xlarge", "accelerator": {"type": "nvidia-a10g", "count": 1}}, 250, 3000),
        ({"instanceType": "p5.48xlarge", "accelerator": {"type": "nvidia-h100-80gb", "count": 8}}, 2000, 8000),
        ({"instanceType": "p5.48xlarge", "accelerator": {"type": "nvidia-h100-80gb", "count": 8}, "diskGb": 10}, 1250, 5000),
        ({"diskThroughput": 500, "diskIops": 4000}, 500, 4000),
    ],
)
def test_gp3_throughput_scales_with_gpus(job, throughput, iops):
    vol = only(plan(stack(jobs=[aws_job(**job)])), VOLUME).inputs
    assert (vol["throughput"], vol["iops"]) == (throughput, iops)


def test_impossible_disk_performance_is_refused_at_registration():
    with pytest.raises(ContractError, match="aws.gp3-performance"):
        plan(stack(jobs=[aws_job(diskThroughput=2000, diskIops=3000)]))


# ---- pools, user data --------------------------------------------------------------------------


def test_pools_never_block_up_waiting_for_capacity():
    pool = {"name": "g5", "instanceTypes": ["g5.xlarge"], "onDemand": 2, "spotMax": 4}
    asg = only(plan(stack(pools=[pool])), ASG).inputs
    assert asg["waitForCapacityTimeout"] == "0"


def test_worst_case_user_data_fits_16k_raw():
    """Multi-node, a long command, many env vars and labels: what EC2 gets (a gzip of the bootstrap,
    whose size is the settings', the agent being fetched) stays under 16 KB."""
    env = {f"VAR_{i:02d}": "v" * 200 for i in range(40)}
    labels = {f"label-{i:02d}": "x" * 60 for i in range(40)}
    job = aws_job(nodes=4, command="python train.py " + " ".join(f"--flag-{i}=value-{i}" for i in range(300)), env=env)
    pool = {"name": "g5", "instanceTypes": ["g5.xlarge"], "spotMax": 2, "agentCommand": "agent " + "x" * 4000}
    p = plan(stack(jobs=[job], labels=labels, pools=[pool]))
    for r in p.by_type(INSTANCE) + [t for t in p.by_type(LT) if "userData" in t.inputs]:  # (not EFA templates)
        raw = base64.b64decode(r.inputs.get("userDataBase64") or r.inputs["userData"])
        assert len(raw) <= 16 * 1024
        assert script_of(r.inputs).startswith("#!/bin/bash")


# ---- the lifecycle against the fake pulumi: refresh first, never a stop before detach -----------


@pytest.mark.parametrize(
    ("args", "job"),
    [
        (["resume", "diffusion"], "diffusion"),
        (["failover", "llm-pretrain", "--to", "on-demand"], "llm-pretrain"),
        (["complete", "sweep-07"], "sweep-07"),
    ],
)
def test_lifecycle_updates_refresh_first_and_never_stop_before_detaching(project, runner, fake_pulumi, args, job):
    from cli.lifecycle import stackfile
    from tests.conftest import pulumi_calls

    result = runner.invoke(app, [*args, "--stack", "example-aws", "--yes"])
    assert result.exit_code == 0, result.output
    calls = [c for c in pulumi_calls(fake_pulumi) if "up" in c or "preview" in c]
    assert calls and all("--refresh" in c for c in calls), calls
    # what those updates apply: attachments that only forget, never StopInstances
    cfg = stackfile.load(stackfile.resolve("example-aws", None))
    for att in planner.run(cfg, "example-aws").by_type(ATTACH):
        assert att.inputs["skipDestroy"] is True and "stopInstanceBeforeDetaching" not in att.inputs
