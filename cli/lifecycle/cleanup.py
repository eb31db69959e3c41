"""``spotctl cleanup``: deleting a completed job's disks, and which orphaned disks may go.

Longer than 420 lines: a job's cleanup decides, plans and acts in three stretches around the
stack file's lock, each with its undo (the record a kill -9 leaves, the protection set again), and
the orphans' and snapshots' rules share its one deletion rule; split, that order would scatter.

Every deletion goes through the one rule in ``cli.lifecycle.states.may_delete_disks``, decided and
acted on under the stack file's lock (so no resume/failover can land between the decision and the
delete), and only for disks that carry this exact stack's ownership labels (``naming.owner_value``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cli.cloud import CloudDisk, CloudSnapshot, Inventory
from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError, Held, change_targets, disk_urns, job_urns
from cli.lifecycle.states import LifecycleError, may_delete_disks
from infra.config import ConfigError, Job, StackConfig
from infra.naming import label_value, owner_value


@dataclass
class Cleanup:
    job_id: str
    urns: list[str]  # what the targeted update deletes
    disks: list[str]
    done: bool
    leftovers: list[str] = field(default_factory=list)  # of ``urns``: what the state holds that the completed job no longer declares


def cleanup_job(ref: stackfile.StackRef, job_id: str, *, force: bool, yes: bool, applier: Applier | None,
                inventory: Callable[[StackConfig], Inventory] | None = None,
                out: Callable[[str], None] = print) -> Cleanup:
    """Delete a completed job's disks and everything else of it (and drop the job from the stack):
    one targeted update of the job's URNs, ``pulumi state unprotect`` of its disks right before it.

    The targets are the one rule of a job change (``change_targets``): the job's URNs in its plan
    plus everything Pulumi's state holds under the job, so VMs a completion never applied (``complete
    --no-apply``, a hand edit) are deleted by the same update (a completed job declares none; left
    out, Pulumi would refuse to delete their parent). Decided under the stack file's lock; the job's
    plan, Pulumi's state and the cloud's disks are read outside it (as every command plans: seconds
    to minutes on a large stack, while other commands wait for the lock); then, under the lock again,
    the job must be exactly the one decided on (``_recheck``) before its disks are unprotected and it
    leaves the file, so no resume can land between the decision and the delete. With ``yes`` and an
    ``applier``, every disk of the job must carry this exact stack's ownership labels in the cloud
    (``inventory``, ``disks_owned``). Without ``yes`` nothing changes (a dry run; the state is read to
    list what would go). With ``applier`` None only the file is edited and the disks stay protected.

    An update that fails puts the job back in the file (what it did not delete is still declared)
    and protects again the disks it did not delete, so a rerun finishes the cleanup.
    """
    from cli.lifecycle.apply import job_plan

    if yes and applier:
        applier.preflight()
    guard = applier.exclusive(ref.path) if (yes and applier) else contextlib.nullcontext()
    with guard:
        with stackfile.locked(ref.path):  # decide
            _finish_retirement(ref, out)
            if applier is not None:  # (the listing too: the job's resources are still in Pulumi's state)
                _resume_if_idle(ref, job_id, applier, yes, out)
            cfg = stackfile.load(ref)
            job = _job(ref, cfg, job_id)
            allowed, why = may_delete_disks(job, force=force, owned=True)
            if not allowed:
                raise LifecycleError(f"job {job_id}: its disks are kept because {why}")
        plan = job_plan(cfg, ref.name, job_id)  # outside the lock: the job alone, as it was decided on
        urns, disks = job_urns(plan, job_id), disk_urns(plan, job_id)
        if applier is None:
            if yes:
                with stackfile.locked(ref.path):
                    _recheck(ref, job, force)
                    _gone(ref, job)
            return Cleanup(job_id, urns, disks, done=yes)
        if not yes:
            try:
                held = applier.held()
            except ApplyError:  # no `pulumi` here: list what the plan names (the update itself reads the state)
                return Cleanup(job_id, urns, disks, done=False)
            targets = _targets(urns, disks, held, job_id)
            return Cleanup(job_id, targets, [d for d in disks if d in targets], done=False,
                           leftovers=sorted(set(targets) - set(urns)))
        held = applier.held()
        targets = _targets(urns, disks, held, job_id)
        leftovers = sorted(set(targets) - set(urns))
        if inventory is None:
            raise LifecycleError(f"job {job_id}: its disks are kept because their ownership labels could not be checked")
        names = {r.urn: physical_name(r.inputs, cfg.cloud) for r in plan.resources if r.urn in disks}
        owned, why = disks_owned(inventory(cfg).disks(), cfg, ref.name, job_id, names, held)
        if not owned:
            raise LifecycleError(f"job {job_id}: its disks are kept because {why}")
        from cli.lifecycle.operations import signals_raise

        with signals_raise():  # SIGTERM/SIGHUP raise as Ctrl-C does, so what follows is put right
            with stackfile.locked(ref.path):  # act: on the job decided on, or not at all
                _recheck(ref, job, force)
                if not targets:  # nothing of the job in the state: dropping it from the file is all
                    _gone(ref, job)
                    return Cleanup(job_id, urns, disks, done=True)
                if leftovers:
                    out(f"job {job_id}: Pulumi's state still holds {', '.join(u.rsplit('::', 1)[-1] for u in leftovers)} "
                        "(its completion was never applied): deleted by the same update")
                lifted = [d for d in disks if d in held.protected]
                taken = _take(ref, job, force, applier, lifted)
            # The update runs outside the lock (as every command's): the job is out of the file already.
            _delete(ref, job, applier, targets, taken, lifted, out)
    return Cleanup(job_id, targets, [d for d in disks if d in targets], done=True, leftovers=leftovers)


def _take(ref: stackfile.StackRef, job: Job, force: bool, applier: Applier, lifted: list[str]) -> tuple:
    """Under the lock: unprotect the job's disks right before the update that deletes them, check the
    job once more, and take it out of the file (recording that, for a kill -9 during the update)."""
    try:
        applier.unprotect(lifted)
        _recheck(ref, job, force)  # a hand edit meanwhile (it does not take the lock)
    except BaseException:
        with contextlib.suppress(ApplyError):
            _protect_again(applier, lifted)
        raise
    taken = stackfile.take_job(ref.path, job.id)
    # Between here and the end of the update the job is out of the file and its disks are
    # unprotected: a kill -9 cannot be caught, so the next `cleanup JOB --yes` finds this record.
    _record_interrupted(ref.path, taken, lifted)
    return taken


def _delete(ref: stackfile.StackRef, job: Job, applier: Applier, targets: list[str], taken: tuple, lifted: list[str],
            out: Callable[[str], None]) -> None:
    """The update that deletes what ``_take`` took out of the file; a failure puts it back (``_failed``)."""
    from cli.lifecycle.operations import STOPS, Interrupted, signal_of

    try:
        applier.up(targets, out)
    except ApplyError as exc:
        raise _failed(ref, applier, taken, lifted, exc) from None
    except STOPS as exc:
        signum, name = signal_of(exc)
        err = _failed(ref, applier, taken, lifted, ApplyError(f"interrupted ({name})", started=True))
        raise Interrupted(str(err), signum) from None
    # Gone for good: a new job of this id starts after this one's attempts (its events stay). The
    # record says so first: a kill before the retirement is written leaves it to the next cleanup
    # (``_finish_retirement``), never a job gone without its id retired.
    _record_interrupted(ref.path, taken, lifted, retire=job.attempt)
    stackfile.retire(ref.path, job.id, job.attempt)
    _record_path(ref.path).unlink(missing_ok=True)


def _gone(ref: stackfile.StackRef, job: Job) -> None:
    """The job leaves the file for good when nothing of it is left to delete by an update: its id is
    retired after its attempts (its events stay; a new job of that id starts after them). Two writes:
    the record of the retirement to come is written before them (see ``_finish_retirement``)."""
    _record_interrupted(ref.path, ("", 0, {"id": job.id}), [], retire=job.attempt)
    stackfile.take_job(ref.path, job.id)
    stackfile.retire(ref.path, job.id, job.attempt)
    _record_path(ref.path).unlink(missing_ok=True)


def _targets(urns: list[str], disks: list[str], held: Held, job_id: str) -> list[str]:
    """The job leaves the program: its URNs in the plan and all the state holds under it are
    dropped, and the targets are those the state holds (``change_targets``, the one rule). Its
    disks are about to be unprotected; any other protected resource refuses the cleanup here,
    before anything changes."""
    dropped = set(urns) | held.under_job(urns, job_id)
    lifting = replace(held, protected=held.protected - set(disks))
    targets = change_targets([], dropped, lambda: lifting, job_id)
    # A disk only the state names (the plan does not) has no name to check its labels by: kept.
    unchecked = [u.rsplit("::", 1)[-1] for u in targets if u not in urns and u.endswith(("-disk", "-volume"))]
    if unchecked:
        raise LifecycleError(f"job {job_id}: its disks are kept because Pulumi's state holds disk(s) {', '.join(unchecked)} "
                             "the job does not declare (their ownership labels cannot be checked); nothing changed")
    return targets


def _protect_again(applier: Applier, lifted: list[str]) -> list[str]:
    """Protect again what spotctl unprotected and the state still holds (what a failed update did
    not delete); returns those URNs. Raises ApplyError when the state cannot be read or written."""
    if not lifted:
        return []
    left = applier.held().resources
    kept = [d for d in lifted if d in left]
    if kept:
        applier.protect(kept)
    return kept


def _record_path(path: Path) -> Path:
    return path.parent / ".spotctl" / f"{path.name}.cleanup.json"


def _record_interrupted(path: Path, taken: tuple, lifted: list[str], retire: int | None = None) -> None:
    """What a cleanup under way took out of the file and unprotected (removed once it is over); with
    ``retire``, its deletes are done and only the retirement of the id after that attempt is left."""
    from cli.lifecycle import cachefile

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
    from cli.lifecycle import cachefile

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


def _resume_if_idle(ref: stackfile.StackRef, job_id: str, applier: Applier, holding: bool,
                    out: Callable[[str], None]) -> None:
    """``_resume_interrupted`` only under the update lock (``holding``: the caller has it): a
    cleanup's update runs outside the stack file's lock, and its record is its own until it ends."""
    if holding:
        _resume_interrupted(ref, job_id, out)
    elif _record_path(ref.path).exists():
        # (an ApplyError: a cleanup's update is running now, and its record stays)
        with contextlib.suppress(ApplyError), applier.exclusive(ref.path, wait=False):
            _resume_interrupted(ref, job_id, out)


def _resume_interrupted(ref: stackfile.StackRef, job_id: str, out: Callable[[str], None]) -> None:
    """A cleanup of ``job_id`` killed during its update (the record is there): the job goes back in
    the file, so this cleanup decides and deletes again from the start (its disks' protection is
    lifted again only after the checks). Another job's record is left for its own cleanup."""
    from cli.lifecycle import cachefile

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


