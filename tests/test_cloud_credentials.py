"""No metadata-server probe off the cloud (cli/cloud/credentials.py): with no credentials configured and
a machine that is not a VM of the stack's cloud, a command fails its cloud calls fast with one warning
and never opens a socket to 169.254.169.254; the sources boto3 / google-auth would use are each enough."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cli.cloud import credentials
from tests import test_sync
from tests.test_sync import cli

bucket, machines = test_sync.bucket, test_sync.machines  # two checkouts sharing moto S3


def dmi(tmp_path: Path, **files: str) -> Path:
    d = tmp_path / "dmi"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")
    return d


@pytest.mark.parametrize("env", [{"AWS_ACCESS_KEY_ID": "AKIA"}, {"AWS_PROFILE": "team"}, {"AWS_WEB_IDENTITY_TOKEN_FILE": "/t"},
                                 {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/c"}, {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}])
def test_aws_credentials_from_the_environment(tmp_path, env):
    assert credentials.missing("aws", env, tmp_path, dmi(tmp_path)) is None


def test_aws_files_and_ec2_count_and_nothing_else(tmp_path):
    home = tmp_path / "home"
    assert "no AWS credentials" in credentials.missing("aws", {}, home, dmi(tmp_path, sys_vendor="QEMU"))
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
    assert credentials.missing("aws", {}, home, dmi(tmp_path)) is None
    other = tmp_path / "creds"
    other.write_text("[default]\n")
    assert credentials.missing("aws", {"AWS_SHARED_CREDENTIALS_FILE": str(other)}, tmp_path / "nohome", dmi(tmp_path)) is None
    for board in ({"board_asset_tag": "i-0123456789abcdef0"}, {"product_uuid": "EC2E1916-9099-7CAF-FD21-012345ABCDEF"},
                  {"sys_vendor": "Amazon EC2"}):
        assert credentials.missing("aws", {}, tmp_path / "nohome", dmi(tmp_path / next(iter(board)), **board)) is None


def test_gcp_credentials_adc_file_and_gce(tmp_path):
    home = tmp_path / "home"
    assert "no GCP credentials" in credentials.missing("gcp", {}, home, dmi(tmp_path, product_name="Standard PC"))
    assert credentials.missing("gcp", {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}, home, dmi(tmp_path)) is None
    assert credentials.missing("gcp", {"SPOTCTL_GCS_ENDPOINT": "http://127.0.0.1:1"}, home, dmi(tmp_path)) is None
    adc = home / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text("{}")
    assert credentials.missing("gcp", {}, home, dmi(tmp_path)) is None
    assert credentials.missing("gcp", {}, tmp_path / "nohome", dmi(tmp_path / "g", product_name="Google Compute Engine")) is None


@pytest.fixture
def metadata_guard(monkeypatch):
    """Every connection attempt to the metadata address, refused and recorded (nothing may try)."""
    tried: list = []
    real_connect, real_create = socket.socket.connect, socket.create_connection

    def connect(self, address):
        if isinstance(address, tuple) and address[0] == "169.254.169.254":
            tried.append(address)
            raise OSError("metadata server blocked by the test")
        return real_connect(self, address)

    def create_connection(address, *a, **k):
        if address[0] == "169.254.169.254":
            tried.append(address)
            raise OSError("metadata server blocked by the test")
        return real_create(address, *a, **k)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return tried


def test_a_shared_stack_without_credentials_off_ec2_never_probes_the_metadata_server(machines, runner, tmp_path,
                                                                                     monkeypatch, metadata_guard):
    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0  # shared: every command pulls first
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setattr(credentials, "DMI", dmi(tmp_path, sys_vendor="LENOVO", product_name="ThinkPad"))
    import boto3

    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a fresh process: no credentials resolved before
    r = cli(runner, "status")
    assert r.exit_code == 0, r.output
    assert metadata_guard == []
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:") and "no events source" not in line]
    assert len(warnings) == 1 and "no AWS credentials" in warnings[0], r.stderr


def test_imds_disabled_by_the_user_is_not_a_source_even_on_ec2(tmp_path):
    ec2 = dmi(tmp_path, sys_vendor="Amazon EC2")
    assert credentials.missing("aws", {}, tmp_path / "nohome", ec2) is None
    assert "no AWS credentials" in credentials.missing("aws", {"AWS_EC2_METADATA_DISABLED": "true"}, tmp_path / "nohome", ec2)
