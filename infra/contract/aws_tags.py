"""AWS's tag rules (see ``infra.contract``): how many tags a resource carries and which keys AWS reserves.
``infra.limits`` reads them back onto ``spotctl:labels``; importing ``infra.contract.aws`` registers them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.contract.rulebook import rule

# The resource types spotctl tags (infra/aws*.py: aws_tags); ASG tags are a list, checked by their count too.
TAGGED = ("aws:ec2/instance:Instance", "aws:ec2/launchTemplate:LaunchTemplate", "aws:ebs/volume:Volume",
          "aws:ebs/snapshot:Snapshot", "aws:ec2/securityGroup:SecurityGroup", "aws:iam/role:Role",
          "aws:iam/instanceProfile:InstanceProfile", "aws:cloudwatch/eventRule:EventRule", "aws:s3/bucket:Bucket")
# ---- tags -----------------------------------------------------------------------------------------

MAX_TAGS = 50
TAGS_SOURCE = ("AWS tag restrictions as https://docs.aws.amazon.com/batch/latest/userguide/tag-restrictions.html and the ECS "
               "Tag API reference state them (\"Maximum number of "
               "tags per resource - 50\"; \"Don't use aws: ... as a prefix for either keys or values, as it is reserved for "
               "AWS use\"; keys at most 128, values at most 256 Unicode characters)")


def tag_problems(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(label key or "" for the whole map, message) for spotctl:labels that would break EC2's tag rules on a
    resource that also carries spotctl's own tags (infra/naming.py AWS_SPOTCTL_TAGS_MAX). The key and value
    rules (no ``aws:`` prefix, lengths) are within spotctl's stricter label rules (infra/config/stack.py)."""
    from infra.naming import AWS_SPOTCTL_TAGS_MAX

    out = []
    room = MAX_TAGS - AWS_SPOTCTL_TAGS_MAX
    if len(labels) > room:
        out.append(("", f"{len(labels)} labels: at most {room} on AWS (a resource takes {MAX_TAGS} tags and spotctl puts up "
                        f"to {AWS_SPOTCTL_TAGS_MAX} of its own on a job's VM; rule aws.tags-50): drop {len(labels) - room}"))
    return out


@rule("aws.tags-50", TAGGED,
      says=f"An AWS resource carries at most {MAX_TAGS} user tags (aws:-prefixed tags are AWS's own and reserved).",
      fix="fewer spotctl:labels (`spotctl validate` checks them against infra/naming.py AWS_SPOTCTL_TAGS_MAX)",
      source=TAGS_SOURCE)
def tags_50(type_: str, props: Mapping[str, Any]) -> str | None:
    tags = props.get("tags")
    if not isinstance(tags, Mapping):
        return None
    mine = [k for k in tags if not str(k).lower().startswith("aws:")]
    return f"{len(mine)} tags (limit {MAX_TAGS})" if len(mine) > MAX_TAGS else None
