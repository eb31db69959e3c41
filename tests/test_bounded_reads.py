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


# ---- Pulumi's workspace files and trace files: one error naming the file -------------------------------------


def workspace_file(project: Path) -> Path:
    import hashlib

    digest = hashlib.sha1(str(project.resolve() / "Pulumi.yaml").encode()).hexdigest()  # noqa: S324
    path = project / "pulumi-home" / "workspaces" / f"spotctl-{digest}-workspace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("body", ["[" * 5000 + "]" * 5000, '["a list"]', '{"stacks": ["x"]}', '{"stacks": {"u": [1]}}',
                                  "not json", "fifo"])
def test_a_corrupt_workspace_file_is_one_error_naming_it(project, body):
    path = workspace_file(project)
    if body == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(body)
    done = spotctl(project, "status")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: {path}: "), done.stderr
    assert "give --stack NAME, or select the stack again with `pulumi stack select`" in done.stderr


def test_a_corrupt_credentials_file_is_one_error_naming_it(project):
    workspace_file(project).write_text('{"stacks": {"a": "example-aws", "b": "example-gcp"}}')
    creds = project / "pulumi-home" / "credentials.json"
    creds.write_text("[" * 5000)
    done = spotctl(project, "status")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: {creds}: ")


@pytest.mark.parametrize("body", ["[" * 5000 + "]" * 5000, '{"data": [1e400, 0]}', '{"metadata": [], "data": [1, 0]}',
                                  '{"data": [1, 0], "metadata": {"gap_seconds": "x"}}', "[1, 0]", "fifo", "dev-zero"])
def test_a_bad_trace_file_is_one_error_naming_it(project, tmp_path, body):
    trace = tmp_path / "t.json"
    if body == "fifo":
        os.mkfifo(trace)
    elif body == "dev-zero":
        trace.symlink_to("/dev/zero")
    else:
        trace.write_text(body)
    for args in (["simulate", "--trace", str(trace), "--starts", "1"],
                 ["drill", "--trace", str(trace), "--", "true"]):
        done = spotctl(project, *args)
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr, (args, done.stderr)
        assert str(trace) in done.stderr and done.stderr.count("\n") == 1, (args, done.stderr)
