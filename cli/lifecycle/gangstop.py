"""A multi-node job's gang stopped before its change (``pipeline.apply``): every VM of the current
attempt goes by an update of its own, so no node of the old gang is still running when the new
rendezvous begins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError, change_targets, job_targets
from cli.lifecycle.states import Change
from infra.config import Job, StackConfig

MISSING = stackfile.MISSING  # a key the job did not have
Undo = Callable[[dict[str, Any], dict[str, Any]], None]
"""Puts back the keys given (before, wrote), each only while it still holds what was written."""


@dataclass(frozen=True)
class Then:
    """What waits for the job's VMs to be stopped, in the words of the messages."""

    what: str  # "the new attempt starts"
    next_step: str  # "attempt 3"
    retry: str  # what the user runs when it could not


def stop_first(job: Job, change: Change, stop_first: str) -> Then | None:
    """The job's VMs go by an update of their own before the change: a new attempt of a multi-node
    job whose VMs may still run (some nodes survived a preemption), or ``stop_first``."""
    if job.state.value not in ("pending", "running"):
        return None  # no VM declared
    if job.nodes > 1 and "attempt" in change.fields:
        return Then("the new attempt starts", f"attempt {job.attempt + 1}", f"`spotctl resume {job.id}` starts attempt {job.attempt + 1}")
    if stop_first:
        return Then(stop_first, change.reason.split(":")[0], f"Run the same command again to continue ({change.reason})")
    return None


def stop_gang_first(ref: stackfile.StackRef, job_id: str, applier: Applier, edit_before: dict[str, Any], undo: Undo,
                    old_cfg: StackConfig, out: Callable[[str], None], then: Then) -> None:
    """Delete every VM of the current attempt before the new one starts: the job is written as
    stopped (it then declares no VMs) and a targeted update of the old attempt's resources applies
    that. ``edit_before``: the keys the change set, as they were before it."""
    mark_before = edit_before.get("applying", MISSING)
    before = {k: v for k, v in edit_before.items() if k != "applying"}  # the mark stays through the stop
    final = stackfile.job_fields(ref.path, job_id, [*before, "applying"])
    mark = final.pop("applying", MISSING)
    stopped = {"state": "stopped"}
    stackfile.restore_fields(ref.path, job_id, before, final)  # the job as it was (keys the change added removed), then stopped
    _, stopped_cfg = stackfile.update_job(ref.path, job_id, lambda current, written: stopped)
    try:
        old_targets = change_targets(job_targets(stopped_cfg, ref.name, job_id),
                                     job_targets(old_cfg, ref.name, job_id, limits=False),
                                     applier.held, job_id)
    except Exception:
        undo(before, final | stopped)
        raise
    attempt = old_cfg.job(job_id).attempt
    out(f"job {job_id}: stopping every node of attempt {attempt} before {then.what}")
    try:
        applier.up(old_targets, out)
    except ApplyError as exc:
        if not exc.started:  # nothing changed in the cloud: the edit goes, and its mark with it
            undo(before | {"applying": mark_before}, final | stopped | {"applying": mark})
            raise
        # The stop began: some old nodes may be gone, so the file stays stopped. Say so, there and here.
        why = (f"the stop of every node of attempt {attempt} (before {then.next_step}) failed midway: {exc}; "
               f"some of its VMs may still run. {then.retry} (its update replaces or deletes what is left of attempt {attempt})")
        # stopReason says what is left to do (the mark's update never began): one explanation, not two.
        stackfile.update_job(ref.path, job_id, lambda current, written: {"stopReason": why, "applying": MISSING})
        raise ApplyError(f"job {job_id}: left stopped at attempt {attempt}: {why}", started=True, detail=exc.detail) from None
    stackfile.update_job(ref.path, job_id, lambda current, written: final)
