"""Upgrading spotctl (its VM scripts changed) never replaces or rewrites a running attempt's VMs at the
next full `pulumi up`: the new scripts reach the next attempt. Checked the way the engine diffs: the
old plan's inputs against the new plan's, each ``ignoreChanges`` path taking the old value."""

from __future__ import annotations

import copy
import re
import shutil

import pytest

from cli.app import app
from cli.lifecycle import stackfile
from cli.plan import mocks as planner
from infra import basics, render
from infra.config import validate
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config

VMS = {"aws": "aws:ec2/instance:Instance", "gcp": "gcp:compute/instance:Instance"}


def _path(path: str) -> list[str]:
    """A Pulumi property path as keys: ``metadata["startup-script"]`` -> [metadata, startup-script]."""
    return [p for p in re.split(r'\[\"|\"\]|\.', path) if p]


def engine_inputs(old: dict, new: dict, ignore: tuple[str, ...]) -> dict:
    """The goal inputs after ``ignoreChanges``: the old value at each path (pulumi/pulumi#2657)."""
    goal = copy.deepcopy(new)
    for path in ignore:
        keys = _path(path)
        src, dst = old, goal
        for k in keys[:-1]:
            src, dst = src.get(k, {}), dst.setdefault(k, {})
        if keys[-1] in src:
            dst[keys[-1]] = src[keys[-1]]
    return goal


def changed_template(tmp_path, monkeypatch) -> None:
    """This spotctl's scripts, one line longer (an upgrade): a copy of templates/ with a comment added."""
    copy_dir = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), copy_dir)
    for f in copy_dir.rglob("*.j2"):
        f.write_text(f.read_text() + "\n# a newer spotctl\n")
    monkeypatch.setattr(render, "templates_dir", lambda: copy_dir)
    monkeypatch.setattr(basics, "templates_dir", lambda: copy_dir)
    render.environment.cache_clear()
    render.scripts_digest.cache_clear()


def vm_inputs(plan, cloud: str) -> dict[str, tuple[dict, tuple[str, ...]]]:
    return {r.urn: (r.inputs, r.ignore_changes) for r in plan.by_type(VMS[cloud])}


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_changed_scripts_leave_running_vms_alone_until_the_next_attempt(cloud, tmp_path, monkeypatch):
    base, job = (AWS_BASE, aws_job) if cloud == "aws" else (GCP_BASE, gcp_job)
    running = job(state="running", attempt=3, scriptsDigest=render.scripts_digest())
    before = vm_inputs(planner.run(validate(stack_config(base, jobs=[running]), "t"), "team"), cloud)
    assert before and all(set(ign) <= {"ami", "placementGroup"} for _, ign in before.values())  # its own scripts: nothing frozen
    changed_template(tmp_path, monkeypatch)
    try:
        after = vm_inputs(planner.run(validate(stack_config(base, jobs=[running]), "t"), "team"), cloud)
        for urn, (inputs, ignore) in after.items():
            assert engine_inputs(before[urn][0], inputs, ignore) == before[urn][0], urn  # no diff: not replaced, not rewritten
        # The next attempt records this spotctl's digest: its VMs get the new scripts.
        nxt = job(state="running", attempt=4, scriptsDigest=render.scripts_digest())
        again = vm_inputs(planner.run(validate(stack_config(base, jobs=[nxt]), "t"), "team"), cloud)
        for urn, (inputs, ignore) in again.items():
            goal = engine_inputs(before[urn][0], inputs, ignore)
            script = "userDataBase64" if cloud == "aws" else "metadata"
            assert goal[script] != before[urn][0][script] and goal[script] == inputs[script]
    finally:
        render.environment.cache_clear()
        render.scripts_digest.cache_clear()


def test_a_job_without_a_recorded_digest_keeps_its_scripts():
    """Stack files from before the digest was recorded: the attempt's scripts are unknown, so kept."""
    plan = planner.run(validate(stack_config(GCP_BASE, jobs=[gcp_job(state="running")]), "t"), "team")
    (vm,) = plan.by_type(VMS["gcp"])
    assert set(vm.ignore_changes) == {'metadata["startup-script"]', 'metadata["shutdown-script"]'}


def test_a_resume_records_the_scripts_its_attempt_starts_with(project, runner):
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--no-apply"])
    assert result.exit_code == 0, result.output
    job = stackfile.load(stackfile.resolve("example-aws", None)).job("diffusion")
    assert (job.attempt, job.scripts_digest) == (3, render.scripts_digest())
    assert f"scriptsDigest: {render.scripts_digest()}" in (project / "stacks" / "Pulumi.example-aws.yaml").read_text()
