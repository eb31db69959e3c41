"""Pool demand keeps arriving every minute: `spotctl pool demand` keeps it in the event bucket, the
watcher publishes it again every minute, its role may do exactly that, and the published metric
drives the pool's alarm and step policy as infra declares them. AWS parts against moto."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from cli.app import app
from cli.lifecycle import stackfile
from cli.plan import mocks as planner
from cli.pools import record
from cli.watch import observe, watcher
from infra.config import validate
from infra.naming import CLOUDWATCH_NAMESPACE, pool_demand_key
from tests.conftest import AWS_BASE, aws_job, stack_config
from tests.iam_eval import allowed
from tests.test_watcher_iam import AWS_WATCHER, NAT, POOL, aws_raw, only

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
BUCKET = "example-aws-events"
DIMS = [{"Name": "Stack", "Value": "example-aws"}, {"Name": "Pool", "Value": "g5"}]


def _datapoints(metric: str, since: datetime, until: datetime) -> list[tuple[datetime, float]]:
    got = boto3.client("cloudwatch", region_name="us-east-1").get_metric_statistics(
        Namespace=CLOUDWATCH_NAMESPACE, MetricName=metric, Dimensions=DIMS, StartTime=since, EndTime=until,
        Period=60, Statistics=["Maximum"])
    return sorted((p["Timestamp"], p["Maximum"]) for p in got["Datapoints"])


# ---- the record and the watcher's minute -----------------------------------------------------------


@mock_aws
def test_pool_demand_keeps_its_demand_in_the_event_bucket(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    result = runner.invoke(app, ["pool", "demand", "g5", "5", "--stack", "example-aws", "--events-bucket", BUCKET])
    assert result.exit_code == 0, result.output
    body = boto3.client("s3", region_name="us-east-1").get_object(Bucket=BUCKET, Key=pool_demand_key("example-aws", "g5"))
    kept = json.loads(body["Body"].read())
    assert (kept["pool"], kept["vms"]) == ("g5", 5)
    # A later demand replaces it (the conditional write takes the object's generation).
    assert runner.invoke(app, ["pool", "demand", "g5", "3", "--stack", "example-aws", "--events-bucket", BUCKET]).exit_code == 0
    body = boto3.client("s3", region_name="us-east-1").get_object(Bucket=BUCKET, Key=pool_demand_key("example-aws", "g5"))
    assert json.loads(body["Body"].read())["vms"] == 3


def test_an_unreadable_record_names_the_pool():
    with pytest.raises(record.PoolError, match="pool g5: its demand record is unreadable"):
        record.Record.decode(b"{not json", "g5")
    with pytest.raises(record.PoolError, match="names pool 'g6'"):
        record.Record.decode(record.Record("g6", 1, T0).encode(), "g5")


@mock_aws
def test_the_watcher_publishes_the_recorded_demand_every_minute(project, monkeypatch):
    """Cycles every 20 s for 3 minutes from one `pool demand`: one publication per minute, each
    with the recorded demand (5 wanted: 3 above the on-demand base of 2)."""
    from cli.cloud import pool_cloud
    from cli.commands import cloud_for

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    ref = stackfile.resolve("example-aws", None)
    cfg = stackfile.load(ref)
    record.write(cloud_for(cfg, ref), BUCKET, ref.name, record.Record("g5", 5, T0 - timedelta(hours=3)))
    clock = [T0]

    def sleep(seconds: float) -> None:
        clock[0] += timedelta(seconds=seconds)

    records: list[dict] = []
    report = watcher.Report(emit=records.append, warn=lambda w: records.append({"warning": w}), out=lambda line: None)
    settings = watcher.Settings(ref, observe.Sources(bucket=BUCKET, poll=False), None, interval_s=20,
                                pools_for=lambda c: pool_cloud(c, ref.name))
    watcher.run(settings, report, cloud_for=lambda c: cloud_for(c, ref), now=lambda: clock[0],
                rng=random.Random(1), sleep=sleep, cycles=9)
    published = [r for r in records if r.get("action") == "publish"]
    assert [r["time"] for r in published] == [(T0 + timedelta(minutes=m)).isoformat() for m in range(3)], records
    assert all(r["metrics"] == {"demand": 5.0, "spot_demand": 3.0} for r in published)
    points = _datapoints("spot_demand", T0 - timedelta(minutes=1), T0 + timedelta(minutes=4))
    assert points == [(T0 + timedelta(minutes=m), 3.0) for m in range(3)]


@mock_aws
def test_no_record_publishes_nothing_and_a_broken_one_is_a_warning(project, monkeypatch):
    from cli.cloud import pool_cloud
    from cli.commands import cloud_for

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    ref = stackfile.resolve("example-aws", None)
    cfg = stackfile.load(ref)
    warnings: list[str] = []
    again = record.Republisher()
    assert again.run(cfg, ref.name, cloud_for(cfg, ref), pool_cloud(cfg, ref.name), BUCKET, T0, warnings.append) == []
    s3.put_object(Bucket=BUCKET, Key=pool_demand_key(ref.name, "g5"), Body=b"6")
    assert again.run(cfg, ref.name, cloud_for(cfg, ref), pool_cloud(cfg, ref.name), BUCKET, T0 + timedelta(minutes=1),
                     warnings.append) == []
    assert warnings and warnings[0].startswith("pool g5: its demand was not published again this cycle")


# ---- the watcher's grant ---------------------------------------------------------------------------
# Evaluated with tests/iam_eval.py, not moto's IAM authentication: moto checks CloudWatch calls as
# `monitoring:<Action>` (its endpoint prefix), while IAM's service prefix is `cloudwatch`
# (Service Authorization Reference, "Actions, resources, and condition keys for Amazon CloudWatch"), so
# the documented policy is denied there and an unconditioned `monitoring:*` would be needed to pass.


def _policy(raw: dict) -> dict:
    p = planner.run(validate(raw, "test"), "team")
    return json.loads(only(p, "aws:iam/rolePolicy:RolePolicy", "watcher-policy").inputs["policy"])


def test_the_watcher_may_publish_in_spotctls_namespace_only():
    policy = _policy(aws_raw())
    assert allowed(policy, "cloudwatch:PutMetricData", "*", **{"cloudwatch:namespace": CLOUDWATCH_NAMESPACE})
    for other in ("AWS/EC2", "spotctl-other", "Spotctl"):
        assert not allowed(policy, "cloudwatch:PutMetricData", "*", **{"cloudwatch:namespace": other}), other
    assert not allowed(policy, "cloudwatch:PutMetricAlarm", "*", **{"cloudwatch:namespace": CLOUDWATCH_NAMESPACE})
    # No fallback in this pool: nothing read back.
    assert not allowed(policy, "cloudwatch:GetMetricStatistics", "*")
    fallback = aws_raw(pools=[{**POOL, "fallbackToOnDemand": 10}])
    assert allowed(_policy(fallback), "cloudwatch:GetMetricStatistics", "*")
    assert allowed(_policy(fallback), "autoscaling:DescribeAutoScalingGroups", "*")
    # A stack without pools: no CloudWatch at all.
    bare = {**stack_config(AWS_BASE, network=NAT, jobs=[aws_job()]), "watcher": AWS_WATCHER}
    assert not allowed(_policy(bare), "cloudwatch:PutMetricData", "*", **{"cloudwatch:namespace": CLOUDWATCH_NAMESPACE})


def test_the_watcher_reaches_cloudwatch():
    """Under the default `s3-endpoint` egress (an S3 gateway only) config already requires the
    watcher's public IP; with `nat` its subnet routes out. Either way the public endpoint is reached."""
    plain = {**aws_raw(), "network": {"subnets": NAT["subnets"]}}
    with pytest.raises(Exception, match="watcher.externalIp"):
        validate(plain, "test")
    p = planner.run(validate({**plain, "watcher": {**AWS_WATCHER, "externalIp": True}}, "test"), "team")
    assert only(p, "aws:ec2/instance:Instance", "watcher-vm").inputs["associatePublicIpAddress"] is True


