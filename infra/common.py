"""What both clouds declare for a job or a pool, decided once (pure; no pulumi import).

The per-cloud components (``infra/gcp.py``, ``infra/aws.py``) turn these plans into resources; the
decisions (names, which nodes get a VM, what is protected, what the scripts are told) live here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config import Capacity, Job, JobState, Pool, StackConfig
from infra.naming import (
    code_key,
    disk_name,
    gen_prefix,
    instance_name,
    secret_id,
    snapshot_name,
    ssm_parameter_name,
    stack_slug,
)
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
    # Job id -> the job's secret env payload (infra.render.secret_payload) as a pulumi.Output marked
    # secret: the only form in which secret values exist in the program (infra.program.declare).
    secrets: Mapping[str, Any] = field(default_factory=dict)
    # The other stacks of the project (stack files next to this one's): the GCP watcher's grant
    # excludes those whose names extend this stack's (infra/gcp_watcher.py extending_slugs).
    siblings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiskPlan:
    """One job disk of a node. ``gen`` counts the moves before it (0: the job's first disk); a disk of
    gen > 0 was restored from the snapshot ``snapshot`` (declared, as the disk's dependency, until
    the move that made it is released; the disk keeps that input afterwards)."""

    gen: int
    name: str
    zone: str
    protect: bool
    attached: bool
    restored: bool
    snapshot: str | None  # the declared snapshot it is restored from (physical name), if declared now
    replica_zones: tuple[str, ...] = ()  # GCP regional disk: its two zones (``zone`` is the job's, where it attaches)

    def logical(self, component: str, rank: int, kind: str = "disk") -> str:
        """Pulumi's logical name: ``kind`` 'disk' (GCP) or 'volume' (AWS); gen 0 keeps the names
        that predate moves, so existing stacks see no change."""
        return f"{component}-n{rank}-{gen_prefix(self.gen)}{kind}"


@dataclass(frozen=True)
class SnapshotPlan:
    """A move's snapshot of a node's disk of generation ``gen - 1`` (in ``zone``), to restore gen ``gen``."""

    gen: int
    name: str
    zone: str

    def logical(self, component: str, rank: int) -> str:
        return f"{component}-n{rank}-{gen_prefix(self.gen)}snapshot"


# How long a move's snapshot, and a disk restored from one, may take to be created (Pulumi's
# customTimeouts; "h" is its largest unit). The providers' defaults (20 min GCP, 10 min AWS) are far
# shorter than a snapshot of a large disk can take (contract rules gcp/aws.move-create-timeout).
MOVE_CREATE_TIMEOUT = "12h"


@dataclass(frozen=True)
class NodePlan:
    """One node of a job: its disk always, its VM only while the job should run; during a move
    also the old zone's disk and the snapshot between them."""

    rank: int
    disk_name: str
    instance_name: str
    declares_instance: bool
    is_master: bool
    disks: tuple[DiskPlan, ...] = ()
    snapshots: tuple[SnapshotPlan, ...] = ()

    @property
    def attached_disk(self) -> DiskPlan:
        return next(d for d in self.disks if d.attached)


PROTECT_DISKS = True
"""Every declared job disk is protected, a completed job's too: only ``spotctl cleanup`` lifts it
(``pulumi state unprotect``), after checking the disk carries this stack's ownership labels, right
before its own targeted update deletes it. Were a completed job's disk declared unprotected, its
completion's update would unprotect it in Pulumi's state, and once the job left the file (``cleanup
--no-apply``, a hand edit) any plain ``pulumi up`` would delete it with no label checked."""


@dataclass(frozen=True)
class JobPlan:
    job: Job
    slug: str
    nodes: tuple[NodePlan, ...]
    # Pulumi `protect` on the disks: a disk can only be deleted once its job completed and
    # `spotctl cleanup` lifted the protection (`pulumi state unprotect`, then a targeted update).
    # Declared protected for as long as it is declared, a completed job's too (``PROTECT_DISKS``).
    protect_disks: bool
    spot: bool
    needs_master_address: bool

    @property
    def labels(self) -> dict[str, str]:
        return {"job": self.job.id}


def node_disks(slug: str, job: Job, rank: int) -> tuple[tuple[DiskPlan, ...], tuple[SnapshotPlan, ...]]:
    """A node's disks and snapshots at the job's move step (``spotctl move``, one targeted update each):

    - no move: the current disk (generation = the zones left so far) in the job's zone;
    - ``snapshot``: + a snapshot of it (the job is stopped: no VM writes to the disk);
    - ``restore``: + the next generation's disk in the target zone, restored from the snapshot,
      protected (old and new coexist under different names);
    - ``start``: the job's zone is the target now and its VMs attach the new disk; the old disk stays
      protected until the new attempt has started;
    - ``release``: the old disk is no longer declared (deleted; the move unprotects it first) and
      the snapshot leaves the program but is kept in the cloud (``retain_on_delete``).

    A move that moved on (``move.held``: its earlier target refused the new attempt) also declares
    the disks left in the held zones, protected and unattached, until its release. A regional disk
    (``diskReplicaZones``) is one disk whose generation moves between its zones do not change; a
    conversion (``move.replicaZones``) restores the next generation as a regional disk.
    """
    protect = PROTECT_DISKS
    # A move with a regional disk keeps the disk: only snapshot moves make a new generation.
    cur = sum(not stay.same_disk for stay in job.zone_history)
    move = job.move
    step = move.step if move else None
    # A conversion (``move.replicaZones``) restores the next generation as a regional disk.
    converting = tuple(move.replica_zones or ()) if move else ()

    def disk(gen: int, zone: str, attached: bool, snapshot_declared: bool, replicas: tuple[str, ...] = ()) -> DiskPlan:
        return DiskPlan(gen, disk_name(slug, job.id, rank, gen), zone, protect, attached, gen > 0,
                        snapshot_name(slug, job.id, rank, gen) if gen > 0 and snapshot_declared else None, replicas)

    if move is None or step == "release":
        return (disk(cur, job.zone, True, False, tuple(job.disk_replica_zones or ())),), ()
    # Disks an earlier move left (its attempt never started in its target): the generations just
    # before the one this move leaves, protected until this move's release.
    source = cur if step in ("snapshot", "restore") else cur - 1
    held = [disk(source - len(move.held) + i, zone, False, False) for i, zone in enumerate(move.held)]
    if step in ("snapshot", "restore"):
        disks = [*held, disk(cur, move.from_, True, False)]
        if step == "restore":
            disks.append(disk(cur + 1, move.to, False, True, converting))
        return tuple(disks), (SnapshotPlan(cur + 1, snapshot_name(slug, job.id, rank, cur + 1), move.from_),)
    # start: the zone history already lists the zone left.
    return ((*held, disk(cur - 1, move.from_, False, False), disk(cur, move.to, True, True, converting)),
            (SnapshotPlan(cur, snapshot_name(slug, job.id, rank, cur), move.from_),))


def job_plan(stack: str, job: Job) -> JobPlan:
    slug = stack_slug(stack)
    runs = job.state in (JobState.PENDING, JobState.RUNNING)
    nodes = []
    for r in range(job.nodes):
        disks, snapshots = node_disks(slug, job, r)
        nodes.append(NodePlan(
            rank=r,
            disk_name=next(d.name for d in disks if d.attached),
            instance_name=instance_name(slug, job.id, job.attempt, r),
            declares_instance=runs,
            is_master=r == 0,
            disks=disks,
            snapshots=snapshots,
        ))
    return JobPlan(
        job=job,
        slug=slug,
        nodes=tuple(nodes),
        protect_disks=PROTECT_DISKS,
        spot=job.capacity is Capacity.SPOT,
        needs_master_address=job.nodes > 1,
    )


# A running attempt's VMs keep the scripts they started with: a changed user data replaces an EC2
# instance (userDataReplaceOnChange: "will trigger a destroy and recreate of the EC2 instance",
# https://www.pulumi.com/registry/packages/aws/api-docs/ec2/instance/), and a changed metadata
# startup-/shutdown-script is written into the running GCE VM (only metadataStartupScript "will cause a
# recreate on modification", https://www.pulumi.com/registry/packages/gcp/api-docs/compute/instance/),
# whose next shutdown would run a script its boot never set up for. ``ignoreChanges`` keeps the state's
# value ("Uses the serialized value from the stack state for any later previews or updates",
# https://www.pulumi.com/docs/iac/concepts/options/ignorechanges/), which a replacement would reuse too
# ("replaces the values of input properties in the goal state with old inputs", pulumi/pulumi#2657): so
# it is set only while the attempt runs on older scripts, never for the update that starts an attempt
# (it records this spotctl's digest with it).
SCRIPT_INPUTS = {"aws": ["userDataBase64"], "gcp": ['metadata["startup-script"]', 'metadata["shutdown-script"]']}


def frozen_scripts(job: Job, cloud: str) -> list[str]:
    """The VM inputs to leave as they are (``ignore_changes``): the scripts, while the job's current
    attempt started with other scripts than this spotctl's (or before they were recorded)."""
    from infra.basics import scripts_digest

    return [] if job.scripts_digest == scripts_digest() else list(SCRIPT_INPUTS[cloud])


def job_script_context(
    cfg: StackConfig, stack: str, plan: JobPlan, node: NodePlan, *, bucket: str, master_addr: str, disk_device: str,
    disk_aliases: tuple[str, ...] = (), secrets_url: str = "",
) -> ScriptContext:
    """``secrets_url``: where the job's secret env is read ("" = the cloud's public API name; AWS under
    ``s3-endpoint`` egress: the stack's SSM interface endpoint, infra/aws.py StackBase.api_url)."""
    job = plan.job
    slug = stack_slug(stack)
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
        env=job.plain_env,
        secret_keys=job.secret_keys,
        secret_ref=secret_ref(cfg, slug, job.id) if job.secret_keys else "",
        secrets_url=secrets_url,
        capacity=job.capacity.value,
        machine_type=job.machine_type or job.instance_type or "",
        disk_device=disk_device,
        disk_aliases=disk_aliases,
        mount_point=MOUNT_POINT,
        **code_fields(cfg, stack, job, bucket),
    )


