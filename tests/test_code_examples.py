"""The example stacks' jobs run the quickstart trainer as written: their code: is examples/quickstart,
the digest they record is the one packing it gives (in this git checkout and in a plain copy), and
validate has nothing to warn about their code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cli.app import app
from cli.code.archive import pack
from cli.code.files import code_files
from cli.lifecycle import stackfile

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"


def digest(root: Path) -> str:
    return pack(root, code_files(root).files).sha256


def warnings(output: str) -> list[str]:
    """validate's warnings but the one every multi-node example gets (its nodes' network; test_gang_network)."""
    return [line for line in output.splitlines() if line.startswith("warning:") and "NCCL runs over TCP" not in line]


@pytest.mark.parametrize("stack", ["example-aws", "example-gcp"])
def test_example_jobs_record_the_quickstarts_digest(project, runner, stack, tmp_path):
    cfg = stackfile.load(stackfile.resolve(stack, None))
    plain = tmp_path / "plain-copy"
    shutil.copytree(QUICKSTART, plain)
    assert digest(QUICKSTART) == digest(plain) == digest(project / "examples" / "quickstart")
    for job in cfg.jobs:
        assert job.code is not None and job.code.dir == "./examples/quickstart", job.id
        assert job.code_digest == digest(QUICKSTART), f"{job.id}: re-record it after editing examples/quickstart"
        assert job.command.startswith(".venv/bin/python train.py") and "requirements.txt" in (job.setup or "")
    result = runner.invoke(app, ["validate", "--stack", stack])
    assert result.exit_code == 0 and not warnings(result.output), result.output


def test_validate_warns_of_a_relative_file_without_code(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text()
    start = text.index("      code: ./examples/quickstart", text.index("id: bert-eval"))
    end = text.index("\n", text.index("codeDigest:", start)) + 1
    path.write_text(text[:start] + "      command: python eval.py --split test\n" + text[end:])
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 0
    assert ("spotctl:jobs[2].command: job bert-eval runs 'eval.py', a relative file, but has no code: the command runs "
            "in the empty job disk") in result.output


def test_validate_says_when_a_containers_host_image_is_not_known_to_run_it(project, runner):
    for stack, image, said in (("example-aws", "", None), ("example-gcp", "", "the default Deep Learning VM image is not "
                               "documented to ship docker"), ("example-aws", "ami-0123456789abcdef0", "its image "
                               "'ami-0123456789abcdef0' must have docker and the NVIDIA Container Toolkit")):
        path = project / "stacks" / f"Pulumi.{stack}.yaml"
        text = path.read_text()
        extra = "      container: nvcr.io/nvidia/pytorch:24.05-py3\n" + (f"      image: {image}\n" if image else "")
        path.write_text(text.replace("      code: ./examples/quickstart", extra + "      code: ./examples/quickstart", 1))
        result = runner.invoke(app, ["validate", "--stack", stack])
        assert result.exit_code == 0, result.output
        assert (said in result.output) if said else not warnings(result.output), result.output
        path.write_text(text)


def test_validate_warns_of_a_code_directory_that_is_not_there(project, runner):
    shutil.rmtree(project / "examples")
    result = runner.invoke(app, ["validate", "--stack", "example-aws"])
    assert result.exit_code == 0, result.output
    assert (f"spotctl:jobs[1].code: job diffusion's directory {project / 'examples' / 'quickstart'} is not there "
            f"(relative to the project root {project}): launch, resume and failover refuse to pack it") in result.output


def test_the_example_launched_from_its_own_directory_with_code_dot(project, runner, monkeypatch):
    """From examples/quickstart: `spotctl launch --code ./` and a job file's relative `code:` name the
    working directory and the job file's directory, recorded relative to the project root (where
    resume, watch and drill read it): the drill of the new job packs exactly the example stacks' code."""
    from cli.drill import runner as drills

    here = project / "examples" / "quickstart"
    job = ("id: {id}\nmachineType: g2-standard-8\naccelerator: {{type: nvidia-l4, count: 1}}\ncode: {code}\n"
           "setup: python3 -m venv .venv && .venv/bin/python -m pip install -r requirements.txt\n"
           "command: .venv/bin/python train.py --steps 600\n")
    own, dot = here.parent / "own.yaml", here.parent / "dot.yaml"  # (beside the code: a file in it changes its digest)
    own.write_text(job.format(id="own", code="{dir: ./quickstart}"))
    dot.write_text(job.format(id="dot", code="./"))
    monkeypatch.chdir(here)
    flag = ["--id", "flag", "--machine", "g2-standard-8", "--command", "python3 train.py", "--code", "./"]
    for args in ([str(own)], flag):
        result = runner.invoke(app, ["launch", *args, "--stack", "example-gcp", "--no-apply"])
        assert result.exit_code == 0, result.output
    # A job file's `code: ./` is the job file's directory: examples/, not the quickstart.
    result = runner.invoke(app, ["launch", str(dot), "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 0, result.output
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    assert cfg.job("own").code.dir == "./examples/quickstart" and cfg.job("flag").code.dir == "./examples/quickstart"
    assert cfg.job("dot").code.dir == "./examples"
    seen = []
    monkeypatch.setattr(drills, "run_drill", lambda spec, status: seen.append(spec) or drills.Report(
        verdict="reentrant", cloud=spec.cloud, command=spec.command, attempts=[], preemptions=1, checkpoint_interval=None, total_s=0))
    assert runner.invoke(app, ["drill", "--stack", "example-gcp", "--job", "own"]).exit_code == 0
    assert seen[0].code.sha256 == digest(QUICKSTART) == cfg.job("vit-finetune").code_digest
