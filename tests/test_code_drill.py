"""The drill delivers code as a job's travels: packed as resume packs it, put in the emulator's bucket
under the job's code prefix, the VM told where (code_uri, its sha256, setup, workdir) and to run there,
not in the caller's directory; --verify's outputs are what the command wrote under the workdir."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from cli.app import app
from cli.code.archive import MTIME
from cli.drill import runner as drills
from cli.drill.code import DrillCode, outputs, staged
from cli.drill.emulator import Emulator
from infra.naming import code_key
from infra.render import ScriptContext

ROOT = Path(__file__).resolve().parent.parent


def test_staged_puts_the_archive_where_the_vm_reads_it(tmp_path):
    code = DrillCode(b"archive-bytes", "c" * 64, setup="make", workdir="src")
    ctx = ScriptContext(cloud="aws", stack="drill", kind="job", name="train", command="python t.py",
                        event_bucket="drill-events", region="local", cwd=str(tmp_path))
    with Emulator() as emu:
        told = staged(ctx, code, emu.put_object)
        assert emu.state.blobs[("drill-events", code_key("drill", "train", "c" * 64))] == b"archive-bytes"
    assert told.code_uri == f"s3://drill-events/{code_key('drill', 'train', 'c' * 64)}" and told.code_sha256 == "c" * 64
    assert (told.setup, told.workdir, told.cwd) == ("make", "src", "")  # never the caller's directory
    assert staged(ctx, None, emu.put_object) is ctx
    gcp = staged(ScriptContext(**{**ctx.__dict__, "cloud": "gcp"}), code, lambda *a: None)
    assert gcp.code_uri.startswith("gs://drill-events/")


def test_outputs_are_what_the_command_wrote_under_the_workdir(tmp_path):
    code = DrillCode(b"", "d" * 64, setup="python3 -m venv .venv", workdir="src")
    work = tmp_path / "code" / ("d" * 64) / "src"
    (work / ".venv").mkdir(parents=True)
    (work / "train.py").write_text("print(1)")  # unpacked: the archive's fixed time
    os.utime(work / "train.py", (MTIME, MTIME))
    (work / ".venv" / "pyvenv.cfg").write_text(f"home = {work}")  # made by setup, before its marker
    os.utime(work / ".venv" / "pyvenv.cfg", (1_700_000_000, 1_700_000_000))
    (tmp_path / ".spotctl").mkdir()
    (tmp_path / ".spotctl" / "setup-1234.done").write_text("")
    os.utime(tmp_path / ".spotctl" / "setup-1234.done", (1_700_000_100, 1_700_000_100))
    assert outputs(tmp_path, code) == {}
    (work / "output").mkdir()
    (work / "output" / "model.json").write_text("{}")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "train.cpython-311.pyc").write_text("x")
    assert outputs(tmp_path, code) == {"output/model.json": hashlib.sha256(b"{}").hexdigest()}


def test_verify_says_no_outputs_found_when_none_were_written(runner):
    result = runner.invoke(app, ["drill", "--preempt-every", "0.6", "--verify", "--",
                                 "for i in $(seq 1 12); do echo SPOTCTL_PROGRESS $i/12; sleep 0.1; done"])
    assert "final outputs: no outputs found (neither run wrote a file under its workdir)" in result.output
    assert "DIFFERENT" not in result.output


def test_drill_code_options_pack_the_directory_as_resume_does(runner, tmp_path, monkeypatch):
    seen: list[drills.DrillSpec] = []
    monkeypatch.setattr(drills, "run_drill", lambda spec, status: seen.append(spec) or _report(spec))
    result = runner.invoke(app, ["drill", "--code", str(ROOT / "examples" / "quickstart"), "--setup", "make deps",
                                 "--workdir", ".", "--", ".venv/bin/python", "train.py"])
    assert result.exit_code == 0, result.output
    (spec,) = seen
    with tarfile.open(fileobj=io.BytesIO(spec.code.archive), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == [".spotctlignore", "requirements.txt", "train.py"]
    assert (spec.code.setup, spec.code.workdir, spec.code.sha256) == ("make deps", ".", hashlib.sha256(spec.code.archive).hexdigest())
    missing = runner.invoke(app, ["drill", "--code", str(tmp_path / "gone"), "--", "true"])
    assert missing.exit_code == 1 and missing.output == f"error: --code {tmp_path / 'gone'}: {tmp_path / 'gone'} does not exist\n"
    lone = runner.invoke(app, ["drill", "--setup", "make", "--", "true"])
    assert lone.exit_code == 1 and lone.output == "error: --setup and --workdir go with --code DIR\n"


def test_drill_job_packs_the_jobs_code(project, runner, monkeypatch):
    seen: list[drills.DrillSpec] = []
    monkeypatch.setattr(drills, "run_drill", lambda spec, status: seen.append(spec) or _report(spec))
    result = runner.invoke(app, ["drill", "--stack", "example-gcp", "--job", "bert-eval"])
    assert result.exit_code == 0, result.output
    (spec,) = seen
    from cli.lifecycle import stackfile

    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("bert-eval")
    assert spec.code.sha256 == job.code_digest and spec.code.setup == job.setup and spec.command == job.command


def _report(spec) -> drills.Report:
    return drills.Report(verdict="reentrant", cloud=spec.cloud, command=spec.command, attempts=[], preemptions=1,
                         checkpoint_interval=None, total_s=0.0)


def test_a_setup_longer_than_the_preemption_interval_runs_once_and_is_not_preempted(runner, tmp_path):
    """The preemption clock starts when the command does: a 3 s setup under --preempt-every 0.8 used to
    be cut short at every attempt, the command never run (did-not-finish after 10 attempts)."""
    code = tmp_path / "code"
    shutil.copytree(ROOT / "examples" / "quickstart", code)
    result = runner.invoke(app, ["drill", "--code", str(code), "--setup", 'sleep 3; echo x >>"$SPOTCTL_MOUNT/setups"',
                                 "--preempt-every", "0.8", "--", "python3", "train.py", "--steps", "400"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("verdict: reentrant"), result.output
    assert "setup ran once, in attempt 1 (" in result.output and "preemptions come after it" in result.output


@pytest.mark.parametrize("stack,job,verify,capacity", [("example-gcp", "bert-eval", True, "spot"),
                                                       ("example-aws", "sweep-07", False, "on-demand")])
def test_the_example_stacks_jobs_drill_as_written_offline(project, runner, tmp_path, monkeypatch, stack, job, verify, capacity):
    """`spotctl drill --job` of an example job: its code packed as launch packs it, its setup as written
    (a venv, then pip install -r requirements.txt) with no package index reachable, the command in the
    unpacked code; reentrant (and with --verify the same outputs as an uninterrupted run), nothing
    written to the project."""
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\nindex-url = http://127.0.0.1:9/simple\ntimeout = 2\n")
    monkeypatch.setenv("HOME", str(home))  # the command gets the caller's HOME: pip reads this config
    code = project / "examples" / "quickstart"
    before = {str(p.relative_to(code)): p.read_bytes() for p in code.rglob("*") if p.is_file()}
    result = runner.invoke(app, ["drill", "--stack", stack, "--job", job] + (["--verify"] if verify else []))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("verdict: reentrant"), result.output
    assert not verify or "final outputs: identical to an uninterrupted run" in result.output
    assert "setup ran once, in attempt 1 (" in result.output
    # An on-demand job is preempted all the same, and the report says the cloud would not.
    assert ("capacity on-demand: AWS never preempts it;" in result.output) == (capacity == "on-demand"), result.output
    assert {str(p.relative_to(code)): p.read_bytes() for p in code.rglob("*") if p.is_file()} == before  # no .venv, no output
