"""A job's VM reads only the agent and its own objects (its code archives live under its own prefix):
the AWS role policy and permissions boundary, and the GCP IAM condition, evaluated for the requests
the agent makes and for another job's code (tests/iam_eval.py)."""

from __future__ import annotations

from infra.agent_artifact import artifact
from infra.agent_object import aws_read_statements, gcp_read_condition
from infra.aws_common import boundary_document
from tests.iam_eval import allowed, condition_holds

ARN = "arn:aws:s3:::spotctl-team-a-events-1"
CODE = "code/" + "a" * 64 + ".tar.gz"


def test_aws_a_job_reads_the_agent_and_its_own_code_only():
    policy = {"Version": "2012-10-17", "Statement": aws_read_statements(ARN, "team-a/train/")}
    boundary = boundary_document("team-a", "team-a", "us-east-1", ARN)
    for doc in (policy, boundary):
        assert allowed(doc, "s3:GetObject", f"{ARN}/{artifact().object_name}")
        assert allowed(doc, "s3:GetObject", f"{ARN}/team-a/train/{CODE}")
    assert not allowed(policy, "s3:GetObject", f"{ARN}/team-a/other-job/{CODE}")
    assert not allowed(policy, "s3:GetObject", f"{ARN}/team-b/train/{CODE}")
    assert not allowed(policy, "s3:PutObject", f"{ARN}/{artifact().object_name}")  # reads, never replaces the agent
    assert not allowed(boundary, "s3:GetObject", f"{ARN}/team-b/train/{CODE}")


def test_gcp_a_job_reads_the_agent_and_its_own_code_only():
    expr = gcp_read_condition("team-a-events-1", "team-a/train/")
    base = "projects/_/buckets/team-a-events-1/objects/"
    assert condition_holds(expr, "storage.googleapis.com/Object", base + artifact().object_name)
    assert condition_holds(expr, "storage.googleapis.com/Object", base + "team-a/train/" + CODE)
    assert not condition_holds(expr, "storage.googleapis.com/Object", base + "team-a/train-2/" + CODE)
    assert not condition_holds(expr, "storage.googleapis.com/Object", base + "team-a/other-job/" + CODE)
    assert not condition_holds(expr, "storage.googleapis.com/Object", "projects/_/buckets/other/objects/" + artifact().object_name)
