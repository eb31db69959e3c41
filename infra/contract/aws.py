"""AWS rules (see ``infra.contract``). One ``@rule`` per rule the AWS APIs enforce on what spotctl
declares, each citing its source; checks get the pulumi-aws constructor inputs as plain Python."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.contract import dig, known, rule

INSTANCE = "aws:ec2/instance:Instance"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"

@rule("aws.imdsv2-required", [INSTANCE, LAUNCH_TEMPLATE],
      says="spotctl requires IMDSv2 on every VM: metadata_options.http_tokens = 'required' (EC2's default is 'optional').",
      fix="build metadata_options with http_tokens='required' (infra/aws.py _metadata_options)",
      source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-new-instances.html")
def imdsv2(type_: str, props: Mapping[str, Any]) -> str | None:
    tokens = dig(props, "metadata_options.http_tokens")
    if not known(tokens):
        return None
    return None if tokens == "required" else f"metadata_options.http_tokens is {tokens!r}"


SCALING_POLICY = "aws:autoscaling/policy:Policy"
STEP_DOC = "https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_StepAdjustment.html"
MAX_STEP_ADJUSTMENTS = 20


def _bound(value: Any) -> float | None:
    return None if value in (None, "") else float(value)


@rule("aws.step-adjustments", [SCALING_POLICY],
      says="Step adjustments must not overlap or leave a gap; at most one has no lower and at most one no upper "
           "bound, never both in one step; with ExactCapacity every adjustment is non-negative.",
      fix="build the steps with infra.common.demand_steps (contiguous from 0, one open-ended last step)",
      source=STEP_DOC + " (\"The ranges of your step adjustments can't overlap or have a gap.\" ... \"For exact "
             "capacity, you must specify a non-negative value.\")")
def step_adjustments(type_: str, props: Mapping[str, Any]) -> str | None:
    steps = props.get("step_adjustments")
    if props.get("policy_type") != "StepScaling" or not isinstance(steps, list) or not known(*steps):
        return None
    spans = []
    for s in steps:
        lower, upper = dig(s, "metric_interval_lower_bound"), dig(s, "metric_interval_upper_bound")
        adjustment = dig(s, "scaling_adjustment")
        if not known(lower, upper, adjustment):
            return None
        lower, upper = _bound(lower), _bound(upper)
        if lower is None and upper is None:
            return "a step has neither a lower nor an upper bound"
        if props.get("adjustment_type") == "ExactCapacity" and adjustment is not None and adjustment < 0:
            return f"ExactCapacity step with a negative adjustment {adjustment}"
        spans.append((float("-inf") if lower is None else lower, float("inf") if upper is None else upper))
    if sum(1 for lo, _ in spans if lo == float("-inf")) > 1 or sum(1 for _, hi in spans if hi == float("inf")) > 1:
        return "more than one step without a lower (or upper) bound"
    spans.sort()
    for (_, hi1), (lo2, _) in zip(spans, spans[1:], strict=False):
        if hi1 != lo2:
            return f"steps {'overlap' if hi1 > lo2 else 'leave a gap'} between {hi1:g} and {lo2:g}"
    if any(lo >= hi for lo, hi in spans):
        return "a step's upper bound is not above its lower bound"
    return None


@rule("aws.step-adjustments-max-20", [SCALING_POLICY],
      says=f"A step scaling policy has at most {MAX_STEP_ADJUSTMENTS} step adjustments (a fixed Auto Scaling quota).",
      fix="let infra.common.demand_steps coarsen the steps (it never gives more than 20)",
      source="https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-quotas.html "
             "(\"Step adjustments per step scaling policy 20\")")
def step_count(type_: str, props: Mapping[str, Any]) -> str | None:
    steps = props.get("step_adjustments")
    if isinstance(steps, list) and len(steps) > MAX_STEP_ADJUSTMENTS:
        return f"{len(steps)} step adjustments"
    return None


@rule("aws.step-scaling-needs-adjustment-type", [SCALING_POLICY],
      says="AdjustmentType and StepAdjustments are required when the policy type is StepScaling.",
      fix="give adjustment_type (ExactCapacity) and step_adjustments",
      source="botocore autoscaling service-2.json PutScalingPolicyType.AdjustmentType / .StepAdjustments (\"Required if "
             "the policy type is StepScaling\"); https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutScalingPolicy.html")
def step_needs_type(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("policy_type") != "StepScaling":
        return None
    missing = [k for k in ("adjustment_type", "step_adjustments") if not props.get(k)]
    return f"StepScaling without {', '.join(missing)}" if missing else None
