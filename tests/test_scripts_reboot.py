"""A job survives a reboot (or stop/start) of its VM: the rendered script booted twice on the same
"VM" (same state dir and job disk, LocalVM against the metadata emulator) resumes from the disk,
on both clouds. SPOTCTL_BOOT_ID plays the kernel's boot id (a new one per reboot)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext

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
def test_units_install_and_the_disk_is_in_fstab_with_nofail(cloud, tmp_path, monkeypatch):
    """The systemd path (not runnable here): units carry [Install] (enabled on AWS); the job unit
    needs the disk's mount; main adds the disk to fstab by UUID with nofail, once (a fake blkid)."""
    from agent.config import Config
    from agent.disk import add_to_fstab
    from agent.units import unit_files

    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="us-east-1",
                        disk_device="/dev/disk/by-id/x", fstab=str(tmp_path / "fstab"))
    cfg = Config.from_dict(ctx.agent_config())
    files = unit_files(cfg, "/usr/bin/python3", "/var/lib/spotctl/agent.pyz")
    assert sum("WantedBy=multi-user.target" in text for text in files.values()) == (3 if cloud == "aws" else 2)
    assert "RequiresMountsFor=/mnt/spotctl" in files["spotctl-job.service"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "blkid").write_text("#!/bin/sh\necho 1234-abcd\n")
    (bin_dir / "blkid").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    add_to_fstab(cfg, "/dev/disk/by-id/x")
    add_to_fstab(cfg, "/dev/disk/by-id/x")
    assert (tmp_path / "fstab").read_text() == "UUID=1234-abcd /mnt/spotctl auto defaults,discard,nofail,x-systemd.device-timeout=120s 0 2\n"


# A trainer that runs until DONE exists (in its working directory, the job disk) and on SIGTERM
# saves at once and says so in TERMS.
def waiting_trainer(tmp_path: Path) -> str:
    return (f"trap 'echo term >>{tmp_path}/TERMS; echo SPOTCTL_CHECKPOINT 1; exit 143' TERM; echo 'start waiting'; "
            f"while [ ! -e {tmp_path}/DONE ]; do sleep 0.05; done")


def start_unit(v: LocalVM, entry: str, boot_id: str) -> subprocess.Popen:
    """What systemd does with an enabled unit at boot: run the installed agent's entry point."""
    return v.unit(entry, {"SPOTCTL_BOOT_ID": boot_id})


def preempt(v: LocalVM, emu: Emulator, cloud: str) -> None:
    if cloud == "gcp":
        emu.preempt_gcp()
        done, _ = v.shutdown(env={"SPOTCTL_BOOT_ID": "boot-1"})
        assert done.returncode == 0, done.stderr
    else:
        emu.notice_aws()  # the watcher: notice, SIGTERM, preempted (leaves `notice`, `signaled`, `stopping`)
        assert v.wait_for(lambda: "preempted" in [e["event"] for e in v.events()], 15), v.debug_log()


