"""The rendered scripts, executed with bash against the local metadata emulator and event sink.

Each test boots a "VM" (LocalVM: a temp dir plays the job disk, background processes play the
systemd units), runs a fake trainer, makes the cloud do something and asserts what was recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cli.drill.emulator import Emulator, Fault
from cli.drill.localvm import LocalVM, local_context
from cli.lifecycle.events import Event
from cli.lifecycle.states import attempt_outcome
from infra.basics import JobState
from infra.render import NOTICE_S, TRAINER_STOP_BUDGET_S, ScriptContext
from tests.conftest import gce_watcher_looked

TRAINER = Path(__file__).parent / "fixtures" / "trainer.py"
EVENT_KEYS = {"stack", "kind", "job", "attempt", "node", "event", "time", "instance", "zone", "details"}


@pytest.fixture
def emu():
    with Emulator() as e:
        yield e


@pytest.fixture
def make_vm(tmp_path, emu):
    vms: list[LocalVM] = []

    def make(cloud="gcp", attempt=1, env=None, command=None, disk=None, stop_budget_s=None, poll_s=1, **ctx_over):
        ctx = ScriptContext(
            cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="events-bkt", region="us-central1",
            command=command or f"{sys.executable} {TRAINER}", attempt=attempt, env=env or {},
            poll_interval_s=poll_s, stop_budget_s=stop_budget_s, **ctx_over,
        )
        disk = disk or tmp_path / "disk"
        vm = LocalVM(local_context(ctx, emu, disk, tmp_path / f"state-{attempt}-{len(vms)}"), tmp_path / f"vm-{attempt}-{len(vms)}")
        vms.append(vm)
        return vm

    yield make
    for vm in vms:
        vm.kill_all()


def said(vm: LocalVM, marker: str) -> int:
    """How many lines of the job's logs start with ``marker``."""
    return sum(("\n" + p.read_text(errors="replace")).count("\n" + marker)
               for p in (vm.disk / ".spotctl" / "logs").glob("*.log"))


def boot_and_train(vm: LocalVM, min_steps: float = 0.3, started: str | None = "start step=") -> None:
    """Boot, and wait until the command says ``started`` (the fixture trainer says it once its SIGTERM
    handler is in): a signal sent while a loaded machine is still starting the interpreter kills it
    before it can checkpoint, which no test here is about."""
    before = said(vm, started) if started else 0
    done = vm.boot()
    assert done.returncode == 0, done.stderr
    assert vm.wait_for(lambda: vm.alive("trainer.pid"), 15), vm.debug_log()
    if started:
        assert vm.wait_for(lambda: said(vm, started) > before, 30), vm.debug_log()
    time.sleep(min_steps)


def names(events) -> list[str]:
    return [e["event"] for e in events]


def uploaded(emu: Emulator) -> list[str]:
    return [e["event"] for e in emu.events()]


def checkpoint(vm: LocalVM) -> dict:
    return json.loads((vm.disk / "checkpoints" / "ckpt.json").read_text())


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


# ---- GCP ------------------------------------------------------------------------------------------


def test_gcp_preemption_checkpoints_and_records_preempted(make_vm, emu):
    vm = make_vm("gcp", poll_s=3600)  # the watcher looks once, before the flip: the shutdown script sees the preemption
    boot_and_train(vm)
    assert vm.wait_for(lambda: gce_watcher_looked(emu), 60)
    flipped = emu.preempt_gcp()
    done, seconds = vm.shutdown()
    assert done.returncode == 0, done.stderr
    # The shutdown script takes the notice path the watcher takes: `preemption-notice` (what `status` and
    # `resume` read as "checkpointing now"), the trainer's budget, then one `preempted`.
    assert names(vm.events()) == ["started", "preemption-notice", "preempted"]
    assert sorted(uploaded(emu)) == ["preempted", "preemption-notice", "started"]  # the notice goes up in the background
    ev = vm.events()[-1]
    assert set(ev) == EVENT_KEYS
    assert ev["details"] == {"source": "shutdown-script", "preempted": "TRUE"}
    assert (ev["job"], ev["attempt"], ev["node"], ev["instance"], ev["zone"]) == ("train", 1, 0, "vm-1", "us-central1-a")
    ck = checkpoint(vm)
    assert ck["saved_at"] - ck["term_at"] >= 0.25  # the trainer got SIGTERM and had time to checkpoint
    assert not vm.alive("trainer.pid")
    assert seconds < NOTICE_S["gcp"]
    preempted_upload = next(u for u in emu.uploads() if u.body["event"] == "preempted")
    # Its latency is bench/scripts_latency.py's to measure (a loaded machine makes any bound flaky).
    assert preempted_upload.received >= flipped
    assert preempted_upload.name.startswith("team-a/train/attempt-1/node-0/") and preempted_upload.bucket == "events-bkt"
    assert emu.state.rejected == []


def test_gcp_normal_stop_records_stopped(make_vm, emu):
    vm = make_vm("gcp")
    boot_and_train(vm)
    done, _ = vm.shutdown()
    assert done.returncode == 0
    assert names(vm.events()) == ["started", "stopped"]
    assert vm.events()[-1]["details"] == {"preempted": "FALSE"}
    assert "term_at" in checkpoint(vm)  # a normal stop also lets the trainer checkpoint


def test_gcp_watcher_sees_preemption_before_the_shutdown_script(make_vm, emu):
    vm = make_vm("gcp", poll_s=1)
    boot_and_train(vm)
    emu.preempt_gcp()
    assert vm.wait_for(lambda: "preempted" in names(vm.events()), 10), vm.debug_log()
    done, seconds = vm.shutdown()
    assert done.returncode == 0 and seconds < 5
    assert names(vm.events()) == ["started", "preemption-notice", "preempted"]
    assert "term_at" in checkpoint(vm)


