"""Physical names and ownership labels, shared by both clouds (pure; no pulumi import).

Physical names carry a short slug of the stack, so two stacks in one project/account never collide,
and stay within GCE's 63-character RFC 1035 limit: slug (<= 16) + job id (<= 30) + suffix (<= 14).
"""

from __future__ import annotations

import hashlib
import re

SLUG_MAX = 16
MANAGED_BY = "spotctl"


def short_hash(*parts: str, n: int = 6) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:n]


def stack_slug(stack: str) -> str:
    """A name-safe, <= 16 char token for a stack; hashed when the stack name had to be changed."""
    clean = re.sub(r"[^a-z0-9-]+", "-", stack.lower()).strip("-") or "stack"
    if not clean[0].isalpha():
        clean = "s" + clean
    if clean == stack and len(clean) <= SLUG_MAX:
        return clean
    return f"{clean[: SLUG_MAX - 5].rstrip('-')}-{short_hash(stack, n=4)}"


def disk_name(slug: str, job_id: str, rank: int, gen: int = 0) -> str:
    """A job disk; ``gen`` counts the job's moves to other zones (each move restores new disks
    from snapshots, named apart so old and new coexist until the old ones are released)."""
    return f"{slug}-{job_id}-n{rank}-{gen_prefix(gen)}disk"


def snapshot_name(slug: str, job_id: str, rank: int, gen: int) -> str:
    """The snapshot a move takes of a node's disk; ``gen`` is the generation restored from it."""
    return f"{slug}-{job_id}-n{rank}-{gen_prefix(gen)}snap"


def gen_prefix(gen: int) -> str:
    """'' for the job's first disks (their names predate moves), ``m<gen>-`` after a move."""
    return f"m{gen}-" if gen else ""


def boot_disk_name(slug: str, job_id: str, rank: int) -> str:
    """A kept boot disk (job ``bootDisk: keep``): one per node, booted by every attempt."""
    return f"{slug}-{job_id}-n{rank}-boot"


def instance_name(slug: str, job_id: str, attempt: int, rank: int) -> str:
    """Changes with the attempt, so a new attempt is a new VM (and never a new disk)."""
    return f"{slug}-{job_id}-a{attempt}-n{rank}"


def ssm_parameter_name(slug: str, job_id: str) -> str:
    """The SSM parameter holding a job's secret env values (AWS; contract rule aws.ssm-parameter-name)."""
    return f"/spotctl/{slug}/{job_id}/env"


def secret_id(slug: str, job_id: str) -> str:
    """The Secret Manager secret holding a job's secret env values (GCP; contract rule gcp.secret-id)."""
    return f"spotctl-{slug}-{job_id}-env"


def shared_stack_file(stack: str) -> str:
    """Where the stack file's shared copy lives in the stack's event bucket (cli/lifecycle/sync.py):
    beside the events' ``<stack>/`` prefix, never under it, so the events' expiry rule never deletes it
    and no job identity (which may write only ``<stack>/<job>/``) can write it."""
    return f"{stack}.spotctl/Pulumi.{stack}.yaml"


def code_root(stack: str) -> str:
    """The prefix under which every job's code archives live (``code_prefix``)."""
    return f"{stack}.spotctl/code/"


def code_prefix(stack: str, job_id: str) -> str:
    """Where a job's code archives live in the stack's event bucket: beside the events' ``<stack>/``
    prefix, never under it, so the events' expiry rule never deletes the code a later attempt needs
    and no job identity (which may write only ``<stack>/<job>/``) can replace it; only this job's
    identity may read it (infra/aws.py, infra/gcp.py)."""
    return f"{code_root(stack)}{job_id}/"


def code_key(stack: str, job_id: str, sha256: str) -> str:
    """The object of one archive, named by its sha256 (uploaded once; a new digest is a new object)."""
    return f"{code_prefix(stack, job_id)}{sha256}.tar.gz"


def watch_lease(stack: str) -> str:
    """The one-watcher-per-stack lease in the stack's event bucket (cli/watch/lease.py): beside the shared
    stack file, never under the expiring ``<stack>/`` prefix, and writable by no job identity."""
    return f"{stack}.spotctl/watch.lease"


def pool_demand_key(stack: str, pool: str) -> str:
    """The durable record of a pool's last published demand in the stack's event bucket
    (cli/pools/record.py): beside the shared stack file, never under the expiring ``<stack>/`` prefix,
    so the watcher can republish it every minute and no job or pool identity can write it."""
    return f"{stack}.spotctl/pools/{pool}.demand"


def boundary_name(slug: str) -> str:
    """The stack's permissions-boundary policy (AWS, path ``/spotctl/``): one per stack, attached to
    every job and pool role (contract aws.role-permissions-boundary); an account-wide name."""
    return f"spotctl-{slug}-boundary"


DEPLOYED_REGION_TAG = "spotctl:region"
"""On an AWS stack's account-wide resources (its IAM permissions boundary): the region of the
deployment that made it, so a second deployment of the same stack name elsewhere is told apart."""


