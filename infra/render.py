"""The one helper that renders ``templates/`` into the scripts VMs run (both clouds, jobs and pools).

Every user value reaches a script through the ``q`` filter (``shlex.quote``); templates are
rendered with ``StrictUndefined`` so a missing variable is an error, never an empty string.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from typing import Literal

import jinja2

from infra.basics import scripts_digest, templates_dir  # noqa: F401 - re-exported: the scripts' home and digest

GCP_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
AWS_METADATA_URL = "http://169.254.169.254"
GCS_URL = "https://storage.googleapis.com"
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com"
MOUNT_POINT = "/mnt/spotctl"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE_PATH = re.compile(r"^/[A-Za-z0-9/_.-]+$")  # an absolute path, one shell word
DEVICE_NAME = "spotctl-data"  # GCE device name of the job disk -> /dev/disk/by-id/google-spotctl-data

# Seconds the cloud gives between the preemption signal and power-off, and what we use of it.
NOTICE_S = {"gcp": 30, "aws": 120}
TRAINER_STOP_BUDGET_S = {"gcp": 20, "aws": 100}


@dataclass(frozen=True)
class ScriptContext:
    """What the scripts of one VM need to know. Field names are the templates' variable names."""

    cloud: Literal["gcp", "aws"]
    stack: str
    kind: Literal["job", "pool"]
    name: str
    command: str
    event_bucket: str
    region: str
    attempt: int = 1
    node_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    env: dict[str, str] = field(default_factory=dict)
    # Secret env values (README "Secrets in env"): only their names and where they are kept travel in
    # the script, never a value. ``secret_ref``: the SSM parameter name (AWS) or the Secret Manager
    # secret ``projects/P/secrets/S`` (GCP) holding ``secret_payload`` of them; "" when none.
    secret_keys: tuple[str, ...] = ()
    secret_ref: str = ""
    secrets_url: str = ""  # the SSM / Secret Manager endpoint (tests and drills: the emulator)
    # The attempt's capacity ("spot"/"on-demand"; "" for pools, whose parts mix) and machine or
    # instance type: recorded in the `started` event so cost reports price each attempt as it ran.
    capacity: str = ""
    machine_type: str = ""
    disk_device: str = ""
    # Other names the job disk may appear under, tried with ``disk_device`` (AWS: see infra/aws.py
    # DATA_DEVICE_NAMES); device paths, space-free.
    disk_aliases: tuple[str, ...] = ()
    mount_point: str = MOUNT_POINT
    cwd: str = ""  # where the command runs; "" = the job disk (drills run it where the user is)
    metadata_url: str = ""
    storage_url: str = ""
    autoscaling_url: str = ""  # AWS pools: the Auto Scaling Query API (tests: the emulator)
    event_prefix: str = ""
    poll_interval_s: int = 5
    # At most one `checkpoint` event per this many seconds (the newest skipped one is recorded when
    # the trainer exits, so a preemption's work lost stays exact; see templates/common/lib.sh.j2).
    checkpoint_event_s: int = 60
    # Seconds the trainer gets after SIGTERM; None = the cloud's default (fits its notice).
    stop_budget_s: int | None = None
    systemd_dir: str = "/etc/systemd/system"
    fstab: str = "/etc/fstab"
    state_dir: str = "/var/lib/spotctl"

    def __post_init__(self) -> None:
        # Values rendered without the quote filter must be what they claim to be.
        if self.cloud not in ("gcp", "aws") or self.kind not in ("job", "pool"):
            raise ValueError(f"bad cloud/kind: {self.cloud!r}/{self.kind!r}")
        for name in ("attempt", "node_rank", "world_size", "master_port", "poll_interval_s", "checkpoint_event_s"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.stop_budget_s is not None and (type(self.stop_budget_s) is not int or self.stop_budget_s < 0):
            raise ValueError(f"stop_budget_s must be a non-negative int, got {self.stop_budget_s!r}")
        for key in (*self.env, *self.secret_keys):
            if not _ENV_KEY.match(key):
                raise ValueError(f"env key {key!r} is not a valid environment variable name")
        for alias in self.disk_aliases:
            if not _DEVICE_PATH.match(alias):
                raise ValueError(f"disk alias {alias!r} is not an absolute device path without spaces")
        if bool(self.secret_keys) != bool(self.secret_ref):
            raise ValueError("secret_keys and secret_ref go together")

    def variables(self) -> dict[str, object]:
        # Shallow (the templates only read; ``env`` copied): ``asdict`` deep-copied every field of
        # every VM's context, twice per GCP VM (bench/plan_scale.py).
        v: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        v["env"] = dict(self.env)
        v["metadata_url"] = self.metadata_url or (GCP_METADATA_URL if self.cloud == "gcp" else AWS_METADATA_URL)
        v["storage_url"] = self.storage_url or (
            GCS_URL if self.cloud == "gcp" else f"https://s3.{self.region}.amazonaws.com"
        )
        v["secrets_url"] = self.secrets_url or (
            SECRET_MANAGER_URL if self.cloud == "gcp" else f"https://ssm.{self.region}.amazonaws.com"
        )
        v["secret_keys"] = " ".join(self.secret_keys)
        v["disk_aliases"] = " ".join(self.disk_aliases)
        v["autoscaling_url"] = self.autoscaling_url or f"https://autoscaling.{self.region}.amazonaws.com"
        v["event_prefix"] = self.event_prefix or f"{self.stack}/"
        v["notice_s"] = NOTICE_S[self.cloud]
        v["stop_budget_s"] = self.stop_budget_s if self.stop_budget_s is not None else TRAINER_STOP_BUDGET_S[self.cloud]
        v["unit"] = f"spotctl-{self.kind}"
        return v


def secret_payload(values: Mapping[str, str]) -> str:
    """What a job's secret holds: ``KEY=<base64url of the value>`` per key, sorted, one space apart.

    Only characters JSON never escapes, so the scripts read it out of the SSM / Secret Manager
    answer with sed and decode each value with ``base64 -d``; no value ever meets a shell parser."""
    for key in values:
        if not _ENV_KEY.match(key):
            raise ValueError(f"env key {key!r} is not a valid environment variable name")
    return " ".join(f"{k}={base64.urlsafe_b64encode(v.encode()).decode()}" for k, v in sorted(values.items()))


def read_secret_payload(payload: str) -> dict[str, str]:
    """The inverse of :func:`secret_payload` (tests, the emulator)."""
    out = {}
    for item in payload.split():
        key, _, b64 = item.partition("=")
        out[key] = base64.urlsafe_b64decode(b64.encode()).decode()
    return out


def event_object_prefix(stack: str, name: str) -> str:
    """Where the scripts of job or pool ``name`` write event objects (``spotctl_record`` in
    templates/common/lib.sh.j2: ``<event_prefix><name>/attempt-N/...`` with the default prefix)."""
    return f"{stack}/{name}/"


def _quote(value: object) -> str:
    if value is None or isinstance(value, jinja2.Undefined):
        raise jinja2.UndefinedError("refusing to shell-quote an undefined value")
    return shlex.quote(str(value))


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # Bash uses "{#" (${#var}); Jinja comments are "{## ... ##}" here.
        comment_start_string="{##",
        comment_end_string="##}",
        # Templates ship with the code: compiled once per process, never stat()ed again per render.
        auto_reload=False,
    )
    env.filters["q"] = _quote
    return env


