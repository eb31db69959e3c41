"""A drill's AWS preemption when the command completes as the notice comes: the watcher records no
`preempted` ("notice after the job completed"), and the drill must not sit out the notice's whole
lead (120 s) waiting for one. The clock of the drill's wait is injected: nothing here depends on how
fast the machine is."""

from __future__ import annotations

import os

from agent import schema
from cli.drill import runner as drills
from cli.drill.code import command_began_ago, setup_ended_ago
from cli.drill.emulator import Emulator, Fault
from cli.drill.localvm import LocalVM, local_context
from cli.drill.preempt import capacity_note, notice_ahead, preempt, settled
from cli.drill.verdict import render_report
from infra.render import NOTICE_S, ScriptContext


class FakeClock:
    """Time that passes only when the code under test sleeps; each sleep first lets ``until`` come
    true in real time (bounded), as the VM's processes get on with it."""

    def __init__(self, until=lambda: True) -> None:
        self.now, self.until = 0.0, until

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.until()
        self.now += seconds


def test_a_notice_is_settled_by_this_attempts_preempted_completed_or_failed():
    earlier = [{"attempt": 1, "event": "preempted"}, {"attempt": 2, "event": "started"}]
    assert settled(earlier, 2) is None  # an earlier attempt's `preempted` is not this one's
    assert settled(earlier + [{"attempt": 2, "event": "preemption-notice"}], 2) is None
    for ending in ("preempted", "completed", "failed"):
        assert settled(earlier + [{"attempt": 2, "event": ending}], 2) == ending


def test_the_aws_notice_goes_out_one_watcher_poll_ahead_and_gcps_at_the_time():
    assert notice_ahead("aws", 1, 2.0) == 1.0 and notice_ahead("aws", 5, 60.0) == 5.0
    assert notice_ahead("aws", 1, 0.8) == 0.4  # (never before the command has had half its interval)
    assert notice_ahead("aws", 1, float("inf")) == 1.0
    assert notice_ahead("gcp", 1, 2.0) == 0.0


def test_a_command_that_completes_as_the_aws_notice_comes_ends_the_wait_without_a_preempted(tmp_path):
    """The command exits 0 and its `completed` is held back by a slow bucket (the run process uploads
    the log first); the drill posts the notice in between. The wait ends at `completed`, long before
    the notice's lead; the VM records no `preempted`."""
    with Emulator() as emu:
        emu.state.sink_fault = Fault(delay_s=3.0)
        ctx = ScriptContext(cloud="aws", stack="drill", kind="job", name="sweep", event_bucket="drill-events",
                            region="local", command="echo SPOTCTL_PROGRESS 1/1", poll_interval_s=1, cwd=str(tmp_path))
        with LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm") as vm:
            assert vm.boot().returncode == 0, vm.debug_log()
            assert vm.wait_for(lambda: (tmp_path / "disk" / schema.COMPLETED_MARKER).exists(), 60), vm.debug_log()
            completed = lambda: any(e["event"] == "completed" for e in vm.events())  # noqa: E731
            clock = FakeClock(until=lambda: vm.wait_for(completed, 60))
            ended = preempt(emu, vm, clock=clock, sleep=clock.sleep)
            events = [e["event"] for e in vm.events()]
    assert ended == "completed", vm.debug_log()
    assert clock.now < NOTICE_S["aws"] / 10, clock.now  # (it sat out all 120 s of the lead)
    assert "preempted" not in events and events[-1] == "completed", events


def test_an_on_demand_job_is_drilled_all_the_same_and_the_report_says_why():
    assert capacity_note("aws", "spot") == "" and capacity_note("gcp", "") == ""
    note = capacity_note("aws", "on-demand")
    assert note.startswith("capacity on-demand: AWS never preempts it; the drill preempted it all the same,\n")
    assert capacity_note("gcp", "on-demand").startswith("capacity on-demand: GCP never preempts it;")
    report = drills.Report(verdict="reentrant", cloud="aws", command="train", attempts=[drills.Attempt(1, outcome="completed")],
                           preemptions=0, checkpoint_interval=None, total_s=1.0, capacity="on-demand")
    lines = render_report(report).split("\n")
    assert "\n".join(lines[2:4]) == note and all(len(line) <= 80 for line in lines[2:4])
    report.capacity = "spot"
    assert "never preempts" not in render_report(report)


def test_the_preemption_clock_starts_when_the_vm_wrote_its_setup_marker_not_when_the_drill_looked(tmp_path):
    assert setup_ended_ago(tmp_path, now=1000.0) is None
    marker = tmp_path / ".spotctl" / "setup-abc.done"
    marker.parent.mkdir()
    marker.write_text("")
    os.utime(marker, (1000.0, 1000.0))
    assert setup_ended_ago(tmp_path, now=1003.5) == 3.5
    assert setup_ended_ago(tmp_path, now=999.0) == 0.0  # (a clock step back never moves it ahead)


def test_the_clock_starts_at_the_commands_trainer_pid_not_at_setups_own(tmp_path):
    disk, state = tmp_path / "disk", tmp_path / "state"
    (disk / ".spotctl").mkdir(parents=True)
    state.mkdir()
    assert command_began_ago(disk, state, now=1000.0) is None  # the run unit has not started it yet
    (state / "trainer.pid").write_text("41")  # setup's process, before its marker
    os.utime(state / "trainer.pid", (990.0, 990.0))
    assert command_began_ago(disk, state, now=1000.0) == 10.0  # (a job without setup: the command's)
    (disk / ".spotctl" / "setup-abc.done").write_text("")
    os.utime(disk / ".spotctl" / "setup-abc.done", (995.0, 995.0))
    assert command_began_ago(disk, state, now=1000.0) is None  # setup's, older than its marker
    os.utime(state / "trainer.pid", (996.5, 996.5))  # the command's, written after the marker
    assert command_began_ago(disk, state, now=1000.0) == 3.5
