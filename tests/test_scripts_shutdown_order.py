"""What systemd does at a stop that the local runs (no systemd) do not, kept in the agent: the job
unit ends only after the trainer's last checkpoint is recorded, and one preemption is one `preempted`
whichever paths see it. The units' order against the job disk's mount is in tests/test_agent_systemd.py
and tests/test_agent_boot_fixes.py; the boot tier (tests/boot/) runs the same under real systemd."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext

TRAINER = Path(__file__).parent / "fixtures" / "trainer.py"


@pytest.fixture
def emu():
    with Emulator() as e:
        yield e


def make_vm(tmp_path: Path, emu: Emulator, cloud: str = "gcp", command: str | None = None, poll_s: int = 1) -> LocalVM:
    ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="events-bkt",
                        region="us-central1", command=command or f"{sys.executable} {TRAINER}", poll_interval_s=poll_s)
    return LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")


def names(vm: LocalVM) -> list[str]:
    return [e["event"] for e in vm.events()]


def test_a_gcp_preemption_seen_by_the_shutdown_script_and_the_watcher_is_recorded_once(tmp_path, emu):
    """The shutdown script classifies the stop as a preemption; a watcher whose poll had begun
    before the script marked the shutdown then sees preempted=TRUE too (its state is recreated by
    removing the marker and starting it). One `preempted`."""
    vm = make_vm(tmp_path, emu, poll_s=3600)
    with vm:
        assert vm.boot().returncode == 0
        assert vm.wait_for(lambda: vm.alive("trainer.pid"), 15), vm.debug_log()
        vm.wait_for(lambda: "started" in names(vm), 10)
        (vm.state / "watch.pid").unlink(missing_ok=True)
        emu.preempt_gcp()
        done, _ = vm.shutdown()
        assert done.returncode == 0, done.stderr
        (vm.state / "shutdown").unlink()
        watcher = subprocess.run(["bash", str(vm.state / "spotctl.sh"), "watch"], env=vm._env(), capture_output=True,
                                 text=True, timeout=60, check=False)
        assert watcher.returncode == 0, watcher.stderr
    assert names(vm).count("preempted") == 1, names(vm)
    assert [e["event"] for e in emu.events()].count("preempted") == 1


def _kill_the_unit_when_run_exits(vm: LocalVM, killed: list[float]) -> None:
    """systemd's end of a unit whose main process exited: SIGKILL to every process left in it (the
    run's process group here: LocalVM starts the run in a session of its own)."""
    deadline = time.monotonic() + 60
    while vm.pid("run.pid") is None and time.monotonic() < deadline:
        time.sleep(0.005)
    pid = vm.pid("run.pid")
    while pid is not None and vm.alive("run.pid") and time.monotonic() < deadline:
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.killpg(pid, signal.SIGKILL)
    killed.append(time.monotonic())


def test_the_job_unit_ends_only_after_its_follower_recorded_the_last_checkpoint(tmp_path, emu):
    """Two checkpoints within the rate limit: the second is held back and recorded by the follower's
    flush once the trainer's output ends. The run must not end first (systemd would kill the follower)."""
    trainer = "echo SPOTCTL_CHECKPOINT 1; sleep 0.3; echo SPOTCTL_CHECKPOINT 2; sleep 0.3"
    vm = make_vm(tmp_path, emu, command=trainer)
    killed: list[float] = []
    with vm:
        assert vm.boot().returncode == 0
        unit = threading.Thread(target=_kill_the_unit_when_run_exits, args=(vm, killed))
        unit.start()
        unit.join(70)
        assert killed, vm.debug_log()
        time.sleep(1.5)  # anything still recording was killed: nothing more can come
    steps = [e["details"].get("step") for e in vm.events() if e["event"] == "checkpoint"]
    assert "completed" in names(vm)
    assert steps == ["1", "2"], (steps, vm.debug_log())
