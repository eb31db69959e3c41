"""Disks no job declares (orphans) and the snapshots a move left: which may go and why, decided and
deleted under the stack file's lock, each through the one deletion rule."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

from cli.cloud import CloudDisk, CloudSnapshot, Inventory
from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, Held
from cli.lifecycle.ownership import is_data_disk, owned_by
from cli.lifecycle.states import may_delete_disks
from infra.config import StackConfig


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
