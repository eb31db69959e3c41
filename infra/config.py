"""The stack configuration (`spotctl:*` keys of `stacks/Pulumi.<stack>.yaml`), read and validated here only.

Both the Pulumi program and every CLI command go through :func:`validate`, so a bad stack file is
rejected with the same message everywhere: the file, the key path as the user wrote it
(``spotctl:jobs[2].capacity``), what was expected, and a "did you mean" for misspelled keys.

This module imports neither pulumi nor any cloud SDK: the CLI must start fast. Longer than 400 lines
because every rule about a stack file's values lives here and nowhere else (one model per section).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from infra.basics import MAX_JOB_NODES, NAMESPACE, Capacity, ConfigError, JobState, own_events  # noqa: F401  (re-exported)
from infra.codespec import CodeSpec, code_problems

# Job ids and pool names become parts of cloud resource names (GCE: RFC 1035, 63 chars; we append
# suffixes such as "-a12-n3-disk"), so they are kept short and in the strictest common alphabet.
# Every pattern here is used with fullmatch: `$` would also match before a trailing newline.
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,28}[a-z0-9])?")
NAME_RULE = (
    "1-30 characters: lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen"
)

POLICY_NAMES = ("default", "greedy", "uniform-progress", "uniform-progress-nh", "n-preemptions", "on-demand")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        use_enum_values=False,
    )


Name = Annotated[str, StringConstraints(strict=True)]
NonEmpty = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$")]

MAX_ATTEMPT = 9999
MAX_HOURS = 87600.0  # ten years: past that a deadline is a typo (and 1e300 overflowed the planner)
# A command travels in the VM's startup script: GCE metadata values are limited to 256 KB and AWS
# user data to 16 KB (the contract checks the rendered script); no real command is longer than this.
MAX_COMMAND = 8192
MAX_ENV_VALUE = 4096
# What plan, status and drill show for (and what mocks and drills deliver as) a secret env value.
SECRET_PLACEHOLDER = "[secret]"
# Regions and zones: ASCII, structured; a zone is its region plus one letter (GCP "-a", AWS "a"),
# or an AWS Local Zone ("us-west-2-lax-1a"). These go to pydantic, whose (Rust) regex `$` matches
# only at the very end, unlike Python's.
REGION_RE = r"^[a-z]{2,}(-[a-z]+)+-?[0-9]{1,2}$"
ZONE_RE = r"^[a-z]{2,}(-[a-z]+)+-?[0-9]{1,2}(-[a-z]|[a-z]|-[a-z]{3}-[0-9][a-z])$"

# Names a job's env may not set: spotctl's own variables and the rendezvous it sets up, names
# that change how bash, the dynamic linker or command lookup behave. (The scripts set their own
# variables after the user's regardless; this makes the stack file say so up front.)
RESERVED_ENV_PREFIXES = {"SPOTCTL_": "spotctl sets its own SPOTCTL_* variables", "BASH_": "it changes how bash runs",
                         "LD_": "it changes the dynamic linker"}
RESERVED_ENV_NAMES = {
    **dict.fromkeys(("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE"), "spotctl sets the rendezvous variables"),
    **dict.fromkeys(("PATH", "CDPATH", "FPATH", "MAILPATH", "ENV", "BASHOPTS", "SHELLOPTS", "IFS", "GLOBIGNORE",
                     "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "POSIXLY_CORRECT", "OPTIND", "OPTARG", "HOME", "PWD",
                     "OLDPWD", "SHELL", "SHLVL", "PPID", "UID", "EUID", "TMOUT", "HISTFILE", "EXECIGNORE", "INPUTRC"),
                    "it changes how the shell or command lookup behaves"),
}


def reserved_env_key(key: str) -> str:
    """Why a job's env may not set ``key`` ("" when it may)."""
    if key in RESERVED_ENV_NAMES:
        return RESERVED_ENV_NAMES[key]
    return next((why for prefix, why in RESERVED_ENV_PREFIXES.items() if key.upper().startswith(prefix)), "")


def zone_in_region(zone: str, region: str, cloud: str) -> bool:
    """``zone`` is one of ``region``'s zones by its structure, not a string prefix
    (``us-central10-c`` is not in ``us-central1``)."""
    if cloud == "gcp":
        return re.fullmatch(re.escape(region) + r"-[a-z]", zone) is not None
    return re.fullmatch(re.escape(region) + r"([a-z]|-[a-z]{3}-[0-9][a-z])", zone) is not None


def env_value_problem(value: str) -> str:
    """What is wrong with an env value ("" when nothing); never quotes the value (it may be a secret)."""
    if "\x00" in value:
        return "must not contain a NUL character (no process can receive it)"
    if len(value) > MAX_ENV_VALUE:
        return f"is {len(value)} characters; at most {MAX_ENV_VALUE}"
    return ""


def _bounded(value: str) -> str:
    if len(value) > MAX_ENV_VALUE:
        raise ValueError(f"an env value is {len(value)} characters; at most {MAX_ENV_VALUE}")
    return value
PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class SecureValue(_Model):
    """A value Pulumi encrypted in the stack file: ``{secure: <ciphertext>}``, as ``pulumi config set
    --secret --path 'spotctl:jobs[0].env.KEY'`` writes it (pulumi/pulumi
    sdk/go/common/resource/config/object.go: ``marshalObject`` writes a secure string as a map with
    the single key ``secure``; ``isSecureValue`` reads exactly that shape back). spotctl never sees the
    clear value: the Pulumi engine decrypts it for the program (``infra.program.read_config``)."""

    secure: Annotated[str, StringConstraints(strict=True, min_length=1)]


