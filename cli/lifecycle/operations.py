"""Job operations behind resume/failover/complete: observe (stack file + recorded events), decide
(``cli.lifecycle.states``), act (edit the stack file atomically under its lock, then a targeted update)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError, job_targets
from cli.lifecycle.states import Change
from infra.config import ConfigError, Job, StackConfig

# ---- act ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    change: Change
    config: StackConfig
    applied: bool
    declined: bool = False  # previewed, then not confirmed (or --preview-only): the file is as before


Confirm = Callable[[str], bool]
"""Asked after Pulumi's preview of the targeted update; False leaves everything as it was."""


Release = Callable[[list[str]], list[str]]
"""Given the URNs a targeted update would touch, under the lock after the edit and before the preview:
the URNs it must also target because the edit drops them (so the update deletes them), once
approved and unprotected (``spotctl move`` releasing old disks); raises to refuse."""


def change_job(ref: stackfile.StackRef, job_id: str, decide: Callable[[Job], Change], *,
               applier: Applier | None, out: Callable[[str], None] = print,
               confirm: Confirm | None = None, release: Release | None = None) -> Outcome:
    """Decide on the job as the stack file has it *under the lock*, write the change, then apply.

    With ``applier`` None the file is only edited (--no-apply). With ``confirm`` (the commands pass
    one unless --yes; ``watch`` passes none: it is the automation) Pulumi first previews the
    targeted update with the edited file, and ``confirm`` decides; declined, the edit is undone.
    With ``release``, what the edit drops from the job is targeted too (so the update deletes it),
    after ``release`` approved it.
    If the update cannot start, the edit is undone (only the keys it set), so the file again
    matches what runs in the cloud.
    """
    guard = applier.exclusive(ref.path) if applier else contextlib.nullcontext()
    if applier:
        applier.preflight()
    with guard:
        holder: dict[str, Any] = {}

        def fields(current: StackConfig, written: Any) -> dict[str, Any]:
            try:
                job = current.job(job_id)
            except KeyError as exc:
                raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None
            change = decide(job)
            wrote = dict(change.fields)
            if job.stop_reason and wrote.get("state", "stopped") != "stopped":
                wrote["stopReason"] = None  # the job leaves the stop it explained
            holder["change"], holder["wrote"] = change, wrote
            holder["before"] = {k: written.get(k, _MISSING) for k in wrote}
            return {} if change.noop else wrote

        old_cfg, new_cfg = stackfile.update_job(ref.path, job_id, fields)
        change: Change = holder["change"]
        if change.noop or applier is None:
            return Outcome(change, new_cfg, applied=False)

        old_job = old_cfg.job(job_id)
        applier.step(f"job {job_id}: planning its resources under mocks (the URNs to target)")
        targets = job_targets(new_cfg, ref.name, job_id)
        if release is not None:
            try:
                targets = sorted(set(targets) | set(release(targets)))
            except Exception:
                _undo(ref.path, job_id, holder["before"], holder["wrote"])
                raise
        if confirm is not None and not _previewed_and_confirmed(ref, job_id, change, holder["wrote"], old_job, targets, applier,
                                                                holder["before"], out, confirm):
            return Outcome(change, old_cfg, applied=False, declined=True)
        gang = _gang_restart(old_job, change)
        if gang:
            _stop_gang_first(ref, job_id, old_cfg, applier, holder["before"], out)
        try:
            applier.up(targets, out)
        except ApplyError as exc:
            if not exc.started:
                _undo(ref.path, job_id, holder["before"], holder["wrote"])
                if gang:  # the old gang is gone: the file must not say it runs
                    why = (f"every node of attempt {old_job.attempt} was stopped, then attempt {old_job.attempt + 1} could not "
                           f"start: {exc}. `spotctl resume {job_id}` starts it")
                    stackfile.update_job(ref.path, job_id, lambda current, written: {"state": "stopped", "stopReason": why})
                    raise ApplyError(f"job {job_id}: left stopped at attempt {old_job.attempt}: {why}", detail=exc.detail) from None
            raise
        _record_disk_kind(ref.path, job_id, new_cfg)
        return Outcome(change, new_cfg, applied=True)


