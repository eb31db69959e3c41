"""tools/refresh_catalog.py against moto's EC2 (the real DescribeInstanceTypes/-Offerings answers it
recorded) and a local stand-in for the Compute Engine API; one error line for what cannot be read."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from infra import catalog
from tools import refresh_catalog


def test_aws_from_ec2_in_moto_gives_the_shipped_entries(moto_server, tmp_path, capsys):
    out = tmp_path / "catalog.json"
    assert refresh_catalog.main(["--aws", "--regions", "us-east-1", "eu-west-1", "eu-west-2", "--out", str(out)]) == 0
    built = json.loads(out.read_text())["aws"]
    shipped = catalog.load()["aws"]
    assert built["types"] == shipped["types"] and len(built["types"]) > 1000
    assert set(built["gpu"]) == set(shipped["gpu"])
    for name in ("g5.2xlarge", "p5.48xlarge", "p4d.24xlarge"):
        for region in ("us-east-1", "eu-west-1", "eu-west-2"):
            assert built["gpu"][name]["regions"].get(region) == shipped["gpu"][name]["regions"].get(region)
        assert built["gpu"][name]["gpu"] == shipped["gpu"][name]["gpu"]
    assert built["gpu"]["p5.48xlarge"]["gpu"] == {"name": "H100", "maker": "NVIDIA", "count": 8, "memoryGiB": 80.0}
    assert built["regions"]["eu-west-1"]["zones"] == ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
    # names kept where they are the same place in every account (eu-west-2), not where they are not (us-east-1)
    assert built["gpu"]["g5.2xlarge"]["regions"]["eu-west-2"]["zones"] == ["eu-west-2a", "eu-west-2b"]
    assert built["gpu"]["g5.2xlarge"]["regions"]["us-east-1"]["zones"] == "unknown"
    assert "aws: 65 GPU machine types" in capsys.readouterr().out


def test_aws_unreachable_is_one_error_line(tmp_path, monkeypatch, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                 "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "catalog.json"
    assert refresh_catalog.main(["--aws", "--regions", "us-east-1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: AWS EC2: Could not connect to the endpoint URL") and err.count("\n") == 1
    assert not out.exists()


class FakeCompute:
    """machineTypes and acceleratorTypes aggregatedList, as the Compute Engine REST API answers them."""

    def __init__(self, machines: dict[str, list[dict]], accelerators: dict[str, list[dict]]):
        fake = self
        self.seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                fake.seen.append(self.path)
                path = self.path.split("?")[0]
                if path == "/compute/v1/projects/p1/aggregated/machineTypes":
                    doc = {"items": {f"zones/{z}": {"machineTypes": ms} for z, ms in machines.items()}}
                elif path == "/compute/v1/projects/p1/aggregated/acceleratorTypes":
                    doc = {"items": {f"zones/{z}": {"acceleratorTypes": a} for z, a in accelerators.items()}}
                else:
                    doc = {"error": {"code": 404, "message": f"project not found: {path}"}}
                body = json.dumps(doc).encode()
                self.send_response(404 if "error" in doc else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def compute():
    mt = lambda name, cpus, mem_mb, **kw: {"name": name, "guestCpus": cpus, "memoryMb": mem_mb, **kw}  # noqa: E731
    fake = FakeCompute(
        {"us-central1-a": [mt("a2-highgpu-1g", 12, 87040), mt("n1-standard-8", 8, 30720)],
         "us-central1-b": [mt("a2-highgpu-1g", 12, 87040), mt("n1-standard-8", 8, 30720),
                           mt("n1-old-1", 1, 1024, deprecated={"state": "DEPRECATED"})],
         "europe-west4-a": [mt("n1-standard-8", 8, 30720)]},
        {"us-central1-a": [{"name": "nvidia-tesla-t4"}, {"name": "nvidia-tesla-a100"}], "europe-west4-a": [{"name": "nvidia-tesla-t4"}]})
    yield fake
    fake.stop()


def test_gcp_from_the_compute_api_is_per_zone(compute, tmp_path):
    out = tmp_path / "catalog.json"
    assert refresh_catalog.main(["--gcp-project", "p1", "--gcp-endpoint", compute.url, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    gcp = doc["gcp"]
    assert gcp["types"] == ["a2-highgpu-1g", "n1-standard-8"]  # the deprecated type left out
    assert gcp["gpu"]["a2-highgpu-1g"] == {
        "vcpus": 12, "memoryGB": 85.0, "gpu": {"type": "nvidia-tesla-a100", "count": 1, "memoryGB": 40},
        "regions": {"us-central1": {"zones": ["us-central1-a", "us-central1-b"]}}}
    assert gcp["attachable"]["nvidia-tesla-t4"]["regions"] == {"us-central1": {"zones": ["us-central1-a"]},
                                                              "europe-west4": {"zones": ["europe-west4-a"]}}
    assert gcp["n1Regions"] == ["europe-west4", "us-central1"]
    assert "machineTypes.aggregatedList" in doc["sources"]["gcp"]["source"]


def test_gcp_bad_project_and_unreachable_endpoint_are_one_error_line(compute, tmp_path, capsys):
    out = tmp_path / "catalog.json"
    assert refresh_catalog.main(["--gcp-project", "nope", "--gcp-endpoint", compute.url, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: GCP Compute Engine API: ") and "project not found" in err and err.count("\n") == 1
    compute.stop()
    assert refresh_catalog.main(["--gcp-project", "p1", "--gcp-endpoint", compute.url, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: GCP Compute Engine API at {compute.url}: ") and err.count("\n") == 1
    assert not out.exists()


def test_gcp_from_the_published_export(tmp_path):
    (tmp_path / "machinetyperegion.csv").write_text(
        "NAME;CPUS;SHARED_CPU;MEMORY_GB;DEPRECATED;ZONE\na3-highgpu-8g;208;False;1872.00;;us-central1\n"
        "n1-standard-8;8;False;30.00;;us-central1\n")
    (tmp_path / "acceleratortyperegion.csv").write_text("NAME;ZONE\nnvidia-tesla-v100;us-central1\nct5lp;us-central1\n")
    out = tmp_path / "catalog.json"
    assert refresh_catalog.main(["--gcp-csv", str(tmp_path), "--gcp-commit", "abc123", "--date", "2026-08-17", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["gcp"]["gpu"]["a3-highgpu-8g"]["regions"] == {"us-central1": {"zones": "unknown"}}
    assert doc["gcp"]["gpu"]["a3-highgpu-8g"]["gpu"] == {"type": "nvidia-h100-80gb", "count": 8, "memoryGB": 80}
    assert list(doc["gcp"]["attachable"]) == ["nvidia-tesla-v100"]
    assert doc["sources"]["gcp"]["date"] == "2026-08-17" and "@abc123" in doc["sources"]["gcp"]["source"]


@pytest.mark.parametrize("content,message", [
    (None, "machinetyperegion.csv: cannot read: No such file or directory"),
    ("name,zone\nx,y\n", "machinetyperegion.csv: not a gcloud export"),
])
def test_a_bad_export_is_one_error_line(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "machinetyperegion.csv").write_text(content)
    assert refresh_catalog.main(["--gcp-csv", str(tmp_path), "--out", str(tmp_path / "c.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_the_shipped_catalog_is_what_the_tool_writes(tmp_path):
    # sorted keys, one-space indent: a rebuild's diff shows only what changed
    text = catalog.PATH.read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    assert Path(refresh_catalog.CATALOG) == catalog.PATH
