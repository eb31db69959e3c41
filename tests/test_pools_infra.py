"""Pools grow with demand from zero: under Pulumi's mocks both clouds size the pool's
dynamic parts by the published demand metric, never by CPU, and the policies' SHAPE is checked by
evaluating it the way each cloud does (an alarm + step policy on AWS, a per-group metric with
single-instance assignment on GCP) for demands from 0 up."""

from __future__ import annotations

import json
import math
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.plan import mocks as planner
from infra import contract
from infra.common import MAX_STEPS, demand_steps
from infra.config import ConfigError, validate
from infra.contract import ContractError
from infra.naming import owner_value
from tests.conftest import AWS_BASE, GCP_BASE, stack_config

ASG = "aws:autoscaling/group:Group"
POLICY = "aws:autoscaling/policy:Policy"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
SCALER = "gcp:compute/regionAutoscaler:RegionAutoscaler"

AWS_POOL = {"name": "g5", "instanceTypes": ["g5.2xlarge", "g6.2xlarge"], "onDemand": 2, "spotMin": 0, "spotMax": 5}
GCP_POOL = {"name": "l4", "machineType": "g2-standard-8", "onDemand": 1, "spotMin": 0, "spotMax": 4}


@cache
def _plan(key: str) -> planner.Plan:
    return planner.run(validate(json.loads(key), "test"), "team-a")


def plan_of(raw: dict) -> planner.Plan:
    return _plan(json.dumps(raw, sort_keys=True))


def named(plan: planner.Plan, type_: str, part: str) -> planner.Resource:
    found = [r for r in plan.by_type(type_) if part in r.name]
    assert len(found) == 1, [r.name for r in plan.by_type(type_)]
    return found[0]


# ---- AWS: what the group's desired capacity becomes for a published value ------------------------


def aws_desired(alarm: dict, policy: dict, value: float) -> int | None:
    """EC2 Auto Scaling's reading of an alarm + step policy: None while the alarm is not in ALARM
    (the group keeps its size); else the ExactCapacity of the step holding value - threshold."""
    ops = {"GreaterThanOrEqualToThreshold": value >= alarm["threshold"], "GreaterThanThreshold": value > alarm["threshold"]}
    if not ops[alarm["comparisonOperator"]]:
        return None
    assert policy["adjustmentType"] == "ExactCapacity"
    over = value - alarm["threshold"]
    for step in policy["stepAdjustments"]:
        lower = float(step.get("metricIntervalLowerBound", "-inf"))
        upper = float(step.get("metricIntervalUpperBound", "inf"))
        if lower <= over < upper:
            return int(step["scalingAdjustment"])
    raise AssertionError(f"no step holds {over}")


def test_aws_spot_part_follows_published_demand_from_zero():
    plan = plan_of(stack_config(AWS_BASE, pools=[AWS_POOL]))
    group = named(plan, ASG, "pool-g5-asg").inputs
    policy = named(plan, POLICY, "spot").inputs
    alarm = named(plan, ALARM, "spot").inputs
    assert policy["policyType"] == "StepScaling" and policy["autoscalingGroupName"] == group["name"]
    (action,) = alarm["alarmActions"]
    assert action.startswith("arn:aws:autoscaling:") and "policy/pool-g5-spot-demand-policy-" in action
    # The metric is the pool's total, published by `spotctl pool demand`, not a per-instance one.
    assert (alarm["namespace"], alarm["metricName"]) == ("spotctl", "spot_demand")
    assert alarm["dimensions"] == {"Pool": "g5", "Stack": "team-a"}
    assert alarm["treatMissingData"] == "missing"  # nobody publishing: the group keeps its size
    assert group["minSize"] == 2.0 and group["maxSize"] == 7.0
    # on-demand base (2) + the spot share, from zero spot VMs up to spotMax, never past it
    assert [aws_desired(alarm, policy, d) for d in range(8)] == [2, 3, 4, 5, 6, 7, 7, 7]
    assert aws_desired(alarm, policy, 0) == 2  # spotMin 0: the spot part scales to zero...
    assert aws_desired(alarm, policy, 1) == 3  # ...and grows from it


def test_aws_no_cpu_or_target_tracking_on_a_gpu_pool():
    plan = plan_of(stack_config(AWS_BASE, pools=[AWS_POOL]))
    for policy in plan.by_type(POLICY):
        assert policy.inputs["policyType"] == "StepScaling"
        assert "targetTrackingConfiguration" not in policy.inputs
    for alarm in plan.by_type(ALARM):
        assert alarm.inputs["namespace"] == "spotctl", alarm.inputs  # never AWS/EC2 CPUUtilization


def test_aws_spot_min_is_a_floor_and_large_pools_stay_within_20_steps():
    plan = plan_of(stack_config(AWS_BASE, pools=[{**AWS_POOL, "spotMin": 2, "spotMax": 60}]))
    policy, alarm = named(plan, POLICY, "spot").inputs, named(plan, ALARM, "spot").inputs
    assert len(policy["stepAdjustments"]) <= 20
    for d in range(0, 70):
        got = aws_desired(alarm, policy, d)
        assert got - 2 >= min(max(d, 2), 60) and got <= 62, (d, got)


