"""The ``applying`` mark a job carries while its update runs: whether the file still holds what was
written before it is marked, the mark cleared once the update finished, and an update found
unfinished applied again (its targets; ``reapply`` for ``watch``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError, change_targets, job_targets
from cli.lifecycle.states import PENDING_STAMP, Change
from infra.config import StackConfig

MISSING = stackfile.MISSING  # a key the job did not have


def _now() -> datetime:
    return datetime.now(UTC)


def pending_text(change: Change) -> str:
    """What the ``applying`` mark says: the change's plain fields, its reason, and when the update
    began (``(since <UTC time>)``: another machine's watcher leaves a mark that young alone,
    ``states.PENDING_GRACE``, as the update may still be under way there)."""
    parts = ", ".join(f"{k}={v}" for k, v in change.fields.items() if not isinstance(v, (dict, list)))
    since = _now().strftime(PENDING_STAMP)
    head = f"{parts}: {change.reason}" if parts else change.reason
    return f"{head[:460]} (since {since})"


def changed_since(current: StackConfig, cfg: StackConfig, job_id: str) -> bool:
    """Whether ``current`` differs from ``cfg`` in the job or in anything but the other jobs (which a
    watcher may edit meanwhile, under the lock: their resources are not this update's targets)."""
    try:
        job = current.job(job_id)
    except KeyError:
        return True
    mine = cfg.job(job_id)
    if job.model_dump(exclude={"applying"}) != mine.model_dump(exclude={"applying"}):
        return True
    # Another job's cleanup (here, or pulled from the shared copy) retires that job's id: not this update's.
    return (current.model_dump(exclude={"jobs", "retired_jobs"}) != cfg.model_dump(exclude={"jobs", "retired_jobs"})
            or current.retired_jobs.get(job_id) != cfg.retired_jobs.get(job_id))


def record_applied(path: Path, job_id: str, cfg: StackConfig, pending: str | None) -> None:
    """The update of the job finished: its ``applying`` mark goes (while it is still this one), and
    (GCP) the kind of disk it has run on is recorded, so adding or dropping ``diskReplicaZones`` by
    hand later is refused (``infra.config.checks._disk_kind_checks``)."""

    def fields(current: StackConfig, written: Any) -> dict[str, Any]:
        try:
            job = current.job(job_id)
        except KeyError:
            return {}
        # The mark's line goes (a ``null`` left behind is noise in the file and sent later edits of it
        # through the slower round trip).
        out: dict[str, Any] = {"applying": MISSING} if pending is not None and written.get("applying") == pending else {}
        # Likewise the ``stoppedBy: null`` a resume wrote: it goes only now, once the update is done,
        # so an undo before it (in process, or from a dead command's proposal record) still finds the
        # ``null`` it wrote and puts ``stoppedBy: user`` back where it was.
        if "stoppedBy" in written and written["stoppedBy"] is None:
            out["stoppedBy"] = MISSING
        if cfg.cloud == "gcp" and job.disk_kind is None and job.state.value != "pending":
            out["diskKind"] = "regional" if job.disk_replica_zones else "zonal"
        return out

    stackfile.update_job(path, job_id, fields)


def pending_targets(ref: stackfile.StackRef, job_id: str, cfg: StackConfig, applier: Applier) -> list[str]:
    """The targets of an update of the job as the file has it when the file before the edit is unknown
    (an interrupted update): what the state holds under the job and the file no longer declares is
    what the edit dropped (``change_targets``)."""
    new = job_targets(cfg, ref.name, job_id)
    held = applier.held()
    return change_targets(new, held.under_job(new, job_id), lambda: held, job_id)


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