# ---- the chain: published metric -> alarm -> step policy --------------------------------------------


def _evaluate(alarm: dict, now: datetime) -> tuple[str, float | None]:
    """CloudWatch's evaluation of one alarm over its last ``EvaluationPeriods`` periods of ``Period``
    (AlarmThatSendsEmail.html: "Evaluating an alarm"; missing data "missing": no point, no state)."""
    cw = boto3.client("cloudwatch", region_name="us-east-1")
    got = cw.get_metric_statistics(Namespace=alarm["Namespace"], MetricName=alarm["MetricName"], Dimensions=alarm["Dimensions"],
                                   StartTime=now - timedelta(seconds=alarm["Period"] * alarm["EvaluationPeriods"]),
                                   EndTime=now, Period=alarm["Period"], Statistics=[alarm["Statistic"]])
    points = [p[alarm["Statistic"]] for p in got["Datapoints"]]
    if not points:
        return "INSUFFICIENT_DATA", None
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    return "ALARM" if max(points) >= alarm["Threshold"] else "OK", max(points)


def _step(policy: dict, value: float, threshold: float) -> int:
    """The step adjustment whose bounds (relative to the threshold) hold ``value``
    (as-scaling-simple-step.html, "Step adjustments": lower inclusive, upper exclusive)."""
    for step in policy["StepAdjustments"]:
        lower = step.get("MetricIntervalLowerBound", float("-inf"))
        upper = step.get("MetricIntervalUpperBound", float("inf"))
        if lower <= value - threshold < upper:
            return step["ScalingAdjustment"]
    raise AssertionError(f"no step holds {value}")