def _env_value(key: str, value: Any) -> Any:
    """A job env value: a string, or a Pulumi secret (exactly ``{secure: <ciphertext>}``)."""
    if isinstance(value, SecureValue | str):
        return value
    if isinstance(value, Mapping) and set(value) == {"secure"} and isinstance(value["secure"], str) and value["secure"]:
        return SecureValue(secure=value["secure"])
    raise ValueError(f"env value of {key!r} must be a string or a Pulumi secret "
                     f"({{secure: <ciphertext>}}, as `pulumi config set --secret --path` writes it), got {_show(value)}")


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


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (no process can receive it)")
    return value


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


class ZoneStay(_Model):
    """A zone the job left: attempts up to ``lastAttempt`` ran there."""

    zone: Name
    last_attempt: PositiveInt
    # When the move that left this zone began (copied from the move record at its start step).
    move_began: AwareDatetime | None = None
    # The job left with its regional disk (diskReplicaZones): no snapshot, the disk's generation
    # (and name) did not change.
    same_disk: bool = False


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
    # (infra/aws.py gp3_performance). Ranges: the EBS API (CreateVolume), see infra/contract/aws.py.
    disk_throughput: Annotated[int, Field(strict=True, ge=125, le=2000)] | None = None
    disk_iops: Annotated[int, Field(strict=True, ge=3000, le=80000)] | None = None
    # `spotctl move`: the move in progress and the zones left so far (their count is the disks'
    # generation: each move creates new disks with new names, so old and new coexist until release).
    move: Move | None = None
    zone_history: list[ZoneStay] = Field(default_factory=list)
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
        return v if v is None else _no_nul(v)

    @model_validator(mode="after")
    def _hours(self) -> Self:
        if self.job_hours is not None and self.deadline_hours is not None and self.job_hours > self.deadline_hours:
            raise ValueError(f"jobHours ({self.job_hours:g}) must be <= deadlineHours ({self.deadline_hours:g}): "
                             "the job cannot finish before its deadline")
        return self

    @property
    def active(self) -> bool:
        """True when the job should have VMs now."""
        return self.state in (JobState.PENDING, JobState.RUNNING)


MAX_PRICE_PER_HOUR = 10_000


class MachinePrice(_Model):
    """What one machine (GCP) or instance (AWS) type costs per hour, in USD: ``{spot, onDemand}``.
    Stack prices win over spotctl's shipped table and the clouds' price APIs (``spotctl cost``)."""

    # Bounded: the dearest GPU machines list near $100/h (a3-highgpu-8g $88.49 in cli/cost/prices.json);
    # $10,000/h is a typo, and sums of unbounded floats overflow the cent rounding of the report.
    spot: Annotated[float, Field(ge=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)]
    on_demand: Annotated[float, Field(ge=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)]

    @field_validator("spot", "on_demand", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"expected a price in USD per hour (a number), got {_show(v)}")
        return v


# How AWS VMs without public IPs reach out (README, "First real `pulumi up`"): `s3-endpoint` (default)
# adds a free S3 gateway endpoint to the VPC's route tables (event uploads, S3 datasets); `public-ip`
# also gives every VM a public IPv4 address (the VPC's subnets need a route to an internet gateway,
# as the default VPC's have); `nat` also declares a NAT gateway in `natSubnet` (a public subnet) and
# routes the configured subnets through it; `existing` declares nothing (the VPC already has egress).
AWS_EGRESS = ("s3-endpoint", "public-ip", "nat", "existing")
# `network.s3Endpoint` (AWS, egress `s3-endpoint` or `public-ip`): `own` (default) declares the stack's
# S3 gateway endpoint on its subnets' route tables; `existing` when those route tables already send S3
# through another gateway endpoint (a route table takes one per service, so a second one fails with
# RouteAlreadyExists), while the stack still declares its SSM/Auto Scaling interface endpoints.
AWS_S3_ENDPOINT = ("own", "existing")
# A pool's instance types are one launch-template override each in its Auto Scaling group(s)
# (infra/aws_scaling.py mixed_group): "You can specify up to 40 instance types per Auto Scaling
# group" (botocore autoscaling 2011-01-01 service-2.json, LaunchTemplateOverrides.InstanceType).
ASG_MAX_INSTANCE_TYPES = 40
GCP_EGRESS = ("nat", "existing")


class Network(_Model):
    """Where VMs attach. GCP: network/subnetwork names; AWS: one subnet id per zone (default VPC if
    none) and ``natSubnet``. ``egress``: how VMs without external IPs reach out (``StackConfig.egress``).

    GCP ``egress``: ``nat`` (default) declares a Cloud Router + NAT for the stack's subnetwork, so VMs
    without external IPs reach GCS, pip and datasets; ``existing`` when the subnetwork already has egress.
    AWS ``egress``: see AWS_EGRESS.
    """

    network: str = "default"
    subnetwork: str | None = None
    subnets: dict[str, str] = Field(default_factory=dict)
    egress: str | None = None
    nat_subnet: str | None = None
    s3_endpoint: str | None = None  # AWS_S3_ENDPOINT


