"""The stack-wide sections besides pools and jobs: prices, the network and its egress, the watcher."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
)

from infra.config.base import ZONE_RE, NonEmpty, _Model, _show

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
