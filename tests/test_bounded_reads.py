"""Every read spotctl makes is bounded: a stack file that is no regular file (a link to /dev/zero, a
FIFO) is refused at once, as a directory is, with one error naming it; run as a process with a
timeout, since the old code read /dev/zero, or waited on the FIFO, for ever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def spotctl(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory"])
@pytest.mark.parametrize("command", [["status"], ["resume", "train", "--yes", "--no-apply"], ["watch", "--once", "--no-poll"]])
def test_a_stack_file_that_is_no_regular_file_is_refused_at_once(project, kind, command):
    path = project / "stacks" / "Pulumi.odd.yaml"
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    done = spotctl(project, *command, "--stack", "odd")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    what = {"dev-zero": "not a regular file", "fifo": "a FIFO", "directory": "a directory"}[kind]
    assert f"stacks/Pulumi.odd.yaml: cannot read: {what} (a stack file is a regular file)" in done.stderr, done.stderr