# `spotctl:watcher`: the always-on VM that runs `spotctl watch` for the stack (README "Watching a
# stack", way 4). Values that reach its startup script are validated to a strict alphabet here and
# still shell-quoted there. Defaults: the smallest general-purpose on-demand VM of each cloud.
WATCHER_MACHINE = {"gcp": "e2-small", "aws": "t3.small"}
PULUMI_VERSION = "3.220.0"  # https://www.pulumi.com/docs/install/ (the Pulumi CLI the watcher VM installs)
UV_VERSION = "0.13.9"  # the uv this project is developed with (`uv --version`)
# A DIY Pulumi backend in the stack's own cloud: `s3://bucket[/prefix][?query]` or `gs://bucket[/prefix]`
# (https://www.pulumi.com/docs/iac/operations/stack-management/using-a-diy-backend/). Pulumi Cloud
# would need an access token on the VM: not supported here.
BACKEND_RE = re.compile(r"(?P<scheme>s3|gs)://(?P<bucket>[a-z0-9][a-z0-9._-]{1,61}[a-z0-9])"
                        r"(?:/(?P<prefix>[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*))?/?(?:\?[A-Za-z0-9=&._-]*)?")
REPO_RE = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?/[A-Za-z0-9._~/-]+")
GIT_REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
VERSION_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
# awskms://<key id or key ARN> (an alias cannot be the resource of an IAM grant on the key),
# gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K (Pulumi's secrets providers:
# https://www.pulumi.com/docs/iac/concepts/secrets/#available-encryption-providers).
AWS_KMS_RE = re.compile(r"awskms://(?:arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/)?[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"
                        r"(?:\?[A-Za-z0-9=&._-]*)?")
GCP_KMS_RE = re.compile(r"gcpkms://projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/locations/[a-z0-9-]+/keyRings/[A-Za-z0-9_-]{1,63}"
                        r"/cryptoKeys/[A-Za-z0-9_-]{1,63}")
