"""The VM agent in the stack's bucket: one object per digest, which the bootstraps fetch with each
VM's own identity. Kept when a newer agent replaces it in the program (``retain_on_delete``): a VM
whose bootstrap pins the older digest (a running attempt, a reboot) still finds its agent."""

from __future__ import annotations

import os
from pathlib import Path

import pulumi

from agent.schema import AGENT_PREFIX
from infra.agent_artifact import artifact


def artifact_file() -> Path:
    """The zipapp as a file (a Pulumi FileAsset uploads bytes as they are), cached by digest."""
    agent = artifact()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spotctl" / "agent"
    path = root / f"{agent.sha256}.pyz"
    if not path.exists() or path.read_bytes() != agent.data:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(agent.data)
        tmp.replace(path)
    return path


def _opts(parent: pulumi.Resource) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, retain_on_delete=True)


def aws_agent_object(name: str, bucket, tags: dict, parent: pulumi.Resource):
    import pulumi_aws as aws

    agent = artifact()
    return aws.s3.BucketObjectv2(f"{name}-agent-{agent.sha256[:12]}", bucket=bucket.id, key=agent.object_name,
                                 source=pulumi.FileAsset(str(artifact_file())), content_type="application/zip",
                                 tags=tags, opts=_opts(parent))


def gcp_agent_object(name: str, bucket, parent: pulumi.Resource):
    import pulumi_gcp as gcp

    agent = artifact()
    return gcp.storage.BucketObject(f"{name}-agent-{agent.sha256[:12]}", bucket=bucket.name, name=agent.object_name,
                                    source=pulumi.FileAsset(str(artifact_file())), content_type="application/zip",
                                    opts=_opts(parent))


def aws_read_statements(bucket_arn: str, own_prefix: str) -> list[dict]:
    """What a job's or pool's role may read: the agent, and its own prefix (its code archives live
    there; nothing of another job's)."""
    return [{"Sid": "ReadAgentAndOwnObjects", "Effect": "Allow", "Action": "s3:GetObject",
             "Resource": [f"{bucket_arn}/{AGENT_PREFIX}*", f"{bucket_arn}/{own_prefix}*"]}]


def gcp_read_condition(bucket: str, own_prefix: str) -> str:
    """The IAM condition of a job's or pool's object reads: the agent and its own prefix."""
    base = f"projects/_/buckets/{bucket}/objects/"
    return f'resource.name.startsWith("{base}{AGENT_PREFIX}") || resource.name.startsWith("{base}{own_prefix}")'
