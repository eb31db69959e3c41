"""Cloud limits that need a stack's name or its rendered VM scripts, checked before `pulumi up` by
`spotctl validate`, `plan` and every lifecycle command for the job it changes, each naming the stack key
to change: which value grew the user data, which stack name makes an invalid bucket or topic. The rules
and their sources are the contract tables' (``infra/contract/``); ``infra.limits`` has the cheap ones.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from typing import Any

from infra.basics import JobState
from infra.contract import get

# Stand-ins of the values the program fills in at `pulumi up` (their longest forms): the size of
# the user data must not be under-estimated. The EBS device is infra/aws.py NVME_BY_ID of a volume id.
_AWS_BUCKET_SUFFIX = "x" * 26  # pulumi's autoname: bucket_prefix + a random suffix
_AWS_DEVICE = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
_MASTER = "255.255.255.255"


def stack_problems(cfg: Any, stack: str, job_ids: Iterable[str] | None = None) -> list[str]:
    """``spotctl:key: message`` lines for limits that need the stack's name or its rendered scripts
    (``job_ids``: only those jobs' user data; None: every job and pool)."""
    from infra.contract import gcp as gcp_rules

    out = []
    if cfg.cloud == "gcp" and (why := gcp_rules.reserved_name_problem(stack)):
        out.append(f"stack name {stack!r}: {why}")
    if cfg.cloud == "aws":
        # A whole stack: every job that may run again (not completed); named jobs (a lifecycle command's
        # plan, old and new): only while they declare VMs, so a change that ends a job is never refused.
        wanted = None if job_ids is None else set(job_ids)
        for i, job in enumerate(cfg.jobs):
            if (job.state is not JobState.COMPLETED) if wanted is None else (job.id in wanted and job.active):
                out += _user_data_problems(cfg, stack, i, job)
        if job_ids is None:
            for i, pool in enumerate(cfg.pools):
                out += _pool_user_data_problems(cfg, stack, i, pool)
    return out


def _gz(text: str) -> int:
    return len(gzip.compress(text.encode(), mtime=0))


def _job_script(cfg: Any, stack: str, job: Any) -> str:
    from infra.common import job_plan, job_script_context
    from infra.naming import stack_slug
    from infra.render import scripts_for

    plan = job_plan(stack, job)
    ctx = job_script_context(cfg, stack, plan, plan.nodes[0], bucket=f"spotctl-{stack_slug(stack)}-events-{_AWS_BUCKET_SUFFIX}",
                             master_addr=_MASTER, disk_device=_AWS_DEVICE, disk_aliases=("/dev/sdf", "/dev/xvdf"))
    return scripts_for(ctx).user_data


def _user_data_problems(cfg: Any, stack: str, i: int, job: Any) -> list[str]:
    """The job's gzip-compressed user data over EC2's limit, naming the stack value that adds most."""
    from infra.contract.aws import USER_DATA_LIMIT

    size = _gz(_job_script(cfg, stack, job))
    if size <= USER_DATA_LIMIT:
        return []
    # What each stack value adds: the script rendered without it (the command as one character).
    grown = {f"jobs[{i}].command": size - _gz(_job_script(cfg, stack, job.model_copy(update={"command": "x"})))}
    for key in job.plain_env:
        without = {k: v for k, v in job.env.items() if k != key}
        grown[f"jobs[{i}].env.{key}"] = size - _gz(_job_script(cfg, stack, job.model_copy(update={"env": without})))
    key = max(grown, key=lambda k: grown[k])
    r = get("aws.user-data-16k")
    fix = ("make it a Pulumi secret (`pulumi config set --secret --path 'spotctl:" + key + "'`: secrets reach the VM "
           "through SSM, not user data) or move it into a file on the job disk" if ".env." in key else
           "move the long command into a script on the job disk and run that")
    return [f"spotctl:{key}: job {job.id}'s user data is {size:,} bytes gzip-compressed, over EC2's {USER_DATA_LIMIT:,} "
            f"({r.id}; {r.source.split()[0]}); this value adds {grown[key]:,} of them: {fix}"]


def _pool_user_data_problems(cfg: Any, stack: str, i: int, pool: Any) -> list[str]:
    from infra.common import pool_script_context
    from infra.contract.aws import USER_DATA_LIMIT
    from infra.naming import stack_slug
    from infra.render import scripts_for

    ctx = pool_script_context(cfg, stack, pool, bucket=f"spotctl-{stack_slug(stack)}-events-{_AWS_BUCKET_SUFFIX}")
    size = _gz(scripts_for(ctx).user_data)
    if size <= USER_DATA_LIMIT:
        return []
    return [f"spotctl:pools[{i}].agentCommand: pool {pool.name}'s user data is {size:,} bytes gzip-compressed, over "
            f"EC2's {USER_DATA_LIMIT:,} (aws.user-data-16k): move the long command into a script on the image and run that"]