# The passphrase of a `passphrase` secrets provider: an SSM parameter name (AWS) or a Secret Manager
# secret id (GCP), read by the watcher VM at boot, never stored in the stack.
SSM_PARAMETER_RE = re.compile(r"/?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
GCP_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")


class Watcher(_Model):
    """``spotctl:watcher``: a small on-demand VM, declared by the stack, that runs ``spotctl watch``
    with an identity that may read the interruption queue/subscription and the event bucket, read and
    write the Pulumi backend's prefix, and run targeted updates of this stack's jobs."""

    machine_type: NonEmpty | None = None  # GCP (default e2-small)
    instance_type: NonEmpty | None = None  # AWS (default t3.small)
    zone: Annotated[str, StringConstraints(strict=True, pattern=ZONE_RE)] | None = None  # default: spotctl:zones[0]
    backend: Annotated[str, StringConstraints(strict=True, min_length=1)]
    secrets_provider: Annotated[str, StringConstraints(strict=True, min_length=1)] = "passphrase"
    passphrase_secret: Annotated[str, StringConstraints(strict=True, min_length=1)] | None = None
    repo: Annotated[str, StringConstraints(strict=True, min_length=1)]
    ref: Annotated[str, StringConstraints(strict=True, min_length=1)] = "main"
    pulumi_version: Annotated[str, StringConstraints(strict=True)] = PULUMI_VERSION
    uv_version: Annotated[str, StringConstraints(strict=True)] = UV_VERSION
    disk_gb: Annotated[int, Field(strict=True, ge=10, le=200)] = 20
    external_ip: bool = False

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if not BACKEND_RE.fullmatch(v):
            raise ValueError(f"expected a DIY Pulumi backend URL 's3://BUCKET[/PREFIX]' (AWS) or 'gs://BUCKET[/PREFIX]' "
                             f"(GCP), got {v!r} (Pulumi Cloud and file:// backends cannot be reached from the watcher VM)")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not REPO_RE.fullmatch(v):
            raise ValueError(f"expected an https:// git URL without credentials (they would sit in the VM's startup "
                             f"script), got {v!r}")
        return v

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        if not GIT_REF_RE.fullmatch(v) or ".." in v:
            raise ValueError(f"expected a git branch, tag or commit, got {v!r}")
        return v

    @field_validator("pulumi_version", "uv_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not VERSION_RE.fullmatch(v):
            raise ValueError(f"expected a version such as '1.2.3', got {v!r}")
        return v

    def backend_parts(self) -> tuple[str, str, str]:
        """(scheme, bucket, prefix) of the backend URL; prefix "" or ending in "/"."""
        m = BACKEND_RE.fullmatch(self.backend)
        assert m is not None  # validated
        prefix = m.group("prefix") or ""
        return m.group("scheme"), m.group("bucket"), f"{prefix}/" if prefix else ""

    def machine(self, cloud: str) -> str:
        return (self.machine_type if cloud == "gcp" else self.instance_type) or WATCHER_MACHINE[cloud]


def _watcher_checks(cfg: StackConfig, problems: list[tuple[str, str]]) -> None:
    """The watcher's keys against the cloud and the stack's zones and network."""
    w = cfg.watcher
    if w is None:
        return
    gcp = cfg.cloud == "gcp"
    key, other = ("machineType", "instanceType") if gcp else ("instanceType", "machineType")
    if (w.instance_type if gcp else w.machine_type) is not None:
        problems.append((f"watcher.{other}", f"not used on {'GCP' if gcp else 'AWS'}; use {key}"))
    if w.zone is not None and w.zone not in cfg.zones:
        problems.append(("watcher.zone", _choice_message("zone", w.zone, cfg.zones)))
    scheme = w.backend_parts()[0]
    if scheme != ("gs" if gcp else "s3"):
        problems.append(("watcher.backend", f"a {scheme}:// backend on {'GCP' if gcp else 'AWS'}: the watcher's identity "
                         f"can be granted only a {'gs' if gcp else 's3'}:// bucket of the stack's own cloud"))
    provider = w.secrets_provider
    if provider == "passphrase":
        secret = w.passphrase_secret
        if secret is None:
            problems.append(("watcher.passphraseSecret", "required with secretsProvider 'passphrase': the name of the "
                             + ("Secret Manager secret" if gcp else "SSM parameter (SecureString)")
                             + " that holds PULUMI_CONFIG_PASSPHRASE"))
        elif not (GCP_SECRET_RE if gcp else SSM_PARAMETER_RE).fullmatch(secret):
            problems.append(("watcher.passphraseSecret", f"{secret!r} is not a valid "
                             + ("Secret Manager secret id" if gcp else "SSM parameter name")))
    else:
        if w.passphrase_secret is not None:
            problems.append(("watcher.passphraseSecret", f"only used with secretsProvider 'passphrase' (it is {provider!r})"))
        if not (GCP_KMS_RE if gcp else AWS_KMS_RE).fullmatch(provider):
            want = ("'gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K'" if gcp
                    else "'awskms://<key id or key ARN>' (not an alias: IAM grants name the key)")
            problems.append(("watcher.secretsProvider", f"expected 'passphrase' or {want}, got {provider!r}"))
    if not gcp and cfg.egress == "s3-endpoint" and not w.external_ip:
        problems.append(("watcher.externalIp", "the watcher needs the internet (git, PyPI, the Pulumi CLI, and the EC2, "
                         "SQS and IAM APIs) but network.egress 's3-endpoint' reaches only S3: set network.egress to "
                         "'nat', 'public-ip' or 'existing', or watcher.externalIp: true"))


class StackConfig(_Model):
    """Everything under the ``spotctl:`` namespace of one stack file."""

    cloud: Literal["gcp", "aws"]
    region: Annotated[str, StringConstraints(strict=True, pattern=REGION_RE)]
    zones: Annotated[list[Annotated[str, StringConstraints(strict=True, pattern=ZONE_RE)]], Field(min_length=1)]
    project: str | None = None
    network: Network = Field(default_factory=Network)
    labels: dict[str, str] = Field(default_factory=dict)
    event_retention_days: Annotated[int, Field(strict=True, ge=1, le=3650)] = 30
    pools: list[Pool] = Field(default_factory=list)
    jobs: list[Job] = Field(default_factory=list)
    prices: dict[str, MachinePrice] = Field(default_factory=dict)
    watcher: Watcher | None = None
    # Job ids `spotctl cleanup` removed, with their last attempt: their events stay in the event
    # bucket (the cost ledger, `policy fit`), filed by job id and attempt, so a new job of the same id
    # must begin after them (``_cross_checks``) or the old job's `completed` would end the new one.
    retired_jobs: dict[str, Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPT)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        # Cross-field problems are reported with their own key path, so they are collected here
        # and raised as one _CrossErrors that validate() turns into messages.
        # Rules across jobs compare only job ids (unique, not a pool's name): one job's edit is validated
        # with the stack-wide keys and that job alone (the job index in cli/lifecycle/stackfile.py).
        # A rule comparing other fields of two jobs must also make that path read the whole file.
        problems: list[tuple[str, str]] = []
        gcp = self.cloud == "gcp"
        if gcp and not self.project:
            problems.append(("project", "required when cloud is 'gcp' (the GCP project id)"))
        for i, zone in enumerate(self.zones):
            if not zone_in_region(zone, self.region, self.cloud):
                problems.append((f"zones[{i}]", f"zone {zone!r} is not in region {self.region!r}"))
        if len(set(self.zones)) != len(self.zones):
            problems.append(("zones", "lists a zone twice"))
        for i, job in enumerate(self.jobs):
            last = self.retired_jobs.get(job.id)
            if last is None:
                continue
            job._retired_after = last
            if job.attempt <= last:
                problems.append((f"jobs[{i}].attempt", (
                    f"job id {job.id!r} belonged to a job `spotctl cleanup` removed after its attempt {last} "
                    f"(spotctl:retiredJobs); its events are kept, filed by id and attempt, and would be read as "
                    f"this job's (its `completed` would end this one): give this job another id; or, once the old "
                    f"job's disks are deleted (`spotctl cleanup` deletes them, unless run with --no-apply: a job "
                    f"of the same id declares disks of the same names), start it at attempt: {last + 1}")))
        for zone in self.network.subnets:
            if zone not in self.zones:
                problems.append((f"network.subnets.{zone}", f"zone {zone!r} is not in spotctl:zones {self.zones}"))
        if gcp:
            _gcp_checks(self, problems)
        elif any(j.boot_disk == "keep" for j in self.jobs):
            i = next(i for i, j in enumerate(self.jobs) if j.boot_disk == "keep")
            problems.append((f"jobs[{i}].bootDisk", "'keep' is supported on GCP only"))
        else:
            _aws_network(problems, self)
        job_ids = {j.id for j in self.jobs}
        for i, pool in enumerate(self.pools):
            if pool.name in job_ids:
                problems.append((
                    f"pools[{i}].name",
                    f"pool {pool.name!r} has the name of a job: both write events under <stack>/{pool.name}/, "
                    "and each identity may write only under its own prefix",
                ))
        _unique(problems, "pools", "name", [p.name for p in self.pools])
        _unique(problems, "jobs", "id", [j.id for j in self.jobs])
        for i, pool in enumerate(self.pools):
            _per_cloud(problems, f"pools[{i}]", gcp, pool.machine_type, "machineType", pool.instance_types, "instanceTypes")
            if not gcp and pool.instance_types is not None and not pool.instance_types:
                problems.append((f"pools[{i}].instanceTypes", "needs at least one instance type"))
            elif not gcp and len(pool.instance_types or ()) > ASG_MAX_INSTANCE_TYPES:
                problems.append((f"pools[{i}].instanceTypes", f"{len(pool.instance_types or ())} instance types; an Auto "
                                 f"Scaling group takes at most {ASG_MAX_INSTANCE_TYPES}"))
        for i, job in enumerate(self.jobs):
            _per_cloud(problems, f"jobs[{i}]", gcp, job.machine_type, "machineType", job.instance_type, "instanceType")
            if job.zone not in self.zones:
                problems.append((f"jobs[{i}].zone", _choice_message("zone", job.zone, self.zones)))
            _move_checks(self, i, job, problems)
            _replica_checks(self, i, job, problems)
            _disk_kind_checks(self, i, job, problems)
            problems.extend((f"jobs[{i}].{key}", f"job {job.id}: {message}") for key, message in code_problems(job))
        _watcher_checks(self, problems)
        for key, value in self.labels.items():
            if not re.fullmatch(r"[a-z][-_a-z0-9]{0,62}", key) or not re.fullmatch(r"[-_a-z0-9]{0,63}", value):
                problems.append(
                    (f"labels.{key}", "labels must be lowercase letters, digits, '-' or '_' (GCP label rules)")
                )
        # Every resource carries these labels and up to GCP_SPOTCTL_LABELS_MAX of spotctl's own; GCE takes
        # at most 64 (contract rule gcp.labels-64, with its source).
        from infra.contract.gcp import MAX_LABELS, PROVIDER_LABELS
        from infra.naming import GCP_SPOTCTL_LABELS_MAX

        room = MAX_LABELS - GCP_SPOTCTL_LABELS_MAX - PROVIDER_LABELS
        if gcp and len(self.labels) > room:
            problems.append(("labels", f"{len(self.labels)} labels: at most {room} (a GCP resource takes {MAX_LABELS} "
                                       f"labels, spotctl adds up to {GCP_SPOTCTL_LABELS_MAX} of its own to a job's VM "
                                       f"and pulumi-gcp {PROVIDER_LABELS} (goog-pulumi-provisioned))"))
        if problems:
            raise _CrossErrors(problems)
        return self

    @property
    def egress(self) -> str:
        """The network's egress choice, with the cloud's default (GCP ``nat``, AWS ``s3-endpoint``)."""
        return self.network.egress or ("nat" if self.cloud == "gcp" else "s3-endpoint")

    @property
    def watcher_zone(self) -> str:
        """The watcher VM's zone (``spotctl:watcher.zone``, else the first of ``spotctl:zones``)."""
        return (self.watcher.zone if self.watcher else None) or self.zones[0]

    def job(self, job_id: str) -> Job:
        """Return the job with this id, or raise KeyError naming the ids that exist."""
        for job in self.jobs:
            if job.id == job_id:
                return job
        raise KeyError(_choice_message("job", job_id, [j.id for j in self.jobs]))


def _move_checks(cfg: StackConfig, i: int, job: Job, problems: list[tuple[str, str]]) -> None:
    """A move names zones of the stack, from the job's zone (before its ``start`` step) to another
    one, and never concerns a completed job (its disks only wait for ``spotctl cleanup``)."""
    move = job.move
    if move is None:
        return
    for name, zone in (("from", move.from_), ("to", move.to)):
        if zone not in cfg.zones:
            problems.append((f"jobs[{i}].move.{name}", _choice_message("zone", zone, cfg.zones)))
    if move.from_ == move.to and not move.replica_zones:  # a conversion may stay in its zone
        problems.append((f"jobs[{i}].move.to", f"is the zone the job moves from ({move.to!r})"))
    if move.replica_zones is not None:
        _conversion_checks(cfg, i, job, move, problems)
    at = move.from_ if move.step in ("snapshot", "restore") else move.to
    if job.zone != at:
        problems.append((f"jobs[{i}].zone", f"is {job.zone!r} but the move's step {move.step!r} has the job in {at!r}"))
    if job.state is JobState.COMPLETED:
        problems.append((f"jobs[{i}].move", "a completed job cannot move (finish or drop the move record first)"))
    if job.boot_disk == "keep":
        problems.append((f"jobs[{i}].move", "a job with bootDisk 'keep' cannot move yet (only its job disks would follow)"))
    if move.step in ("start", "release") and not job.zone_history:
        problems.append((f"jobs[{i}].zoneHistory", f"step {move.step!r} needs the zone the job left ({move.from_!r})"))
    for zone in move.held:
        if zone not in cfg.zones:
            problems.append((f"jobs[{i}].move.held", _choice_message("zone", zone, cfg.zones)))
    generations = sum(not stay.same_disk for stay in job.zone_history) - (move.step in ("start", "release"))
    if len(move.held) > generations:
        problems.append((f"jobs[{i}].move.held", f"names {len(move.held)} zone(s) whose disks were left, but the zone "
                         f"history has only {max(generations, 0)} earlier move(s)"))


def _replica_checks(cfg: StackConfig, i: int, job: Job, problems: list[tuple[str, str]]) -> None:
    """A regional disk (GCP) lives in two distinct zones of the stack, one of them the job's; it
    moves only between them (``spotctl move`` without a snapshot)."""
    zones = job.disk_replica_zones
    if zones is None:
        return
    key = f"jobs[{i}].diskReplicaZones"
    if cfg.cloud != "gcp":
        problems.append((key, "regional persistent disks are a GCP option (AWS EBS volumes live in one zone)"))
        return
    if len(zones) != 2 or len(set(zones)) != 2:
        problems.append((key, f"needs exactly two different zones (a regional disk is replicated in two), got {zones}"))
    for zone in zones:
        if zone not in cfg.zones:
            problems.append((key, _choice_message("zone", zone, cfg.zones)))
    if job.zone not in zones:
        problems.append((f"jobs[{i}].zone", f"is {job.zone!r}, not one of its disk's replica zones {zones}"))
    converted = job.move is not None and job.move.replica_zones == zones and job.move.step in ("start", "release")
    if job.move is not None and not converted:
        problems.append((f"jobs[{i}].move", "a job with a regional disk moves between its replica zones in one step, "
                         "without a move record"))
    if job.boot_disk == "keep":
        problems.append((key, "a job with bootDisk 'keep' cannot move, so a regional disk gains it nothing"))
    _regional_series(job, key, problems)


def _regional_series(job: Job, key: str, problems: list[tuple[str, str]]) -> None:
    """The job's machine series takes a Regional Persistent Disk (gcp.regional-disk-machine-series)."""
    from infra.contract.gcp import regional_disk_problem

    problem = regional_disk_problem(job.machine_type) if job.machine_type else None
    if problem is not None:
        problems.append((key, problem))


def _conversion_checks(cfg: StackConfig, i: int, job: Job, move: Move, problems: list[tuple[str, str]]) -> None:
    """A move into a regional disk: a GCP job, two distinct zones of the stack, ``to`` one of them,
    from a zonal disk (until the start step writes ``diskReplicaZones``)."""
    key, zones = f"jobs[{i}].move.replicaZones", move.replica_zones or []
    if cfg.cloud != "gcp":
        problems.append((key, "regional persistent disks are a GCP option"))
        return
    if len(zones) != 2 or len(set(zones)) != 2:
        problems.append((key, f"needs exactly two different zones (a regional disk is replicated in two), got {zones}"))
    problems.extend((key, _choice_message("zone", z, cfg.zones)) for z in zones if z not in cfg.zones)
    if move.to not in zones:
        problems.append((key, f"does not include the zone the job moves to ({move.to!r})"))
    if move.step in ("snapshot", "restore") and job.disk_replica_zones is not None:
        problems.append((key, "the job's disk is regional already (diskReplicaZones): nothing to convert"))
    if move.held:
        problems.append((f"jobs[{i}].move.held", "a conversion to a regional disk does not move on from a refused zone"))
    if move.step in ("snapshot", "restore"):  # from start on, diskReplicaZones is written (checked there)
        _regional_series(job, key, problems)


def recorded_disk_kind(job: Job) -> str | None:
    """The kind of disk the job has run on, as the stack file tells it: ``diskKind``, else its zone
    history (a move that kept the disk was a regional disk's; disks never turn back into zonal ones),
    else unknown (a job spotctl never updated)."""
    if job.disk_kind is not None:
        return job.disk_kind
    if any(stay.same_disk for stay in job.zone_history):
        return "regional"
    return "zonal" if job.zone_history else None


def _disk_kind_checks(cfg: StackConfig, i: int, job: Job, problems: list[tuple[str, str]]) -> None:
    """``diskReplicaZones`` added to or dropped from a GCP job that has run: a RegionDisk and a Disk
    are different resources under the same name, so the job would start on a new, empty disk (the
    old one survives only through ``protect``). Refused, saying what to do instead."""
    ran = recorded_disk_kind(job)
    if cfg.cloud != "gcp" or ran is None:
        return
    now = "regional" if job.disk_replica_zones else "zonal"
    if ran == now:
        return
    said = f"diskKind: {ran}" if job.disk_kind else "as its zoneHistory shows"
    if now == "regional":
        wanted = list(job.disk_replica_zones or [])
        to = job.zone if job.zone in wanted else wanted[0]
        problems.append((f"jobs[{i}].diskReplicaZones", f"job {job.id} has run on a zonal disk ({said}): adding "
                         f"diskReplicaZones would declare a new, empty regional disk under the same name and start the job on it. "
                         f"Remove diskReplicaZones and convert {job.id}'s disk with a move instead: `spotctl move {job.id} "
                         f"--to-zone {to} --replica-zones {','.join(wanted)}` (snapshot, restore into a regional disk, start, "
                         f"release the zonal one)"))
    else:
        problems.append((f"jobs[{i}].diskReplicaZones", f"job {job.id} has run on a regional disk ({said}): "
                         f"removing diskReplicaZones would declare a new, empty zonal disk under the same name and start the job on "
                         f"it. Put diskReplicaZones back (turning a regional disk back into a zonal one is not supported)"))


def _gcp_checks(cfg: StackConfig, problems: list[tuple[str, str]]) -> None:
    """GCP-only cross checks: the subnetwork of a custom network, machine type vs GPUs (the one
    table in infra/contract/gcp.py), and the egress choice."""
    from infra.contract.gcp import gpu_problem

    net = cfg.network
    if net.network != "default" and not net.subnetwork:
        problems.append((
            "network.subnetwork",
            f"required when network is {net.network!r}: a custom-mode VPC has no subnetwork 'default' "
            f"(name the network's subnetwork in region {cfg.region!r})",
        ))
    for section, items in (("pools", cfg.pools), ("jobs", cfg.jobs)):
        for i, item in enumerate(items):
            if item.machine_type is None:
                continue
            acc = item.accelerator
            problem = gpu_problem(item.machine_type, acc.type if acc else None, acc.count if acc else None)
            if problem is not None:
                problems.append((f"{section}[{i}].{problem[0]}", problem[1]))
    if cfg.egress not in GCP_EGRESS:
        problems.append(("network.egress", _choice_message("egress", cfg.egress, GCP_EGRESS)))
    if cfg.network.s3_endpoint is not None:
        problems.append(("network.s3Endpoint", "AWS only (GCP has no S3 gateway endpoint)"))


class _CrossErrors(ValueError):
    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{k}: {m}" for k, m in problems))


DEADLINE_POLICIES = ("greedy", "uniform-progress", "uniform-progress-nh")


def policy_warnings(cfg: StackConfig) -> list[str]:
    """Jobs whose policy will have nothing to weigh (valid config, so warnings, never errors).

    The deadline policies need ``jobHours`` and ``deadlineHours``: without them they keep spot
    however often it is preempted. ``default`` and ``n-preemptions`` work without a deadline
    (cost per hour of progress; preemptions), but a deadline without ``jobHours`` is not weighed.
    """
    out = []
    for i, job in enumerate(cfg.jobs):
        key = f"spotctl:jobs[{i}]"
        if job.policy in DEADLINE_POLICIES and not (job.job_hours and job.deadline_hours):
            out.append(f"{key}.policy: {job.policy!r} weighs a deadline, but job {job.id} has no "
                       f"{'jobHours' if job.deadline_hours else 'deadlineHours'}: it will stay on spot however often it is "
                       "preempted (set jobHours and deadlineHours, or use 'default' or 'n-preemptions')")
        elif job.deadline_hours and not job.job_hours and job.policy != "on-demand":
            out.append(f"{key}.deadlineHours: job {job.id} has no jobHours, so its deadline cannot be weighed "
                       f"({job.policy!r} decides without it)")
        elif job.job_hours and job.deadline_hours and job.job_hours > job.deadline_hours:
            out.append(f"{key}.jobHours: {job.job_hours} h of work cannot fit in deadlineHours {job.deadline_hours}: "
                       f"job {job.id} will run on-demand and still miss it")
    return out


def _unique(problems: list[tuple[str, str]], section: str, key: str, values: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        if value in seen:
            problems.append(
                (f"{section}[{i}].{key}", f"duplicate {key} {value!r} (also {NAMESPACE}:{section}[{seen[value]}])")
            )
        else:
            seen[value] = i


def _aws_network(problems: list[tuple[str, str]], cfg: StackConfig) -> None:
    net = cfg.network
    # A zone without a subnet would fall back to the default VPC while the security group lives in
    # the configured subnets' VPC: EC2 refuses an SG and a subnet of different VPCs.
    missing = [z for z in cfg.zones if z not in net.subnets]
    if net.subnets and missing:
        problems.append(("network.subnets", f"has no subnet for zone(s) {', '.join(missing)}: set one per zone in "
                         "spotctl:zones (all in one VPC), or none to use the default VPC"))
    egress = cfg.egress
    if egress not in AWS_EGRESS:
        problems.append(("network.egress", _choice_message("egress", egress, AWS_EGRESS)))
    if egress == "nat":
        if not net.nat_subnet:
            problems.append(("network.natSubnet", "required with egress 'nat' (a public subnet of the same VPC)"))
        if not net.subnets:
            problems.append(("network.subnets", "egress 'nat' needs private subnets of your own (the default VPC's are public)"))
        if net.nat_subnet and net.nat_subnet in net.subnets.values():
            problems.append(("network.natSubnet", "must be a public subnet other than the VMs' subnets"))
    elif net.nat_subnet:
        problems.append(("network.natSubnet", f"only used with egress 'nat' (egress is {egress!r})"))
    if net.s3_endpoint is not None:
        if net.s3_endpoint not in AWS_S3_ENDPOINT:
            problems.append(("network.s3Endpoint", _choice_message("s3Endpoint", net.s3_endpoint, AWS_S3_ENDPOINT)))
        elif egress in ("nat", "existing"):
            why = ("declares no S3 endpoint" if egress == "existing" else
                   "puts its S3 endpoint on the stack's own new route table, which no other endpoint is on")
            problems.append(("network.s3Endpoint", f"only used with egress 's3-endpoint' or 'public-ip' "
                             f"(egress {egress!r} {why})"))


def provider_conflicts(config: Mapping[str, Any], cfg: StackConfig, source: str) -> None:
    """Refuse provider settings that contradict ``spotctl:`` keys (spotctl configures the provider
    itself from ``spotctl:region``).

    Raises:
        ConfigError: naming both keys.
    """
    if cfg.cloud == "aws":
        region = config.get("aws:region")
        if isinstance(region, str) and region and region != cfg.region:
            raise ConfigError(source, [f"aws:region: {region!r} conflicts with {NAMESPACE}:region {cfg.region!r} "
                                       f"(spotctl uses {NAMESPACE}:region for every AWS resource; remove aws:region or make them equal)"])


def _per_cloud(problems, path, gcp, gcp_value, gcp_key, aws_value, aws_key) -> None:
    want, want_value, other, other_value = (
        (gcp_key, gcp_value, aws_key, aws_value) if gcp else (aws_key, aws_value, gcp_key, gcp_value)
    )
    cloud = "GCP" if gcp else "AWS"
    if other_value is not None:
        problems.append((f"{path}.{other}", f"not used on {cloud}; use {want}"))
    elif want_value is None:
        problems.append((f"{path}.{want}", f"required on {cloud}"))


def _choice_message(what: str, got: object, choices: Sequence[str]) -> str:
    msg = f"expected one of {', '.join(repr(c) for c in choices)}, got {got!r}"
    close = difflib.get_close_matches(str(got), [str(c) for c in choices], n=1, cutoff=0.6)
    if close:
        msg += f" (did you mean {close[0]!r}?)"
    return msg


# --- reading ---------------------------------------------------------------------------------


def _path(loc: Sequence[str | int]) -> str:
    """('jobs', 2, 'capacity') -> 'spotctl:jobs[2].capacity'."""
    out = NAMESPACE + ":"
    first = True
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += part if first else f".{part}"
        first = False
    return out


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that owns the last key of ``loc`` (to suggest its real keys)."""
    model: Any = StackConfig
    map_key = False  # the part after a mapping field (spotctl:prices.<type>) is a user's key
    for part in loc[:-1]:
        if isinstance(part, int) or map_key:
            map_key = False
            continue
        field = model.model_fields.get(_snake(part))
        if field is None:
            return None
        map_key = getattr(field.annotation, "__origin__", None) is dict
        model = _inner_model(field.annotation)
        if model is None:
            return None
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _keys_of(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}


def _describe(err: Mapping[str, Any]) -> tuple[str, str]:
    """Turn one pydantic error into (key path, message)."""
    loc = [p for p in err["loc"]]
    kind = err["type"]
    value = err.get("input")
    if kind == "value_error" and isinstance(err.get("ctx", {}).get("error"), _CrossErrors):
        raise AssertionError("cross errors are expanded by the caller")
    if kind == "extra_forbidden":
        model = _model_at(loc)
        key = str(loc[-1])
        msg = "unknown key"
        if model is not None:
            close = difflib.get_close_matches(key, _keys_of(model), n=1, cutoff=0.6)
            msg += f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(_keys_of(model))}"
        return _path(loc), msg
    if kind == "missing":
        return _path(loc), "required key is missing"
    if kind in ("literal_error", "enum"):
        choices = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        return _path(loc), _choice_message(str(loc[-1]), value, choices)
    if kind in _TYPE_WORDS:
        return _path(loc), f"expected {_TYPE_WORDS[kind]}, got {_show(value)}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        ctx = err.get("ctx", {})
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return _path(loc), f"expected a number {op} {bound}, got {_show(value)}"
    if kind in ("too_short", "string_too_short"):
        return _path(loc), "must not be empty"
    if kind == "string_too_long":
        return _path(loc), f"is {len(value)} characters long; at most {err['ctx']['max_length']}"
    if kind == "finite_number":
        return _path(loc), f"expected a finite number, got {_show(value)}"
    if kind == "string_pattern_mismatch":
        what = {"region": "a region name such as 'us-central1' or 'us-east-1'"}.get(
            str(loc[-1]), "a zone name such as 'us-central1-a' or 'us-east-1a'" if "zone" in str(loc[-2:]) else
            "printable text (no control characters)")
        return _path(loc), f"expected {what}, got {_show(value)}"
    if kind == "value_error":
        return _path(loc), str(err["ctx"]["error"])
    return _path(loc), f"{err['msg']}, got {_show(value)}"


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def validate(raw: Mapping[str, Any], source: str) -> StackConfig:
    """Validate the ``spotctl:`` part of a stack's config.

    Args:
        raw: config keys without the namespace (``{"cloud": "gcp", "jobs": [...]}``).
        source: what to name in errors (the stack file path).

    Raises:
        ConfigError: naming every problem found, each with its key path.
    """
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        problems: list[str] = []
        for err in exc.errors(include_url=False):
            cross = err.get("ctx", {}).get("error")
            if isinstance(cross, _CrossErrors):
                problems += [f"{_path(_split(k))}: {m}" for k, m in cross.problems]
                continue
            key, msg = _describe(err)
            problems.append(f"{key}: {msg}")
        raise ConfigError(source, problems) from None


def _split(key: str) -> list[str | int]:
    out: list[str | int] = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        out.append(int(part[1:-1]) if part.startswith("[") else part)
    return out


def namespaced(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Pick the ``spotctl:`` keys of a Pulumi config map, decoding JSON-string values.

    Pulumi hands config to programs as strings (JSON for lists and maps); a stack file read
    with YAML already has typed values. Both arrive here.
    """
    raw: dict[str, Any] = {}
    for key, value in config.items():
        ns, sep, name = str(key).partition(":")
        if ns != NAMESPACE or not sep:
            continue
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            raise ConfigError(source, [f"{key}: spotctl settings cannot be secrets (nothing here is secret)"])
        if isinstance(value, str):
            # The engine passes every top-level value as a string ("30", "true", '["a"]').
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        raw[name] = value
    return raw