def test_gcp_host_maintenance_checkpoints_and_is_not_a_preemption(make_vm, emu):
    """A VM without GPUs gets GCE's 60 s notice: the trainer is stopped at once, `stopped` recorded
    with the reason, the VM powered off; the stop path that follows records nothing more."""
    vm = make_vm("gcp", poll_s=1)
    boot_and_train(vm)
    emu.reset(maintenance_event="TERMINATE_ON_HOST_MAINTENANCE")
    assert vm.wait_for(lambda: "maintenance-notice" in names(vm.events()), 10)
    assert vm.wait_for(lambda: "stopped" in names(vm.events()), 15), vm.debug_log()
    assert vm.wait_for(lambda: not vm.alive("trainer.pid"), 10) and "term_at" in checkpoint(vm)
    assert vm.wait_for(lambda: len(emu.state.poweroffs) == 1, 10)
    vm.shutdown()
    assert names(vm.events()) == ["started", "maintenance-notice", "stopped"]
    details = vm.events()[-1]["details"]
    assert (details["reason"], details["maintenance_event"]) == ("host-maintenance", "TERMINATE_ON_HOST_MAINTENANCE")


def test_gcp_gpu_vm_trains_through_the_maintenance_notice(make_vm, emu, tmp_path):
    """A GPU VM's notice comes an hour ahead (here shortened to 38 s: budget 2 s + 30 s of uploads + a
    poll leave ~5 s): the trainer keeps training after the notice and is stopped only at its time."""
    device = tmp_path / "nvidiactl"
    device.write_text("")
    vm = make_vm("gcp", poll_s=1, stop_budget_s=2)
    done = vm.boot(env={"SPOTCTL_NVIDIA_DEVICE": str(device), "SPOTCTL_MAINTENANCE_NOTICE_S": "38"})
    assert done.returncode == 0, done.stderr
    assert vm.wait_for(lambda: vm.alive("trainer.pid"), 15), vm.debug_log()
    emu.reset(maintenance_event="TERMINATE_ON_HOST_MAINTENANCE")
    assert vm.wait_for(lambda: "stopped" in names(vm.events()), 30), vm.debug_log()
    assert vm.wait_for(lambda: not vm.alive("trainer.pid"), 10)
    notice, stopped = vm.events()[1:]
    assert (notice["event"], stopped["details"]["reason"]) == ("maintenance-notice", "host-maintenance")
    # The trainer's SIGTERM came at the planned time, seconds after the notice, not at it.
    planned = datetime.strptime(notice["details"]["checkpoint_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    noticed = datetime.fromisoformat(notice["time"].replace("Z", "+00:00")).timestamp()
    assert planned - noticed >= 3 and checkpoint(vm)["term_at"] >= planned


def test_trainer_gets_exactly_one_sigterm(make_vm, emu, tmp_path):
    counter = tmp_path / "terms"
    cmd = f"trap 'echo x >> {counter}' TERM; echo trapped; while true; do sleep 0.1; done"
    vm = make_vm("gcp", command=cmd, stop_budget_s=2, poll_s=1)
    boot_and_train(vm, started="trapped")
    emu.preempt_gcp()
    assert vm.wait_for(lambda: "preemption-notice" in names(vm.events()), 10)
    vm.shutdown()  # the shutdown script must not signal again
    time.sleep(0.5)
    assert counter.read_text().count("x") == 1


# ---- job outcomes (both clouds share the runner) ------------------------------------------------


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_completed_and_not_run_again(make_vm, emu, cloud):
    vm = make_vm(cloud, env={"STEPS": "20"})
    assert vm.boot().returncode == 0
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    assert names(vm.events()) == ["started", "completed"]
    assert (vm.disk / ".spotctl" / "completed").exists()
    again = make_vm(cloud, attempt=2, env={"STEPS": "20"})
    assert again.boot().returncode == 0
    assert not again.alive("run.pid")
    assert names(again.events()) == ["started", "completed", "completed"]
    assert again.events()[-1]["details"] == {"reason": "already completed"}


@pytest.mark.parametrize("cloud,capacity,machine", [("gcp", "spot", "a2-highgpu-1g"), ("aws", "on-demand", "p4d.24xlarge")])
def test_started_says_what_the_attempt_runs_on(make_vm, emu, cloud, capacity, machine):
    vm = make_vm(cloud, attempt=2, env={"STEPS": "5"}, capacity=capacity, machine_type=machine, node_rank=1, world_size=2)
    assert vm.boot().returncode == 0
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    started = vm.events()[0]
    assert (started["event"], started["attempt"], started["node"]) == ("started", 2, 1)
    assert started["details"] == {"capacity": capacity, "machineType": machine, "nodes": "2"}


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_first_progress_line_is_recorded_once(make_vm, emu, cloud):
    """The end of the changeover, for the policy: the first SPOTCTL_PROGRESS or SPOTCTL_CHECKPOINT line."""
    cmd = "echo loading; sleep 1; echo SPOTCTL_PROGRESS 1/3; echo SPOTCTL_CHECKPOINT 1; echo SPOTCTL_PROGRESS 2/3; sleep 1"
    vm = make_vm(cloud, command=cmd)
    assert vm.boot().returncode == 0
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    want = ["checkpoint", "completed", "progress", "started"]
    assert vm.wait_for(lambda: sorted(names(vm.events())) == want, 10), names(vm.events())
    started, progress = (next(e for e in vm.events() if e["event"] == name) for name in ("started", "progress"))
    assert progress["time"] >= started["time"] and progress["attempt"] == 1
    log = (vm.disk / ".spotctl" / "logs" / "attempt-1-node-0.log").read_text()
    assert log == "loading\nSPOTCTL_PROGRESS 1/3\nSPOTCTL_CHECKPOINT 1\nSPOTCTL_PROGRESS 2/3\n"


def test_checkpoint_events_are_rate_limited_and_the_newest_is_kept(make_vm, emu, tmp_path):
    """Five checkpoints within a second, at most one event a minute: the first, and the newest when the
    trainer exits (with the time its line was seen), so the bucket is not flooded and nothing is missed."""
    cmd = "for i in 1 2 3 4 5; do echo SPOTCTL_PROGRESS $i/5; echo SPOTCTL_CHECKPOINT $i; sleep 0.1; done; sleep 1"
    vm = make_vm("gcp", command=cmd, checkpoint_event_s=60)
    assert vm.boot().returncode == 0
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    assert vm.wait_for(lambda: names(vm.events()).count("checkpoint") == 2, 10), names(vm.events())
    first, newest = (e for e in vm.events() if e["event"] == "checkpoint")
    assert (first["details"], newest["details"]["step"]) == ({"step": "1"}, "5")
    assert first["time"] <= newest["details"]["at"] <= newest["time"]
    assert vm.wait_for(lambda: uploaded(emu).count("checkpoint") == 2, 10), uploaded(emu)
    every = make_vm("aws", command=cmd, checkpoint_event_s=0, disk=tmp_path / "disk-2")  # no limit: every checkpoint
    assert every.boot().returncode == 0
    assert every.wait_exit("run.pid", 20), every.debug_log()
    assert every.wait_for(lambda: [e["details"]["step"] for e in every.events() if e["event"] == "checkpoint"] == list("12345"), 10)


# A trainer printing progress every 10 ms and checkpointing every 20 steps; on SIGTERM it either
# saves (the step it reached) or just exits.
LOOP = ('while [ $i -lt 100000 ]; do i=$((i+1)); echo "SPOTCTL_PROGRESS $i/100000"; '
        '[ $((i % 20)) -ne 0 ] || echo "SPOTCTL_CHECKPOINT $i"; sleep 0.01; done')
SAVES_ON_TERM = "i=0; trap 'echo \"SPOTCTL_CHECKPOINT $i\"; exit 143' TERM; " + LOOP
EXITS_ON_TERM = "i=0; trap 'exit 143' TERM; " + LOOP


@pytest.mark.parametrize("cloud,command", [("gcp", SAVES_ON_TERM), ("aws", EXITS_ON_TERM)])
def test_a_preemption_says_how_far_training_got_and_the_last_checkpoint(make_vm, emu, cloud, command):
    """What `spotctl cost` needs for the work lost: `preempted` carries the newest progress step and the
    newest checkpoint is an event (the rate limit held it back, or the trainer wrote it on SIGTERM)."""
    from cli.cost.ledger import job_ledger
    from cli.lifecycle.events import Event
    from infra.config import validate

    # GCP: the shutdown script's path (a watcher polling every minute does not see the preemption first).
    vm = make_vm(cloud, command=command, poll_s=60 if cloud == "gcp" else 1, stop_budget_s=5)
    boot_and_train(vm, min_steps=1.5, started="SPOTCTL_PROGRESS")
    # the first checkpoint is recorded at once (in the background): let it land before the preemption
    assert vm.wait_for(lambda: "checkpoint" in names(vm.events()), 15), vm.debug_log()
    if cloud == "gcp":
        emu.preempt_gcp()
        done, _ = vm.shutdown()  # the shutdown script: `preempted` first, then the trainer's checkpoint
        assert done.returncode == 0, done.stderr
    else:
        emu.notice_aws()  # the watcher: notice, the trainer stops, then `preempted`
        assert vm.wait_for(lambda: "preempted" in names(vm.events()), 15), vm.debug_log()
    assert vm.wait_for(lambda: "preempted" in uploaded(emu), 10)
    events = vm.events()
    preempted = next(e for e in events if e["event"] == "preempted")
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    log = (vm.disk / ".spotctl" / "logs" / "attempt-1-node-0.log").read_text().splitlines()
    last_ckpt = int([line for line in log if line.startswith("SPOTCTL_CHECKPOINT")][-1].split()[1])
    assert checkpoints[0]["details"] == {"step": "20"}  # the first one, at once
    assert int(checkpoints[-1]["details"]["step"]) == last_ckpt and len(checkpoints) == 2  # the rest held back
    progress = int(preempted["details"]["progress"])
    cfg = validate({"cloud": cloud, "project": "p", "region": "us-central1" if cloud == "gcp" else "us-east-1",
                    "zones": ["us-central1-a" if cloud == "gcp" else "us-east-1a"],
                    "jobs": [{"id": "train", "machineType" if cloud == "gcp" else "instanceType": "g2-standard-8" if cloud == "gcp" else "g5.2xlarge",
                              "zone": "us-central1-a" if cloud == "gcp" else "us-east-1a", "command": "x", "state": "running"}]}, "f")
    parsed = [Event.parse(e) for e in events]
    (attempt,) = job_ledger(cfg.jobs[0], parsed, max(e.time for e in parsed)).attempts
    if command is SAVES_ON_TERM:
        assert last_ckpt >= progress  # saved on SIGTERM: every step the preemption saw (its stamp may precede `preempted`'s)
        assert (attempt.lost_steps, attempt.lost_hours) == (0, 0.0)
    else:
        assert 0 <= progress - last_ckpt < 20 + 2  # at most a checkpoint interval (and a line in flight)
        # (a preemption landing right on a checkpoint step loses nothing: 1 time in 20)
        assert attempt.lost_steps == progress - last_ckpt and (attempt.lost_hours > 0) == (progress > last_ckpt)


def exited_holding_the_log(make_vm, cloud: str, tmp_path: Path, hold_s: float, exit_code: int = 0) -> LocalVM:
    """A VM whose trainer has exited (``exit_code``) while a process it left holds its log's pipe for
    ``hold_s`` seconds: its run waits for tee that long (at most 5 s) before recording the end."""
    holder = tmp_path / "holder.pid"
    vm = make_vm(cloud, command=f"setsid sleep {hold_s} & echo $! > {holder}" + (f"; exit {exit_code}" if exit_code else ""))
    assert vm.boot().returncode == 0
    assert vm.wait_for(lambda: holder.exists() and not vm.alive("trainer.pid"), 15), vm.debug_log()
    return vm


def outcome(vm: LocalVM) -> JobState | None:
    """What the VM's recorded events say of attempt 1, as spotctl reads them."""
    return attempt_outcome([Event("train", e["attempt"], e["node"], e["event"], datetime.now(UTC)) for e in vm.events()], 1)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_notice_as_the_trainer_finishes_does_not_undo_the_completion(make_vm, emu, cloud, tmp_path):
    """The trainer exits 0; the run then waits for the log (a process it left holds the pipe: here
    4 s; an upload does the same on a loaded VM); a notice in that wait used to make the finished job
    a preempted one (no `completed`, a new attempt). Found by the drill on a loaded CI machine."""
    vm = exited_holding_the_log(make_vm, cloud, tmp_path, 4)
    emu.notice_aws() if cloud == "aws" else emu.preempt_gcp()
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    time.sleep(1.5)  # the watcher's next poll sees the notice
    done, _ = vm.shutdown()
    assert done.returncode == 0, done.stderr
    assert "completed" in names(vm.events()) and "preempted" not in names(vm.events()), (names(vm.events()), vm.debug_log())
    assert outcome(vm) is JobState.COMPLETED
    assert (vm.disk / ".spotctl" / "completed").exists()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_stop_of_the_unit_as_the_trainer_finishes_still_records_completed(make_vm, emu, cloud, tmp_path):
    """The stop path runs first (it records nothing for a finished job), then systemd SIGTERMs the
    job unit (KillMode=mixed) while its run waits for the log: the run still records `completed`
    (it used to die there, leaving no end event at all)."""
    vm = exited_holding_the_log(make_vm, cloud, tmp_path, 4.5)  # the run's wait for tee: at most 5 s
    assert vm.wait_for(lambda: (vm.disk / ".spotctl" / "completed").exists(), 5), vm.debug_log()
    done, _ = vm.shutdown()
    assert done.returncode == 0, done.stderr
    assert vm.alive("run.pid"), "the run ended before the unit's stop: this machine is too slow for the test's window"
    os.kill(vm.pid("run.pid"), signal.SIGTERM)
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    assert names(vm.events()) == ["started", "completed"], vm.debug_log()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_trainer_that_failed_before_a_stop_is_failed_not_stopped(make_vm, emu, cloud, tmp_path):
    """It exited 3 on its own; a stop came while its run waited for the log: `failed` (counted against
    maxFailures), not `stopped` (a new attempt, the failure forgotten)."""
    vm = exited_holding_the_log(make_vm, cloud, tmp_path, 4.5, exit_code=3)
    done, _ = vm.shutdown()
    assert done.returncode == 0, done.stderr
    assert vm.alive("run.pid"), "the run ended before the unit's stop: this machine is too slow for the test's window"
    os.kill(vm.pid("run.pid"), signal.SIGTERM)
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    assert ("failed", {"exit_code": "3"}) in [(e["event"], e["details"]) for e in vm.events()], vm.debug_log()
    assert outcome(vm) is JobState.FAILED  # the stop path, which found no trainer, may record `stopped` too: moot


def test_a_gang_node_that_completed_runs_again_in_a_later_attempt_and_a_single_node_never(make_vm, emu, tmp_path):
    """A gang's later attempt (another node was preempted mid-work) needs every rank for its
    rendezvous: a node's completion counts within its own attempt only. One node: never again."""
    runs = tmp_path / "RUNS"
    gang = make_vm("gcp", attempt=3, command=f"echo x >> {runs}", world_size=2)
    assert gang.boot().returncode == 0
    assert gang.wait_for(lambda: "completed" in names(gang.events()), 20), gang.debug_log()
    later = make_vm("gcp", attempt=4, command=f"echo x >> {runs}", world_size=2)
    assert later.boot().returncode == 0
    assert later.wait_for(lambda: names(later.events()).count("completed") == 2, 20), later.debug_log()
    assert runs.read_text() == "x\nx\n" and later.events()[-1]["details"] == {}
    # within its attempt it never runs again, also when a power loss left the marker empty (its event says it)
    (later.disk / ".spotctl" / "completed").write_text("")
    rebooted = make_vm("gcp", attempt=4, command=f"echo x >> {runs}", world_size=2)
    assert rebooted.boot().returncode == 0
    assert runs.read_text() == "x\nx\n" and rebooted.events()[-1]["details"] == {"reason": "already completed"}
    alone = make_vm("gcp", attempt=5, command=f"echo x >> {runs}", disk=tmp_path / "disk1")
    assert alone.boot().returncode == 0 and alone.wait_for(lambda: "completed" in names(alone.events()), 20)
    again = make_vm("gcp", attempt=6, command=f"echo x >> {runs}", disk=tmp_path / "disk1")
    assert again.boot().returncode == 0
    assert runs.read_text() == "x\nx\nx\n" and again.events()[-1]["details"] == {"reason": "already completed"}


def test_failed_records_exit_code(make_vm, emu):
    vm = make_vm("aws", env={"STEPS": "5", "EXIT_CODE": "3"})
    vm.boot()
    assert vm.wait_exit("run.pid", 20)
    assert names(vm.events()) == ["started", "failed"]
    assert vm.events()[-1]["details"] == {"exit_code": "3"}
    assert uploaded(emu) == ["started", "failed"]
    assert emu.state.rejected == []  # every S3 PUT carried a valid SigV4 signature


def test_resume_environment(make_vm, emu, tmp_path):
    out = tmp_path / "env.txt"
    cmd = f"env | grep -E '^(SPOTCTL_|MASTER_|NODE_RANK|WORLD_SIZE|MY_)' | sort > {out}"
    vm = make_vm("gcp", attempt=3, command=cmd, env={"MY_VAR": "a b 'c' $HOME"}, node_rank=1, world_size=4, master_addr="10.1.2.3")
    (vm.disk / "checkpoints").mkdir(parents=True)
    (vm.disk / "checkpoints" / "last.pt").write_text("x")  # SPOTCTL_RESUME comes from the disk, not the attempt
    vm.boot()
    assert vm.wait_exit("run.pid", 20)
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["SPOTCTL_JOB_ID"] == "train" and env["SPOTCTL_ATTEMPT"] == "3" and env["SPOTCTL_RESUME"] == "1"
    assert env["SPOTCTL_CHECKPOINT_DIR"] == f"{vm.disk}/checkpoints"
    assert (env["MASTER_ADDR"], env["NODE_RANK"], env["WORLD_SIZE"]) == ("10.1.2.3", "1", "4")
    assert env["MY_VAR"] == "a b 'c' $HOME"


def test_first_attempt_is_not_a_resume(make_vm, emu, tmp_path):
    out = tmp_path / "resume.txt"
    vm = make_vm("gcp", command=f"echo \"[${{SPOTCTL_RESUME:-}}]\" > {out}")
    vm.boot()
    assert vm.wait_exit("run.pid", 20)
    assert out.read_text() == "[]\n"


# ---- AWS ------------------------------------------------------------------------------------------


def test_aws_spot_notice_checkpoints_then_records_preempted(make_vm, emu):
    vm = make_vm("aws", poll_s=1, env={"CKPT_S": "1.0"})
    boot_and_train(vm)
    noticed = emu.notice_aws()
    assert vm.wait_for(lambda: "preempted" in uploaded(emu), 15), vm.debug_log()
    events = vm.events()
    assert names(events) == ["started", "preemption-notice", "preempted"]
    assert json.loads(events[1]["details"]["instance_action"])["action"] == "terminate"
    ck = checkpoint(vm)
    assert ck["saved_at"] - ck["term_at"] >= 0.95
    # `preempted` is recorded once the trainer has stopped, i.e. after its checkpoint was saved.
    preempted = next(u for u in emu.uploads() if u.body["event"] == "preempted")
    notice = next(u for u in emu.uploads() if u.body["event"] == "preemption-notice")
    # The watcher's poll saw the notice (its latency is bench/scripts_latency.py's to measure);
    # the trainer then had its whole checkpoint time before `preempted` was recorded (the event's own
    # time, ms, against the checkpoint's: not the uploads' arrival, as the notice's goes on in the
    # background and may arrive late on a loaded machine).
    assert notice.received >= noticed
    recorded_ms = round(datetime.fromisoformat(preempted.body["time"].replace("Z", "+00:00")).timestamp() * 1000)
    assert recorded_ms >= int(ck["saved_at"] * 1000)
    assert emu.state.rejected == []
    # The stop that follows at the 2-minute mark records nothing new.
    vm.shutdown()
    assert names(vm.events()) == ["started", "preemption-notice", "preempted"]


def test_aws_normal_stop_records_stopped(make_vm, emu):
    vm = make_vm("aws", poll_s=1)
    boot_and_train(vm)
    done, _ = vm.shutdown()
    assert done.returncode == 0
    assert names(vm.events()) == ["started", "stopped"]
    assert "term_at" in checkpoint(vm)


def test_aws_rebalance_recommendation_recorded_once(make_vm, emu):
    vm = make_vm("aws", poll_s=1)
    boot_and_train(vm)
    emu.reset(rebalance={"noticeTime": "2026-11-21T08:22:00Z"})
    assert vm.wait_for(lambda: "rebalance-recommendation" in names(vm.events()), 10)
    time.sleep(2.5)
    assert names(vm.events()).count("rebalance-recommendation") == 1
    assert vm.alive("trainer.pid")  # a recommendation is not a notice: training goes on


def test_imds_requires_the_token(emu):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{emu.url}/latest/meta-data/instance-id", timeout=2)
    assert err.value.code == 401


# ---- faults: every script finishes inside its budget ----------------------------------------------

FAULTS = {
    "metadata-slow": {"metadata_fault": Fault(delay_s=5)},
    "metadata-5xx": {"metadata_fault": Fault(status=503)},
    "metadata-unreachable": "metadata",
    "sink-slow": {"sink_fault": Fault(delay_s=5)},
    "sink-5xx": {"sink_fault": Fault(status=500)},
    "sink-unreachable": "sink",
}


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_shutdown_path_finishes_in_budget_under_faults(make_vm, emu, cloud, fault):
    stop_budget, record_budget = 2, 2
    over = {}
    if FAULTS[fault] == "metadata":
        over["metadata_url"] = closed_port_url()
    elif FAULTS[fault] == "sink":
        over["storage_url"] = closed_port_url()
    vm = make_vm(cloud, stop_budget_s=stop_budget, poll_s=60, env={"IGNORE_TERM": "1"})
    boot_and_train(vm)  # (the bootstrap needs both to fetch the agent: the faults begin after the boot)
    if over:
        from dataclasses import replace

        vm = LocalVM(replace(vm.ctx, **over), vm.workdir)  # the stop path's own settings
    if isinstance(FAULTS[fault], dict):
        emu.reset(**FAULTS[fault])
    if cloud == "gcp":
        emu.preempt_gcp()
    else:
        emu.notice_aws()
    done, seconds = vm.shutdown(env={"SPOTCTL_RECORD_BUDGET_S": str(record_budget)})
    assert done.returncode == 0, done.stderr
    # Bounded by the trainer's budget, or the recorder's, plus a few short metadata timeouts (~9 s in
    # all): well inside the cloud's notice, the deadline that matters, however loaded the machine.
    assert seconds < NOTICE_S[cloud], (seconds, vm.debug_log())
    events = names(vm.events())
    assert events[-1] in ("preempted", "stopped", "checkpoint-timeout"), events
    assert "checkpoint-timeout" in events  # the trainer ignored SIGTERM: that is recorded too
    if fault.startswith("sink"):  # the recorder gave up at its budget instead of waiting on the bucket
        assert f"not uploaded within {record_budget}s" in vm.debug_log(), vm.debug_log()


def test_gcp_worst_case_at_real_budgets_fits_the_30s_notice(make_vm, emu):
    """Trainer ignores SIGTERM, metadata and bucket unreachable: still done before the hard stop."""
    from dataclasses import replace

    vm = make_vm("gcp", poll_s=60, env={"IGNORE_TERM": "1"})
    boot_and_train(vm)  # (the bootstrap needs both to fetch the agent: the stop path's settings lose them)
    vm = LocalVM(replace(vm.ctx, metadata_url=closed_port_url(), storage_url=closed_port_url()), vm.workdir)
    done, seconds = vm.shutdown()
    assert done.returncode == 0
    assert seconds < NOTICE_S["gcp"] - 2, seconds
    assert TRAINER_STOP_BUDGET_S["gcp"] <= seconds  # it did give the trainer its whole budget
    # The stop is classified (and recorded) first, then the trainer's budget runs out.
    assert names(vm.events())[-2:] == ["stopped", "checkpoint-timeout"]
    assert vm.events()[-2]["details"] == {"preempted": "unknown"}


def test_gcp_worst_case_when_the_watcher_sees_the_notice_first_fits_the_30s_notice(make_vm, emu):
    """The other ordering: the watcher sees preempted=TRUE first, a whole poll (5 s, the real interval)
    after it flipped, and the shutdown script finds its notice. Trainer ignores SIGTERM, bucket
    unreachable (every record spends its budget). From the flip, the watcher's path (trainer, tee, the
    checkpoint flush, then `preempted` in the foreground) and the shutdown script both end inside the
    30 s. The old path took a poll + 20 + 2 + 2 + 10 (`preempted` at the default budget) ≈ 39 s."""
    from dataclasses import replace

    vm = make_vm("gcp", poll_s=5, env={"IGNORE_TERM": "1"})
    boot_and_train(vm)
    # The bucket stops answering (after the bootstrap fetched the agent): every record spends its budget.
    emu.reset(sink_fault=Fault(delay_s=40))
    vm = LocalVM(replace(vm.ctx, storage_url=closed_port_url()), vm.workdir)  # the shutdown script's too

    def polls() -> int:
        return sum(1 for m, p in emu.state.requests if m == "GET" and p.endswith("/instance/preempted"))

    seen = polls()
    assert vm.wait_for(lambda: polls() > seen, 15), vm.debug_log()
    flipped = emu.preempt_gcp()  # just after a poll: the watcher sees it one poll later
    assert vm.wait_for(lambda: (vm.state / "notice").exists(), 15), vm.debug_log()
    done, _ = vm.shutdown()
    assert done.returncode == 0, done.stderr
    assert vm.wait_exit("watch.pid", 60), vm.debug_log()
    ended = time.monotonic()
    assert ended - flipped < NOTICE_S["gcp"] - 2, (ended - flipped, vm.debug_log())
    assert names(vm.events())[-1] == "preempted", names(vm.events())
    assert "checkpoint-timeout" in names(vm.events())


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_trainer_log_is_uploaded_next_to_the_events(make_vm, emu, cloud, tmp_path):
    """Chunks named by byte offset under .../attempt-N/node-R/logs/; `spotctl logs` joins them."""
    from cli.lifecycle import logs

    command = "printf 'step 1\\n'; printf 'caf\\303\\251 \\n\\n'; printf 'last line\\n'"
    vm = make_vm(cloud, attempt=2, command=command)
    assert vm.boot().returncode == 0
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    assert names(vm.events()) == ["started", "completed"]
    chunks = dict(emu.state.log_chunks)
    assert chunks and all(n.startswith("team-a/train/attempt-2/node-0/logs/") for n in chunks), chunks
    disk_copy = (vm.disk / ".spotctl" / "logs" / "attempt-2-node-0.log").read_bytes()
    assert logs.read(None, "train", logs.LogKey(2, 0), chunks) == disk_copy == "step 1\ncafé \n\nlast line\n".encode()


# ---- the trainer is its whole process group; the stop path reads the log after tee -------------


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_stop_waits_for_the_trainers_group_not_its_leader(make_vm, emu, cloud):
    """`a; b` keeps bash as the trainer's leader: on SIGTERM it dies at once while its child (here the
    fake trainer, 7 s to checkpoint: longer than run waits for tee) saves on. The stop path and the job's
    run wait for the whole group; systemd SIGKILLs whatever is left of the unit once run exits
    (KillMode=mixed, systemd.kill(5)), played here by killing the group right then."""
    vm = make_vm(cloud, command=f"{sys.executable} {TRAINER}; echo after", env={"CKPT_S": "7"}, poll_s=60)
    boot_and_train(vm)
    group = vm.pid("trainer.pid")
    done, _ = vm.shutdown()
    assert done.returncode == 0, done.stderr
    assert vm.wait_exit("run.pid", 30), vm.debug_log()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    ck = checkpoint(vm)
    assert ck["saved_at"] - ck["term_at"] >= 6.9
    assert names(vm.events()) == ["started", "stopped"]


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_checkpoint_written_on_sigterm_is_recorded_through_a_slow_pipe(make_vm, emu, cloud):
    """The trainer's last line (its checkpoint on SIGTERM) may reach the log late, through a slow part
    of its own pipeline that outlives it: the stop path waits for the trainer's group and for the run
    to have written its last lines before it reads the log."""
    command = ("( trap 'echo SPOTCTL_CHECKPOINT 7; exit 143' TERM; echo SPOTCTL_PROGRESS 7; while :; do sleep 0.1; done ) | "
               "( trap '' TERM; while IFS= read -r line; do sleep 0.5; printf '%s\\n' \"$line\"; done )")
    vm = make_vm(cloud, command=command, poll_s=1 if cloud == "aws" else 60, checkpoint_event_s=3600)
    assert vm.boot().returncode == 0
    assert vm.wait_for(lambda: "progress" in names(vm.events()), 15), vm.debug_log()
    if cloud == "gcp":
        emu.preempt_gcp()
        done, _ = vm.shutdown()
        assert done.returncode == 0, done.stderr
    else:
        emu.notice_aws()
        assert vm.wait_for(lambda: "preempted" in names(vm.events()), 15), vm.debug_log()
    steps = [e["details"]["step"] for e in vm.events() if e["event"] == "checkpoint"]
    assert steps == ["7"], (names(vm.events()), vm.debug_log())


def test_a_background_checkpoint_upload_does_not_hold_the_checkpoint_lock(make_vm, emu):
    """The follower records checkpoints in the background; the stop path's flush takes the same lock,
    which must not wait for the bucket (here 8 s to answer)."""
    vm = make_vm("gcp", command="echo SPOTCTL_CHECKPOINT 1; sleep 30", poll_s=60)
    emu.reset(sink_fault=Fault(delay_s=8))
    assert vm.boot().returncode == 0
    assert vm.wait_for(lambda: "checkpoint" in names(vm.events()), 15), vm.debug_log()
    assert emu.uploads() == []  # its upload is under way
    free = subprocess.run(["flock", "-n", str(vm.state / "checkpoint.lock"), "true"], check=False)
    assert free.returncode == 0


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_shutdown_path_records_preempted_when_the_watcher_was_stopped_first(make_vm, emu, cloud):
    """The watcher saw the notice and waits for the trainer (2 s to checkpoint); it is stopped before it
    records `preempted` (at shutdown, before the ordering this fix adds). The shutdown path, which finds
    the notice, records it with the notice's details."""
    vm = make_vm(cloud, poll_s=1, env={"CKPT_S": "2"})
    boot_and_train(vm)
    if cloud == "gcp":
        emu.preempt_gcp()
    else:
        emu.notice_aws()
    assert vm.wait_for(lambda: "preemption-notice" in names(vm.events()), 15), vm.debug_log()
    os.killpg(vm.pid("watch.pid"), signal.SIGKILL)
    done, _ = vm.shutdown()
    assert done.returncode == 0, done.stderr
    assert names(vm.events()) == ["started", "preemption-notice", "preempted"]
    notice, preempted = vm.events()[1:]
    assert {k: v for k, v in preempted["details"].items() if k != "progress"} == {
        k: v for k, v in notice["details"].items() if k != "progress"}
    assert vm.wait_for(lambda: "preempted" in uploaded(emu), 10)
    assert "saved_at" in checkpoint(vm)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_watcher_is_stopped_after_the_shutdown_path(cloud):
    """At shutdown systemd stops units in the inverse of their start order (systemd.unit(5)): the
    watcher, which may be recording a preemption, outlives the shutdown path."""
    from agent.config import Config
    from agent.units import unit_files

    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="us-east-1")
    files = unit_files(Config.from_dict(ctx.agent_config()), "/usr/bin/python3", "/var/lib/spotctl/agent.pyz")
    watch_unit = files["spotctl-watch.service"]
    watch_unit = watch_unit[: watch_unit.index("[Service]")]
    if cloud == "gcp":
        assert "Before=google-shutdown-scripts.service" in watch_unit
    else:
        after = next(line for line in files["spotctl-stop.service"].splitlines() if line.startswith("After="))
        assert "spotctl-watch.service" in after.split()


def test_a_kept_boot_disk_uploads_the_next_attempts_log_from_its_start(emu, tmp_path):
    """bootDisk: keep (GCP): attempt 2 boots attempt 1's disk, state dir included; its log is a new
    file, uploaded from byte 0 (the offset is the log's own, not the state dir's)."""
    from cli.lifecycle import logs

    vms = []
    try:
        for attempt, command in ((1, "for i in $(seq 300); do echo attempt-one-line-$i; done; exit 3"), (2, "echo two")):
            ctx = ScriptContext(cloud="gcp", stack="team-a", kind="job", name="train", event_bucket="events-bkt",
                                region="us-central1", command=command, attempt=attempt)
            vm = LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / f"vm-{attempt}")
            vms.append(vm)
            assert vm.boot(env={"SPOTCTL_BOOT_ID": f"boot-{attempt}"}).returncode == 0
            assert vm.wait_exit("run.pid", 20), vm.debug_log()
            vm.kill_all()  # powered off before the next attempt boots its disk (they share the state dir and its pid files)
        chunks = dict(emu.state.log_chunks)
        mine = {n: c for n, c in chunks.items() if "/attempt-2/" in n}
        assert logs.read(None, "train", logs.LogKey(2, 0), mine) == b"two\n", sorted(chunks)
    finally:
        for vm in vms:
            vm.kill_all()


