"""A job survives a reboot (or stop/start) of its VM: the rendered script booted twice on the same
"VM" (same state dir and job disk, LocalVM against the metadata emulator) resumes from the disk,
on both clouds. SPOTCTL_BOOT_ID plays the kernel's boot id (a new one per reboot)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext, scripts_for

TRAINER = Path(__file__).parent / "fixtures" / "trainer.py"


@pytest.fixture
def vm(tmp_path, request):
    vms = []

    def make(cloud: str, env: dict | None = None) -> LocalVM:
        emu = Emulator().__enter__()
        request.addfinalizer(lambda: emu.__exit__(None, None, None))
        ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="bkt", region="us-east-1",
                            command=f"{sys.executable} {TRAINER}", poll_interval_s=1, env={"STEP_S": "0.01", **(env or {})})
        made = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
        vms.append(made)
        return made

    yield make
    for v in vms:
        v.kill_all()


def trainer_log(vm: LocalVM) -> list[str]:
    path = vm.disk / ".spotctl" / "logs" / "attempt-1-node-0.log"
    return [line for line in path.read_text().splitlines() if line.startswith("start ")] if path.exists() else []


def boot(vm: LocalVM, boot_id: str) -> None:
    done = vm.boot(env={"SPOTCTL_BOOT_ID": boot_id})
    assert done.returncode == 0, done.stderr
    assert vm.wait_for(lambda: vm.alive("trainer.pid"), 20), vm.debug_log()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_reboot_resumes_from_the_checkpoint(vm, cloud):
    v = vm(cloud)
    boot(v, "boot-1")
    assert v.wait_for(lambda: len(trainer_log(v)) == 1, 10)
    assert v.wait_for(lambda: (v.disk / ".spotctl" / "events.jsonl").exists(), 10)
    done, _ = v.shutdown()  # a reboot stops the units: the trainer checkpoints
    assert done.returncode == 0, done.stderr
    step = json.loads((v.disk / "checkpoints" / "ckpt.json").read_text())["step"]
    assert step > 0
    v.kill_all()
    boot(v, "boot-2")  # same VM, same disk, new boot: the stop markers of boot 1 are gone
    assert v.wait_for(lambda: len(trainer_log(v)) == 2, 10), v.debug_log()
    assert trainer_log(v) == ["start step=0 resume=0", f"start step={step} resume=1"]
    names = [e["event"] for e in v.events()]
    assert names == ["started", "stopped", "started"]


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_crash_without_checkpoint_still_resumes_because_it_started(vm, cloud):
    v = vm(cloud)
    boot(v, "boot-1")
    assert v.wait_for(lambda: len(trainer_log(v)) == 1, 10)
    v.kill_all()  # power lost: no checkpoint, but the disk knows training started
    boot(v, "boot-2")
    assert v.wait_for(lambda: len(trainer_log(v)) == 2, 10), v.debug_log()
    assert trainer_log(v)[1] == "start step=0 resume=1"


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_startup_script_run_again_in_the_same_boot_starts_nothing_twice(vm, cloud):
    v = vm(cloud)
    boot(v, "boot-1")
    first = v.pid("trainer.pid")
    done = v.boot(env={"SPOTCTL_BOOT_ID": "boot-1"})
    assert done.returncode == 0, done.stderr
    assert v.pid("trainer.pid") == first and v.alive("trainer.pid")
    assert v.wait_for(lambda: len(trainer_log(v)) == 1, 5)
    assert [e["event"] for e in v.events()] == ["started"]


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_units_are_enabled_and_the_disk_is_in_fstab_with_nofail(cloud, tmp_path):
    """The systemd path (not runnable here): units carry [Install] and are enabled; the job unit
    needs the disk's mount; main adds the disk to fstab by UUID with nofail (run with a fake blkid)."""
    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="us-east-1",
                        disk_device="/dev/disk/by-id/x", fstab=str(tmp_path / "fstab"))
    script = scripts_for(ctx).startup
    assert script.count("WantedBy=multi-user.target") == (3 if cloud == "aws" else 2)
    assert 'systemctl enable "${units[@]}"' in script and "RequiresMountsFor=$SPOTCTL_MOUNT" in script
    assert "SPOTCTL_RESUME 1" not in script  # never from the attempt number
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "blkid").write_text("#!/bin/sh\necho 1234-abcd\n")
    (bin_dir / "blkid").chmod(0o755)
    path = tmp_path / "spotctl.sh"
    # Call the function alone: everything before the entry-point dispatch, then spotctl_fstab twice.
    body = script[: script.index('case "${1:-')] + "spotctl_fstab\nspotctl_fstab\n"
    path.write_text(body)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run([shutil.which("bash") or "bash", str(path)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fstab").read_text() == "UUID=1234-abcd /mnt/spotctl auto defaults,discard,nofail,x-systemd.device-timeout=120s 0 2\n"
