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


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_job_file_that_is_no_regular_file_or_too_large_is_refused_at_once(project, runner, tmp_path, kind):
    """A FIFO (nobody writes to it) or /dev/zero would keep launch reading for ever; 2 MiB of YAML is no job."""
    import os

    if kind == "fifo":
        job_file = tmp_path / "job.yaml"
        os.mkfifo(job_file)
        why = "not a regular file"
    elif kind == "device":
        job_file, why = Path("/dev/zero"), "not a regular file"
    else:
        job_file = tmp_path / "job.yaml"
        job_file.write_text("id: j1\n" + "#" * (2 << 20) + "\n")
        why = "larger than 1 MiB"
    assert refused(runner, project, ["launch", str(job_file)]) == f"error: {job_file}: cannot read: {why}\n"


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


UNLISTED = ("is not in spotctl's catalog: not checked (GPUs, regions) and not priced unless spotctl:prices has it; "
            "did you mean ")


@pytest.mark.parametrize("stack,machine,key,close", [
    ("example-gcp", "gs-standard-8", "machineType", "'g2-standard-8'"),
    ("example-aws", "gg5.2xlarge", "instanceType", "'g5.2xlarge'"),
])
def test_a_wellformed_machine_the_catalog_lacks_is_written_with_a_warning_in_launch_and_validate(
        project, runner, stack, machine, key, close):
    path = stack_file(project, stack)
    result = runner.invoke(app, ["launch", "--id", "jx", "--machine", machine, "--command", "x", "--stack", stack, "--no-apply"])
    assert result.exit_code == 0, result.output
    index = path.read_text().count("- id: ")  - 1
    said = f"spotctl:jobs[{index}].{key}: job jx: {machine!r} {UNLISTED}{close}"
    assert f"warning: stacks/Pulumi.{stack}.yaml: {said}" in result.output
    assert f"{key}: {machine}" in path.read_text()
    result = runner.invoke(app, ["validate", "--stack", stack])
    assert result.exit_code == 0 and f"warning: stacks/Pulumi.{stack}.yaml: {said}" in result.output, result.output


@pytest.mark.parametrize("stack,machine,message", [
    ("example-gcp", "G2-standard-8", "unknown machine type 'G2-standard-8': Compute Engine's names are lowercase; "
     "did you mean 'g2-standard-8'?"),
    ("example-gcp", "h100-mega", "unknown machine type 'h100-mega': not the shape of one (a Compute Engine machine type is "
     "SERIES-KIND-VCPUS, e.g. 'g2-standard-8', or custom-VCPUS-MB)"),
    ("example-gcp", "g2_standard_8", "unknown machine type 'g2_standard_8': not the shape of one (a Compute Engine machine "
     "type is SERIES-KIND-VCPUS, e.g. 'g2-standard-8', or custom-VCPUS-MB); did you mean 'g2-standard-8'"),
    ("example-aws", "G5.2xlarge", "unknown instance type 'G5.2xlarge': EC2's names are lowercase; did you mean 'g5.2xlarge'?"),
    ("example-aws", "g5.2xlarge!", "unknown instance type 'g5.2xlarge!': not the shape of one (an EC2 instance type is "
     "FAMILY.SIZE, e.g. 'g5.2xlarge'); did you mean 'g5.2xlarge'"),
    ("example-gcp", "g2-standard-7", "unknown machine type 'g2-standard-7' (did you mean"),  # a near miss, as before
])
def test_a_machine_no_cloud_can_have_is_refused_naming_the_flag_and_in_a_job_file_the_key(
        project, runner, tmp_path, stack, machine, message):
    output = refused(runner, project, ["launch", "--id", "jx", "--machine", machine, "--command", "x"], stack)
    assert output.startswith(f"error: launch of job jx: --machine: {message}"), output
    key = "machineType" if stack == "example-gcp" else "instanceType"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"id: jx\n{key}: {machine!r}\ncommand: x\n")
    output = refused(runner, project, ["launch", str(job_file)], stack)
    assert output.startswith(f"error: {job_file}: {key}: {message}"), output


def test_every_machine_in_the_catalog_has_its_clouds_shape():
    from infra import catalog

    for cloud in ("gcp", "aws"):
        types = catalog.load()[cloud]["types"]
        assert len(types) > 100 and all(catalog.SHAPES[cloud].fullmatch(t) for t in types)
        assert not [t for t in types if catalog.unknown_type(cloud, t) or catalog.unlisted(cloud, t)]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(cloud=st.sampled_from(["gcp", "aws"]),
       name=st.one_of(st.text("abcgnsxA.-_0123456789", min_size=1, max_size=16),
                      st.sampled_from(["g2-standard-8", "g5.2xlarge", "e2-micro", "x4-960-16t-metal", "c7i.metal-48xl"])
                      .map(lambda n: n.replace("2", "9"))))
def test_every_machine_name_is_known_custom_refused_or_warned_of_never_silent(cloud, name):
    from infra import catalog

    known = name in catalog.load()[cloud]["types"] or (cloud == "gcp" and catalog.is_custom(name))
    refused_, warned = catalog.unknown_type(cloud, name), catalog.unlisted(cloud, name)
    assert [bool(known), bool(refused_), bool(warned)].count(True) == 1, (known, refused_, warned)
    if warned:  # only a name of the cloud's shape is let through with a warning
        assert catalog.SHAPES[cloud].fullmatch(name)
