"""A job being moved accepts no new attempt except through the move: ``resume``/``failover``/the
watcher cannot restart it in the zone it leaves (on the disks the move's release deletes), ``status``
says ``moving``, and a release never deletes a disk an attempt newer than the move's has used."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.events import Event
from cli.lifecycle.move import next_step
from cli.lifecycle.states import LifecycleError, decide_failover, decide_resume
from infra.basics import Capacity
from infra.config import ConfigError, validate
from tests.conftest import GCP_BASE, gcp_job, pulumi_calls, stack_config
from tests.test_move import MOVE_ARGS, held_disks, started

MOVE = {"from": "us-central1-a", "to": "us-central1-b"}


def moving(step: str, **fields):
    at = {"snapshot": {"state": "stopped"}, "restore": {"state": "stopped"}}[step]
    return validate(stack_config(GCP_BASE, jobs=[gcp_job(**at, move=MOVE | {"step": step, "attempt": 1}, **fields)]), "t").jobs[0]


def job_now(name: str = "llm-pretrain"):
    return stackfile.load(stackfile.resolve("example-gcp", None)).job(name)


@pytest.mark.parametrize("step", ["snapshot", "restore"])
def test_resume_and_failover_refuse_a_job_whose_move_left_its_zone(step):
    job = moving(step)
    for decide in (lambda: decide_resume(job, [], force=True), lambda: decide_failover(job, Capacity.ON_DEMAND)):
        with pytest.raises(LifecycleError) as exc:
            decide()
        text = str(exc.value)
        assert f"job train is moving to us-central1-b (step {step})" in text
        assert "spotctl move train --to-zone us-central1-b" in text


def stop_after_restore_failed(project, runner, monkeypatch):
    """A move whose restore step's update failed: the file says restore, the job stopped in us-central1-a."""
    (project / "events").mkdir(exist_ok=True)
    monkeypatch.setenv("FAKE_PULUMI_UP_FAIL_AT", "3")
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events")])
    assert result.exit_code == 1, result.output
    monkeypatch.delenv("FAKE_PULUMI_UP_FAIL_AT")
    job = job_now()
    assert (job.move.step, job.zone, job.state.value) == ("restore", "us-central1-a", "stopped")


def test_resume_during_a_move_is_refused_and_the_old_disks_keep_their_work(project, runner, fake_pulumi, pulumi_state, gce,
                                                                           monkeypatch):
    """The data loss: a resume between the move's steps restarted the job on the old disks, and the
    move's release later deleted them. Now the resume is refused (nothing applied, the file as it
    was), status says moving, and the move finishes from its snapshot."""
    pulumi_state.seed("example-gcp")
    stop_after_restore_failed(project, runner, monkeypatch)
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before, ups = path.read_bytes(), len([c for c in pulumi_calls(fake_pulumi) if "up" in c])
    events = ["--events-dir", str(project / "events")]
    for cmd in (["resume", "llm-pretrain", *events], ["resume", "llm-pretrain", "--force", *events],
                ["failover", "llm-pretrain", "--to", "on-demand"]):
        result = runner.invoke(app, [*cmd, "--stack", "example-gcp", "--yes"])
        assert result.exit_code == 1, result.output
        assert "job llm-pretrain is moving to us-central1-b (step restore)" in result.output
        assert "spotctl move llm-pretrain --to-zone us-central1-b" in result.output
    assert path.read_bytes() == before and len([c for c in pulumi_calls(fake_pulumi) if "up" in c]) == ups
    status = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-gcp", "--json", "--events-dir",
                                 str(project / "events")])
    (row,) = json.loads(status.stdout)
    assert row["status"] == "moving" and "spotctl move llm-pretrain --to-zone us-central1-b" in row["status_reason"]
    assert runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(project / "events")]).exit_code == 0
    result = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(started(project, 2))])
    assert result.exit_code == 0, result.output
    assert held_disks(pulumi_state, "llm-pretrain") == {"job-llm-pretrain-n0-m1-disk": True, "job-llm-pretrain-n1-m1-disk": True}
    assert (job_now().attempt, job_now().zone) == (2, "us-central1-b")


# ---- the release's half: no disk an attempt newer than the move's used -----------------------------------

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)