def _record_disk_kind(path: Path, job_id: str, cfg: StackConfig) -> None:
    """The job has run on its disk once an update of it was applied: record the disk's kind (GCP),
    so adding or dropping ``diskReplicaZones`` by hand later is refused (``infra.config._disk_kind_checks``)."""
    if cfg.cloud != "gcp":
        return

    def fields(current: StackConfig, written: Any) -> dict[str, Any]:
        try:
            job = current.job(job_id)
        except KeyError:
            return {}
        if job.disk_kind is not None or job.state.value == "pending":
            return {}
        return {"diskKind": "regional" if job.disk_replica_zones else "zonal"}

    stackfile.update_job(path, job_id, fields)


def _previewed_and_confirmed(ref: stackfile.StackRef, job_id: str, change: Change, wrote: dict[str, Any], old_job: Job,
                             targets: list[str], applier: Applier, before: dict[str, Any], out: Callable[[str], None],
                             confirm: Confirm) -> bool:
    """Pulumi's preview of the targeted update (the file already edited), then the question; on
    no (or a failed preview) the edit is undone."""
    try:
        applier.preview(targets, out)
    except ApplyError:
        _undo(ref.path, job_id, before, wrote)
        raise
    gang = (f" (every node of attempt {old_job.attempt} is stopped first)" if _gang_restart(old_job, change) else "")
    if confirm(f"Do you want to perform this update of job {job_id}{gang}?"):
        return True
    _undo(ref.path, job_id, before, wrote)
    return False


def _gang_restart(job: Job, change: Change) -> bool:
    """A new attempt of a multi-node job whose VMs may still run (some nodes survived a preemption)."""
    return job.nodes > 1 and "attempt" in change.fields and job.state.value in ("pending", "running")


def _stop_gang_first(ref: stackfile.StackRef, job_id: str, old_cfg: StackConfig, applier: Applier,
                     before: dict[str, Any], out: Callable[[str], None]) -> None:
    """Delete every VM of the current attempt before the new one starts, so no surviving node of
    the old gang is still running when the new rendezvous begins: the job is written as stopped
    (it then declares no VMs) and a targeted update of the old attempt's resources applies that."""

    old_targets = job_targets(old_cfg, ref.name, job_id)
    final = stackfile.job_fields(ref.path, job_id, list(before))
    stopped = {k: before[k] for k in before if before[k] is not _MISSING} | {"state": "stopped"}
    stackfile.update_job(ref.path, job_id, lambda current, written: stopped)
    attempt = old_cfg.job(job_id).attempt
    out(f"job {job_id}: stopping every node of attempt {attempt} before the new attempt starts")
    try:
        applier.up(old_targets, out)
    except ApplyError as exc:
        if not exc.started:
            _undo(ref.path, job_id, before, final | stopped)
            raise
        # The stop began: some old nodes may be gone, so the file stays stopped. Say so, there and here.
        why = (f"the stop of every node of attempt {attempt} (before attempt {attempt + 1}) failed midway: {exc}; "
               f"some of its VMs may still run. `spotctl resume {job_id}` starts attempt {attempt + 1} (its update "
               f"replaces what is left of attempt {attempt})")
        stackfile.update_job(ref.path, job_id, lambda current, written: {"stopReason": why})
        raise ApplyError(f"job {job_id}: left stopped at attempt {attempt}: {why}", started=True, detail=exc.detail) from None
    stackfile.update_job(ref.path, job_id, lambda current, written: final)


class _Missing:
    pass


_MISSING = _Missing()


def _undo(path: Path, job_id: str, before: dict[str, Any], wrote: dict[str, Any]) -> None:
    """Put back the keys this command set, under the lock, each only while it still holds what
    the command wrote (a concurrent complete, failover or hand edit wins); a job removed meanwhile
    is left removed."""

    def restore(config_map: Any, current: StackConfig) -> None:
        try:
            entry = stackfile.job_entry(config_map, job_id)
        except KeyError:
            return
        for name, value in before.items():
            if name not in wrote or entry.get(name, _MISSING) != wrote[name]:
                continue
            if value is _MISSING:
                entry.pop(name, None)
            else:
                entry[name] = value

    if all(v is not _MISSING for v in before.values()):
        def keys(current: StackConfig, written: Any) -> dict[str, Any]:
            return {k: v for k, v in before.items() if k in wrote and written.get(k, _MISSING) == wrote[k]} if written else {}

        stackfile.update_job(path, job_id, keys)
        return
    stackfile.edit(path, restore)