def test_aws_fallback_group_is_on_demand_and_sized_by_fallback_demand():
    plan = plan_of(stack_config(AWS_BASE, pools=[{**AWS_POOL, "fallbackToOnDemand": 15}]))
    fallback = named(plan, ASG, "fallback").inputs
    dist = fallback["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist["onDemandBaseCapacity"] == 0.0 and dist["onDemandPercentageAboveBaseCapacity"] == 100.0
    assert fallback["minSize"] == 0.0 and fallback["maxSize"] == 5.0
    alarm, policy = named(plan, ALARM, "fallback").inputs, named(plan, POLICY, "fallback").inputs
    assert alarm["metricName"] == "fallback_demand" and policy["autoscalingGroupName"] == fallback["name"]
    assert [aws_desired(alarm, policy, d) for d in range(7)] == [0, 1, 2, 3, 4, 5, 5]
    assert plan.outputs["pools"]["g5"] == {"asg": "team-a-g5", "fallbackAsg": "team-a-g5-fallback"}
    assert not [r for r in plan_of(stack_config(AWS_BASE, pools=[AWS_POOL])).by_type(ASG) if "fallback" in r.name]


def test_aws_instances_may_protect_themselves_only_in_their_pool():
    plan = plan_of(stack_config(AWS_BASE, pools=[{**AWS_POOL, "fallbackToOnDemand": 15}]))
    doc = json.loads(named(plan, "aws:iam/rolePolicy:RolePolicy", "protect").inputs["policy"])
    protect = next(s for s in doc["Statement"] if s["Action"] == "autoscaling:SetInstanceProtection")
    assert sorted(a.split("/", 1)[1] for a in protect["Resource"]) == ["team-a-g5", "team-a-g5-fallback"]
    assert all(a.startswith("arn:aws:autoscaling:") for a in protect["Resource"])


# ---- GCP: the autoscaler's target for a published value -------------------------------------------


def gce_target(policy: dict, value: float) -> int:
    """The Compute Engine autoscaler with one per-group metric: ceil(value / single instance
    assignment) VMs, within min..max."""
    (metric,) = policy["metrics"]
    wanted = math.ceil(value / metric["singleInstanceAssignment"])
    return max(int(policy["minReplicas"]), min(int(policy["maxReplicas"]), wanted))


def test_gcp_spot_mig_follows_published_demand_from_zero():
    plan = plan_of(stack_config(GCP_BASE, pools=[GCP_POOL]))
    policy = named(plan, SCALER, "spot").inputs["autoscalingPolicy"]
    assert "cpuUtilization" not in policy and "loadBalancingUtilization" not in policy
    (metric,) = policy["metrics"]
    assert metric["name"] == "custom.googleapis.com/spotctl/pool/spot_demand"
    assert metric["filter"] == f'resource.type = "global" AND metric.labels.stack = "{owner_value("team-a")}" AND metric.labels.pool = "l4"'
    assert "target" not in metric  # per-group: single-instance assignment, not a utilization target
    assert [gce_target(policy, d) for d in range(7)] == [0, 1, 2, 3, 4, 4, 4]
    assert policy["scaleInControl"] == {"maxScaledInReplicas": {"fixed": 1.0}, "timeWindowSec": 600.0}
    assert "targetSize" not in named(plan, MIG, "spot").inputs
    assert named(plan, MIG, "ondemand").inputs["targetSize"] == 1.0  # the base holds its size
    assert len(plan.by_type(SCALER)) == 1  # nothing scales the static part


def test_gcp_fallback_mig_is_standard_and_sized_by_fallback_demand():
    plan = plan_of(stack_config(GCP_BASE, pools=[{**GCP_POOL, "fallbackToOnDemand": 10}]))
    assert named(plan, TEMPLATE, "fallback").inputs["scheduling"]["provisioningModel"] == "STANDARD"
    policy = named(plan, SCALER, "fallback").inputs["autoscalingPolicy"]
    assert policy["metrics"][0]["name"] == "custom.googleapis.com/spotctl/pool/fallback_demand"
    assert [gce_target(policy, d) for d in range(6)] == [0, 1, 2, 3, 4, 4]
    assert set(plan.outputs["pools"]["l4"]["migs"]) == {"ondemand", "spot", "fallback"}
    # Every autoscaled part has a shape GCE autoscales (gcp.autoscaled-mig-shape); the static part spreads evenly.
    shapes = {part: named(plan, MIG, part).inputs["distributionPolicyTargetShape"] for part in ("ondemand", "spot", "fallback")}
    assert shapes == {"ondemand": "EVEN", "spot": "BALANCED", "fallback": "BALANCED"}


# ---- the steps, for any pool size -----------------------------------------------------------------


@given(st.integers(0, 200), st.integers(0, 200), st.integers(0, 400))
def test_demand_steps_never_give_less_than_asked(lo, span, demand):
    min_size, max_size = lo, lo + span
    steps = demand_steps(min_size, max_size)
    assert 1 <= len(steps) <= MAX_STEPS
    assert steps[0].lower == 0 and steps[-1].upper is None
    assert all(a.upper == b.lower for a, b in zip(steps, steps[1:], strict=False))
    (step,) = [s for s in steps if s.lower <= demand and (s.upper is None or demand < s.upper)]
    assert max(min_size, min(demand, max_size)) <= step.size <= max_size
    if max_size < MAX_STEPS:
        assert step.size == max(min_size, min(demand, max_size))  # exact while steps suffice
    contract.check(POLICY, "p", {"policy_type": "StepScaling", "adjustment_type": "ExactCapacity", "step_adjustments": [
        {"metric_interval_lower_bound": str(s.lower), "metric_interval_upper_bound": None if s.upper is None else str(s.upper),
         "scaling_adjustment": s.size} for s in steps]})


# ---- the rules these rely on ----------------------------------------------------------------------


def _steps(*spans):
    return {"policy_type": "StepScaling", "adjustment_type": "ExactCapacity", "step_adjustments": [
        {"metric_interval_lower_bound": lo, "metric_interval_upper_bound": hi, "scaling_adjustment": n} for lo, hi, n in spans]}


@pytest.mark.parametrize("props,problem", [
    (_steps(("0", "1", 0), ("2", None, 1)), "leave a gap"),
    (_steps(("0", "2", 0), ("1", None, 1)), "overlap"),
    (_steps((None, None, 0)), "neither a lower nor an upper"),
    (_steps(("0", None, 0), ("1", None, 1)), "more than one step"),
    (_steps(("0", None, -1)), "negative"),
])
def test_step_adjustment_rule(props, problem):
    with pytest.raises(ContractError, match=f"(?s){problem}.*aws.step-adjustments"):
        contract.check(POLICY, "p", props)


def test_step_count_and_type_rules():
    many = _steps(*[(str(i), str(i + 1), i) for i in range(20)], ("20", None, 20))
    with pytest.raises(ContractError, match="aws.step-adjustments-max-20"):
        contract.check(POLICY, "p", many)
    with pytest.raises(ContractError, match="aws.step-scaling-needs-adjustment-type"):
        contract.check(POLICY, "p", {"policy_type": "StepScaling", "step_adjustments": [{"metric_interval_lower_bound": "0"}]})


def _scaler(min_replicas=0, **policy):
    return {"autoscaling_policy": {"min_replicas": min_replicas, "max_replicas": 4, **policy}}


GROUP_METRIC = {"name": "custom.googleapis.com/x", "filter": 'resource.type = "global"', "single_instance_assignment": 1}


@pytest.mark.parametrize("props,problem", [
    (_scaler(cpu_utilization={"target": 0.6}), "CPU"),
    (_scaler(), "no metric"),
    (_scaler(metrics=[{"name": "custom.googleapis.com/x", "target": 3}]), "per-instance"),
    (_scaler(metrics=[{**GROUP_METRIC, "filter": 'resource.type = "gce_instance"'}]), "per-instance"),
])
def test_zero_needs_a_per_group_metric(props, problem):
    with pytest.raises(ContractError, match=f"(?s){problem}.*gcp.autoscaler-zero-needs-per-group-metric"):
        contract.check(SCALER, "s", props)
    contract.check(SCALER, "s", {"autoscaling_policy": {**props["autoscaling_policy"], "min_replicas": 1}})
    contract.check(SCALER, "s", _scaler(metrics=[GROUP_METRIC]))


def test_metric_filter_and_count_rules():
    with pytest.raises(ContractError, match="gcp.autoscaler-metric-filter"):
        contract.check(SCALER, "s", _scaler(metrics=[{**GROUP_METRIC, "filter": 'resource.type = "global" OR a = "b"'}]))
    with pytest.raises(ContractError, match="gcp.autoscaler-max-5-metrics"):
        contract.check(SCALER, "s", _scaler(min_replicas=1, metrics=[GROUP_METRIC] * 6))


# ---- config ---------------------------------------------------------------------------------------


def test_fallback_needs_a_spot_part_and_minutes():
    with pytest.raises(ConfigError, match=r"pools\[0\].*fallbackToOnDemand replaces missing spot VMs"):
        validate(stack_config(AWS_BASE, pools=[{**AWS_POOL, "spotMax": 0, "fallbackToOnDemand": 5}]), "f.yaml")
    with pytest.raises(ConfigError, match=r"spotctl:pools\[0\]\.fallbackToOnDemand: expected a number >= 1"):
        validate(stack_config(AWS_BASE, pools=[{**AWS_POOL, "fallbackToOnDemand": 0}]), "f.yaml")
    with pytest.raises(ConfigError, match="did you mean 'fallbackToOnDemand'"):
        validate(stack_config(AWS_BASE, pools=[{**AWS_POOL, "fallbackToOndemand": 5}]), "f.yaml")
