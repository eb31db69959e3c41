"""resume of a pending job with --no-apply says what it wrote and that nothing was applied; its help says
it starts a pending job's attempt 1 (how the quickstarts use it)."""

from __future__ import annotations

from cli.app import app


def test_resume_no_apply_of_a_pending_job_says_nothing_was_applied(project, runner):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    job = project / "job.yaml"
    job.write_text("id: first\nmachineType: g2-standard-8\naccelerator: {type: nvidia-l4, count: 1}\ncommand: python3 -V\n")
    assert runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"]).exit_code == 0
    assert "state:" not in stack.read_text().split("id: first")[1]  # (no state: pending)
    result = runner.invoke(app, ["resume", "first", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ("job first: state=running (the first attempt starts: its VMs are created on new disks) — written "
                             "to stacks/Pulumi.example-gcp.yaml; nothing applied (pulumi was not run)\n")
    assert "applied:" not in result.stdout and "is applied" not in result.stdout
    entry = stack.read_text().split("id: first")[1]
    assert "state: running" in entry and "attempt:" not in entry  # (attempt 1 is the default)


def test_resume_help_says_it_starts_a_pending_job(runner):
    result = runner.invoke(app, ["resume", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "Start a pending job's attempt 1 (what `spotctl launch --no-apply` writes)" in " ".join(result.stdout.split())
