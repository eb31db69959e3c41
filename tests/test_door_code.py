"""A job file's code: goes through the check --code gets: nothing machine-local reaches the shared stack file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.app import app

JOB = "id: c1\nmachineType: g2-standard-8\naccelerator: {type: nvidia-l4, count: 1}\ncommand: python3 train.py\n"


def launch(runner, job: Path):
    return runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"])


def test_a_job_file_code_outside_the_project_is_refused_naming_file_and_key(project, runner, tmp_path):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = stack.read_bytes()
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    outside.mkdir()
    for code, key in ((str(outside), "code"), (f"{{dir: {outside}}}", "code.dir")):
        job = project / "job.yaml"
        job.write_text(JOB + f"code: {code}\n")
        result = launch(runner, job)
        assert result.exit_code == 1, result.output
        assert f"error: {job}: {key}: {outside}: {outside} is outside the project root {project}" in result.output
        assert result.output.count("error:") == 1
        assert stack.read_bytes() == before


def test_a_job_file_code_that_does_not_exist_is_refused(project, runner):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = stack.read_bytes()
    (project / "jobs").mkdir()
    job = project / "jobs" / "job.yaml"
    job.write_text(JOB + "code: ./nowhere\n")
    result = launch(runner, job)
    assert result.exit_code == 1
    assert f"error: {job}: code: ./nowhere: {project / 'jobs' / 'nowhere'} does not exist" in result.output
    assert stack.read_bytes() == before


def test_an_absolute_code_inside_the_project_is_written_relative(project, runner):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = stack.read_text()
    job = project / "job.yaml"
    job.write_text(JOB + f"code: {project / 'examples' / 'quickstart'}\n")
    result = launch(runner, job)
    assert result.exit_code == 0, result.output
    assert stack.read_text() == before + ("    - id: c1\n      machineType: g2-standard-8\n"
                                          "      accelerator: {type: nvidia-l4, count: 1}\n      zone: us-central1-a\n"
                                          "      code: ./examples/quickstart\n      command: python3 train.py\n")


def test_with_dash_c_the_job_file_and_code_are_paths_as_the_shell_means_them(project, runner, tmp_path, monkeypatch):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = stack.read_text()
    shell = tmp_path.parent / f"{tmp_path.name}-shell"
    shell.mkdir()
    (shell / "job.yaml").write_text(JOB)
    monkeypatch.chdir(shell)
    result = runner.invoke(app, ["-C", str(project), "launch", "job.yaml", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 0, result.output
    assert stack.read_text() == before + ("    - id: c1\n      machineType: g2-standard-8\n"
                                          "      accelerator: {type: nvidia-l4, count: 1}\n      zone: us-central1-a\n"
                                          "      command: python3 train.py\n")
    stack.write_text(before)
    monkeypatch.chdir(project / "examples")  # --code too: the shell's quickstart, inside the project
    flags = ["-C", "..", "launch", "--id", "c2", "--machine", "g2-standard-8", "--command", "python3 train.py",
             "--code", "quickstart", "--stack", "example-gcp", "--no-apply"]
    result = runner.invoke(app, flags)
    assert result.exit_code == 0, result.output
    assert "      code: ./examples/quickstart\n" in stack.read_text()
    monkeypatch.chdir(project / "examples")  # (-C moved this process: a shell would still be here)
    missing = runner.invoke(app, ["-C", str(project), "launch", "nope.yaml", "--stack", "example-gcp", "--no-apply"])
    assert missing.exit_code == 1 and str(project / "examples" / "nope.yaml") in missing.output


def test_a_stack_file_code_outside_the_project_is_refused_by_validate_and_resume(project, runner, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-away"
    outside.mkdir()
    (outside / "train.py").write_text("print('hi')\n")
    job = project / "job.yaml"
    job.write_text(JOB + "code: ./examples/quickstart\n")
    assert launch(runner, job).exit_code == 0
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    head, _, entry = stack.read_text().rpartition("- id: c1\n")
    stack.write_text(head + "- id: c1\n" + entry.replace("code: ./examples/quickstart", f"code: {outside}"))
    before = stack.read_bytes()
    why = f"job c1's code {outside} is outside the project root {project}"
    checked = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert checked.exit_code == 1 and checked.output.count("error:") == 1, checked.output
    assert checked.output.startswith("error: stacks/Pulumi.example-gcp.yaml: spotctl:jobs[") and why in checked.output
    assert stack.read_bytes() == before
    from cli.code import CodeError
    from cli.code.prepare import StackContext, prepare_code
    from cli.lifecycle import stackfile

    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("c1")
    with pytest.raises(CodeError, match="outside the project root"):  # resume and failover pack through it
        prepare_code(job, StackContext("example-gcp", project), upload=False)