def agent_parts(emu, tmp_path: Path, cloud: str):
    """A job VM's agent in this process (not booted): its config and recorder, against the emulator."""
    from agent.config import Config
    from agent.events import Recorder
    from agent.imds import Metadata
    from agent.storage import Cloud

    ctx = ScriptContext(cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="events-bkt",
                        region="us-central1", command="true")
    cfg = Config.from_dict(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state").agent_config())
    (tmp_path / "state").mkdir(exist_ok=True)
    meta = Metadata(cfg)
    return cfg, Recorder(cfg, meta, Cloud(cfg, meta))


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_an_upload_keeps_to_its_budget_across_its_requests(emu, tmp_path, cloud):
    """Publishing one event with a 2 s budget: the credential requests (GCP token; AWS IMDS token, role,
    credentials) and the upload share the budget (here each metadata answer takes 1.8 s: giving every
    request its own 2 s would take 4 of them, 7 s)."""
    _, rec = agent_parts(emu, tmp_path, cloud)
    emu.reset(metadata_fault=Fault(delay_s=1.8))
    started = time.monotonic()
    rec.publish("obj", b"{}", 2)
    assert time.monotonic() - started < 2 + 1.5


def test_aws_a_slow_bucket_never_delays_a_notice_after_a_rebalance_recommendation(make_vm, emu):
    """The recommendation's event is uploaded in the background (here the bucket takes 8 s a request):
    a notice that follows is seen at the next poll, before that upload has even landed."""
    vm = make_vm("aws", poll_s=1)
    boot_and_train(vm)
    emu.reset(sink_fault=Fault(delay_s=8), rebalance={"noticeTime": "2026-11-21T08:22:00Z"})
    assert vm.wait_for(lambda: "rebalance-recommendation" in names(vm.events()), 15), vm.debug_log()
    emu.notice_aws()
    seen: dict[str, list] = {}

    def noticed() -> bool:
        if "preemption-notice" not in names(vm.events()):
            return False
        seen["uploaded"] = uploaded(emu)
        return True

    assert vm.wait_for(noticed, 40), vm.debug_log()
    assert "rebalance-recommendation" not in seen["uploaded"]


def test_two_log_uploads_at_once_send_each_chunk_once(emu, tmp_path):
    """The watcher's background upload and the run's last one may overlap: one at a time (a lock),
    so the second finds the offset the first advanced and sends nothing twice."""
    import threading

    _, rec = agent_parts(emu, tmp_path, "gcp")
    _, other = agent_parts(emu, tmp_path, "gcp")
    log = tmp_path / "disk" / ".spotctl" / "logs" / "attempt-1-node-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("line\n" * 100)
    emu.reset(sink_fault=Fault(delay_s=1))
    first = threading.Thread(target=rec.upload_log, args=(10,))
    first.start()
    other.upload_log(10)
    first.join()
    sent = [p for m, p in emu.state.requests if m == "POST" and "logs%2F000000000000.log" in p]
    assert len(sent) == 1, sent


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_log_chunk_stored_but_never_answered_does_not_stop_the_log(emu, tmp_path, cloud):
    """The bucket keeps a chunk but its answer never comes: every retry in that call is unanswered too,
    and the log grows before the next call. On GCP a retry is an overwrite the VM's objectCreator role
    refuses (403), so retrying the same name would stop the log there. The chunk goes again with the
    same bytes, 412 (already there) counts as stored, and the next chunk starts where it ended."""
    from cli.lifecycle import logs

    _, rec = agent_parts(emu, tmp_path, cloud)
    log = tmp_path / "disk" / ".spotctl" / "logs" / "attempt-1-node-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"first {i}\n" for i in range(50)))
    emu.reset(lose_answers=1000)  # stored, then nothing answered for the rest of the call
    assert rec.upload_log(2) is False  # the budget ran out before the log's end: said so
    assert list(emu.state.log_chunks) == ["team-a/train/attempt-1/node-0/logs/000000000000.log"]
    emu.reset(lose_answers=0)
    with log.open("a") as f:
        f.write("".join(f"later {i}\n" for i in range(50)))
    # A budget is a cap, not a wait: 60 s instead of 2 is as fast here, and a loaded machine (the
    # AWS variant's three metadata requests per call) does not run out of it before "last\n".
    assert rec.upload_log(60)
    with log.open("a") as f:
        f.write("last\n")
    assert rec.upload_log(60)
    chunks = dict(emu.state.log_chunks)
    assert logs.read(None, "train", logs.LogKey(1, 0), chunks) == log.read_bytes(), sorted(chunks)


def test_waiting_for_another_log_upload_does_not_spend_the_last_ones_budget(emu, tmp_path):
    """The watcher's background upload holds the lock (a slow bucket) when the trainer exits: the
    last upload waits for it, then still has its whole budget for the log's last lines. The old
    script counted the wait against the budget (and gave up waiting after one budget): the lines
    written since the background upload read the log were never sent."""
    from cli.lifecycle import logs

    _, rec = agent_parts(emu, tmp_path, "gcp")
    log = tmp_path / "disk" / ".spotctl" / "logs" / "attempt-1-node-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("the end\n")
    lock = tmp_path / "state" / "log-upload.lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "3"])  # the background upload, 3 s long
    try:
        deadline = time.monotonic() + 10
        while not subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode and time.monotonic() < deadline:
            time.sleep(0.05)  # until the holder has it
        assert rec.upload_log(1)
    finally:
        holder.wait(10)
    assert logs.read(None, "train", logs.LogKey(1, 0), dict(emu.state.log_chunks)) == b"the end\n"


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_an_event_stored_but_never_answered_counts_as_uploaded_at_the_next_try(emu, tmp_path, cloud):
    """The same for an event: its retry finds it there (GCP: 412; AWS: overwritten with the same bytes)
    and the recorder stops, instead of spending its whole budget on 403s."""
    _, rec = agent_parts(emu, tmp_path, cloud)
    emu.reset(lose_answers=1)
    started = time.monotonic()
    assert rec.publish("team-a/train/e.json", b'{"event":"x"}', 6)
    debug_log = tmp_path / "state" / "spotctl.log"
    assert not debug_log.exists() or "not uploaded" not in debug_log.read_text()
    assert time.monotonic() - started < 5
    assert [u.name for u in emu.uploads()] == ["team-a/train/e.json"]


def test_gcp_the_trainer_waits_for_the_nvidia_driver_the_vm_asked_for(make_vm, emu, tmp_path):
    """A Deep Learning VM image installs the driver at first boot (metadata install-nvidia-driver=True);
    the trainer starts once nvidia-smi answers (a stand-in that fails until READY exists)."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n[ -e {tmp_path}/READY ]\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    emu.reset(attributes={"install-nvidia-driver": "True"})
    vm = make_vm("gcp", command=f"touch {tmp_path}/TRAINED")
    assert vm.boot(env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}).returncode == 0
    assert vm.wait_for(lambda: "started" in names(vm.events()), 15), vm.debug_log()
    time.sleep(3)  # the driver is still installing: the trainer waits
    assert not (tmp_path / "TRAINED").exists()
    (tmp_path / "READY").write_text("")
    assert vm.wait_exit("run.pid", 20), vm.debug_log()
    assert (tmp_path / "TRAINED").exists() and names(vm.events()) == ["started", "completed"]