@pytest.mark.parametrize("ending", ["completes", "is-preempted"])
@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_units_started_before_main_on_a_later_boot_forget_the_last_boots_markers(tmp_path, cloud, ending):
    """A later boot: the enabled units (AWS: always, user data runs at the first boot only; GCP: an
    enable from an older spotctl) start before the startup script. They must not act on the previous
    boot's `stopping`/`signaled`/`notice` (no `completed`, no SIGTERM, an unhandled notice), and main
    running afterwards (GCP) must neither forget their trainer nor start a second one."""
    with Emulator() as emu:
        ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="bkt", region="us-east-1",
                            command=waiting_trainer(tmp_path), poll_interval_s=1, stop_budget_s=5)
        v = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
        units: list[subprocess.Popen] = []
        try:
            boot(v, "boot-1")
            preempt(v, emu, cloud)
            assert (v.state / "signaled").exists() and (v.state / "stopping").exists()
            v.kill_all()
            emu.reset(preempted=False, instance_action=None)
            units += [start_unit(v, "run", "boot-2"), start_unit(v, "watch", "boot-2")]
            assert v.wait_for(lambda: v.alive("trainer.pid") and len(trainer_starts(v)) == 2, 20), v.debug_log()
            first = v.pid("trainer.pid")
            (v.state / "run.pid").write_text(str(units[0].pid))  # what systemd knows: the units are active
            (v.state / "watch.pid").write_text(str(units[1].pid))
            if cloud == "gcp":  # the startup script runs later in the same boot
                done = v.boot(env={"SPOTCTL_BOOT_ID": "boot-2"})
                assert done.returncode == 0, done.stderr
                assert v.pid("trainer.pid") == first and v.alive("trainer.pid")
            if ending == "completes":
                (tmp_path / "DONE").write_text("")
                assert v.wait_for(lambda: units[0].poll() is not None, 20), v.debug_log()
                assert lifecycle(v)[-2:] == ["started", "completed"]
            elif cloud == "gcp":
                emu.preempt_gcp()
                done, _ = v.shutdown(env={"SPOTCTL_BOOT_ID": "boot-2"})
                assert done.returncode == 0, done.stderr
                # The watcher (1 s polls) may see it before the shutdown script does.
                assert lifecycle(v)[-2:] == ["started", "preempted"] or lifecycle(v)[-3:] == [
                    "started", "preemption-notice", "preempted"]
            else:
                emu.notice_aws()
                assert v.wait_for(lambda: lifecycle(v)[-3:] == ["started", "preemption-notice", "preempted"], 20), (
                    lifecycle(v), v.debug_log())
            if ending == "is-preempted":
                assert (tmp_path / "TERMS").read_text() == "term\nterm\n"  # the trainer of boot 2 got its SIGTERM
            assert len(trainer_starts(v)) == 2  # one trainer per boot
        finally:
            for unit in units:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(unit.pid, signal.SIGKILL)
            v.kill_all()


@pytest.mark.parametrize("kind", ["job", "pool"])
@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_later_boot_of_a_completed_job_never_runs_it_again_and_a_pools_agent_does(tmp_path, cloud, kind):
    """AWS starts the enabled units at a stop/start without user data's main: the run itself checks
    the job's completion on its disk (the trainer ran twice). A pool's agent is a service: it starts
    at every boot, whatever its last exit."""
    with Emulator() as emu:
        ctx = ScriptContext(cloud=cloud, stack="team-a", kind=kind, name="train", event_bucket="bkt", region="us-east-1",
                            command=f"echo start; echo x >> {tmp_path}/RUNS", poll_interval_s=1)
        v = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
        try:
            assert v.boot(env={"SPOTCTL_BOOT_ID": "boot-1"}).returncode == 0
            assert v.wait_for(lambda: "completed" in lifecycle(v), 20), v.debug_log()
            v.kill_all()
            unit = start_unit(v, "run", "boot-2")
            assert unit.wait(20) == 0
            if kind == "pool":
                assert (tmp_path / "RUNS").read_text() == "x\nx\n"
                assert lifecycle(v) == ["started", "completed", "started", "completed"]
            else:
                assert (tmp_path / "RUNS").read_text() == "x\n"
                assert lifecycle(v) == ["started", "completed", "completed"]
                assert v.events()[-1]["details"] == {"reason": "already completed"}
        finally:
            v.kill_all()


def lifecycle(v: LocalVM) -> list[str]:
    """The events but the trainer's own (progress, checkpoint)."""
    return [e["event"] for e in v.events() if e["event"] not in ("progress", "checkpoint")]