def render(template: str, ctx: ScriptContext, variables: Mapping[str, object] | None = None) -> str:
    """Render one template (e.g. ``gcp/startup.sh.j2``) for ``ctx`` (``variables``: its
    ``ctx.variables()`` when the caller already has them)."""
    return environment().get_template(template).render(**(variables if variables is not None else ctx.variables()))


@dataclass(frozen=True)
class Scripts:
    """The rendered scripts of one VM: GCP uses both keys of metadata; AWS only ``user_data``."""

    startup: str
    shutdown: str = ""

    @property
    def user_data(self) -> str:
        return self.startup


def scripts_for(ctx: ScriptContext) -> Scripts:
    if ctx.cloud == "gcp":
        variables = ctx.variables()
        return Scripts(render("gcp/startup.sh.j2", ctx, variables), render("gcp/shutdown.sh.j2", ctx, variables))
    return Scripts(render("aws/user-data.sh.j2", ctx))


# Where the watcher VM gets its tools (templates/watcher/startup.sh.j2): the GitHub release archives
# of the Pulumi CLI (pulumi-v<V>-linux-x64.tar.gz: pulumi/, with the language hosts next to the CLI)
# and of uv (uv-x86_64-unknown-linux-gnu/uv, https://github.com/astral-sh/uv/releases).
PULUMI_RELEASE_URL = "https://github.com/pulumi/pulumi/releases/download/v{v}/pulumi-v{v}-linux-x64.tar.gz"
UV_RELEASE_URL = "https://github.com/astral-sh/uv/releases/download/{v}/uv-x86_64-unknown-linux-gnu.tar.gz"


@dataclass(frozen=True)
class WatcherContext:
    """What the watcher VM's startup script needs (``spotctl:watcher``, validated by infra/config/).
    The paths are the shipped unit's (examples/spotctl-watch@.service); tests move them."""

    cloud: Literal["gcp", "aws"]
    stack: str
    region: str
    repo: str
    ref: str
    backend: str
    secrets_provider: str
    passphrase_secret: str
    project: str = ""
    pulumi_version: str = "0.0.0"
    uv_version: str = "0.0.0"
    pulumi_url: str = ""
    uv_url: str = ""
    metadata_url: str = ""
    secrets_url: str = SECRET_MANAGER_URL
    project_dir: str = "/opt/spotctl"
    pulumi_root: str = "/opt/pulumi"
    bin_dir: str = "/usr/local/bin"
    etc_dir: str = "/etc/spotctl"
    systemd_dir: str = "/etc/systemd/system"
    user: str = "spotctl"
    home: str = "/home/spotctl"

    def variables(self) -> dict[str, object]:
        v = asdict(self)
        v["pulumi_url"] = self.pulumi_url or PULUMI_RELEASE_URL.format(v=self.pulumi_version)
        v["uv_url"] = self.uv_url or UV_RELEASE_URL.format(v=self.uv_version)
        v["metadata_url"] = self.metadata_url or (GCP_METADATA_URL if self.cloud == "gcp" else AWS_METADATA_URL)
        return v


def watcher_script(ctx: WatcherContext) -> str:
    """The watcher VM's startup script (GCP ``startup-script`` metadata; AWS user data)."""
    return environment().get_template("watcher/startup.sh.j2").render(**ctx.variables())
