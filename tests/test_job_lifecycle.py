"""One job's whole life on one disk, run by the real agent (the rendered bootstrap, LocalVM playing
systemd, the emulator playing the metadata server and the bucket): an example stack's job as written
(its code: examples/quickstart packed as launch packs it, its setup) on a fresh disk; the code fetched
with the job's identity and checked; setup once; training; a preemption; a reboot of the same attempt
(setup not run again, the code it started with, even though the user has changed the code since); the
next attempt with the new code (fetched, set up once more, resumed from the checkpoint); completed;
and only then the VM powers itself off."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli.code.prepare import StackContext, pack_dir
from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from cli.lifecycle import stackfile
from infra.common import code_fields
from infra.naming import code_key
from infra.render import ScriptContext

BUCKET = "team-events"
JOB = {"example-gcp": "vit-finetune", "example-aws": "sweep-07"}
# The example's training, slowed so that each stop below comes well before it could finish.
PACE = " --steps 300 --checkpoint-every 20 --step-seconds 0.02"
# Counts setup's runs on the disk, then the example's setup as written.
COUNT = 'echo "$SPOTCTL_CODE_DIR" >>"$SPOTCTL_MOUNT/setup-runs"; '


def entry(stack: str, project: Path):
    cfg = stackfile.load(stackfile.resolve(stack, None))
    return cfg, cfg.job(JOB[stack])


def context(cfg, stack: str, job, attempt: int) -> ScriptContext:
    """The VM's context for ``attempt`` of the entry as it stands: what infra renders (code_fields)."""
    return ScriptContext(cloud=cfg.cloud, stack=stack, kind="job", name=job.id, command=job.command + PACE,
                         event_bucket=BUCKET, region=cfg.region, attempt=attempt, env=job.plain_env,
                         capacity=job.capacity.value, poll_interval_s=1,
                         **{**code_fields(cfg, stack, job, BUCKET), "setup": COUNT + job.setup})


def vm_for(ctx: ScriptContext, emu: Emulator, tmp: Path, n: int) -> LocalVM:
    return LocalVM(local_context(ctx, emu, tmp / "disk", tmp / f"state-{n}"), tmp / f"vm-{n}")


def checkpoints(disk: Path) -> list[int]:
    found = disk / "checkpoints"
    return sorted(int(p.stem.split("-")[1]) for p in found.glob("step-*.json")) if found.is_dir() else []


def code_reads(emu: Emulator) -> list[str]:
    """The code objects downloaded, each with the VM's identity (its token; signed, on AWS)."""
    assert {who for _, name, who in emu.state.downloads if ".spotctl/code/" in name} <= {"vm"}, emu.state.downloads
    return [name for _, name, _ in emu.state.downloads if ".spotctl/code/" in name]


def preempt(emu: Emulator, vm: LocalVM, cloud: str) -> None:
    """What the cloud does: GCE flips `preempted` and runs the shutdown script; EC2 posts the notice
    (the watcher sees it) and stops the instance (the stop hook runs)."""
    if cloud == "gcp":
        emu.preempt_gcp()
    else:
        emu.notice_aws(lead_s=30)
        assert vm.wait_for(lambda: "preempted" in [e["event"] for e in vm.events()], 30), vm.debug_log()
    assert vm.shutdown()[0].returncode == 0
    vm.kill_all()


