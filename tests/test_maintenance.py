"""GCE GPU host maintenance (a one-hour notice: https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance):
the attempt is stopped, with reason maintenance, and resumed; a gang never becomes ``failed`` from it
(its peers' trainers fail when the maintained node goes: that is the maintenance's, not the job's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cli.lifecycle.events import Event
from cli.lifecycle.states import S, attempt_outcome, decide_resume
from cli.watch.decide import JobMemory, decide_job, failures, seen
from infra.config import validate
from tests.conftest import GCP_BASE, gcp_job, stack_config

T0 = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)


def gang(**fields):
    return validate(stack_config(GCP_BASE, jobs=[gcp_job(nodes=3, state="running", attempt=2, **fields)]), "t").jobs[0]


def ev(node: int, kind: str, minutes: int = 0, **details) -> Event:
    return Event("train", 2, node, kind, T0 + timedelta(minutes=minutes), details)


NOTICE = ev(1, "maintenance-notice", 0, maintenance_event="TERMINATE_ON_HOST_MAINTENANCE")
PEERS_FAIL = [ev(0, "failed", 2, exit_code="1"), ev(2, "failed", 2, exit_code="1")]
STOPPED = ev(1, "stopped", 9, reason="host-maintenance")


def decide(events, now=T0 + timedelta(minutes=10)):
    return decide_job(gang(), [seen(e, "bucket") for e in events], JobMemory(), set(), now)


def test_a_gangs_failures_after_a_maintenance_notice_wait_for_the_maintained_node():
    action, notes = decide([NOTICE, *PEERS_FAIL])
    assert action is None  # not marked failed (maxFailures 0), not resumed while node 1 checkpoints
    (note,) = [n for n in notes if n.kind == "maintenance"]
    assert "node(s) 1 of attempt 2 got a host maintenance notice" in note.reason
    assert attempt_outcome([NOTICE, *PEERS_FAIL], 2, 3) is None


def test_once_the_maintained_node_stopped_the_gang_is_resumed_not_failed():
    action, _ = decide([NOTICE, *PEERS_FAIL, STOPPED])
    assert (action.kind, action.force) == ("resume", False), action
    assert attempt_outcome([NOTICE, *PEERS_FAIL, STOPPED], 2, 3) is S
    change = decide_resume(gang(), [NOTICE, *PEERS_FAIL, STOPPED])
    assert change.fields["attempt"] == 3 and "host maintenance stopped node(s) 1 of attempt 2" in change.reason
    assert failures([seen(e, "bucket") for e in [NOTICE, *PEERS_FAIL, STOPPED]]) == 0  # maxFailures not spent


def test_the_stopped_event_alone_names_the_maintenance():
    """The watcher acts on the facts of the attempt (act.py passes the notice too); a stop whose reason is
    host maintenance alone also tells the peers' failures apart."""
    assert attempt_outcome([*PEERS_FAIL, STOPPED], 2, 3) is S


def test_a_failure_without_maintenance_is_still_the_jobs():
    action, _ = decide(PEERS_FAIL)
    assert action.kind == "mark-failed"
    assert failures([seen(e, "bucket") for e in PEERS_FAIL]) == 1