def code_fields(cfg: StackConfig, stack: str, job: Job, bucket: str) -> dict[str, str]:
    """What the VM is told of the job's code (docs/guides/code.md): the archive's object and digest
    (``code: {dir}``, uploaded by spotctl under ``code_key``) or the repository and its pinned commit,
    the setup command, the workdir and the container. A ``code:`` spotctl has not yet packed (no
    ``codeDigest`` / ``codeCommit``) is left out: the VM then runs as it does without ``code:``."""
    out = {"setup": job.setup or "", "workdir": job.workdir or "", "container": job.container or ""}
    code = job.code
    if code is None:
        return out
    if code.dir is not None and job.code_digest:
        scheme = "gs" if cfg.cloud == "gcp" else "s3"
        out |= {"code_uri": f"{scheme}://{bucket}/{code_key(stack, job.id, job.code_digest)}", "code_sha256": job.code_digest}
    elif code.git is not None and job.code_commit:
        out |= {"code_git_url": code.git, "code_git_commit": job.code_commit, "code_git_token_env": code.token_env or ""}
    return out


def secret_ref(cfg: StackConfig, slug: str, job_id: str) -> str:
    """Where a job's secret env values are kept, as the scripts name it: the SSM parameter name
    (AWS) or the Secret Manager secret's resource name (GCP)."""
    if cfg.cloud == "aws":
        return ssm_parameter_name(slug, job_id)
    return f"projects/{cfg.project}/secrets/{secret_id(slug, job_id)}"


