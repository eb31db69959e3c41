"""What both clouds declare for a job or a pool, decided once (pure; no pulumi import).

The per-cloud components (``infra/gcp.py``, ``infra/aws.py``) turn these plans into resources; the
decisions (names, which nodes get a VM, what is protected, what the scripts are told) live here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from infra.config import Capacity, Job, JobState, Pool, StackConfig
from infra.naming import disk_name, instance_name, stack_slug
from infra.render import MOUNT_POINT, ScriptContext

BOOT_DISK_GB = 100
MASTER_PORT = 29500


def master_port(attempt: int) -> int:
    """The rendezvous port of an attempt. The address stays the same across attempts; the port
    moves, so a process left over from an earlier attempt can never join the new rendezvous."""
    return MASTER_PORT + attempt % 500


@dataclass(frozen=True)
class StackArgs:
    """What every component of a stack is given (components never read pulumi.Config themselves)."""

    cfg: StackConfig
    stack: str
    slug: str


@dataclass(frozen=True)
class NodePlan:
    """One node of a job: its disk always, its VM only while the job should run."""

    rank: int
    disk_name: str
    instance_name: str
    declares_instance: bool
    is_master: bool


@dataclass(frozen=True)
class JobPlan:
    job: Job
    slug: str
    nodes: tuple[NodePlan, ...]
    # Pulumi `protect` on the disks: a disk can only be deleted once its job completed and
    # `spotctl cleanup` lifted the protection (`pulumi state unprotect`, then a targeted update).
    protect_disks: bool
    spot: bool
    needs_master_address: bool

    @property
    def labels(self) -> dict[str, str]:
        return {"job": self.job.id}


def job_plan(stack: str, job: Job) -> JobPlan:
    slug = stack_slug(stack)
    runs = job.state in (JobState.PENDING, JobState.RUNNING)
    nodes = tuple(
        NodePlan(
            rank=r,
            disk_name=disk_name(slug, job.id, r),
            instance_name=instance_name(slug, job.id, job.attempt, r),
            declares_instance=runs,
            is_master=r == 0,
        )
        for r in range(job.nodes)
    )
    return JobPlan(
        job=job,
        slug=slug,
        nodes=nodes,
        protect_disks=job.state is not JobState.COMPLETED,
        spot=job.capacity is Capacity.SPOT,
        needs_master_address=job.nodes > 1,
    )


def job_script_context(
    cfg: StackConfig, stack: str, plan: JobPlan, node: NodePlan, *, bucket: str, master_addr: str, disk_device: str
) -> ScriptContext:
    job = plan.job
    return ScriptContext(
        cloud=cfg.cloud,
        stack=stack,
        kind="job",
        name=job.id,
        command=job.command,
        event_bucket=bucket,
        region=cfg.region,
        attempt=job.attempt,
        node_rank=node.rank,
        world_size=job.nodes,
        master_addr=master_addr,
        master_port=master_port(job.attempt),
        env=dict(job.env),
        capacity=job.capacity.value,
        machine_type=job.machine_type or job.instance_type or "",
        disk_device=disk_device,
        mount_point=MOUNT_POINT,
    )


def pool_script_context(cfg: StackConfig, stack: str, pool: Pool, *, bucket: str) -> ScriptContext:
    # Pool VMs have no job disk: the agent's work directory is on the boot disk.
    return ScriptContext(
        cloud=cfg.cloud,
        stack=stack,
        kind="pool",
        name=pool.name,
        command=pool.agent_command or "",
        event_bucket=bucket,
        region=cfg.region,
        machine_type=pool.machine_type or ",".join(pool.instance_types or []),
        disk_device="",
        mount_point="/var/lib/spotctl/work",
    )


def pool_parts(pool: Pool) -> list[tuple[str, bool]]:
    """(part name, is spot) for the parts a pool declares: static on-demand and/or dynamic spot."""
    parts = []
    if pool.on_demand > 0:
        parts.append(("ondemand", False))
    if pool.spot_max > 0:
        parts.append(("spot", True))
    return parts


def job_outputs(plan: JobPlan, *, disks_key: str, disks: Sequence[Any], instances: Sequence[Any], master_addr: Any) -> dict[str, Any]:
    """A job's stack outputs; ``disks``/``instances`` are the cloud's names or ids (Outputs are fine)."""
    job = plan.job
    return {
        "zone": job.zone,
        "capacity": job.capacity.value,
        "state": job.state.value,
        "attempt": job.attempt,
        disks_key: list(disks),
        "instances": list(instances),
        "masterAddress": master_addr,
    }


def declare_components(
    args: StackArgs, plans: Sequence[JobPlan], base_cls: Callable, pool_cls: Callable, job_cls: Callable, opts: Any = None
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The stack's shared base, one pool component per pool and one job component per job.

    ``opts`` (ResourceOptions, e.g. the explicit provider) is given to every component."""
    base = base_cls("stack", args, opts=opts)
    pools = {pool.name: pool_cls(f"pool-{pool.name}", args, pool, base, opts=opts) for pool in args.cfg.pools}
    jobs = {plan.job.id: job_cls(f"job-{plan.job.id}", args, plan, base, opts=opts) for plan in plans}
    return base, pools, jobs
