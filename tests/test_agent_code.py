"""The VM side of code delivery, run by the agent against the emulator: the archive is fetched with
the job's identity and checked against its digest, unpacked once under code/<sha256>/, setup runs once
per disk and code (not again after a reboot), the command runs in the workdir and, done, the VM powers
itself off; every way it cannot run ends the attempt `failed` naming the job and the key."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from agent.code import CodeError, git_env, unpack
from agent.config import Config
from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext

TRAIN = """import json, os, sys
open(os.path.join(os.environ["SPOTCTL_MOUNT"], "ran.json"), "w").write(json.dumps(
    {"cwd": os.getcwd(), "workdir": os.environ["SPOTCTL_WORKDIR"], "code": os.environ["SPOTCTL_CODE_DIR"],
     "lib": open("../lib.txt").read()}))
print("SPOTCTL_PROGRESS 1/1")
"""
SETUP = 'echo "setup ran" >>"$SPOTCTL_MOUNT/setup-runs"; echo installing'


def archive(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def emu():
    with Emulator() as e:
        yield e


def code_vm(emu, tmp_path: Path, cloud: str, data: bytes, *, digest: str | None = None, setup: str = SETUP,
            command: str = f"{sys.executable} train.py", **over) -> LocalVM:
    sha = digest or hashlib.sha256(data).hexdigest()
    key = f"team-a/train/code/{sha}.tar.gz"
    emu.put_object("bkt", key, data)
    ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="bkt", region="us-east-1",
                        command=command, code_uri=f"{'gs' if cloud == 'gcp' else 's3'}://bkt/{key}", code_sha256=sha,
                        setup=setup, workdir="src", poll_interval_s=1, **over)
    return LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")


def names(vm: LocalVM) -> list[str]:
    return [e["event"] for e in vm.events()]


def run_once(vm: LocalVM) -> LocalVM:
    """Boot, let the run end, power off."""
    try:
        assert vm.boot().returncode == 0
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
    finally:
        vm.kill_all()
    return vm


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_code_is_fetched_set_up_once_run_in_its_workdir_and_the_vm_stops(emu, tmp_path, cloud):
    data = archive({"src/train.py": TRAIN, "lib.txt": "lib"})
    sha = hashlib.sha256(data).hexdigest()
    vm = code_vm(emu, tmp_path, cloud, data)
    try:
        assert vm.boot(env={"SPOTCTL_BOOT_ID": "boot-1"}).returncode == 0
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
        assert names(vm) == ["started", "progress", "completed"], vm.debug_log()
        ran = json.loads((vm.disk / "ran.json").read_text())
        code = vm.disk / "code" / sha
        assert ran == {"cwd": str(code / "src"), "workdir": str(code / "src"), "code": str(code), "lib": "lib"}
        assert (vm.disk / "setup-runs").read_text() == "setup ran\n"
        assert "installing" in (vm.disk / ".spotctl" / "logs" / "attempt-1-node-0.log").read_text()  # setup's output: the job log
        assert not [p for p in (vm.disk / "code").iterdir() if p.name != sha]  # no temp dir left
        # the job's own identity read the archive (the emulator checked the signature / token)
        assert not emu.state.rejected
        (poweroff,) = emu.state.poweroffs
        assert poweroff["argv"] == ["shutdown", "-h", "now"]
        completed = next(u for u in emu.uploads() if u.body["event"] == "completed")
        assert poweroff["received"] > completed.received  # after `completed` was uploaded
        # A reboot (a new attempt would be the same): setup does not run again on this disk.
        (vm.disk / ".spotctl" / "completed").unlink()  # (or the finished job would not run at all)
        vm.kill_all()
        assert vm.boot(env={"SPOTCTL_BOOT_ID": "boot-2"}).returncode == 0
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
        assert names(vm).count("completed") == 2
        assert (vm.disk / "setup-runs").read_text() == "setup ran\n"
    finally:
        vm.kill_all()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_digest_mismatch_fails_the_attempt_naming_the_job_and_code(emu, tmp_path, cloud):
    data = archive({"src/train.py": TRAIN})
    vm = run_once(code_vm(emu, tmp_path, cloud, data, digest="0" * 64))
    assert names(vm) == ["started", "failed"]
    details = vm.events()[-1]["details"]
    assert details["key"] == "code" and details["reason"].startswith("job train: code ") and "not the recorded 0000" in details["reason"]
    assert not (vm.disk / "code" / ("0" * 64)).exists() and not (vm.disk / "setup-runs").exists()
    assert "not the recorded" in (vm.disk / ".spotctl" / "logs" / "attempt-1-node-0.log").read_text()
    assert len(emu.state.poweroffs) == 1  # its log and event uploaded, the VM stops


def test_a_failing_setup_fails_the_attempt_with_the_logs_tail_and_stops_after_the_upload(emu, tmp_path):
    data = archive({"src/train.py": TRAIN})
    vm = run_once(code_vm(emu, tmp_path, "gcp", data, setup="echo 'No matching distribution found for torch==9'; exit 3"))
    assert names(vm) == ["started", "failed"]
    details = vm.events()[-1]["details"]
    assert details["reason"] == "job train: setup failed (exit 3)" and details["key"] == "setup" and details["exit_code"] == "3"
    assert "No matching distribution found for torch==9" in details["log_tail"]
    assert not (vm.disk / "ran.json").exists()
    failed = next(u for u in emu.uploads() if u.body["event"] == "failed")
    assert any("/logs/" in name for name in emu.state.log_chunks)
    assert emu.state.poweroffs[0]["received"] > failed.received


def test_a_git_repository_is_cloned_at_its_commit(emu, tmp_path):
    repo = tmp_path / "repo"
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "src").mkdir()
    (repo / "src" / "train.py").write_text(TRAIN)
    (repo / "lib.txt").write_text("from git")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "lib.txt").write_text("a later commit")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    ctx = ScriptContext(cloud="gcp", stack="team-a", kind="job", name="train", event_bucket="bkt", region="r",
                        command=f"{sys.executable} train.py", code_git_url=f"file://{repo}", code_git_commit=commit,
                        workdir="src")
    vm = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
    try:
        assert vm.boot().returncode == 0
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
    finally:
        vm.kill_all()
    assert names(vm)[-1] == "completed", vm.debug_log()
    assert json.loads((vm.disk / "ran.json").read_text())["lib"] == "from git"  # the recorded commit, not the newest


def test_a_git_token_travels_in_gits_environment_never_in_argv():
    env = git_env("ghp_secret")
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader" and env["GIT_CONFIG_VALUE_0"].startswith("Authorization: Basic ")
    assert git_env("") == {}


def test_an_archive_cannot_write_outside_its_directory(tmp_path):
    cfg = Config(cloud="gcp", stack="s", kind="job", name="train", command="x", event_bucket="b", region="r",
                 mount_point=str(tmp_path), code_uri="gs://b/k", code_sha256="a" * 64)
    with pytest.raises(CodeError, match="leaves the code directory"):
        unpack(cfg, archive({"../evil": "x"}))
    assert not (tmp_path / "code" / "evil").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_container_runs_setup_and_command_with_the_disk_and_the_jobs_env(emu, tmp_path, cloud):
    """docker is a stand-in on PATH recording its argv and the values of the -e names it got."""
    calls = tmp_path / "docker-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "names = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == '-e']\n"
        f"open({str(calls)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'env': {{n: os.environ.get(n) for n in names}}}}) + '\\n')\n")
    (bin_dir / "docker").chmod(0o755)
    data = archive({"src/train.py": TRAIN})
    vm = code_vm(emu, tmp_path, cloud, data, container="nvcr.io/nvidia/pytorch:24.01-py3", env={"WANDB_PROJECT": "p"})
    import os

    try:
        assert vm.boot(env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}).returncode == 0
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
    finally:
        vm.kill_all()
    setup, command = [json.loads(line) for line in calls.read_text().splitlines()]
    workdir = str(vm.disk / "code" / hashlib.sha256(data).hexdigest() / "src")
    argv = command["argv"]
    assert argv[:4] == ["run", "--rm", "--gpus", "all"]
    assert argv[argv.index("-v") + 1] == f"{vm.disk}:{vm.disk}" and argv[argv.index("-w") + 1] == workdir
    assert argv[-4:] == ["nvcr.io/nvidia/pytorch:24.01-py3", "bash", "-c", f"{sys.executable} train.py"]
    assert setup["argv"][-1] == SETUP
    assert command["env"]["WANDB_PROJECT"] == "p" and command["env"]["SPOTCTL_JOB_ID"] == "train"
    assert command["env"]["SPOTCTL_CHECKPOINT_DIR"] == f"{vm.disk}/checkpoints"
    assert "PATH" not in command["env"] and "HOME" not in command["env"]  # the image's own
    assert names(vm)[-1] == "completed"


def test_without_code_the_command_runs_on_the_job_disk_as_before(emu, tmp_path):
    out = tmp_path / "where"
    ctx = ScriptContext(cloud="aws", stack="s", kind="job", name="j", command=f"pwd > {out}", event_bucket="b", region="r")
    vm = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
    try:
        assert vm.boot().returncode == 0
        assert vm.wait_exit("run.pid", 20)
    finally:
        vm.kill_all()
    assert out.read_text().strip() == str(tmp_path / "disk")
    assert not (tmp_path / "disk" / "code").exists()