def _failed(ref: stackfile.StackRef, applier: Applier, taken: tuple, lifted: list[str], exc: ApplyError) -> ApplyError:
    """The cleanup's update failed: the job goes back in the file (what was not deleted is still
    declared there) and the disks it did not delete are protected again; the error says what is left."""
    stackfile.put_back_job(ref.path, taken)
    _record_path(ref.path).unlink(missing_ok=True)
    job_id = taken[2].get("id")
    what = "failed midway" if exc.started else "did not start"
    try:
        kept = _protect_again(applier, lifted)
    except ApplyError as again:
        protection = f"; its disks' protection could not be set again ({again})"
    else:
        protection = f"; the disks not deleted are protected again ({', '.join(d.rsplit('::', 1)[-1] for d in kept)})" if kept else ""
    return ApplyError(f"{exc}\njob {job_id}: the cleanup's update {what}: the job is kept in the stack file"
                      f"{protection}; run `spotctl cleanup {job_id} --yes` again to finish it",
                      started=exc.started, detail=exc.detail)


def _job(ref: stackfile.StackRef, cfg: StackConfig, job_id: str) -> Job:
    try:
        return cfg.job(job_id)
    except KeyError as exc:
        raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None


def _recheck(ref: stackfile.StackRef, seen: Job, force: bool) -> None:
    """The job as the file has it *now* is still the one the decision was made on (a hand edit
    does not take the lock)."""
    now = _job(ref, stackfile.load(ref), seen.id)
    # The whole entry: the plan (what is deleted) was made of the job as decided on, outside the lock.
    if now != seen or not may_delete_disks(now, force=force, owned=True)[0]:
        raise LifecycleError(f"job {seen.id} changed while its disks were being deleted "
                             f"(now {now.state.value}, attempt {now.attempt}); nothing deleted")