def trainer_starts(v: LocalVM) -> list[str]:
    path = v.disk / ".spotctl" / "logs" / "attempt-1-node-0.log"
    return [line for line in path.read_text().splitlines() if line.startswith("start")] if path.exists() else []


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_only_aws_enables_the_units(cloud, tmp_path, monkeypatch):
    """GCP reruns the startup script at every boot; an enabled unit would start before it, with the
    previous boot's agent (tested above); AWS runs user data once, so there the units are enabled."""
    from agent.config import Config
    from agent.units import start_systemd

    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >>{calls}\n')
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="us-east-1",
                        systemd_dir=str(tmp_path / "systemd"))
    start_systemd(Config.from_dict(ctx.agent_config()), "/usr/bin/python3", "/var/lib/spotctl/agent.pyz")
    made = calls.read_text().splitlines()
    units = "spotctl-stop.service spotctl-watch.service spotctl-job.service" if cloud == "aws" else \
        "spotctl-watch.service spotctl-job.service"
    assert made == ["daemon-reload", f"{'enable' if cloud == 'aws' else 'disable'} {units}", f"start --no-block {units}"]
    assert (tmp_path / "systemd" / "spotctl-job.service").exists()
    if cloud == "gcp":  # the shutdown script's unit is ordered after the job disk's mount (not requiring it)
        assert (tmp_path / "systemd" / "google-shutdown-scripts.service.d" / "spotctl.conf").read_text() == \
            "[Unit]\nAfter=mnt-spotctl.mount\n"


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_changeover_of_a_later_boot_ends_at_its_own_first_progress_line(tmp_path, cloud):
    """The attempt's log goes on across reboots: the `progress` event of boot 2 comes from boot 2's
    first progress line (here written only once GO exists), not from boot 1's lines."""
    go = tmp_path / "GO"
    command = (f"echo start; if [ -e {tmp_path}/BOOTED ]; then while [ ! -e {go} ]; do sleep 0.05; done; fi; "
               f": >{tmp_path}/BOOTED; echo SPOTCTL_PROGRESS 1; sleep 60")
    with Emulator() as emu:
        ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="bkt", region="us-east-1",
                            command=command, poll_interval_s=60)
        v = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")
        try:
            boot(v, "boot-1")
            assert v.wait_for(lambda: [e["event"] for e in v.events()].count("progress") == 1, 15), v.debug_log()
            v.kill_all()
            boot(v, "boot-2")
            time.sleep(2)  # the follower of boot 2 is reading the log (boot 1's progress line included)
            go_at = time.time()
            go.write_text("")
            assert v.wait_for(lambda: [e["event"] for e in v.events()].count("progress") == 2, 15), v.debug_log()
            second = [e for e in v.events() if e["event"] == "progress"][1]
            at = datetime.datetime.strptime(second["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC).timestamp()
            assert at >= go_at - 0.01, (second["time"], go_at)
        finally:
            v.kill_all()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_line_a_power_loss_cut_short_is_ended_before_the_next_boot_writes(vm, cloud):
    """A trainer may write a line's text and its newline in two writes (unbuffered Python does); a
    power loss between them left the next boot's first line glued to it (once in a suite run)."""
    v = vm(cloud)
    boot(v, "boot-1")
    assert v.wait_for(lambda: len(trainer_log(v)) == 1, 10)
    v.kill_all()
    log = v.disk / ".spotctl" / "logs" / "attempt-1-node-0.log"
    with log.open("a") as fh:
        if not log.read_text().endswith("\n"):
            fh.write("\n")  # the kill itself fell between a line's text and its newline (a loaded machine): one cut line only
        fh.write("step 7 of 10")  # the text of a line whose newline the power loss took
    boot(v, "boot-2")
    assert v.wait_for(lambda: len(trainer_log(v)) == 2, 10), v.debug_log()
    # (the copy on the disk may get the line's newline a moment after the trainer's own record has it:
    # the trainer writes a line's text and its newline apart, as this test's premise says)
    assert v.wait_for(lambda: "\nstep 7 of 10\nstart step=0 resume=1\n" in log.read_text(), 10), log.read_text()
