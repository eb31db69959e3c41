"""What the VM is told of a job's code (infra.common.job_script_context): the archive's object in the
stack's bucket and its digest, or the repository at its recorded commit, with setup, workdir, container."""

from __future__ import annotations

import pytest

from infra.common import job_plan, job_script_context
from infra.config import validate
from infra.naming import code_key
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config

SHA, COMMIT = "e" * 64, "f" * 40
KEYS = {"setup": "pip install -r requirements.txt", "workdir": "src", "container": "nvcr.io/nvidia/pytorch:24.05-py3"}


def told(base, job):
    cfg = validate(stack_config(base, jobs=[job]), "f")
    plan = job_plan("team", cfg.jobs[0])
    return job_script_context(cfg, "team", plan, plan.nodes[0], bucket="bkt", master_addr="10.0.0.2", disk_device="/dev/x")


@pytest.mark.parametrize("base, make, scheme", [(AWS_BASE, aws_job, "s3"), (GCP_BASE, gcp_job, "gs")])
def test_a_packed_directory_is_its_object_and_digest(base, make, scheme):
    ctx = told(base, make(code="./", codeDigest=SHA, **KEYS))
    assert ctx.code_uri == f"{scheme}://bkt/{code_key('team', 'train', SHA)}" and ctx.code_sha256 == SHA
    assert (ctx.setup, ctx.workdir, ctx.container) == (KEYS["setup"], "src", KEYS["container"])
    assert not ctx.code_git_url and not ctx.code_git_commit


def test_a_repository_at_its_recorded_commit_with_its_token_env():
    job = gcp_job(code={"git": "https://github.com/team/train.git", "ref": "main", "tokenEnv": "GIT_TOKEN"},
                  codeCommit=COMMIT, env={"GIT_TOKEN": {"secure": "v1:abc"}})
    ctx = told(GCP_BASE, job)
    assert (ctx.code_git_url, ctx.code_git_commit, ctx.code_git_token_env) == ("https://github.com/team/train.git", COMMIT, "GIT_TOKEN")
    assert ctx.secret_keys == ("GIT_TOKEN",) and not ctx.code_uri  # the token travels as a secret, never in the script


def test_code_not_yet_packed_or_no_code_tells_nothing_of_code():
    for job in (aws_job(code="./"), aws_job(), aws_job(code={"git": "https://github.com/a/b"})):
        ctx = told(AWS_BASE, job)
        assert (ctx.code_uri, ctx.code_sha256, ctx.code_git_url, ctx.code_git_commit) == ("", "", "", "")
