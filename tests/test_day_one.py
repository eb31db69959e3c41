"""Day one, as a new engineer does it: from a fresh clone, `uv tool install .`, then the installed
`spotctl` from a project elsewhere: `check`, `launch --no-apply` (the cost shown, the entry written),
`launch` applied with the project's fake pulumi (only the new job's resources), `stop` then `resume` on
the same disk, and the workspace's stack selection byte for byte as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_day_one_from_a_fresh_clone(project, pulumi_state, tmp_path):
    uv = shutil.which("uv")
    assert uv, "uv is how spotctl is installed (pip install uv)"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "--quiet", head], cwd=clone, check=True)
    tools = {"UV_TOOL_DIR": str(tmp_path / "tools"), "UV_TOOL_BIN_DIR": str(tmp_path / "bin")}
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | tools
    subprocess.run([uv, "tool", "install", "."], cwd=clone, env=env, check=True, capture_output=True, timeout=600)
    spotctl = str(tmp_path / "bin" / "spotctl")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([spotctl, *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)

    digest = hashlib.sha1(str(project.resolve() / "Pulumi.yaml").encode()).hexdigest()
    selection = project / "pulumi-home" / "workspaces" / f"spotctl-{digest}-workspace.json"
    selection.parent.mkdir(parents=True)
    selection.write_text(json.dumps({"stack": "example-aws"}))
    selected = selection.read_bytes()

    check = run("check", "--stack", "example-gcp", "--no-outputs", "--json")
    assert "Traceback" not in check.stdout + check.stderr
    found = {f["what"]: f for f in json.loads(check.stdout)}
    assert found["pulumi CLI"]["ok"] and found["pulumi CLI"]["detail"].startswith("v3.272.0 at ")
    assert found["stack"]["ok"] and found["stack"]["detail"] == "example-gcp (gcp): stacks/Pulumi.example-gcp.yaml"

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    dry = run("launch", "--id", "day-one", "--machine", "g2-standard-8", "--gpus", "nvidia-l4:1", "--command", "python train.py",
              "--job-hours", "4", "--deadline-hours", "8", "--stack", "example-gcp", "--no-apply")
    assert dry.returncode == 0, dry.stderr
    assert "job day-one  g2-standard-8" in dry.stdout and "job day-one, policy default: expected $" in dry.stdout
    assert path.read_text().startswith(before) and "    - id: day-one\n" in path.read_text()
    path.write_text(before)  # the same job again, applied this time

    pulumi_state.seed("example-gcp")
    others = set(pulumi_state.resources())
    applied = run("launch", "--id", "day-one", "--machine", "g2-standard-8", "--gpus", "nvidia-l4:1", "--command", "python train.py",
                  "--stack", "example-gcp", "--yes")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.rstrip().endswith("— applied")
    added = set(pulumi_state.resources()) - others
    assert added and all("day-one" in urn for urn in added)

    stopped = run("stop", "day-one", "--stack", "example-gcp", "--yes")
    assert stopped.returncode == 0, stopped.stderr
    assert not pulumi_state.named("job-day-one-n0-vm") and pulumi_state.named("job-day-one-n0-disk")
    resumed = run("resume", "day-one", "--stack", "example-gcp", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "attempt=2, state=running" in resumed.stdout
    assert pulumi_state.named("job-day-one-n0-vm") and pulumi_state.named("job-day-one-n0-disk")
    *_, last = pulumi_state.ops()
    assert [op.split()[0] for op in last if op.endswith("::job-day-one-n0-disk")] == ["update"]  # the same disk

    assert selection.read_bytes() == selected
