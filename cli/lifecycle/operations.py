"""Job operations behind resume/failover/complete and ``watch``: a change goes through the change
pipeline (``cli.lifecycle.pipeline``, re-exported here); ``reapply`` applies what the file already says."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError
from cli.lifecycle.applying import pending_targets, record_applied
from cli.lifecycle.interrupts import STOPS, Interrupted, Signalled, signal_of, signals_raise
from cli.lifecycle.pipeline import Approved, Confirm, Outcome, Release, change_job

__all__ = ["STOPS", "Approved", "Confirm", "Interrupted", "Outcome", "Release", "Signalled", "change_job",
           "pending_targets", "reapply", "signal_of", "signals_raise"]


def reapply(ref: stackfile.StackRef, job_id: str, applier: Applier, out: Callable[[str], None], only_pending: bool = False) -> str:
    """Apply the job as the file has it (``watch``: an update another spotctl started and never
    finished, or its own before a crash): "applied", or "busy" when a live spotctl holds the stack's
    update lock now (it is applying it: nothing to do), or "noop" when the job is gone or, with
    ``only_pending``, its ``applying`` mark went meanwhile (the update finished)."""
    applier.preflight()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(applier.exclusive(ref.path, wait=False))
        except ApplyError:
            return "busy"
        cfg = stackfile.load(ref)
        try:
            job = cfg.job(job_id)
        except KeyError:
            return "noop"
        if only_pending and job.applying is None:
            return "noop"
        applier.up(pending_targets(ref, job_id, cfg, applier), out)
        record_applied(ref.path, job_id, cfg, job.applying)
        return "applied"