def owned_by(disk: CloudDisk, cfg: StackConfig, stack: str) -> bool:
    """The disk carries this exact stack's ownership labels (owner value and managed)."""
    owner, _, managed = disk.owner(cfg.cloud)
    return managed and owner == owner_value(stack)


def physical_name(inputs: Mapping[str, Any], cloud: str) -> str:
    """A disk's name in the cloud as the program declares it (GCP ``name``, AWS the ``Name`` tag)."""
    return str(inputs.get("name") or "") if cloud == "gcp" else str((inputs.get("tags") or {}).get("Name", ""))


def _cloud_name(disk: CloudDisk, cloud: str) -> str:
    return disk.labels.get("Name", "") if cloud == "aws" else disk.id


def disks_owned(disks: Iterable[CloudDisk], cfg: StackConfig, stack: str, job_id: str,
                names: Mapping[str, str], held: Held) -> tuple[bool, str]:
    """The ownership half of the one deletion rule, on the real disks: every disk about to be
    deleted (``names``: URN -> its name in the cloud) exists in the cloud carrying this exact
    stack's ownership labels and the job's label, or is in neither the cloud nor Pulumi's state
    (an update that failed midway deleted it already). (False, why) naming the first that is not.
    ``cleanup`` and a move's release both decide through it."""
    by_name = {_cloud_name(d, cfg.cloud): d for d in disks}
    for urn, name in sorted(names.items()):
        disk = by_name.get(name)
        if disk is None:
            if urn in held.resources:
                return False, (f"its disk {name} is not among the disks labelled for stack {stack} in the cloud "
                               "(relabelled, or deleted by hand: then `pulumi refresh`), yet Pulumi's state holds it")
            continue
        _, labelled_job, _ = disk.owner(cfg.cloud)
        if not owned_by(disk, cfg, stack) or labelled_job != label_value(job_id):
            return False, f"its disk {disk.id} does not carry this stack's ownership labels"
    return True, "every disk carries this stack's ownership labels"