@mock_aws
def test_published_demand_drives_the_alarm_and_the_step_policy(project, monkeypatch):
    """The alarm and the policy as the plan declares them (created in moto), the metric as the
    watcher publishes it: the alarm fires and the policy's step sets the group to base + demand."""
    from cli.cloud import pool_cloud
    from cli.commands import cloud_for

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    ref = stackfile.resolve("example-aws", None)
    cfg = stackfile.load(ref)
    p = planner.run(cfg, ref.name)
    alarm_in = only(p, "aws:cloudwatch/metricAlarm:MetricAlarm", "pool-g5-spot-demand-alarm").inputs
    policy_in = only(p, "aws:autoscaling/policy:Policy", "pool-g5-spot-demand-policy").inputs
    ec2, asg = boto3.client("ec2", region_name="us-east-1"), boto3.client("autoscaling", region_name="us-east-1")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    ec2.create_launch_template(LaunchTemplateName="pool-lt", LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.2xlarge"})
    asg.create_auto_scaling_group(AutoScalingGroupName="example-aws-g5", MinSize=2, MaxSize=14, DesiredCapacity=2,
                                  LaunchTemplate={"LaunchTemplateName": "pool-lt", "Version": "$Latest"}, VPCZoneIdentifier=subnet)
    asg.put_scaling_policy(
        AutoScalingGroupName="example-aws-g5", PolicyName=policy_in["name"], PolicyType=policy_in["policyType"],
        AdjustmentType=policy_in["adjustmentType"], MetricAggregationType=policy_in["metricAggregationType"],
        StepAdjustments=[{k: (float(v) if "Bound" in k else v) for k, v in (
            ("MetricIntervalLowerBound", s.get("metricIntervalLowerBound")), ("MetricIntervalUpperBound", s.get("metricIntervalUpperBound")),
            ("ScalingAdjustment", int(s["scalingAdjustment"]))) if v is not None} for s in policy_in["stepAdjustments"]])
    policy_arn = asg.describe_policies(PolicyNames=[policy_in["name"]])["ScalingPolicies"][0]["PolicyARN"]
    cw = boto3.client("cloudwatch", region_name="us-east-1")
    cw.put_metric_alarm(AlarmName=alarm_in["name"], Namespace=alarm_in["namespace"], MetricName=alarm_in["metricName"],
                        Dimensions=[{"Name": k, "Value": v} for k, v in alarm_in["dimensions"].items()],
                        Statistic=alarm_in["statistic"], Period=int(alarm_in["period"]), EvaluationPeriods=int(alarm_in["evaluationPeriods"]),
                        ComparisonOperator=alarm_in["comparisonOperator"], Threshold=alarm_in["threshold"],
                        TreatMissingData=alarm_in["treatMissingData"], AlarmActions=[policy_arn])
    alarm = cw.describe_alarms(AlarmNames=[alarm_in["name"]])["MetricAlarms"][0]
    assert _evaluate(alarm, T0) == ("INSUFFICIENT_DATA", None)  # nothing published: the group keeps its size

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    record.write(cloud_for(cfg, ref), BUCKET, ref.name, record.Record("g5", 9, T0))
    again = record.Republisher()
    for minute in range(3):
        now = T0 + timedelta(minutes=minute, seconds=5)
        again.run(cfg, ref.name, cloud_for(cfg, ref), pool_cloud(cfg, ref.name), BUCKET, now, lambda w: None)
        state, value = _evaluate(alarm, now + timedelta(seconds=1))
        assert state == "ALARM" and value == 7.0  # 9 wanted, 2 on the on-demand base
        policy = asg.describe_policies(PolicyNames=[policy_in["name"]])["ScalingPolicies"][0]
        assert policy["PolicyARN"] in alarm["AlarmActions"]
        asg.set_desired_capacity(AutoScalingGroupName="example-aws-g5",
                                 DesiredCapacity=_step(policy, value, alarm["Threshold"]))
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["example-aws-g5"])["AutoScalingGroups"][0]
        assert group["DesiredCapacity"] == 2 + 7
