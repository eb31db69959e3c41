"""Another deployment of this stack's name in the same AWS account, found with read-only calls.

IAM names are account-wide, so a stack deployed in two regions (or twice) shares its permissions
boundary's name, spotctl-<slug>-boundary: the second `pulumi up` fails on it (EntityAlreadyExists),
or, worse, takes it over. The boundary carries the region and the event bucket of the deployment that
made it (``infra.naming.DEPLOYED_REGION_TAG``, ``DEPLOYED_BUCKET_TAG``): a deployment in another region,
or in this region with another event bucket, is another one."""

from __future__ import annotations

from cli.cloud import call
from infra.naming import DEPLOYED_BUCKET_TAG, DEPLOYED_REGION_TAG, boundary_name, owner_value, stack_slug


def aws_boundary(region: str, stack: str) -> dict[str, str] | None:
    """The tags of this stack name's boundary in the caller's account; None when there is none.
    Raises CloudError (one line) when the account cannot be asked."""
    import boto3

    def ask():
        account = boto3.client("sts", region_name=region).get_caller_identity()["Account"]
        iam = boto3.client("iam", region_name=region)
        arn = f"arn:aws:iam::{account}:policy/spotctl/{boundary_name(stack_slug(stack))}"
        try:
            tags = iam.list_policy_tags(PolicyArn=arn)["Tags"]
        except iam.exceptions.NoSuchEntityException:
            return None
        return {t["Key"]: t["Value"] for t in tags}

    return call(ask)


def clash(stack: str, region: str, tags: dict[str, str] | None, bucket: str | None = None) -> str | None:
    """Why this deployment would collide with the one that owns the boundary (None: it is this one,
    or there is none). A boundary of another stack whose name has the same slug counts too.
    ``bucket``: this stack file's deployment's event bucket, when known (None: not deployed, or not
    known here)."""
    if tags is None:
        return None
    name = boundary_name(stack_slug(stack))
    if tags.get("spotctl:owner") not in (None, owner_value(stack)):
        return (f"the IAM policy {name} belongs to another stack whose name makes the same slug: IAM names are "
                "account-wide, so give this stack another name")
    there = tags.get(DEPLOYED_REGION_TAG)
    if there and there != region:
        return (f"stack {stack} is already deployed in {there} in this account (its permissions boundary {name}): "
                f"IAM names are account-wide, so a deployment in {region} would collide with it; give this stack "
                "another name, or deploy it in one region")
    theirs = tags.get(DEPLOYED_BUCKET_TAG)
    if theirs and bucket != theirs:
        ours = (f"this stack file's deployment has event bucket {bucket}" if bucket else
                f"if it is this stack file's, say so with --events-bucket {theirs} (or `spotctl sync` with it)")
        return (f"stack {stack} is already deployed in {region} in this account by a deployment with event bucket "
                f"{theirs} (its permissions boundary {name}); {ours}; a second deployment would collide with it "
                "(IAM names are account-wide, Auto Scaling groups, alarms and rules per region): give it another name")
    return None