def pool_script_context(cfg: StackConfig, stack: str, pool: Pool, *, bucket: str, autoscaling_url: str = "") -> ScriptContext:
    """Pool VMs have no job disk: the agent's work directory is on the boot disk. ``autoscaling_url``:
    "" = the public regional name; AWS under ``s3-endpoint`` egress the stack's Auto Scaling endpoint."""
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
        autoscaling_url=autoscaling_url,
    )


@dataclass(frozen=True)
class PoolPart:
    """One part of a pool: the static on-demand base, the spot part, or the on-demand fallback.

    ``metric`` is the pool metric (``infra.naming.POOL_METRICS``) that sizes the part between
    ``min_size`` and ``max_size``; None for the static part, whose size is fixed.
    """

    name: str
    spot: bool
    metric: str | None
    min_size: int
    max_size: int


def pool_parts(pool: Pool) -> list[PoolPart]:
    """The parts a pool declares: static on-demand, dynamic spot, and (with fallbackToOnDemand) fallback."""
    parts = []
    if pool.on_demand > 0:
        parts.append(PoolPart("ondemand", False, None, pool.on_demand, pool.on_demand))
    if pool.spot_max > 0:
        parts.append(PoolPart("spot", True, "spot_demand", pool.spot_min, pool.spot_max))
        if pool.fallback_to_on_demand is not None:
            parts.append(PoolPart("fallback", False, "fallback_demand", 0, pool.spot_max))
    return parts


