"""A job's VM identity reads only its own code archives: the AWS job role's code policy (evaluated
with tests/iam_eval.py and enforced by moto's IAM), the stack's permissions boundary, and the GCP job
account's conditional grant (tests/iam_eval.py's CEL). Plans run the real program under Pulumi's mocks."""

from __future__ import annotations

import json
from functools import cache

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.core import set_initial_no_auth_action_count

from cli.plan import mocks as planner
from infra.config import validate
from infra.naming import code_key
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config
from tests.iam_eval import allowed, condition_holds

SHA = "ab" * 32
CODE = {"code": "./", "codeDigest": SHA}


@cache
def aws_plan() -> planner.Plan:
    jobs = [aws_job(**CODE), aws_job(id="other", **CODE), aws_job(id="train2", **CODE), aws_job(id="plain")]
    return planner.run(validate(stack_config(AWS_BASE, jobs=jobs), "x"), "team")


def policy(name: str) -> dict:
    (found,) = [r for r in aws_plan().by_type("aws:iam/rolePolicy:RolePolicy") if r.name == name]
    return json.loads(found.inputs["policy"])


def bucket_arn() -> str:
    return policy("job-train-events-policy")["Statement"][0]["Resource"].removesuffix("/team/train/*")


def obj(key: str) -> str:
    return f"{bucket_arn()}/{key}"


def test_aws_a_job_reads_its_own_code_and_nothing_else():
    code = policy("job-train-code-policy")
    mine = code_key("team", "train", SHA)
    assert allowed(code, "s3:GetObject", obj(mine))
    for key in (code_key("team", "other", SHA), code_key("team", "train2", SHA), "team.spotctl/Pulumi.team.yaml",
                "team.spotctl/watch.lease", "team/other/attempt-1/node-0/started.json", "team.spotctl/code/trainx"):
        assert not allowed(code, "s3:GetObject", obj(key)), key
    for action in ("s3:PutObject", "s3:DeleteObject", "s3:ListBucket"):
        assert not allowed(code, action, obj(mine)) and not allowed(code, action, bucket_arn()), action
    # No job identity can replace a code archive (its events policy stops at <stack>/<job>/).
    for job in ("train", "other", "plain"):
        assert not allowed(policy(f"job-{job}-events-policy"), "s3:PutObject", obj(mine)), job


def test_aws_the_boundary_covers_the_code_read_and_a_job_without_code_gets_none():
    (boundary,) = [r for r in aws_plan().by_type("aws:iam/policy:Policy") if r.name == "stack-boundary"]
    document = json.loads(boundary.inputs["policy"])
    assert allowed(document, "s3:GetObject", obj(code_key("team", "train", SHA)))
    assert not allowed(document, "s3:GetObject", obj(code_key("team-b", "train", SHA)))
    assert not allowed(document, "s3:GetObject", obj("team.spotctl/Pulumi.team.yaml"))
    assert not allowed(document, "s3:PutObject", obj(code_key("team", "train", SHA)))
    names = {r.name for r in aws_plan().by_type("aws:iam/rolePolicy:RolePolicy")}
    assert "job-plain-code-policy" not in names and "job-plain-events-policy" in names


def _user(iam, name: str, documents: list[dict]):
    iam.create_user(UserName=name)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    for i, document in enumerate(documents):
        iam.put_user_policy(UserName=name, PolicyName=f"p{i}", PolicyDocument=json.dumps(document))
    return boto3.client("s3", region_name="us-east-1", aws_access_key_id=key["AccessKeyId"],
                        aws_secret_access_key=key["SecretAccessKey"])


def test_aws_moto_enforces_the_job_roles_policies(monkeypatch):
    """The job role's own policies, given to an IAM user of moto with IAM enforced: S3 answers as the
    VM's identity would be answered (the plan's mocked bucket ARN mapped to the real form)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    real = "arn:aws:s3:::bkt"

    def real_arns(document: dict) -> dict:
        return json.loads(json.dumps(document).replace(bucket_arn(), real))

    job_policies = [real_arns(policy("job-train-code-policy")), real_arns(policy("job-train-events-policy"))]

    @set_initial_no_auth_action_count(7)  # the IAM calls that make the two users (then every call is checked)
    @mock_aws
    def run() -> None:
        iam = boto3.client("iam", region_name="us-east-1")
        admin = _user(iam, "admin", [{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}])
        job = _user(iam, "job", job_policies)
        admin.create_bucket(Bucket="bkt")
        mine, theirs = code_key("team", "train", SHA), code_key("team", "other", SHA)
        for key in (mine, theirs):
            admin.put_object(Bucket="bkt", Key=key, Body=b"archive")
        assert job.get_object(Bucket="bkt", Key=mine)["Body"].read() == b"archive"
        job.put_object(Bucket="bkt", Key="team/train/attempt-1/node-0/started.json", Body=b"{}")
        for call in (lambda: job.get_object(Bucket="bkt", Key=theirs),
                     lambda: job.put_object(Bucket="bkt", Key=mine, Body=b"evil"),
                     lambda: job.list_objects_v2(Bucket="bkt", Prefix="team.spotctl/")):
            with pytest.raises(ClientError) as err:
                call()
            assert err.value.response["Error"]["Code"] == "AccessDenied"
        assert admin.get_object(Bucket="bkt", Key=mine)["Body"].read() == b"archive"

    run()


def test_gcp_a_job_account_reads_its_own_code_and_nothing_else():
    jobs = [gcp_job(**CODE), gcp_job(id="other", **CODE), gcp_job(id="plain")]
    plan = planner.run(validate(stack_config(GCP_BASE, jobs=jobs), "x"), "team")
    grants = {r.name: r.inputs for r in plan.by_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert "job-plain-sa-code-reader" not in grants
    grant = grants["job-train-sa-code-reader"]
    assert grant["role"] == "roles/storage.objectViewer" and grant["member"] == grants["job-train-sa-events-writer"]["member"]
    bucket = grant["bucket"]

    def reads(key: str, in_bucket: str = bucket) -> bool:
        return condition_holds(grant["condition"]["expression"], "storage.googleapis.com/Object",
                               f"projects/_/buckets/{in_bucket}/objects/{key}")

    assert reads(code_key("team", "train", SHA))
    for key in (code_key("team", "other", SHA), "team.spotctl/code/trainx/a.tar.gz", "team.spotctl/Pulumi.team.yaml",
                "team/other/attempt-1/node-0/started.json"):
        assert not reads(key), key
    assert not reads(code_key("team", "train", SHA), "another-bucket")
    # Listing is checked against the bucket's own name, which the condition never matches.
    assert not condition_holds(grant["condition"]["expression"], "storage.googleapis.com/Bucket", f"projects/_/buckets/{bucket}")
    # The events writer's condition does not reach the code: no job replaces an archive.
    writer = grants["job-train-sa-events-writer"]["condition"]["expression"]
    assert not condition_holds(writer, "storage.googleapis.com/Object",
                               f"projects/_/buckets/{bucket}/objects/{code_key('team', 'train', SHA)}")
