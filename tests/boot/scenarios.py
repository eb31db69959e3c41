"""The boot tier's scenarios, one function each, for either cloud (test_boot.py runs them in order on
one job's VMs per cloud). Each asserts the events on the job disk and in the bucket; times
are measured (host clock: the notice, the trainer's SIGTERM as it tells the second serial port, the
VM's exit), recorded, and held to the clouds' own budgets (never to a test's guess)."""

from __future__ import annotations

import re
import time

from tests.boot.conftest import BOOT_S, Record, Story
from tests.boot.plan import plan_vm
from tests.boot.vm import filesystem_id, read_disk_file

# What each cloud gives a VM between the stop signal and the hard power-off: GCE's preemption and
# a stop both send the ACPI power button and power off 30 s later if the guest has not ("Compute
# Engine sends a preemption notice ... ACPI G2 Soft Off ... If the instance does not stop after 30
# seconds, Compute Engine sends an ACPI G3 Mechanical Off", cloud.google.com/compute/docs/instances/
# preemptible#preemption-process; a stop gives up to 90 s, .../instances/stop-start-instance). EC2
# interrupts a spot instance 2 minutes after its notice (docs.aws.amazon.com/AWSEC2/latest/UserGuide/
# spot-instance-termination-notices.html).
HARD_STOP_S = {("gcp", "preempt"): 30.0, ("gcp", "stop"): 90.0, ("aws", "preempt"): 120.0, ("aws", "stop"): 120.0}


def _names(events: list[dict]) -> list[str]:
    return [e["event"] for e in events]


def first_boot(story: Story, record: Record) -> None:
    start = time.monotonic()
    guest = story.boot(story.plan, "vm-attempt1")
    story.wait(lambda: guest.probe.first("start"), BOOT_S, "the trainer to start")
    record[f"{story.cloud} boot to trainer start (s)"] = guest.probe.first("start")[0] - start
    assert guest.probe.first("start")[1] == "start 0 resume=0"
    # The code fetched from the bucket, checked and unpacked on the job disk; its setup, then the
    # command (tests/boot/code/train.sh fails without setup's file beside it), both in the code.
    setup = guest.probe.first("setup")
    assert setup is not None and setup[0] <= guest.probe.first("start")[0], "setup ran before the command"
    assert setup[1] == f"setup {story.plan.mount_point}/{story.plan.code_dir}", setup
    # (`started` and `progress` are asserted on the job disk at the next stop: their uploads, at the
    # trainer's start, have real-time budgets an emulated CPU on a loaded machine was seen to miss
    # (2 boots of ~10); the scripts keep such an event in the job disk's log.)
    story.wait(lambda: story.events("checkpoint"), 120, "the first checkpoint event")
    story.filesystem = filesystem_id(story.disk)
    assert story.filesystem is not None, "the blank job disk was formatted"
    story.done.add("first boot")


def reboot(story: Story, record: Record) -> None:
    story.requires("first boot")
    guest = story.guest
    assert guest is not None
    # A reset (GCE `instances reset`, a power cycle): the same boot disk and job disk come back.
    at = time.monotonic()
    guest.reset()
    story.wait(lambda: guest.probe.first("start", after=at), BOOT_S, "the trainer to start again after the reset")
    when, line = guest.probe.first("start", after=at)
    record[f"{story.cloud} reset to trainer start (s)"] = when - at
    step = int(re.match(r"start (\d+) resume=(\d)", line)[1])
    assert line.endswith("resume=1") and step > 0, f"resumed from the checkpoint: {line}"
    assert guest.probe.first("setup", after=at) is None, "setup ran again after the reset"
    assert filesystem_id(story.disk) == story.filesystem, "the job disk was not formatted again"
    story.done.add("reboot")


def _stop(story: Story, record: Record, kind: str, notice) -> tuple[float, int]:
    """Give the cloud's stop signal (``notice()`` returns its time), power off at the cloud's hard
    stop if the guest has not; returns (notice time, the step the trainer saved on SIGTERM)."""
    guest = story.guest
    assert guest is not None
    time.sleep(3)  # some steps past the resume
    at = notice()
    hard = HARD_STOP_S[(story.cloud, kind)]
    if story.cloud == "aws" and kind == "preempt":
        # EC2 interrupts at the notice's time; waiting out 2 minutes tells nothing more once the
        # watcher has recorded the preemption, so the power button comes then (the stop hook runs).
        story.wait(lambda: story.events("preempted"), hard - 15, "the preempted event")
        guest.power_button()
    off = guest.wait_off(max(0.0, at + hard - time.monotonic()))
    if not off:
        guest.hard_stop()
    record[f"{story.cloud} {kind}: hard stop needed"] = "yes" if not off else "no"
    term, saved = guest.probe.first("term", after=at), guest.probe.first("saved", after=at)
    record[f"{story.cloud} {kind}: notice to SIGTERM (s)"] = term[0] - at if term else None
    record[f"{story.cloud} {kind}: notice to checkpoint saved (s)"] = saved[0] - at if saved else None
    record[f"{story.cloud} {kind}: notice to power-off (s)"] = (guest.exited_at or time.monotonic()) - at
    assert term is not None, "the trainer got SIGTERM"
    assert saved is not None, "the trainer saved its checkpoint before the power-off"
    # The clouds' budgets, not a test's slack: the trainer is promised its whole stop budget before the
    # hard stop (GCE preemption: SIGTERM within 10 s of the notice), and the VM, having recorded the
    # stop, powers off by itself before it.
    assert term[0] - at <= hard - story.plan.stop_budget_s, \
        f"SIGTERM {term[0] - at:.1f} s after the notice: the trainer's {story.plan.stop_budget_s:.0f} s end after the hard stop at {hard:.0f} s"
    assert off, f"the VM was still on at the cloud's hard stop, {hard:.0f} s after the notice"
    step = int(saved[1].split()[1])
    assert story.checkpoint_on_disk() == step
    return at, step


