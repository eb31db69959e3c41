"""The real-CLI tier: runs only where the `pulumi` CLI (and its providers) are installed; skipped
elsewhere (here, the CLI cannot be installed: it downloads binaries at run time)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.pulumi_cli


@pytest.mark.skipif(shutil.which("pulumi") is None, reason="the pulumi CLI is not on PATH")
@pytest.mark.parametrize("stack", ["example-gcp", "example-aws"])
def test_pulumi_preview_accepts_the_program(project, tmp_path, stack):
    """`pulumi preview` against a local file backend: the provider schema checks every input that
    mocks accept blindly (credentials are needed for the provider invokes, so CI must provide them)."""
    env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{tmp_path}", "PULUMI_CONFIG_PASSPHRASE": "test"}
    subprocess.run(["pulumi", "stack", "init", stack, "--non-interactive"], cwd=project, env=env, check=True)
    done = subprocess.run(["pulumi", "preview", "--stack", stack, "--non-interactive", "--diff"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "spotctl:" in done.stdout and "TrainingJob" in done.stdout
