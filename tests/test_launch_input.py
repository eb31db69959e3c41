"""How `spotctl launch` takes a job (a job file, or flags) and `spotctl validate` checks it: bad input is one
line naming the file or key, exit 1, and the stack file left byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.app import app


def stack_file(project: Path, stack: str = "example-gcp") -> Path:
    return project / "stacks" / f"Pulumi.{stack}.yaml"


def refused(runner, project: Path, args: list[str], stack: str = "example-gcp") -> str:
    """Run ``args`` (a launch that must be refused); return its output, the stack file checked unchanged."""
    path = stack_file(project, stack)
    before = path.read_bytes()
    result = runner.invoke(app, [*args, "--stack", stack, "--no-apply"])
    assert result.exit_code == 1, result.output
    assert path.read_bytes() == before
    return result.output


@pytest.mark.parametrize("data,line,byte", [
    (b"\xff\xfeid: j1\n", 1, "0xff"),  # UTF-16's byte-order mark
    (b"id: j1\nmachineType: g2-standard-8\ncommand: python caf\xe9.py\n", 3, "0xe9"),  # one Latin-1 byte
])
def test_a_job_file_that_is_not_utf8_is_one_line_naming_the_file(project, runner, tmp_path, data, line, byte):
    job_file = tmp_path / "job.yaml"
    job_file.write_bytes(data)
    assert refused(runner, project, ["launch", str(job_file)]) == (
        f"error: {job_file}: line {line}: not UTF-8 text (byte {byte}); save the file as UTF-8\n")


@pytest.mark.parametrize("line,key", [
    ("attempt: 7", "attempt"),
    ('codeDigest: "' + "ab" * 32 + '"', "codeDigest"),
    ("codeCommit: " + "a" * 40, "codeCommit"),
    ("code_digest: " + "ab" * 32, "code_digest"),  # (the model's Python name is read too)
    ("zoneHistory: [{zone: us-central1-b, lastAttempt: 1}]", "zoneHistory"),
    ("stoppedBy: user", "stoppedBy"),
    ("stopReason: x", "stopReason"),
    ("applying: x", "applying"),
    ("scriptsDigest: 0123456789abcdef", "scriptsDigest"),
    ("diskKind: zonal", "diskKind"),
    ("move: {from: us-central1-a, to: us-central1-b, step: snapshot}", "move"),
])
def test_every_key_spotctl_manages_is_refused_in_a_job_file(project, runner, tmp_path, line, key):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"id: sweep-09\nmachineType: g2-standard-8\ncode: ./code\ncommand: python train.py\n{line}\n")
    (tmp_path / "code").mkdir()
    output = refused(runner, project, ["launch", str(job_file)])
    assert output == f"error: {job_file}: {key}: spotctl writes this key as the job runs (a new job has none): remove the key\n"


def test_the_managed_keys_are_the_job_models_and_all_of_them_are_named(project, runner, tmp_path):
    from infra.config.jobs import MANAGED_KEYS, Job

    assert {Job.model_fields[f].alias for f in Job.model_fields} >= set(MANAGED_KEYS)
    job_file = tmp_path / "job.yaml"
    job_file.write_text("id: sweep-09\nmachineType: g2-standard-8\ncommand: x\nstate: running\nattempt: 3\n")
    assert refused(runner, project, ["launch", str(job_file)]) == (
        f"error: {job_file}: state: a new job is pending until launch applies it: remove the key\n"
        f"error: {job_file}: attempt: spotctl writes this key as the job runs (a new job has none): remove the key\n")


@pytest.mark.parametrize("blank", ["   ", "\t", " \u3000 "])
def test_a_command_of_only_whitespace_is_refused_as_an_empty_one_is(project, runner, tmp_path, blank):
    flags = ["launch", "--id", "jx", "--machine", "g2-standard-8"]
    assert refused(runner, project, [*flags, "--command", ""]) == "error: launch of job jx: --command: must not be empty\n"
    assert refused(runner, project, [*flags, "--command", blank]) == (
        "error: launch of job jx: --command: must not be empty (it is only whitespace)\n")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f'id: jx\nmachineType: g2-standard-8\ncommand: "{blank}"\n')
    assert refused(runner, project, ["launch", str(job_file)]) == (
        f"error: {job_file}: command: must not be empty (it is only whitespace)\n")