DEPLOYED_BUCKET_TAG = "spotctl:events"
"""Beside it: the event bucket of that deployment (a name no other deployment has: the bucket's name
is made unique at create, ``bucket_prefix``), so a second deployment in the same region is told apart too."""


def event_root(stack: str) -> str:
    """The prefix every event and log object of the stack lives under (``<stack>/<job or pool>/``)."""
    return f"{stack}/"


def owner_value(stack: str) -> str:
    """The ownership label/tag value of a stack: collision-free, unlike ``label_value`` (a lossy
    slug: ``team.a``, ``team-a`` and ``Team-A`` share one). The slug keeps it readable, the hash of
    the *exact* name tells such stacks apart; <= 63 characters of GCP's label alphabet."""
    slug = label_value(stack)[:54].rstrip("-_") or "stack"
    return f"{slug}-{short_hash(stack, n=8)}"


def owner_filter(stack: str) -> str:
    """A Compute Engine list filter on exactly this stack's resources: its owner label (the
    ``spotctl-stack`` label is ``label_value``, shared by ``team.a`` and ``team-a``)."""
    return f'labels.spotctl-owner="{owner_value(stack)}"'


GCP_SPOTCTL_LABELS_MAX = 6
"""The most ``spotctl-*`` labels infra/ puts on one GCP resource: managed, stack and owner, the
owner's job (or pool, or watcher role), and on a job's VM its node and attempt (a kept boot disk:
node and disk). What is left of GCE's 64 labels a resource is the user's (``spotctl:labels``,
checked in infra/config/; rule gcp.labels-64 checks every resource)."""


def gcp_labels(stack: str, extra: dict[str, str], **owner: str) -> dict[str, str]:
    """GCP labels: lowercase keys/values, ``spotctl-stack`` (a filter), ``spotctl-owner`` (exact) etc."""
    labels = dict(extra)
    labels.update({"spotctl-managed": "true", "spotctl-stack": label_value(stack), "spotctl-owner": owner_value(stack)})
    labels.update({f"spotctl-{k}": label_value(v) for k, v in owner.items()})
    return dict(sorted(labels.items()))


AWS_SPOTCTL_TAGS_MAX = 7
"""The most tags infra/ puts on one AWS resource besides ``spotctl:labels``: managed, stack, owner, job,
node, attempt and Name (a job's VM). What is left of EC2's 50 is the user's (rule aws.tags-50)."""


def aws_tags(stack: str, extra: dict[str, str], name: str | None = None, **owner: str) -> dict[str, str]:
    """AWS tags: ``spotctl:stack``, ``spotctl:owner`` (as on GCP) etc., plus ``Name`` when given."""
    tags = dict(extra)
    tags.update({"spotctl:managed": "true", "spotctl:stack": stack, "spotctl:owner": owner_value(stack)})
    tags.update({f"spotctl:{k}": v for k, v in owner.items()})
    if name:
        tags["Name"] = name
    return dict(sorted(tags.items()))


def label_value(value: str) -> str:
    v = re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]
    return v


# ---- pool demand metrics (published by `spotctl pool demand`, read by the autoscalers) ------------
# spot_demand: VMs the spot part should have (demand above the on-demand base, clipped to spotMax);
# fallback_demand: on-demand VMs standing in for spot that stayed sold out (fallbackToOnDemand);
# demand and unmet are published for `spotctl pool status` and dashboards. All are per-group
# values (a total for the pool, meaningful at 0 VMs), never per-instance ones.
POOL_METRICS = ("demand", "spot_demand", "unmet", "fallback_demand")
CLOUDWATCH_NAMESPACE = "spotctl"


def pool_metric_type(metric: str) -> str:
    """The Cloud Monitoring custom metric type of a pool metric."""
    return f"custom.googleapis.com/spotctl/pool/{metric}"


def pool_metric_dimensions(stack: str, pool: str) -> dict[str, str]:
    """CloudWatch dimensions of a pool's metrics (the alarm must name exactly these)."""
    return {"Stack": stack, "Pool": pool}


def pool_metric_labels(stack: str, pool: str) -> dict[str, str]:
    """Cloud Monitoring metric labels of a pool's metrics (the autoscaler filter matches them)."""
    # The exact owner value: ``label_value`` gives ``team.a`` and ``team-a`` one series, and each
    # stack's autoscaler would follow the other's demand.
    return {"stack": owner_value(stack), "pool": pool}


def pool_metric_filter(stack: str, pool: str) -> str:
    """The autoscaler's filter (the metric type is its ``name``): a per-group series (resource type
    ``global``) of this stack's pool, selectors joined by AND with ``=`` only."""
    labels = " AND ".join(f'metric.labels.{k} = "{v}"' for k, v in pool_metric_labels(stack, pool).items())
    return f'resource.type = "global" AND {labels}'
