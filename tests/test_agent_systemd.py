"""What systemd does to the agent, and the fixes for it: the SIGTERM checkpoint event is recorded by
the job unit's own main process before it exits (systemd kills the rest of the unit then); the job
disk stays mounted while every stop path uses it; a preemption is recorded once whatever path sees
it; the command gets the image's PATH and HOME, and the drill gives it the same variables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import Config
from agent.schema import EXPORTED_VARIABLES, POOL_ONLY
from agent.trainer import image_env
from agent.units import GCE_SHUTDOWN_UNIT, unit_files
from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext


@pytest.fixture
def emu():
    with Emulator() as e:
        yield e


def make(emu, tmp_path: Path, cloud: str, command: str, **over) -> LocalVM:
    ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="bkt", region="us-east-1",
                        command=command, **over)
    return LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")


def names(vm: LocalVM) -> list[str]:
    return [e["event"] for e in vm.events()]


def training(emu, tmp_path: Path, poll_s: int) -> LocalVM:
    """A GCP job VM booted, its trainer (tests/fixtures/trainer.py) running."""
    vm = make(emu, tmp_path, "gcp", f"{sys.executable} {Path(__file__).parent / 'fixtures' / 'trainer.py'}",
              poll_interval_s=poll_s)
    assert vm.boot().returncode == 0
    assert vm.wait_for(lambda: vm.alive("trainer.pid"), 60), vm.debug_log()
    return vm


SAVES_ON_TERM = "trap 'echo SPOTCTL_CHECKPOINT 7; exit 143' TERM; echo SPOTCTL_CHECKPOINT 1; while :; do sleep 0.05; done"


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_sigterm_checkpoint_is_recorded_before_the_job_unit_ends(emu, tmp_path, cloud):
    """systemd stops the job unit: SIGTERM to its main process (KillMode=mixed), and once that exits,
    SIGKILL to everything left in the unit. The checkpoint the trainer wrote on SIGTERM must be an
    event by then (the bash version's follower was killed before its flush, 7 of 7 times)."""
    vm = make(emu, tmp_path, cloud, SAVES_ON_TERM, poll_interval_s=3600, checkpoint_event_s=3600)
    try:
        assert vm.boot().returncode == 0
        assert vm.wait_for(lambda: "checkpoint" in names(vm), 60), vm.debug_log()
        os.kill(vm.pid("run.pid"), signal.SIGTERM)
        assert vm.wait_exit("run.pid", 60), vm.debug_log()
    finally:
        vm.kill_all()  # what systemd does to the rest of the unit, and the power-off
    steps = [e["details"]["step"] for e in vm.events() if e["event"] == "checkpoint"]
    assert steps == ["1", "7"], (names(vm), vm.debug_log())
    # Uploads arrive in any order (step 1's went up in the background and may land after step 7's on a
    # loaded machine); the objects' names carry the event time, which is what readers order by.
    uploaded = sorted((u.name, u.body["details"].get("step")) for u in emu.uploads() if u.body["event"] == "checkpoint")
    assert [step for _, step in uploaded][-1:] == ["7"], uploaded


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_every_stop_path_keeps_the_job_disk_mounted(cloud):
    """A unit with RequiresMountsFor= on the disk is stopped before the disk is unmounted: the job,
    the watcher, AWS's stop hook; GCE's shutdown-script unit (its ExecStop runs the shutdown script)
    is ordered after the mount by a drop-in without requiring it (tests/test_agent_boot_fixes.py)."""
    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="r",
                        mount_point="/mnt/job disk")
    files = unit_files(Config.from_dict(ctx.agent_config()), "/usr/bin/python3", "/var/lib/spotctl/agent.pyz")
    holders = [n for n, text in files.items() if "RequiresMountsFor=/mnt/job disk\n" in text]
    want = ["spotctl-job.service", "spotctl-watch.service"] + (["spotctl-stop.service"] if cloud == "aws" else [])
    assert sorted(holders) == sorted(want)
    if cloud == "gcp":
        assert files[f"{GCE_SHUTDOWN_UNIT}.d/spotctl.conf"] == "[Unit]\nAfter=mnt-job\\x20disk.mount\n"
    # The job unit's stop outlasts the trainer's budget: its main process flushes the checkpoint after.
    budget = ctx.variables()["stop_budget_s"]
    assert f"TimeoutStopSec={budget + 8}\n" in files["spotctl-job.service"] and budget + 8 <= ctx.variables()["notice_s"]


