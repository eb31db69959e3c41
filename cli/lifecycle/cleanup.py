"""``spotctl cleanup``: deleting a completed job's disks, and which orphaned disks may go.

Every deletion goes through the one rule in ``cli.lifecycle.states.may_delete_disks``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cli.cloud import CloudDisk
from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError, job_urns
from cli.lifecycle.states import LifecycleError, may_delete_disks
from infra.config import ConfigError, StackConfig
from infra.naming import label_value


@dataclass
class Cleanup:
    job_id: str
    urns: list[str]
    disks: list[str]
    done: bool


def cleanup_job(ref: stackfile.StackRef, job_id: str, *, force: bool, yes: bool, applier: Applier | None,
                out: Callable[[str], None] = print) -> Cleanup:
    """Delete a completed job's disks (and drop the job from the stack): ``pulumi state unprotect``
    on its disks, remove its entry, then a targeted update deletes exactly its resources.

    Without ``yes`` nothing changes (a dry run). With ``applier`` None only the file is edited and
    the disks stay protected in Pulumi's state (the next ``pulumi up`` refuses to delete them).
    """
    from cli.lifecycle.apply import disk_urns
    from cli.plan import mocks as planner

    cfg = stackfile.load(ref)
    try:
        job = cfg.job(job_id)
    except KeyError as exc:
        raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None
    allowed, why = may_delete_disks(job, force=force, owned=True)
    if not allowed:
        raise LifecycleError(f"job {job_id}: its disks are kept because {why}")
    plan = planner.run(cfg, ref.name)
    urns, disks = job_urns(plan, job_id), disk_urns(plan, job_id)
    if not yes:
        return Cleanup(job_id, urns, disks, done=False)
    if applier:
        applier.preflight()
    guard = applier.exclusive(ref.path) if applier else contextlib.nullcontext()
    with guard:
        original = ref.path.read_text()
        stackfile.edit(ref.path, lambda config, current: stackfile.remove_job(config, job_id))
        if applier is None:
            return Cleanup(job_id, urns, disks, done=True)
        try:
            applier.unprotect(disks)
            applier.up(urns, out)
        except ApplyError as exc:
            if not exc.started:
                _restore_if_unchanged(ref.path, original, job_id)
            raise
    return Cleanup(job_id, urns, disks, done=True)


def _restore_if_unchanged(path: Path, original: str, job_id: str) -> None:
    """Put the removed job back (the whole original file, when nothing else changed it since)."""
    with stackfile.locked(path):
        current = stackfile.read_config(path)
        if not any(isinstance(j, dict) and j.get("id") == job_id for j in current.get(stackfile.key("jobs")) or []):
            stackfile.atomic_write(path, original)


def owned_by(disk: CloudDisk, cfg: StackConfig, stack: str) -> bool:
    owner, _, managed = disk.owner(cfg.cloud)
    expected = stack if cfg.cloud == "aws" else label_value(stack)
    return managed and owner == expected


def deletable_orphans(disks: Iterable[CloudDisk], cfg: StackConfig, stack: str) -> list[tuple[CloudDisk, bool, str]]:
    """Every disk of this stack that no job declares, with whether it may go and why.

    A disk is an orphan when its job label names no job of the stack file. It may be deleted only
    when it carries this stack's ownership labels and is not attached to a VM.
    """
    declared = {j.id for j in cfg.jobs}
    out = []
    for disk in disks:
        _, job_id, _ = disk.owner(cfg.cloud)
        if job_id in declared:
            continue
        owned = owned_by(disk, cfg, stack)
        ok, why = may_delete_disks(None, force=False, owned=owned)
        if ok and disk.in_use:
            ok, why = False, "it is attached to a VM"
        out.append((disk, ok, why))
    return out