@pytest.mark.parametrize("stack", ["example-gcp", "example-aws"])
def test_a_job_from_a_fresh_disk_to_completed_and_powered_off(project, tmp_path, stack):
    cfg, job = entry(stack, project)
    archive = pack_dir(job, StackContext(stack, project))
    assert archive.sha256 == job.code_digest  # the digest the example records is the one launch packs
    old = tmp_path / "vm"
    log1 = old / "disk" / ".spotctl" / "logs" / "attempt-1-node-0.log"
    code_a = old / "disk" / "code" / archive.sha256

    with Emulator() as emu:
        emu.put_object(BUCKET, code_key(stack, job.id, archive.sha256), archive.data)

        # Attempt 1, fresh disk: code fetched with the VM's identity, setup once, training.
        vm = vm_for(context(cfg, stack, job, 1), emu, old, 1)
        try:
            assert vm.boot(env={"SPOTCTL_BOOT_ID": "boot-1"}).returncode == 0
            assert vm.wait_for(lambda: checkpoints(vm.disk), 120), (vm.debug_log(), log1.read_text() if log1.exists() else "")
            assert code_reads(emu) == [code_reads(emu)[0]] and archive.sha256 in code_reads(emu)[0]
            assert not emu.state.rejected
            assert (code_a / ".venv" / "bin" / "python").exists()  # setup's venv, on the job disk
            preempt(emu, vm, cfg.cloud)
        finally:
            vm.kill_all()
        events = [e["event"] for e in vm.events()]
        assert events[0] == "started" and events[-1] == "preempted" and "completed" not in events, events
        assert emu.state.poweroffs == []  # a preempted VM is the cloud's to stop
        at_preemption = checkpoints(vm.disk)[-1]

        # Meanwhile the user changes the code: launch/resume would record the new digest with the next attempt.
        train = project / "examples" / "quickstart" / "train.py"
        train.write_text(train.read_text().replace('print("training complete", flush=True)',
                                                   'print("training complete (v2)", flush=True)'))
        archive_b = pack_dir(job, StackContext(stack, project))
        job_b = job.model_copy(update={"code_digest": archive_b.sha256})
        assert archive_b.sha256 != archive.sha256
        emu.put_object(BUCKET, code_key(stack, job.id, archive_b.sha256), archive_b.data)

        # The same attempt reboots on the same disk: its own code, no setup, training resumes.
        emu.reset(preempted=False, instance_action=None)
        reads = len(code_reads(emu))
        vm = vm_for(context(cfg, stack, job, 1), emu, old, 2)
        try:
            assert vm.boot(env={"SPOTCTL_BOOT_ID": "boot-2"}).returncode == 0
            assert vm.wait_for(lambda: checkpoints(vm.disk)[-1] > at_preemption, 60), vm.debug_log()
        finally:
            vm.kill_all()  # a power loss this time
        assert len(code_reads(emu)) == reads  # unpacked already: nothing fetched
        assert f"resuming from step {at_preemption}" in log1.read_text()
        assert log1.read_text().count("spotctl: setup\n") == 1
        assert emu.state.poweroffs == []

        # Attempt 2 from the entry that records the new digest: fetched, set up once more, resumed, done.
        vm = vm_for(context(cfg, stack, job_b, 2), emu, old, 3)
        try:
            assert vm.boot(env={"SPOTCTL_BOOT_ID": "boot-3"}).returncode == 0
            assert vm.wait_exit("run.pid", 120), vm.debug_log()
        finally:
            vm.kill_all()
        assert len(code_reads(emu)) == reads + 1 and archive_b.sha256 in code_reads(emu)[-1]
        log2 = (old / "disk" / ".spotctl" / "logs" / "attempt-2-node-0.log").read_text()
        assert "resuming from step" in log2 and "training complete (v2)" in log2 and "spotctl: setup\n" in log2
        runs = (old / "disk" / "setup-runs").read_text().split()
        assert runs == [str(code_a), str(old / "disk" / "code" / archive_b.sha256)]  # once per code, never on reboot
        model = json.loads((old / "disk" / "code" / archive_b.sha256 / "output" / "model.json").read_text())
        assert model["steps"] == 300
        mine = [e for e in vm.events() if e["attempt"] == 2]
        assert [e["event"] for e in mine][0] == "started" and mine[-1]["event"] == "completed"
        (poweroff,) = emu.state.poweroffs  # once, at the very end, after `completed` reached the bucket
        completed = next(u for u in emu.uploads() if u.body["event"] == "completed")
        assert poweroff["received"] > completed.received and poweroff["argv"] == ["shutdown", "-h", "now"]
        assert not emu.state.rejected
        assert sorted(os.listdir(old / "disk" / "code")) == sorted([archive.sha256, archive_b.sha256])


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
@pytest.mark.parametrize("command", ["true", "exit 3"])
def test_the_shutdown_that_follows_the_self_stop_records_nothing_more(tmp_path, cloud, command):
    """The VM's own power-off runs the shutdown path (GCE's shutdown script, AWS's stop hook): after a
    command that ended on its own, completed or failed, it has nothing to stop and nothing to record."""
    ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket=BUCKET, region="r",
                        command=command, poll_interval_s=1)
    with Emulator() as emu:
        vm = vm_for(ctx, emu, tmp_path, 1)
        try:
            assert vm.boot().returncode == 0
            assert vm.wait_exit("run.pid", 30), vm.debug_log()
            assert len(emu.state.poweroffs) == 1
            before = [e["event"] for e in vm.events()]
            assert vm.shutdown()[0].returncode == 0  # what the OS does as it powers off
        finally:
            vm.kill_all()
        assert [e["event"] for e in vm.events()] == before == ["started", "completed" if command == "true" else "failed"]
        assert [e["event"] for e in emu.events()].count("stopped") == 0