def _assert_stop_recorded(story: Story, event: str, step: int) -> None:
    """``event`` once, and the SIGTERM checkpoint as a `checkpoint` event, on the job disk and in the bucket."""
    on_disk = story.disk_events()
    mine = [e for e in on_disk if e["attempt"] == story.plan.attempt]
    assert _names(mine)[0] == "started" and "progress" in _names(mine), _names(mine)
    assert mine[0]["details"]["capacity"] == "spot"
    assert _names(mine).count(event) == 1, f"one {event} on the job disk: {_names(mine)}"
    assert any(e["event"] == "checkpoint" and e["details"].get("step") == str(step) for e in mine), \
        f"the SIGTERM checkpoint (step {step}) as an event on the job disk: {[(e['event'], e['details']) for e in mine]}"
    bucket = [e for e in story.events() if e["attempt"] == story.plan.attempt]
    assert _names(bucket).count(event) == 1, f"one {event} in the bucket: {_names(bucket)}"
    # The checkpoint's upload has a few seconds (its flush, 2-5 s): an emulated CPU on a busy
    # machine can miss them, and the scripts then keep it in the job disk's log and say so in
    # theirs. It is in the bucket, or the VM's log says it was not uploaded.
    if not any(e["event"] == "checkpoint" and e["details"].get("step") == str(step) for e in bucket):
        log = story.guest.read_file("/var/lib/spotctl/spotctl.log") or ""
        assert "event checkpoint.json not uploaded" in log, \
            f"the SIGTERM checkpoint (step {step}) neither in the bucket nor reported missed: {[(e['event'], e['details']) for e in bucket]}"


def preemption(story: Story, record: Record) -> None:
    story.requires("reboot")
    guest = story.guest
    assert guest is not None
    if story.cloud == "gcp":
        def notice() -> float:
            at = story.emu.preempt_gcp()
            guest.power_button()
            return at
    else:
        def notice() -> float:
            return story.emu.notice_aws("terminate", lead_s=120)
    _, step = _stop(story, record, "preempt", notice)
    _assert_stop_recorded(story, "preempted", step)
    assert read_disk_file(story.disk, f"/{story.plan.code_dir}/setup-runs") == "ran\n", \
        "setup ran once on the job disk across the reboot"
    assert not any(e["event"] == "stopped" for e in story.events() if e["attempt"] == story.plan.attempt)
    story.done.add("preemption")


def normal_stop(story: Story, record: Record) -> None:
    """The next attempt (``spotctl resume``: a new VM, a new boot disk, the same job disk), stopped."""
    story.requires("preemption")
    plan = plan_vm(story.cloud, story.plan.job, story.env, attempt=story.plan.attempt + 1)
    start = time.monotonic()
    guest = story.boot(plan, "vm-attempt2")
    story.wait(lambda: guest.probe.first("start"), BOOT_S, "the next attempt's trainer")
    record[f"{story.cloud} attempt 2 boot to trainer start (s)"] = guest.probe.first("start")[0] - start
    assert re.fullmatch(r"start [1-9]\d* resume=1", guest.probe.first("start")[1])
    assert filesystem_id(story.disk) == story.filesystem, "the job disk was not formatted again"
    assert guest.probe.first("setup") is None, "the next attempt ran setup again on the same job disk and code"
    _, step = _stop(story, record, "stop", guest.power_button)
    _assert_stop_recorded(story, "stopped", step)
    story.done.add("normal stop")


def completion(story: Story, record: Record) -> None:
    start = time.monotonic()
    guest = story.boot(story.plan, "vm-done")
    story.wait(lambda: story.events("completed"), BOOT_S + 60, "the completed event")
    record[f"{story.cloud} completion: boot to completed (s)"] = time.monotonic() - start
    assert guest.probe.first("done")[1] == "done 30"
    # The agent powers its VM off once `completed` and the log are uploaded (agent/run.py power_off:
    # `shutdown -h now` under systemd): nobody presses the power button here.
    assert guest.wait_off(120), "the VM powered itself off after the job completed"
    assert guest.exited_at is not None
    completed_at = min(u.received for u in story.emu.uploads()
                       if u.body.get("job") == story.plan.job and u.body["event"] == "completed")
    assert completed_at <= guest.exited_at, "the VM powered off only after `completed` was in the bucket"
    record[f"{story.cloud} completion: completed to self power-off (s)"] = guest.exited_at - completed_at
    assert "the job's work on this VM is over: powering off" in (guest.read_file("/var/lib/spotctl/spotctl.log") or "")
    assert story.checkpoint_on_disk() == 30
    assert (story.disk_events() and read_completed(story)) == story.plan.attempt
    names = _names(story.events())
    assert names.count("completed") == 1 and "stopped" not in names and "failed" not in names, names


def read_completed(story: Story) -> int | None:
    text = read_disk_file(story.disk, "/.spotctl/completed")
    return int(text) if text else None