def test_a_gcp_preemption_is_recorded_once_by_two_stop_paths_at_once(emu, tmp_path):
    """Two shutdown paths seeing preempted=TRUE at once (the watcher's and the shutdown script's
    in the field): one claims the notice, the other waits for its record; one `preempted`."""
    vm = training(emu, tmp_path, 3600)
    try:
        emu.preempt_gcp()
        args = ["bash", str(vm.shutdown_script)]
        both = [subprocess.Popen(args, env=vm._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
        assert [p.wait(60) for p in both] == [0, 0]
    finally:
        vm.kill_all()
    assert names(vm).count("preempted") == 1, (names(vm), vm.debug_log())
    assert [e["event"] for e in emu.events()].count("preempted") == 1


def test_a_gcp_preemption_is_recorded_once_when_the_watcher_and_the_shutdown_script_both_see_it(emu, tmp_path):
    vm = training(emu, tmp_path, 1)
    try:
        emu.preempt_gcp()
        assert vm.wait_for(lambda: (vm.state / "notice").exists(), 60)
        done, _ = vm.shutdown()
        assert done.returncode == 0
        assert vm.wait_exit("watch.pid", 60)
    finally:
        vm.kill_all()
    assert names(vm).count("preempted") == 1, (names(vm), vm.debug_log())


def test_the_command_gets_the_vms_variables_and_not_the_callers(emu, tmp_path):
    """Without systemd (a drill) the command gets the caller's PATH and HOME, the job's env and
    spotctl's variables: nothing else of the caller's environment, as on a VM."""
    out = tmp_path / "env"
    vm = make(emu, tmp_path, "gcp", f"{sys.executable} -c 'import json, os; print(json.dumps(dict(os.environ)))' > {out}",
              env={"MY_SETTING": "x"})
    try:
        assert vm.boot(env={"CALLER_ONLY": "leak", "HOME": "/home/someone"}).returncode == 0
        assert vm.wait_exit("run.pid", 60), vm.debug_log()
    finally:
        vm.kill_all()
    import json

    env = json.loads(out.read_text())
    spotctl = set(EXPORTED_VARIABLES) - set(POOL_ONLY) - {"SPOTCTL_RESUME"}
    assert set(env) - {"PWD", "SHLVL", "_", "LC_CTYPE"} == {"PATH", "HOME", "MY_SETTING", *spotctl}
    assert env["HOME"] == "/home/someone" and env["PATH"] == os.environ["PATH"] and "CALLER_ONLY" not in env


def test_on_a_vm_the_command_gets_the_images_login_path(tmp_path, monkeypatch):
    """systemd starts the agent with a bare PATH: the command's PATH is what a login shell of the
    image gets (e.g. AWS's deep learning AMIs add their PyTorch there)."""
    shell = tmp_path / "login-shell"
    shell.write_text('#!/bin/sh\n[ "$1" = -l ] && printf %s /opt/pytorch/bin:/usr/bin:/bin\n')
    shell.chmod(0o755)
    monkeypatch.setattr(Config, "no_systemd", property(lambda self: False))
    cfg = Config(cloud="aws", stack="s", kind="job", name="j", command="x", event_bucket="b", region="r")
    env = image_env(cfg, login_shell=str(shell))
    assert env["PATH"] == "/opt/pytorch/bin:/usr/bin:/bin" and env["HOME"]
    broken = tmp_path / "broken-shell"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    assert image_env(cfg, login_shell=str(broken))["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_user_env_never_overrides_spotctls_variables(tmp_path):
    from agent.trainer import command_env

    cfg = Config(cloud="gcp", stack="s", kind="job", name="j", command="x", event_bucket="b", region="r",
                 env={"SPOTCTL_JOB_ID": "evil", "MASTER_ADDR": "1.2.3.4", "PATH": "/mine"}, mount_point=str(tmp_path))
    env = command_env(cfg, {"PATH": "/image", "HOME": "/root"}, {"SPOTCTL_ATTEMPT": "9"}, str(tmp_path), False)
    assert env["SPOTCTL_JOB_ID"] == "j" and env["MASTER_ADDR"] == "127.0.0.1" and env["SPOTCTL_ATTEMPT"] == "1"
    assert env["PATH"] == "/mine" and "SPOTCTL_RESUME" not in env


@pytest.mark.parametrize("kind,stop", [("job", "preempted"), ("pool", None)])
def test_only_a_job_whose_command_ended_powers_its_vm_off(emu, tmp_path, kind, stop):
    """A preempted job's VM is the cloud's to stop; a pool's agent is a service (its VM never stops itself)."""
    ctx = ScriptContext(cloud="gcp", stack="team-a", kind=kind, name="train", event_bucket="bkt", region="r",
                        command="sleep 600" if stop else "true", poll_interval_s=3600)
    vm = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
    try:
        assert vm.boot().returncode == 0
        if stop:
            assert vm.wait_for(lambda: vm.alive("trainer.pid"), 60)
            emu.preempt_gcp()
            assert vm.shutdown()[0].returncode == 0
        assert vm.wait_exit("run.pid", 60), vm.debug_log()
    finally:
        vm.kill_all()
    assert names(vm)[-1] == ("preempted" if stop else "completed")
    assert emu.state.poweroffs == []