def at_start(last_attempt: int, attempt: int = 3, recorded: int | None = 1, began: str = "2026-11-22T03:00:00Z"):
    move = MOVE | {"step": "start", "began": began} | ({"attempt": recorded} if recorded else {})
    return validate(stack_config(GCP_BASE, jobs=[gcp_job(state="running", zone="us-central1-b", attempt=attempt,
                                                         zoneHistory=[{"zone": "us-central1-a", "lastAttempt": last_attempt}],
                                                         move=move)]), "t").jobs[0]


def test_a_release_keeps_disks_a_later_attempt_used_in_the_zone_left():
    go = [Event("train", 3, 0, "started", T0)]
    assert next_step(at_start(2, attempt=3, recorded=2), "us-central1-b", go).fields["move"]["step"] == "release"
    with pytest.raises(LifecycleError, match=r"attempt\(s\) 2 ran in us-central1-a after the move snapshotted its disks "
                                             r"\(at attempt 1\).*are kept; nothing deleted"):
        next_step(at_start(2, attempt=3, recorded=1), "us-central1-b", go)


def test_the_recorded_attempts_own_late_boot_does_not_keep_the_disks():
    """Its VM booted after the move began (a resume just before the move): the snapshot step stopped it
    before the snapshot, which holds its work."""
    go = [Event("train", 1, 0, "started", T0 - timedelta(minutes=30)), Event("train", 2, 0, "started", T0)]
    assert next_step(at_start(1, attempt=2, recorded=1), "us-central1-b", go).fields["move"]["step"] == "release"


def test_a_release_of_a_record_without_its_attempt_reads_the_events():
    go = [Event("train", 2, 0, "started", T0)]
    assert next_step(at_start(1, attempt=2, recorded=None), "us-central1-b", go).fields["move"]["step"] == "release"
    booted = [Event("train", 1, 0, "started", T0 - timedelta(minutes=30)), *go]  # after the move began (03:00)
    with pytest.raises(LifecycleError, match=r"attempt\(s\) 1 ran in us-central1-a after the move"):
        next_step(at_start(1, attempt=2, recorded=None), "us-central1-b", booted)


def test_the_start_step_refuses_snapshots_older_than_the_job():
    job = validate(stack_config(GCP_BASE, jobs=[gcp_job(state="running", attempt=2,
                                                        move=MOVE | {"step": "restore", "attempt": 1})]), "t").jobs[0]
    with pytest.raises(LifecycleError, match="attempt 2 ran in us-central1-a after the move snapshotted its disks"):
        next_step(job, "us-central1-b", [])


def test_the_snapshot_step_records_the_attempt_it_snapshots():
    job = validate(stack_config(GCP_BASE, jobs=[gcp_job(state="running", attempt=4)]), "t").jobs[0]
    assert next_step(job, "us-central1-b", [], T0).fields["move"]["attempt"] == 4
    with pytest.raises(ConfigError, match=r"jobs\[0\].move.attempt: is 5, later than the job's attempt 4"):
        validate(stack_config(GCP_BASE, jobs=[gcp_job(state="stopped", attempt=4, move=MOVE | {"step": "snapshot",
                                                                                                  "attempt": 5})]), "t")


def test_a_watcher_resume_decided_before_the_move_wrote_its_step_is_refused_under_the_lock():
    """The watcher saw attempt 1 preempted and decided a resume; `spotctl move` wrote its snapshot
    step before the watcher's act took the lock: the act decides again there and is refused."""
    from cli.watch.decide import Action, JobMemory, decide_job, seen

    job = moving("snapshot")
    action, _ = decide_job(job, [seen(Event("train", 1, 0, "preempted", T0), "bucket")], JobMemory(), set(), T0)
    assert action.kind == "move"  # what it decides once it sees the move
    stale = Action("train", "resume", 1, "node 0 of attempt 1 preempted")
    from cli.watch.decide import still_current

    assert still_current(job, stale) is None  # same attempt: only the guard stops it
    with pytest.raises(LifecycleError, match="is moving to us-central1-b"):
        decide_resume(job, [Event("train", 1, 0, "preempted", T0)])


def test_the_watchers_view_says_moving(project):
    from cli.watch.journal import watcher_view

    assert watcher_view(project / "Pulumi.x.yaml", [moving("restore")])["train"]["status"] == "moving"
