"""`spotctl check`: one line per thing applying needs, exit 1 when a needed one is missing, never a
traceback (nothing configured at all included); and `uv tool install .` puts a working spotctl on PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from cli.app import app
from cli.lifecycle import readiness

ROOT = Path(__file__).resolve().parent.parent


def lines(output: str) -> dict[str, str]:
    """what -> its line (the wrapped rest joined)."""
    out: dict[str, str] = {}
    last = ""
    for line in output.splitlines():
        if line.startswith(" "):
            out[last] += " " + line.strip()
            continue
        mark, rest = line.split(None, 1)
        last = next(w for w in ("pulumi CLI", "backend login", "stack", "gcp credentials", "aws credentials", "event bucket")
                    if rest.startswith(w))
        out[last] = f"{mark} {rest[len(last):].strip()}"
    return out


def test_nothing_configured_is_one_line_each_and_exit_1(project, runner, no_credentials, monkeypatch, tmp_path):
    monkeypatch.delenv("SPOTCTL_PULUMI_ROOT", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.delenv("PULUMI_ACCESS_TOKEN", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no Pulumi.yaml here nor above
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # typer.Exit(1), not a crash
    found = lines(result.output)
    assert list(found) == ["pulumi CLI", "backend login", "stack", "gcp credentials", "aws credentials", "event bucket"]
    assert found["pulumi CLI"].startswith("missing no `pulumi` on PATH")
    assert found["backend login"].startswith("missing not logged in: `pulumi login`")
    assert found["stack"].startswith("missing spotctl: no stack: give --stack NAME")
    assert found["gcp credentials"].startswith("missing no GCP credentials")
    assert found["event bucket"].startswith("- not known")
    assert "Traceback" not in result.output


def test_a_ready_machine_exits_0(project, runner, fake_pulumi, monkeypatch):
    (project / "pulumi-home").mkdir(exist_ok=True)
    (project / "pulumi-home" / "credentials.json").write_text(json.dumps({"current": "file://~", "accessTokens": {}}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/dev/null")
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", json.dumps({"eventBucket": "example-gcp-events"}))
    result = runner.invoke(app, ["check", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    found = lines(result.output)
    assert found["pulumi CLI"].startswith("ok v3.272.0 at ")
    assert found["backend login"].startswith("ok file://~ (")
    assert found["stack"] == "ok example-gcp (gcp): stacks/Pulumi.example-gcp.yaml"
    assert found["gcp credentials"] == "ok found"
    assert found["event bucket"] == "ok example-gcp-events (the stack's eventBucket output)"
    assert found["aws credentials"].endswith("(not needed by stack example-gcp)") or found["aws credentials"] == "ok found"
    doc = json.loads(runner.invoke(app, ["check", "--stack", "example-gcp", "--json"]).output)
    assert [d["status"] for d in doc][:4] == ["ok", "ok", "ok", "ok"]


def test_an_old_pulumi_or_a_broken_stack_file_is_missing(project, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_VERSION", "v3.100.2")
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    path.write_text(path.read_text().replace("instanceType: p4d.24xlarge", "instanceTyp: p4d.24xlarge"))
    result = runner.invoke(app, ["check", "--stack", "example-aws"])
    assert result.exit_code == 1
    found = lines(result.output)
    assert found["pulumi CLI"].startswith("missing v3.100.2 at ") and found["pulumi CLI"].endswith("spotctl needs >= 3.170.0")
    assert found["stack"].startswith("missing stacks/Pulumi.example-aws.yaml: spotctl:jobs[1].instanceTyp: unknown key")


def test_a_pulumi_cloud_backend_needs_a_token():
    seen = readiness.Seen("/bin/pulumi", "v3.200.0", "", "https://api.pulumi.com", "credentials.json", False, "s", "f",
                          "aws", "", {"aws": None, "gcp": "none"}, "b", "synced")
    found = {f.what: f for f in readiness.judge(seen)}
    assert not found["backend login"].ok and "has no access token" in found["backend login"].detail
    assert found["gcp credentials"].needed is False and found["aws credentials"].ok


def test_the_wheel_carries_the_data_files_and_the_script(tmp_path):
    uv = shutil.which("uv")
    assert uv, "uv is how spotctl is installed (pip install uv)"
    subprocess.run([uv, "build", "--wheel", "-o", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    (wheel,) = tmp_path.glob("spotctl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("cli/cost/prices.json", "cli/cost/always_on.json", "cli/policy/regimes.json",
                 "infra/_templates/agent/bootstrap.sh.j2", "agent/__main__.py", "agent/schema.py",
                 "infra/_templates/watcher/startup.sh.j2", "infra/_templates/gcp/startup.sh.j2",
                 "infra/_templates/aws/user-data.sh.j2"):
        assert data in names, data
    (entry,) = [n for n in names if n.endswith("entry_points.txt")]
    assert "spotctl = cli.commands.startup:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_uv_tool_install_puts_spotctl_on_path(tmp_path):
    uv = shutil.which("uv")
    assert uv
    env = {**os.environ, "UV_TOOL_DIR": str(tmp_path / "tools"), "UV_TOOL_BIN_DIR": str(tmp_path / "bin")}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([uv, "tool", "install", str(ROOT)], env=env, check=True, capture_output=True, timeout=600)
    elsewhere = tmp_path / "anywhere"
    elsewhere.mkdir()
    run_env = {**env, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(elsewhere), "PULUMI_HOME": str(elsewhere / ".pulumi")}
    version = subprocess.run(["spotctl", "--version"], cwd=elsewhere, env=run_env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout == "spotctl 0.1.0\n"
    check = subprocess.run(["spotctl", "check"], cwd=elsewhere, env=run_env, capture_output=True, text=True)
    assert check.returncode == 1 and "Traceback" not in check.stdout + check.stderr
    assert check.stdout.startswith("missing  pulumi CLI")
