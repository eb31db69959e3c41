"""`spotctl pool demand` and `spotctl pool status` through the real clients: boto3 CloudWatch and
Auto Scaling against moto; google-cloud-monitoring (REST) and google-cloud-compute against local
fakes. Plus the pure demand decisions (spot share, fallback after sustained shortage)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from cli.app import app
from cli.cloud import PoolView, PoolVm, pool_cloud
from cli.lifecycle import stackfile
from cli.pools.demand import PoolError, decide, fallback_size, publish
from infra.config import Pool
from infra.naming import owner_value
from tests.fixtures.fake_gce import FakeGce
from tests.fixtures.fake_monitoring import FakeMonitoring

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POOL = Pool(name="g5", instance_types=["g5.2xlarge"], on_demand=2, spot_min=0, spot_max=5, fallback_to_on_demand=10)


# ---- the decisions --------------------------------------------------------------------------------


def test_spot_share_is_demand_above_the_base_within_spot_max():
    assert [decide(POOL, d, T0).spot_demand for d in range(9)] == [0, 0, 0, 1, 2, 3, 4, 5, 5]
    with pytest.raises(PoolError, match="demand must be >= 0"):
        decide(POOL, -1, T0)


def test_fallback_only_after_a_shortage_lasting_the_configured_minutes():
    at = [T0 - timedelta(minutes=m) for m in range(12, 0, -1)]  # oldest first
    assert fallback_size(10, 3, [(t, 3.0) for t in at], T0) == 3
    assert fallback_size(10, 3, [(t, 3.0) for t in at[-8:]], T0) == 0  # only 8 minutes short so far
    broken = [(t, 0.0 if i == 6 else 3.0) for i, t in enumerate(at)]
    assert fallback_size(10, 3, broken, T0) == 0  # the shortage ended 6 minutes ago: it starts over
    assert fallback_size(10, 3, [(t, 2.0 if i > 5 else 4.0) for i, t in enumerate(at)], T0) == 2  # the smallest shortfall
    assert fallback_size(10, 0, [(t, 3.0) for t in at], T0) == 0  # spot is back: the fallback goes
    # via decide: 6 wanted, 2 base, 4 spot wanted, 1 running -> 3 unmet
    d = decide(POOL, 6, T0, spot_running=1, unmet_history=[(t, 3.0) for t in at])
    assert (d.spot_demand, d.unmet, d.fallback_demand) == (4, 3, 3) and "fallback" in d.reason


# ---- AWS: CloudWatch and Auto Scaling through boto3 against moto -----------------------------------


def _aws_pool_groups(stack: str = "example-aws") -> tuple[str, list[str]]:
    """The pool's mixed ASG as infra declares it (name, base 2), with 3 instances running."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    asg = boto3.client("autoscaling", region_name="us-east-1")
    subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]][:2]
    ec2.create_launch_template(LaunchTemplateName="pool-lt", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.2xlarge"})
    name = f"{stack}-g5"
    asg.create_auto_scaling_group(AutoScalingGroupName=name, MinSize=2, MaxSize=14, DesiredCapacity=3,
                                  LaunchTemplate={"LaunchTemplateName": "pool-lt", "Version": "$Latest"},
                                  VPCZoneIdentifier=",".join(subnets))
    ids = [i["InstanceId"] for i in asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Instances"]]
    return name, ids


@mock_aws
def test_aws_demand_is_published_to_cloudwatch(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    result = runner.invoke(app, ["pool", "demand", "g5", "5", "--stack", "example-aws", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"pool": "g5", "demand": 5.0, "spot_demand": 3.0, "reason": json.loads(result.output)["reason"]}
    cw = boto3.client("cloudwatch", region_name="us-east-1")
    got = cw.get_metric_statistics(Namespace="spotctl", MetricName="spot_demand", StartTime=datetime.now(UTC) - timedelta(minutes=5),
                                   EndTime=datetime.now(UTC) + timedelta(minutes=1), Period=60, Statistics=["Maximum"],
                                   Dimensions=[{"Name": "Stack", "Value": "example-aws"}, {"Name": "Pool", "Value": "g5"}])
    assert [p["Maximum"] for p in got["Datapoints"]] == [3.0]  # what the alarm in infra/aws_scaling.py reads
    assert [m["MetricName"] for m in cw.list_metrics(Namespace="spotctl")["Metrics"]].count("demand") == 1


def test_unknown_pool_and_bad_demand_are_refused(project, runner):
    result = runner.invoke(app, ["pool", "demand", "g55", "5", "--stack", "example-aws"])
    assert result.exit_code == 1 and "error: pool 'g55' is not declared; pools: g5 (did you mean 'g5'?)" in result.output
    result = runner.invoke(app, ["pool", "demand", "g5", "-1", "--stack", "example-aws"])
    assert result.exit_code != 0
    for huge in ("1e400", "1" + "0" * 400):  # not a number of VMs: one clear error, never an OverflowError
        result = runner.invoke(app, ["pool", "demand", "g5", huge, "--stack", "example-aws"])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), repr(result.exception)
        assert "Invalid value for 'N'" in result.output


@mock_aws
def test_aws_fallback_reads_spot_running_and_the_shortage_history(project, monkeypatch):
    """With fallbackToOnDemand the publication observes the group: no spot instance is running (moto
    launches on-demand), so all spot demand is unmet; after 10 minutes of that, fallback = shortage."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    _aws_pool_groups()
    ref = stackfile.resolve("example-aws", None)
    raw = ref.path.read_text().replace("      spotMax: 12\n", "      spotMax: 12\n      fallbackToOnDemand: 10\n", 1)
    ref.path.write_text(raw)
    cfg = stackfile.load(ref)
    cloud = pool_cloud(cfg, "example-aws")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    first = publish(cloud, cfg, "example-aws", "g5", 6, now - timedelta(minutes=11))
    assert (first.spot_demand, first.unmet, first.fallback_demand) == (4, 4, 0)
    for m in range(10, 0, -2):
        publish(cloud, cfg, "example-aws", "g5", 6, now - timedelta(minutes=m))
    last = publish(cloud, cfg, "example-aws", "g5", 6, now)
    assert (last.unmet, last.fallback_demand) == (4, 4)
    assert cloud.history("g5", "fallback_demand", now - timedelta(minutes=1), now + timedelta(minutes=1))[-1][1] == 4.0


@mock_aws
def test_aws_status_sizes_vms_busy_idle(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name, ids = _aws_pool_groups()
    boto3.client("autoscaling", region_name="us-east-1").set_instance_protection(
        InstanceIds=ids[:1], AutoScalingGroupName=name, ProtectedFromScaleIn=True)
    assert runner.invoke(app, ["pool", "demand", "g5", "3", "--stack", "example-aws"]).exit_code == 0
    result = runner.invoke(app, ["pool", "status", "g5", "--stack", "example-aws", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["parts"] == {"ondemand": {"target": 2, "vms": 3}, "spot": {"target": 1, "vms": 0}}  # moto launches on-demand
    assert (data["busy"], data["idle"]) == (1, 2)
    assert data["metrics"].get("spot_demand") == 1.0 and data["metrics"]["demand"] == 3.0, data["metrics"]
    assert sum(n for types in data["zones"].values() for n in types.values()) == 3
    assert {vm["type"] for vm in data["vms"]} == {"g5.2xlarge"}
    table = runner.invoke(app, ["pool", "status", "g5", "--stack", "example-aws"])
    assert table.exit_code == 0 and "1 busy, 2 idle" in table.output and "ondemand" in table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80, table.output  # (no COLUMNS: 80)


# ---- GCP: Cloud Monitoring (REST) and Compute against local fakes ----------------------------------


@pytest.fixture
def gcp_fakes(monkeypatch):
    mon, gce = FakeMonitoring(), FakeGce()
    monkeypatch.setenv("SPOTCTL_MONITORING_ENDPOINT", mon.url)
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
    yield mon, gce
    mon.stop()
    gce.stop()


def test_gcp_demand_is_a_per_group_custom_metric(project, runner, gcp_fakes):
    mon, _ = gcp_fakes
    result = runner.invoke(app, ["pool", "demand", "l4", "4", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    assert "published demand=4, spot_demand=3" in result.output
    series = {ts["metric"]["type"]: ts for ts in mon.series}
    spot = series["custom.googleapis.com/spotctl/pool/spot_demand"]
    # exactly what the autoscaler's filter (infra/naming.py pool_metric_filter) selects
    assert spot["metric"]["labels"] == {"stack": owner_value("example-gcp"), "pool": "l4"}
    assert spot["resource"] == {"type": "global", "labels": {"project_id": "my-ml-project"}}
    assert spot["metricKind"] == "GAUGE" and spot["points"][0]["value"] == {"doubleValue": 3.0}


def test_gcp_status_from_migs_instances_and_preemptions(project, runner, gcp_fakes):
    _, gce = gcp_fakes
    labels = {"spotctl-stack": "example-gcp", "spotctl-owner": owner_value("example-gcp"), "spotctl-pool": "l4"}
    gce.add_mig("example-gcp-l4-ondemand", 1)
    gce.add_mig("example-gcp-l4-spot", 2)
    gce.add_instance("us-central1-a", "example-gcp-l4-ondemand-x1a2", labels, machine_type="g2-standard-8")
    gce.add_instance("us-central1-b", "example-gcp-l4-spot-k9z8", labels, machine_type="g2-standard-8")
    gce.add_instance("us-central1-c", "example-gcp-l4-spot-q7w6", labels, machine_type="g2-standard-8")
    gce.preempt("us-central1-c", "example-gcp-l4-spot-q7w6")
    gce.add_instance("us-central1-a", "other-vm", {**labels, "spotctl-pool": "a100"})
    assert runner.invoke(app, ["pool", "demand", "l4", "3", "--stack", "example-gcp"]).exit_code == 0
    result = runner.invoke(app, ["pool", "status", "l4", "--stack", "example-gcp", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["parts"] == {"ondemand": {"target": 1, "vms": 1}, "spot": {"target": 2, "vms": 2}}
    assert data["metrics"] == {"demand": 3.0, "spot_demand": 2.0}
    assert data["zones"] == {"us-central1-a": {"g2-standard-8": 1}, "us-central1-b": {"g2-standard-8": 1},
                             "us-central1-c": {"g2-standard-8": 1}}
    assert data["busy"] is None  # GCP does not report it
    assert len(data["preemptions"]) == 1 and data["preemptions"][0].endswith("example-gcp-l4-spot-q7w6")
    table = runner.invoke(app, ["pool", "status", "l4", "--stack", "example-gcp"])
    assert table.exit_code == 0 and "unknown (GCP does not report it)" in table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80, table.output  # (no COLUMNS: 80)


def test_cloud_errors_are_one_line(project, runner, monkeypatch):
    monkeypatch.setenv("SPOTCTL_MONITORING_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    result = runner.invoke(app, ["pool", "demand", "l4", "1", "--stack", "example-gcp"])
    assert result.exit_code == 1 and result.output.startswith("error: cannot ask the cloud") and "Traceback" not in result.output


@pytest.mark.parametrize("argv, missing", [
    (["pool", "status", "g5", "--stack", "example-aws"], "no AWS credentials ("),
    (["pool", "demand", "g5", "6", "--stack", "example-aws"], "no AWS credentials ("),
    (["pool", "status", "l4", "--stack", "example-gcp"], "no GCP credentials ("),
    (["pool", "demand", "l4", "3", "--stack", "example-gcp", "--json"], "no GCP credentials ("),
])
def test_no_credentials_is_spotctls_one_error_line(project, runner, no_credentials, argv, missing):
    stack_file = project / "stacks" / f"Pulumi.{argv[argv.index('--stack') + 1]}.yaml"
    before = stack_file.read_bytes()
    result = runner.invoke(app, argv)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.exception, result.output)
    assert result.output.splitlines() == [result.output.splitlines()[0]], result.output
    assert result.output.startswith(f"error: cannot ask the cloud: {missing}"), result.output  # as every other command says it
    assert stack_file.read_bytes() == before


def test_an_aws_call_failing_is_one_error_line(project, runner, monkeypatch):
    """Credentials are there (a local endpoint), the calls fail: boto3's error becomes the line, not a traceback."""
    for k, v in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    for argv in (["pool", "status", "g5", "--stack", "example-aws"], ["pool", "demand", "g5", "6", "--stack", "example-aws"]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.exception, result.output)
        assert result.output.startswith("error: cannot ask the cloud: EndpointConnectionError") and len(result.output.splitlines()) == 1


def test_view_types_are_plain_data():
    view = PoolView({"spot": 1}, [PoolVm("vm", "spot", "z", "t", "RUNNING", None)], {}, [])
    assert view.vms[0].busy is None
