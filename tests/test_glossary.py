"""States in one place: every state and status has its one line (cli/lifecycle/glossary.py), `status -h`
and docs/guides/launch-stop.md show them; the `starting` status; the user's stop in the state machine."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cli.app import app
from cli.lifecycle import glossary, states
from cli.lifecycle.events import Event
from cli.lifecycle.status import job_report
from infra.basics import JobState
from infra.config import Job

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def job(**over) -> Job:
    base = {"id": "train", "machine_type": "a2-highgpu-1g", "zone": "us-central1-a", "command": "t", "state": "running",
            "attempt": 3}
    return Job.model_validate(base | over)


def test_every_state_and_every_status_status_can_show_has_its_line():
    assert set(glossary.STATES) == set(JobState)
    edges = {s for pair in [*states.TRANSITIONS, *states.USER_STOPS] for s in pair}
    assert edges <= set(glossary.STATES)
    source = (ROOT / "cli" / "lifecycle" / "status.py").read_text()
    literals = set(re.findall(r'status(?:, reason)? = "([a-z?-]+)"', source))
    literals |= {f"{s}?" for s in ("failed", "completed")}  # status = f"{outcome.value}?"
    assert literals and literals <= set(glossary.STATUSES)


def test_status_help_lists_each_one(runner):
    result = runner.invoke(app, ["status", "-h"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for name, line in [*((s.value, t) for s, t in glossary.STATES.items()), *glossary.STATUSES.items()]:
        assert f"{name}: {' '.join(line.split())}" in text, name


def test_the_guide_carries_the_generated_table(tmp_path):
    guide = (ROOT / "docs" / "guides" / "launch-stop.md").read_text()
    assert glossary.markdown() in guide
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    from states_doc import updated

    assert updated(guide) == guide  # tools/states_doc.py keeps it so
    stale = guide.replace("| `starting` | status |", "| `starting` | status | (old)")
    assert updated(stale) == guide


def test_starting_between_the_applied_attempt_and_its_started_event():
    assert job_report(job(), [])["status"] == "starting"
    older = [Event("train", 2, 0, "started", T0, {})]
    assert job_report(job(), older)["status"] == "starting"  # the previous attempt's start says nothing of this one
    started = [Event("train", 3, 0, "started", T0 + timedelta(minutes=3), {})]
    assert job_report(job(), started)["status"] == "running"
    assert job_report(job(), None)["status"] == "running"  # no events read: nothing to say either way
    assert job_report(job(applying="attempt=3 (since 2026-11-21T10:00:00Z)"), [])["status"] == "update-pending"


@pytest.mark.parametrize("state", ["running", "preempted", "stopped"])
def test_the_users_stop_is_an_edge_of_the_state_machine(state):
    change = states.decide_stop(job(state=state))
    assert change.fields == {"state": "stopped", "stoppedBy": "user"}
    assert change.reason == states.USER_STOPS[(JobState(state), JobState.STOPPED)]
    assert states.decide_stop(job(state="stopped", stopped_by="user")).noop


def test_stop_is_refused_where_there_is_nothing_to_stop():
    for state in ("completed", "failed"):
        with pytest.raises(states.LifecycleError, match=f"job train is {state}: it has no VMs to stop"):
            states.decide_stop(job(state=state))
    with pytest.raises(states.LifecycleError, match="job train is pending: nothing of it runs yet"):
        states.decide_stop(job(state="pending"))


def test_stopped_by_belongs_to_a_stopped_job():
    with pytest.raises(ValueError, match="stoppedBy: user is only for a stopped job"):
        job(state="running", stopped_by="user")


def test_a_job_the_user_stopped_says_how_it_comes_back():
    row = job_report(job(state="stopped", stopped_by="user"), [])
    assert (row["status"], row["status_reason"]) == ("stopped", "stopped by the user (`spotctl stop`); `spotctl resume "
                                                                 "train` starts attempt 4 on the same disks")