def is_data_disk(disk: CloudDisk, cloud: str) -> bool:
    """A job's data disk/volume (job and node labels, no pool label), not a pool's or a VM's boot disk."""
    sep = ":" if cloud == "aws" else "-"
    labels = disk.labels
    return f"spotctl{sep}job" in labels and f"spotctl{sep}node" in labels and f"spotctl{sep}pool" not in labels


def deletable_orphans(disks: Iterable[CloudDisk], cfg: StackConfig, stack: str, held: Held | None = None,
                      completed: Mapping[str, datetime] | None = None) -> list[tuple[CloudDisk, bool, str]]:
    """Every data disk of this stack that no job of the file declares, with whether it may go and why.

    Boot disks and pool disks are not listed. An orphan may be deleted only when it carries this
    exact stack's ownership labels, its job is in neither the stack file nor the Pulumi state
    (``held``; None: unknown, so nothing goes), Pulumi holds no resource with its id, its job
    recorded a ``completed`` event after the disk was made (``completed``: job -> its last completion),
    and no VM uses it. Anything else is listed and kept.

    The completion must be later than the disk: an earlier one is of an earlier job of that id (ids
    are reused once retired), or of another deployment of a stack of the same name in the same account
    (AWS names its resources with random suffixes, so two can coexist; their ownership tags are the
    same): the disk of a live job of either stays.
    """
    declared = {j.id for j in cfg.jobs}
    done = dict(completed or {})
    out = []
    for disk in disks:
        if not is_data_disk(disk, cfg.cloud):
            continue
        _, job_id, _ = disk.owner(cfg.cloud)
        if job_id in declared:
            continue
        ok, why = may_delete_disks(None, force=False, owned=owned_by(disk, cfg, stack))
        if ok and held is None:
            ok, why = False, "the Pulumi state could not be read"
        elif ok and (job_id in held.jobs or disk.id in held.disks):
            ok, why = False, f"Pulumi's state still holds it (job {job_id})"
        elif ok and job_id not in done:
            ok, why = False, f"job {job_id} recorded no `completed` event (renamed or removed by hand?)"
        elif ok and disk.created is None:
            ok, why = False, "its creation time is unknown (a completion cannot be told to be its job's)"
        elif ok and done[job_id] <= disk.created:
            ok, why = False, (f"job {job_id}'s last `completed` event ({done[job_id].isoformat()}) is older than the disk "
                              f"(made {disk.created.isoformat()}): it is of an earlier job of that id, or of another stack "
                              "of the same name")
        elif ok and disk.in_use:
            ok, why = False, "it is attached to a VM"
        elif ok:
            why = f"job {job_id} completed and is in neither the stack file nor the Pulumi state"
        out.append((disk, ok, why))
    return out


def orphan_jobs(disks: Iterable[CloudDisk], cfg: StackConfig) -> set[str]:
    """The job ids named by data disks that no job of the file declares (whose events to read)."""
    declared = {j.id for j in cfg.jobs}
    return {job for d in disks if is_data_disk(d, cfg.cloud) and (job := d.owner(cfg.cloud)[1]) and job not in declared}


