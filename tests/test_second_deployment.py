"""A second deployment of a stack name in one AWS account: the permissions boundary's name is
account-wide, so `spotctl validate --cloud` refuses the stack when the boundary there was made by a
deployment in another region (its spotctl:region tag), by one in this region with another event
bucket (its spotctl:events tag), or by another stack with the same slug."""

from __future__ import annotations

import json

import boto3
from moto import mock_aws

from cli.app import app
from cli.lifecycle import stackfile
from cli.plan import mocks as planner
from infra.naming import DEPLOYED_BUCKET_TAG, DEPLOYED_REGION_TAG, owner_value


def _boundary(region: str, owner: str, bucket: str | None = None) -> None:
    extra = [{"Key": DEPLOYED_BUCKET_TAG, "Value": bucket}] if bucket else []
    boto3.client("iam", region_name="us-east-1").create_policy(
        PolicyName="spotctl-example-aws-boundary", Path="/spotctl/",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}),
        Tags=[{"Key": "spotctl:owner", "Value": owner}, {"Key": DEPLOYED_REGION_TAG, "Value": region}, *extra])


@mock_aws
def test_validate_cloud_refuses_a_deployment_of_the_same_name_in_another_region(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud"]).exit_code == 0  # nothing deployed yet
    _boundary("eu-west-1", owner_value("example-aws"))
    result = runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud"])
    assert result.exit_code == 1
    assert "spotctl:region: stack example-aws is already deployed in eu-west-1 in this account" in result.output
    assert result.output.count("error") == 1
    assert runner.invoke(app, ["validate", "--stack", "example-aws"]).exit_code == 0  # offline: not asked


@mock_aws
def test_its_own_deployment_is_not_a_clash_and_another_stacks_same_slug_is(project, runner, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    _boundary("us-east-1", owner_value("example-aws"))
    assert runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud"]).exit_code == 0
    boto3.client("iam", region_name="us-east-1").tag_policy(
        PolicyArn="arn:aws:iam::123456789012:policy/spotctl/spotctl-example-aws-boundary",
        Tags=[{"Key": "spotctl:owner", "Value": owner_value("Example.AWS")}])
    result = runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud"])
    assert result.exit_code == 1 and "belongs to another stack whose name makes the same slug" in result.output


def test_the_boundary_carries_its_deployments_region(project):
    ref = stackfile.resolve("example-aws", None)
    p = planner.run(stackfile.load(ref), ref.name)
    [boundary] = [r for r in p.by_type("aws:iam/policy:Policy") if r.name == "stack-boundary"]
    assert boundary.inputs["tags"][DEPLOYED_REGION_TAG] == "us-east-1"


@mock_aws
def test_validate_cloud_refuses_a_second_deployment_in_the_same_region(project, runner, monkeypatch):
    """Same name, same region, another backend: its boundary names its own event bucket."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    _boundary("us-east-1", owner_value("example-aws"), bucket="spotctl-example-aws-events-20261128a")
    result = runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud"])  # this file knows no deployment
    assert result.exit_code == 1
    assert ("spotctl:region: stack example-aws is already deployed in us-east-1 in this account by a deployment with "
            "event bucket spotctl-example-aws-events-20261128a") in result.output
    assert "say so with --events-bucket spotctl-example-aws-events-20261128a" in result.output
    other = runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud", "--events-bucket", "spotctl-example-aws-events-x"])
    assert other.exit_code == 1 and "this stack file's deployment has event bucket spotctl-example-aws-events-x" in other.output
    mine = runner.invoke(app, ["validate", "--stack", "example-aws", "--cloud", "--events-bucket",
                               "spotctl-example-aws-events-20261128a"])
    assert mine.exit_code == 0, mine.output


def test_the_boundary_carries_its_deployments_event_bucket(project):
    ref = stackfile.resolve("example-aws", None)
    p = planner.run(stackfile.load(ref), ref.name)
    [boundary] = [r for r in p.by_type("aws:iam/policy:Policy") if r.name == "stack-boundary"]
    assert boundary.inputs["tags"][DEPLOYED_BUCKET_TAG] == p.outputs["eventBucket"]
