"""Pools and jobs (``spotctl:pools``, ``spotctl:jobs``): their keys and the rules within one of them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AwareDatetime,
    Field,
    PrivateAttr,
    StringConstraints,
    field_validator,
    model_validator,
)

from infra.basics import MAX_JOB_NODES, Capacity, JobState, own_events
from infra.codespec import CodeSpec
from infra.config.base import (
    MAX_ATTEMPT,
    MAX_COMMAND,
    MAX_HOURS,
    NAME_RE,
    NAME_RULE,
    POLICY_NAMES,
    ZONE_RE,
    Name,
    NonEmpty,
    NonNegativeInt,
    PositiveInt,
    SecureValue,
    _bounded,
    _choice_message,
    _env_value,
    _Model,
    _no_nul,
    reserved_env_key,
)


class Accelerator(_Model):
    """A GPU model and how many of it per VM (GCE names, e.g. ``nvidia-h100-80gb``; on AWS informational)."""

    type: Annotated[str, StringConstraints(strict=True, min_length=1)]
    count: PositiveInt = 1


class Pool(_Model):
    """Shared GPU capacity: a static on-demand part and a dynamic spot part that autoscales."""

    name: Name
    machine_type: NonEmpty | None = None
    instance_types: list[NonEmpty] | None = None
    accelerator: Accelerator | None = None
    on_demand: NonNegativeInt = 0
    spot_min: NonNegativeInt = 0
    spot_max: NonNegativeInt = 0
    agent_command: Annotated[str, StringConstraints(strict=True, max_length=MAX_COMMAND)] | None = None
    disk_gb: Annotated[int, Field(strict=True, ge=10, le=65536)] = 200
    image: str | None = None
    external_ip: bool = False
    # Minutes demand may stay unmet by spot before on-demand VMs are added above the base (None: never).
    fallback_to_on_demand: Annotated[int, Field(strict=True, ge=1, le=1440)] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"pool name {v!r} is not a valid cloud resource name: use {NAME_RULE}")
        return v

    @field_validator("agent_command")
    @classmethod
    def _agent(cls, v: str | None) -> str | None:
        return v if v is None else _no_nul(v)

    @model_validator(mode="after")
    def _sizes(self) -> Self:
        if self.spot_max < self.spot_min:
            raise ValueError(f"spotMax ({self.spot_max}) must be >= spotMin ({self.spot_min})")
        if self.on_demand + self.spot_max == 0:
            raise ValueError("a pool needs onDemand > 0 or spotMax > 0, or it declares no capacity")
        if self.fallback_to_on_demand is not None and self.spot_max == 0:
            raise ValueError("fallbackToOnDemand replaces missing spot VMs: it needs spotMax > 0")
        return self


MOVE_STEPS = ("snapshot", "restore", "start", "release")


class Move(_Model):
    """A move of a job (and its disks) to another zone, in progress: the last step written.

    Steps, each one targeted update (``cli/lifecycle/move.py`` decides them): ``snapshot`` (no VMs,
    a snapshot of every node's disk), ``restore`` (new disks in ``to`` from the snapshots), ``start``
    (zone := ``to``, next attempt on the new disks), ``release`` (the old disks go).
    """

    from_: Name = Field(alias="from")
    to: Name
    step: Literal["snapshot", "restore", "start", "release"]
    # When the move began (its snapshot step was written): the move's changeover is measured from
    # here to the new attempt's `started` event (``cli.lifecycle.move.move_changeovers``).
    began: AwareDatetime | None = None
    # Zones whose disks earlier moves left behind, oldest first, still protected: a move whose new
    # attempt was refused in its target zone (never started) moved on from there to ``to``; those
    # disks go with this move's release, once its new attempt has started (``infra.common.node_disks``).
    held: list[Name] = Field(default_factory=list)
    # GCP: the disks this move restores are regional persistent disks replicated in these two
    # zones (``to`` one of them): a zonal job disk converted through a snapshot (``spotctl move
    # --replica-zones``); the start step writes them as the job's ``diskReplicaZones``.
    replica_zones: list[Annotated[str, StringConstraints(strict=True, pattern=ZONE_RE)]] | None = None
    # The attempt whose disks the snapshot step snapshotted: the restored disks hold its work and
    # no later one's, so no other attempt may run on the disks left behind (``states.moving_guard``)
    # and the release deletes them only while the zone history says this attempt was the last there.
    attempt: PositiveInt | None = None


class ZoneStay(_Model):
    """A zone the job left: attempts up to ``lastAttempt`` ran there."""

    zone: Name
    last_attempt: PositiveInt
    # When the move that left this zone began (copied from the move record at its start step).
    move_began: AwareDatetime | None = None
    # The job left with its regional disk (diskReplicaZones): no snapshot, the disk's generation
    # (and name) did not change.
    same_disk: bool = False


# The job keys spotctl writes as the job runs, never a person: its state and attempts, a move and the
# zones left, the scripts and code an attempt started with, why and by whom it stopped, an update under
# way and the kind of disk it ran on. A new job has none of them (`launch` refuses them in a job file).
MANAGED_KEYS = ("state", "attempt", "move", "zoneHistory", "scriptsDigest", "diskKind", "stopReason", "stoppedBy",
                "applying", "codeDigest", "codeCommit")


class Job(_Model):
    """One training run whose disk outlives every VM it runs on."""

    id: Name
    machine_type: NonEmpty | None = None
    instance_type: NonEmpty | None = None
    accelerator: Accelerator | None = None
    image: str | None = None
    disk_gb: Annotated[int, Field(strict=True, ge=10, le=65536)] = 200
    command: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_COMMAND)]
    nodes: Annotated[int, Field(strict=True, ge=1, le=MAX_JOB_NODES)] = 1
    capacity: Capacity = Capacity.SPOT
    zone: Annotated[str, StringConstraints(strict=True, pattern=ZONE_RE)]
    # Bounded so every physical name stays within GCE's 63 characters (slug 16 + id 30 + "-a9999-n63").
    attempt: Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPT)] = 1
    state: JobState = JobState.PENDING
    deadline_hours: Annotated[float, Field(strict=True, gt=0, le=MAX_HOURS, allow_inf_nan=False)] | None = None
    job_hours: Annotated[float, Field(strict=True, gt=0, le=MAX_HOURS, allow_inf_nan=False)] | None = None
    policy: str = "default"
    # How many failed attempts `spotctl watch` retries before it marks the job failed (0: none).
    max_failures: Annotated[int, Field(strict=True, ge=0, le=100)] = 0
    # Values are strings or Pulumi secrets ({secure: ...}); secrets reach the VM through the cloud's
    # secret store, never through the script (infra.program.read_config, README "Secrets in env").
    env: dict[str, str | SecureValue] = Field(default_factory=dict)
    external_ip: bool = False
    # GCP: "keep" gives every node a protected boot disk that each attempt boots from (what was
    # installed at first boot survives preemption); "attempt" (default) boots each attempt fresh.
    boot_disk: Literal["attempt", "keep"] = "attempt"
    # AWS gp3 job disks: provisioned throughput (MiB/s) and IOPS; unset = scaled with the GPUs
    # (infra/aws_common.py gp3_performance). Ranges: the EBS API (CreateVolume), see infra/contract/aws.py.
    disk_throughput: Annotated[int, Field(strict=True, ge=125, le=2000)] | None = None
    disk_iops: Annotated[int, Field(strict=True, ge=3000, le=80000)] | None = None
    # `spotctl move`: the move in progress and the zones left so far (their count is the disks'
    # generation: each move creates new disks with new names, so old and new coexist until release).
    move: Move | None = None
    zone_history: list[ZoneStay] = Field(default_factory=list)
    # The digest of spotctl's VM scripts the current attempt started with (``infra.basics.scripts_digest``,
    # written with each new attempt): while it differs from this spotctl's, the attempt's VMs keep their
    # scripts (``infra.common.frozen_scripts``); new scripts reach the next attempt.
    scripts_digest: Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9a-f]{16}$")] | None = None
    # `spotctl watch` may move the job to another zone of the stack when resumes keep being refused
    # for capacity in its zone and a move is cheaper than on-demand (cli/policy/failover.py).
    move_on_capacity: bool = True
    # GCP: the job disk is a regional persistent disk replicated in these two zones of the stack
    # (infra/contract/gcp.py gcp.regional-disk-*): a move between them keeps the disk (no snapshot).
    disk_replica_zones: list[Annotated[str, StringConstraints(strict=True, pattern=ZONE_RE)]] | None = None
    # GCP: the kind of job disk the job has run on, recorded by spotctl after an update it applied
    # (and by a conversion's start step). A regional and a zonal disk are different resources under
    # the same name, so adding or dropping diskReplicaZones by hand would give the job a new, empty
    # disk: validation refuses it (``_disk_kind_checks``).
    disk_kind: Literal["zonal", "regional"] | None = None
    # Why spotctl left the job stopped when it did not finish what it started (a gang's stop that
    # failed midway); cleared by the next change of state. ``spotctl status`` shows it.
    stop_reason: Annotated[str, StringConstraints(max_length=2000)] | None = None
    # `spotctl stop`: the user stopped the job (VMs gone, disks kept); `spotctl watch` never resumes it,
    # only `spotctl resume` does. Cleared by the next change of state.
    stopped_by: Literal["user"] | None = None
    # An update of the job spotctl started and has not seen finish (set before `pulumi up`, cleared
    # after it succeeded): a kill -9 or a failed update leaves it, so `status` shows it and the same
    # command, `resume` or `watch` apply the job again (cli/lifecycle/operations.py ``_mark_pending``).
    applying: Annotated[str, StringConstraints(max_length=2000)] | None = None
    # Where the job's code comes from, what runs once per disk and code before the command, where the
    # command runs, and in what container (infra/codespec.py, docs/guides/code.md); the archive's
    # sha256 or the repository's commit spotctl recorded at the attempt's launch.
    code: CodeSpec | None = None
    setup: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_COMMAND)] | None = None
    workdir: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=1024)] | None = None
    container: Annotated[str, StringConstraints(strict=True, min_length=1, max_length=512)] | None = None
    code_digest: str | None = None
    code_commit: str | None = None
    _retired_after: int = PrivateAttr(0)  # set by StackConfig from spotctl:retiredJobs

    @classmethod
    def managed_key(cls, key: str) -> str | None:
        """The stack file's name of ``key`` (as written, or by its Python name) when spotctl writes it
        as the job runs (MANAGED_KEYS), else None."""
        field = cls.model_fields.get(key)
        alias = field.alias if field is not None else key
        return alias if alias in MANAGED_KEYS else None

    @property
    def retired_after(self) -> int:
        """The last attempt of an earlier job of this id that `spotctl cleanup` removed (0: none): its
        events are kept under the same id, and are not this job's (``mine``)."""
        return self._retired_after

    def mine(self, events: list[Any], attempt_of: Any = lambda e: e.attempt) -> list[Any]:
        """The events of this job's own attempts (``own_events``)."""
        return own_events(self._retired_after, events, attempt_of)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"job id {v!r} is not a valid cloud resource name: use {NAME_RULE}")
        return v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in POLICY_NAMES:
            raise ValueError(_choice_message("policy", v, POLICY_NAMES))
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, v: Any) -> Any:
        if not isinstance(v, Mapping):
            return v  # pydantic names the type error
        return {key: _env_value(str(key), value) for key, value in v.items()}

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str | SecureValue]) -> dict[str, str | SecureValue]:
        for key, value in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env key {key!r} is not a valid environment variable name")
            if reserved_env_key(key):
                raise ValueError(f"env key {key!r} is reserved: {reserved_env_key(key)}")
            if isinstance(value, str):
                _bounded(_no_nul(value))
        return v

    @property
    def plain_env(self) -> dict[str, str]:
        """The env values in clear (they travel in the VM's script)."""
        return {k: v for k, v in self.env.items() if isinstance(v, str)}

    @property
    def secret_keys(self) -> tuple[str, ...]:
        """The env keys whose values are Pulumi secrets (they travel through the cloud's secret store)."""
        return tuple(sorted(k for k, v in self.env.items() if isinstance(v, SecureValue)))

    @field_validator("command", "setup")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():  # (as '' is: a shell given only blanks runs nothing)
            raise ValueError("must not be empty (it is only whitespace)")
        return v if v is None else _no_nul(v)

    @model_validator(mode="after")
    def _hours(self) -> Self:
        if self.job_hours is not None and self.deadline_hours is not None and self.job_hours > self.deadline_hours:
            raise ValueError(f"jobHours ({self.job_hours:g}) must be <= deadlineHours ({self.deadline_hours:g}): "
                             "the job cannot finish before its deadline")
        return self

    @model_validator(mode="after")
    def _stopped_by(self) -> Self:
        if self.stopped_by is not None and self.state is not JobState.STOPPED:
            raise ValueError(f"stoppedBy: {self.stopped_by} is only for a stopped job (state is {self.state.value}): "
                             "remove it, or `spotctl stop` the job")
        return self

    @property
    def active(self) -> bool:
        """True when the job should have VMs now."""
        return self.state in (JobState.PENDING, JobState.RUNNING)

    @property
    def spot_only(self) -> bool:
        """GCE creates the job's machine type only as a Spot VM (rule gcp.a3-high-spot-only): no policy
        may pick on-demand for it."""
        from infra.contract.gcp import spot_only

        return bool(self.machine_type) and spot_only(self.machine_type or "")
