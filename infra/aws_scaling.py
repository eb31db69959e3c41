"""AWS pool groups and their demand-driven scaling (used by ``infra.aws.GpuPool``): an ASG over
every subnet and instance type, and the alarm + step policy that sizes it by the pool's published
demand metric (see README, "Pools")."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.common import PoolPart, demand_steps
from infra.config import Pool
from infra.naming import CLOUDWATCH_NAMESPACE, pool_metric_dimensions


def mixed_group(resource: str, physical: str, min_size: int, max_size: int, *, on_demand_base: int,
                 on_demand_above_base_pct: int, vpc_zone_identifiers, template_id, instance_types, tags, opts):
    """An ASG over every subnet and instance type: ``on_demand_base`` on-demand instances, then
    ``on_demand_above_base_pct`` % on-demand above it (the rest spot); the ASG refills what spot takes."""
    return aws.autoscaling.Group(
        resource,
        name=physical,
        min_size=min_size,
        max_size=max_size,
        vpc_zone_identifiers=vpc_zone_identifiers,
        capacity_rebalance=on_demand_above_base_pct < 100,
        # Never block `pulumi up` on capacity (spot may be short, GPU quotas too): the group keeps
        # trying on its own; its activity history says what it got (contract rule aws.asg-no-capacity-wait).
        wait_for_capacity_timeout="0",
        mixed_instances_policy=aws.autoscaling.GroupMixedInstancesPolicyArgs(
            instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                on_demand_base_capacity=on_demand_base,
                on_demand_percentage_above_base_capacity=on_demand_above_base_pct,
                spot_allocation_strategy="price-capacity-optimized",
                # spot_max_price left unset: the cap is the on-demand price.
            ),
            launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                    launch_template_id=template_id, version="$Latest"
                ),
                overrides=[aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(instance_type=t) for t in instance_types],
            ),
        ),
        tags=[aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True) for k, v in tags.items()],
        opts=opts,
    )


def demand_scaling(resource: str, physical: str, stack: str, pool: Pool, group, part: PoolPart, base: int, tags, opts):
    """Size ``group`` to ``base`` + the part's share of the published demand, never by CPU.

    A step scaling policy with ExactCapacity steps (``infra.common.demand_steps``) behind an alarm on
    the pool's demand metric with threshold 0, so the alarm is in ALARM whenever demand is
    published, 0 included, and Auto Scaling re-runs the policy every minute it stays there (alarm
    actions other than Auto Scaling's run only on state changes). The metric is a total for the
    pool, defined at 0 instances, so a part with min 0 grows from zero; target tracking would need
    a per-instance metric, undefined at 0 instances. Without published demand the alarm has
    INSUFFICIENT_DATA and the group keeps its size.
    """
    policy = aws.autoscaling.Policy(
        f"{resource}-demand-policy",
        name=f"{physical}-demand",
        autoscaling_group_name=group.name,
        policy_type="StepScaling",
        adjustment_type="ExactCapacity",
        metric_aggregation_type="Maximum",
        step_adjustments=[
            aws.autoscaling.PolicyStepAdjustmentArgs(
                metric_interval_lower_bound=str(step.lower),
                metric_interval_upper_bound=None if step.upper is None else str(step.upper),
                scaling_adjustment=base + step.size,
            )
            for step in demand_steps(part.min_size, part.max_size)
        ],
        opts=opts,
    )
    aws.cloudwatch.MetricAlarm(
        f"{resource}-demand-alarm",
        name=f"{physical}-demand",
        alarm_description=f"spotctl {stack}/{pool.name}: {part.metric} sizes the {part.name} part (always in ALARM while published)",
        namespace=CLOUDWATCH_NAMESPACE,
        metric_name=part.metric,
        dimensions=pool_metric_dimensions(stack, pool.name),
        statistic="Maximum",
        period=60,
        evaluation_periods=1,
        comparison_operator="GreaterThanOrEqualToThreshold",
        threshold=0,
        treat_missing_data="missing",
        alarm_actions=[policy.arn],
        tags=tags,
        opts=opts,
    )
    return policy


def protect_policy(resource: str, role, groups, opts):
    """Let the pool's instances set scale-in protection, in the pool's groups only: a busy instance
    looks its group up (DescribeAutoScalingInstances) and protects itself (SetInstanceProtection)."""
    return aws.iam.RolePolicy(
        resource,
        role=role.id,
        policy=pulumi.Output.all(*[g.arn for g in groups]).apply(
            lambda arns: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Sid": "ProtectSelfInPool", "Effect": "Allow", "Action": "autoscaling:SetInstanceProtection",
                         "Resource": list(arns)},
                        # Describe* actions take no resource-level permissions.
                        {"Sid": "FindOwnGroup", "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingInstances",
                         "Resource": "*"},
                    ],
                }
            )
        ),
        opts=opts,
    )
