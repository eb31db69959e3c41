"""The one helper that renders ``templates/`` into the scripts VMs run (both clouds, jobs and pools).

Every user value reaches a script through the ``q`` filter (``shlex.quote``); templates are
rendered with ``StrictUndefined`` so a missing variable is an error, never an empty string.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import urllib.parse
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from typing import Literal

import jinja2

from agent import schema
from infra.agent_artifact import artifact
from infra.basics import scripts_digest, templates_dir  # noqa: F401 - re-exported: the scripts' home and digest

GCP_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
AWS_METADATA_URL = "http://169.254.169.254"
GCS_URL = "https://storage.googleapis.com"
SECRET_MANAGER_URL = "https://secretmanager.googleapis.com"
MOUNT_POINT = "/mnt/spotctl"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
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
    # the trainer exits, so a preemption's work lost stays exact; see agent/trainer.py Pump).
    checkpoint_event_s: int = 60
    # Seconds the trainer gets after SIGTERM; None = the cloud's default (fits its notice).
    stop_budget_s: int | None = None
    systemd_dir: str = "/etc/systemd/system"
    fstab: str = "/etc/fstab"
    state_dir: str = "/var/lib/spotctl"
    # Where the job's code comes from (filled by the CLI at launch): an archive ``s3://B/K`` or
    # ``gs://B/K`` (.tar.gz) with its sha256, or a git URL at a commit (a private repo's token in the
    # secure env value named ``code_git_token_env``); ``setup`` runs once per disk and code,
    # ``workdir`` is relative to the unpacked code, ``container`` an image to run both in.
    code_uri: str = ""
    code_sha256: str = ""
    code_git_url: str = ""
    code_git_commit: str = ""
    code_git_token_env: str = ""
    setup: str = ""
    workdir: str = ""
    container: str = ""

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
        if self.code_uri and not (re.match(r"^(s3|gs)://[^/]+/.+", self.code_uri) and _SHA256.match(self.code_sha256)):
            raise ValueError(f"code_uri {self.code_uri!r} must be s3://BUCKET/KEY or gs://BUCKET/KEY with a sha256")
        if self.code_git_url and not self.code_git_commit:
            raise ValueError("code_git_url needs code_git_commit")
        if self.code_git_token_env and not _ENV_KEY.match(self.code_git_token_env):
            raise ValueError(f"code_git_token_env {self.code_git_token_env!r} is not an environment variable name")
        if self.workdir.startswith("/") or ".." in self.workdir.split("/"):
            raise ValueError(f"workdir {self.workdir!r} must be relative to the code, without '..'")

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
        # AWS attaches the volume only once the instance exists (a VolumeAttachment after the
        # instance, infra/aws.py) and runs user data once: wait up to 10 minutes. GCE attaches it
        # with the instance.
        v["disk_wait_s"] = 600 if self.cloud == "aws" else 120
        return v

    def agent_config(self) -> dict[str, object]:
        """What the VM agent reads (agent/config.py ``Config``): the settings, nothing derived twice."""
        v = self.variables()
        keys = {f.name for f in fields(self)} | {"disk_wait_s", "notice_s", "unit"}
        doc = {k: v[k] for k in sorted(keys)}
        doc["secret_keys"], doc["disk_aliases"] = list(self.secret_keys), list(self.disk_aliases)
        return doc


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


event_object_prefix = schema.event_object_prefix


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


def bootstrap_variables(ctx: ScriptContext) -> dict[str, object]:
    """The bootstrap's values: the agent's digest and where to fetch it, and the agent's config."""
    v = ctx.variables()
    agent = artifact()
    if ctx.cloud == "gcp":
        path = f"/storage/v1/b/{urllib.parse.quote(ctx.event_bucket, safe='')}/o/{urllib.parse.quote(agent.object_name, safe='')}?alt=media"
    else:
        path = f"/{urllib.parse.quote(ctx.event_bucket, safe='')}/{agent.object_name}"
    v.update(agent_sha256=agent.sha256, agent_url_path=path,
             config_json=json.dumps(ctx.agent_config(), sort_keys=True, ensure_ascii=False, separators=(",", ":")))
    return v


def bootstrap_config(script: str) -> dict[str, object]:
    """The agent's config a rendered bootstrap carries (tests, and a person reading user data)."""
    for line in script.splitlines():
        if line.startswith("SPOTCTL_CONFIG_JSON="):
            return json.loads(shlex.split(line.partition("=")[2])[0])
    raise ValueError("not a spotctl bootstrap: no SPOTCTL_CONFIG_JSON line")


def scripts_for(ctx: ScriptContext) -> Scripts:
    """The bootstrap(s) of one VM: GCE startup and shutdown metadata, or EC2 user data."""
    variables = bootstrap_variables(ctx)
    if ctx.cloud == "gcp":
        return Scripts(render("gcp/startup.sh.j2", ctx, variables), render("gcp/shutdown.sh.j2", ctx, variables))
    return Scripts(render("aws/user-data.sh.j2", ctx, variables))


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