def cleanup_orphans(ref: stackfile.StackRef, inventory: Callable[[StackConfig], Inventory], applier: Applier | None,
                    completed: Callable[[StackConfig, str], datetime | None], *, delete: set[str] | None,
                    report: Callable[[CloudDisk, bool, str, bool], None] | None = None) -> list[tuple[CloudDisk, bool, str]]:
    """List orphaned disks and delete those that may go, decided and deleted under the stack
    file's lock: all of them with ``delete`` None, only those whose ids are in ``delete`` (what
    the user was shown and confirmed) otherwise. ``completed(cfg, job)`` is when a job last recorded a
    ``completed`` event (None: never); ``report(disk, deletable, why, deleting)`` is told about each."""
    with stackfile.locked(ref.path):
        cfg = stackfile.load(ref)
        inv = inventory(cfg)
        disks = inv.disks()
        held = applier.held() if applier else None
        done = {job: when for job in sorted(orphan_jobs(disks, cfg)) if (when := completed(cfg, job)) is not None}
        found = deletable_orphans(disks, cfg, ref.name, held, done)
        _delete_listed(found, delete, report, inv.delete)
    return found


def _delete_listed(found: list, delete: set[str] | None, report: Callable | None, remove: Callable) -> None:
    """Delete what may go of ``found`` (``(item, deletable, why)``): all of it with ``delete`` None,
    only the ids in ``delete`` (what the user was shown and confirmed) otherwise; ``report`` is told
    about each item first. Called under the stack file's lock."""
    for item, ok, why in found:
        going = ok and (delete is None or item.id in delete)
        if report:
            report(item, ok, why, going)
        if going:
            remove(item)


# ---- a move's snapshots follow the event retention -----------------------------------------------------
# Neither cloud expires a snapshot by itself: GCP's ``maxRetentionDays`` is the "policy for
# retention of scheduled snapshots" of a snapshot schedule (ResourcePolicySnapshotSchedulePolicyRetentionPolicy,
# cloud.google.com/python/docs/reference/compute/latest/google.cloud.compute_v1.types.ResourcePolicySnapshotSchedulePolicyRetentionPolicy),
# AWS's RetainRule is "for snapshots created by snapshot policies" of Data Lifecycle Manager
# (docs.aws.amazon.com/dlm/latest/APIReference/API_RetainRule.html). A move's snapshots are made by
# the Pulumi program, so spotctl deletes them itself after ``eventRetentionDays``.


def expired_snapshots(snaps: Iterable[CloudSnapshot], cfg: StackConfig, stack: str,
                      now: datetime) -> list[tuple[CloudSnapshot, bool, str]]:
    """Every move snapshot of this stack, with whether it may be deleted now and why.

    One may go when it carries this exact stack's ownership labels and a job and node label (a
    move's snapshot), is older than ``spotctl:eventRetentionDays``, and its job is not moving
    (a move in progress restores from it). Anything else is kept.
    """
    moving = {j.id for j in cfg.jobs if j.move is not None}
    keep_for = timedelta(days=cfg.event_retention_days)
    out = []
    for snap in snaps:
        if not is_data_disk(snap, cfg.cloud):
            continue
        _, job_id, _ = snap.owner(cfg.cloud)
        if not owned_by(snap, cfg, stack):
            ok, why = False, "it does not carry this stack's ownership labels"
        elif job_id in moving:
            ok, why = False, f"job {job_id} is moving (the move restores from its snapshots)"
        elif snap.created is None:
            ok, why = False, "its creation time is unknown"
        elif now - snap.created < keep_for:
            left = keep_for - (now - snap.created)
            ok, why = False, f"made {snap.created.date().isoformat()}: kept {left.days} more day(s) (eventRetentionDays {cfg.event_retention_days})"
        else:
            ok, why = True, f"made {snap.created.date().isoformat()}, older than eventRetentionDays ({cfg.event_retention_days})"
        out.append((snap, ok, why))
    return out


def prune_snapshots(ref: stackfile.StackRef, inventory: Callable[[StackConfig], Inventory], now: datetime, *,
                    delete: set[str] | None,
                    report: Callable[[CloudSnapshot, bool, str, bool], None] | None = None) -> list[tuple[CloudSnapshot, bool, str]]:
    """List this stack's move snapshots and delete the expired ones, decided and deleted under the
    stack file's lock (so no move can start between): all of them with ``delete`` None, only those
    whose ids are in ``delete`` otherwise; ``report(snapshot, deletable, why, deleting)`` is told about each."""
    with stackfile.locked(ref.path):
        cfg = stackfile.load(ref)
        inv = inventory(cfg)
        found = expired_snapshots(inv.snapshots(), cfg, ref.name, now)
        _delete_listed(found, delete, report, inv.delete_snapshot)
    return found