# Step adjustments per step scaling policy (Auto Scaling quota; see infra/contract/aws.py).
MAX_STEPS = 20


@dataclass(frozen=True)
class Step:
    """Metric values in [lower, upper) (upper None: no bound) set the part to ``size`` VMs."""

    lower: int
    upper: int | None
    size: int


def demand_steps(min_size: int, max_size: int, max_steps: int = MAX_STEPS) -> list[Step]:
    """Steps that turn a published demand (whole VMs) into an exact part size, never below what is
    asked: a demand of 0 gives ``min_size`` (0 scales to zero), ``d`` gives ``max(min_size, d)`` while
    there are enough steps, else the next boundary up; ``max_size`` from there on. Contiguous from
    0 with one open-ended last step, as step adjustments must be."""
    bounds = list(range(0, max_size + 1))
    if len(bounds) > max_steps:
        # 0 and 1 keep their own steps (scale to zero, the first VM); the rest is spread evenly.
        rest = max_steps - 2
        bounds = [0, 1] + sorted({1 + -(-(max_size - 1) * i // rest) for i in range(1, rest + 1)})
    steps = []
    for i, lower in enumerate(bounds):
        upper = bounds[i + 1] if i + 1 < len(bounds) else None
        # Every whole demand in [lower, upper) fits in upper - 1 VMs.
        size = max_size if upper is None else upper - 1
        steps.append(Step(lower, upper, max(min_size, size)))
    return steps


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
    args: StackArgs, plans: Sequence[JobPlan], base_cls: Callable, pool_cls: Callable, job_cls: Callable, opts: Any = None,
    watcher_cls: Callable | None = None,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The stack's shared base, the watcher (``spotctl:watcher``; as ``base.watcher``, None without
    one, declared before the jobs, which may grant it access to their identities), one pool
    component per pool and one job component per job.

    ``opts`` (ResourceOptions, e.g. the explicit provider) is given to every component."""
    base = base_cls("stack", args, opts=opts)
    base.watcher = watcher_cls("watcher", args, base, opts=opts) if watcher_cls and args.cfg.watcher else None
    pools = {pool.name: pool_cls(f"pool-{pool.name}", args, pool, base, opts=opts) for pool in args.cfg.pools}
    jobs = {plan.job.id: job_cls(f"job-{plan.job.id}", args, plan, base, opts=opts) for plan in plans}
    return base, pools, jobs
