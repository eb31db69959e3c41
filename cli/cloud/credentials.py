"""Whether a cloud's credentials can be found without asking a metadata server (pure but for reading
the environment and a few local files).

boto3 and google-auth end their credential chains at the instance metadata server (169.254.169.254):
off the cloud, on a network that drops that address, each command then waits seconds for nothing. So
before any cloud call, ``Cloud`` asks :func:`missing` and, when nothing is configured and this machine
is not a VM of that cloud, fails fast with one clear CloudError (the callers' usual "unreachable: one
warning" path) instead of letting the SDK probe.

AWS, boto3's chain (https://docs.aws.amazon.com/boto3/latest/guide/credentials.html: parameters,
environment variables, assume role, assume role with web identity, IAM Identity Center, the shared
credential file, the AWS config file, boto2 config, container provider, instance metadata service):
everything before the last one is a variable or a file this checks; the IMDS is asked (by boto3, whose
``metadata_service_timeout`` default is 1 s, one attempt) only on EC2, recognised from DMI as AWS
documents it (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/identify_ec2_instances.html:
``/sys/devices/virtual/dmi/id/board_asset_tag`` is the instance id ``i-...``; ``product_uuid`` /
``sys_vendor`` on older Xen instances).

GCP, ``google.auth.default`` (https://googleapis.dev/python/google-auth/latest/reference/google.auth.html:
GOOGLE_APPLICATION_CREDENTIALS, the Cloud SDK's application default credentials, App Engine, then the
Compute Engine metadata server): the metadata server only on GCE, whose DMI ``product_name`` is
"Google Compute Engine" (google-auth's own residency check, ``_metadata.detect_gce_residency_linux``).

A local endpoint (AWS_ENDPOINT_URL, SPOTCTL_GCS_ENDPOINT, ...: moto, the emulators) never needs the
metadata server either: the checks are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DMI = Path("/sys/devices/virtual/dmi/id")
AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
           "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ENDPOINT_URL")
GCP_ENV = ("GOOGLE_APPLICATION_CREDENTIALS", "SPOTCTL_GCS_ENDPOINT", "SPOTCTL_GCE_ENDPOINT", "SPOTCTL_BILLING_ENDPOINT",
           "SPOTCTL_MONITORING_ENDPOINT", "PUBSUB_EMULATOR_HOST", "GCE_METADATA_HOST")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def on_ec2(dmi: Path = DMI) -> bool:
    tag, uuid, vendor = _read(dmi / "board_asset_tag"), _read(dmi / "product_uuid").lower(), _read(dmi / "sys_vendor")
    return tag.startswith("i-") or uuid.startswith("ec2") or vendor == "Amazon EC2"


def on_gce(dmi: Path = DMI) -> bool:
    return _read(dmi / "product_name") == "Google Compute Engine"


def missing(cloud: str, env: Mapping[str, str] | None = None, home: Path | None = None, dmi: Path | None = None) -> str | None:
    """None when ``cloud``'s SDK may find credentials without a wasted metadata probe; else one line
    saying where none was found."""
    dmi = DMI if dmi is None else dmi
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    if cloud == "aws":
        if any(env.get(k) for k in AWS_ENV):
            return None
        files = [Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"),
                 Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")]
        imds = env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true" and on_ec2(dmi)  # botocore's switch
        if any(p.is_file() for p in files) or imds:
            return None
        return ("no AWS credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ~/.aws/credentials or config, web identity, "
                "container credentials), and this is not an EC2 instance: not asking the instance metadata service")
    if any(env.get(k) for k in GCP_ENV):
        return None
    config = Path(env.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
    if (config / "application_default_credentials.json").is_file() or on_gce(dmi):
        return None
    return ("no GCP credentials (GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`), and this "
            "is not a Compute Engine VM: not asking the metadata server")
