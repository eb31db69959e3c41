"""The parts of a job's cleanup (the job leaves the stack with its disks): what its update targets,
taking it out of the file and putting it back, and the record a cleanup under way leaves for a
kill -9. The steps themselves, in order, are ``pipeline.remove_job``.

Every deletion goes through the one rule in ``cli.lifecycle.states.may_delete_disks``, decided and
acted on under the stack file's lock (so no resume/failover can land between the decision and the
delete), and only for disks that carry this exact stack's ownership labels (``ownership``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cli.cloud import Inventory
from cli.lifecycle import cachefile, stackfile
from cli.lifecycle.apply import Applier, ApplyError, Held, change_targets
from cli.lifecycle.ownership import disks_owned, physical_name
from cli.lifecycle.states import LifecycleError, may_delete_disks
from infra.config import ConfigError, Job, StackConfig


@dataclass
class Cleanup:
    job_id: str
    urns: list[str]  # what the targeted update deletes
    disks: list[str]
    done: bool
    leftovers: list[str] = field(default_factory=list)  # of ``urns``: what the state holds that the completed job no longer declares
    declined: bool = False  # listed, then not confirmed (or --preview-only, or no terminal): nothing changed
    plan: Any = field(default=None, repr=False, compare=False)  # the job's plan under mocks (its disks' names)


def kept(job_id: str, why: str) -> LifecycleError:
    return LifecycleError(f"job {job_id}: its disks are kept because {why}")


def settle(ref: stackfile.StackRef, job_id: str, applier: Applier | None, out: Callable[[str], None]) -> None:
    """Under the stack file's lock (and the update lock when ``applier``): finish what an earlier
    cleanup killed midway left (a retirement; this job's interrupted update puts it back)."""
    _finish_retirement(ref, out)
    if applier is not None:  # (its record is its own while a cleanup's update runs: the update lock is held here)
        _resume_interrupted(ref, job_id, out)


def targets(urns: list[str], disks: list[str], held: Held, job_id: str) -> list[str]:
    """The job leaves the program: its URNs in the plan and all the state holds under it are
    dropped, and the targets are those the state holds (``change_targets``, the one rule). Its
    disks are about to be unprotected; any other protected resource refuses the cleanup here,
    before anything changes."""
    dropped = set(urns) | held.under_job(urns, job_id)
    lifting = replace(held, protected=held.protected - set(disks))
    found = change_targets([], dropped, lambda: lifting, job_id)
    # A disk only the state names (the plan does not) has no name to check its labels by: kept.
    unchecked = [u.rsplit("::", 1)[-1] for u in found if u not in urns and u.endswith(("-disk", "-volume"))]
    if unchecked:
        raise kept(job_id, f"Pulumi's state holds disk(s) {', '.join(unchecked)} the job does not declare (their "
                           "ownership labels cannot be checked); nothing changed")
    return found


def recheck(ref: stackfile.StackRef, seen: Job, force: bool) -> None:
    """The job as the file has it *now* is still the one the decision was made on (a hand edit
    does not take the lock)."""
    try:
        now = stackfile.load(ref).job(seen.id)
    except KeyError as exc:
        raise ConfigError(str(ref.path), [f"job {seen.id}: {exc.args[0]}"]) from None
    # The whole entry: the plan (what is deleted) was made of the job as decided on, outside the lock.
    if now != seen or not may_delete_disks(now, force=force, owned=True)[0]:
        raise LifecycleError(f"job {seen.id} changed while its disks were being deleted "
                             f"(now {now.state.value}, attempt {now.attempt}); nothing deleted")


def check_owned(inventory: Callable[[StackConfig], Inventory] | None, cfg: StackConfig, stack: str, job: Job,
                plan, disks: list[str], held: Held, force: bool) -> None:
    """The whole deletion rule on the cloud's disks, under the lock: the job may lose its disks and
    every one of them carries this exact stack's ownership labels (``disks_owned``)."""
    if inventory is None:
        raise kept(job.id, "their ownership labels could not be checked")
    names = {r.urn: physical_name(r.inputs, cfg.cloud) for r in plan.resources if r.urn in disks}
    owned, why = disks_owned(inventory(cfg).disks(), cfg, stack, job.id, names, held)
    allowed, because = may_delete_disks(job, force=force, owned=owned)
    if not allowed:
        raise kept(job.id, why if not owned else because)


def take(ref: stackfile.StackRef, job: Job, force: bool, applier: Applier, lifted: list[str]) -> tuple:
    """Under the lock: unprotect the job's disks right before the update that deletes them, check the
    job once more, and take it out of the file (recording that, for a kill -9 during the update)."""
    taken = None
    try:
        applier.unprotect(lifted)
        recheck(ref, job, force)  # a hand edit meanwhile (it does not take the lock)
        taken = stackfile.take_job(ref.path, job.id)
        # Between here and the end of the update the job is out of the file and its disks are
        # unprotected: a kill -9 cannot be caught, so the next `cleanup JOB --yes` finds this record.
        _record_interrupted(ref.path, taken, lifted)
    except BaseException:
        if taken is not None:
            stackfile.put_back_job(ref.path, taken)
        with contextlib.suppress(ApplyError):
            _protect_again(applier, lifted)
        raise
    return taken


def retire_taken(ref: stackfile.StackRef, job: Job, taken: tuple, lifted: list[str]) -> None:
    """The update deleted what ``take`` took out of the file: gone for good, a new job of this id
    starts after this one's attempts (its events stay). The record says so first: a kill before the
    retirement is written leaves it to the next cleanup (``_finish_retirement``), never a job gone
    without its id retired."""
    _record_interrupted(ref.path, taken, lifted, retire=job.attempt)
    stackfile.retire(ref.path, job.id, job.attempt)
    _record_path(ref.path).unlink(missing_ok=True)


def gone(ref: stackfile.StackRef, job: Job) -> None:
    """The job leaves the file for good when nothing of it is left to delete by an update: its id is
    retired after its attempts (its events stay; a new job of that id starts after them). Two writes:
    the record of the retirement to come is written before them (see ``_finish_retirement``)."""
    _record_interrupted(ref.path, ("", 0, {"id": job.id}), [], retire=job.attempt)
    stackfile.take_job(ref.path, job.id)
    stackfile.retire(ref.path, job.id, job.attempt)
    _record_path(ref.path).unlink(missing_ok=True)


def put_back(ref: stackfile.StackRef, applier: Applier, taken: tuple, lifted: list[str], exc: ApplyError) -> ApplyError:
    """The cleanup's update failed: the job goes back in the file (what was not deleted is still
    declared there) and the disks it did not delete are protected again; the error says what is left."""
    stackfile.put_back_job(ref.path, taken)
    _record_path(ref.path).unlink(missing_ok=True)
    job_id = taken[2].get("id")
    what = "failed midway" if exc.started else "did not start"
    try:
        again = _protect_again(applier, lifted)
    except ApplyError as failed:
        protection = f"; its disks' protection could not be set again ({failed})"
    else:
        protection = f"; the disks not deleted are protected again ({', '.join(d.rsplit('::', 1)[-1] for d in again)})" if again else ""
    return ApplyError(f"{exc}\njob {job_id}: the cleanup's update {what}: the job is kept in the stack file"
                      f"{protection}; run `spotctl cleanup {job_id} --yes` again to finish it",
                      started=exc.started, detail=exc.detail)


def _protect_again(applier: Applier, lifted: list[str]) -> list[str]:
    """Protect again what spotctl unprotected and the state still holds (what a failed update did
    not delete); returns those URNs. Raises ApplyError when the state cannot be read or written."""
    if not lifted:
        return []
    left = applier.held().resources
    back = [d for d in lifted if d in left]
    if back:
        applier.protect(back)
    return back


# ---- the record a cleanup under way leaves (a kill -9 cannot be caught) -------------------------------


def _record_path(path: Path) -> Path:
    return path.parent / ".spotctl" / f"{path.name}.cleanup.json"


def _record_interrupted(path: Path, taken: tuple, lifted: list[str], retire: int | None = None) -> None:
    """What a cleanup under way took out of the file and unprotected (removed once it is over); with
    ``retire``, its deletes are done and only the retirement of the id after that attempt is left."""
    block, index, entry = taken
    _record_path(path).parent.mkdir(parents=True, exist_ok=True)
    cachefile.save_record(_record_path(path), {"job": entry.get("id"), "taken": [block, index, entry], "lifted": lifted,
                                               **({"retire": retire} if retire is not None else {})})


def _finish_retirement(ref: stackfile.StackRef, out: Callable[[str], None]) -> None:
    """Under the stack file's lock: a cleanup killed between dropping its job from the file and
    retiring its id (two writes) left a record saying what is left; it is done now, whichever job
    this cleanup is of. A job still in the file was never dropped: nothing to retire. (A cleanup
    retiring its own job meanwhile, after its update, writes the same retirement: the later of the
    two changes nothing.)"""
    path = _record_path(ref.path)
    doc = cachefile.open_record(path)
    try:
        job_id, attempt = (str(doc["job"]), doc["retire"]) if doc is not None and "retire" in doc else (None, None)
    except (KeyError, TypeError):
        return
    if job_id is None or isinstance(attempt, bool) or not isinstance(attempt, int):
        return
    if job_id not in {j.id for j in stackfile.load(ref).jobs}:
        stackfile.retire(ref.path, job_id, attempt)
        out(f"job {job_id}: an earlier cleanup was stopped before it retired the id: retired after attempt {attempt} now")
    path.unlink(missing_ok=True)


def _resume_interrupted(ref: stackfile.StackRef, job_id: str, out: Callable[[str], None]) -> None:
    """A cleanup of ``job_id`` killed during its update (the record is there): the job goes back in
    the file, so this cleanup decides and deletes again from the start (its disks' protection is
    lifted again only after the checks). Another job's record is left for its own cleanup."""
    path = _record_path(ref.path)
    doc = cachefile.open_record(path)  # sealed: a record a commit carried would put its own job in the file
    try:
        if doc is None or doc.get("job") != job_id or "retire" in doc:  # (deleted already: only retired, never put back)
            return
        taken = tuple(doc["taken"])
        if len(taken) != 3 or not isinstance(taken[2], dict) or taken[2].get("id") != job_id:
            return
    except (KeyError, TypeError):
        return
    if stackfile.put_back_job(ref.path, taken):
        out(f"job {job_id}: a cleanup of it was interrupted during its update: the job is back in {ref.path}, "
            "and this cleanup starts again")
    path.unlink(missing_ok=True)
