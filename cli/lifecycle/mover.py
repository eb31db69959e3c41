"""``spotctl move`` acted on: every step the situation allows now, each written and applied through
the change pipeline (``pipeline.change_job``), the old disks released through the one deletion rule,
and the move's expired snapshots pruned once it finished. The steps are decided in ``move``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cli.cloud import CloudError, Inventory
from cli.lifecycle import pipeline, stackfile
from cli.lifecycle.apply import Applier, ApplyError, job_plan, job_urns
from cli.lifecycle.events import Event
from cli.lifecycle.move import next_step, reapply
from cli.lifecycle.states import Change, LifecycleError, S, may_delete_disks
from infra.config import Capacity, ConfigError, Job, StackConfig


@dataclass
class MoveOutcome:
    job_id: str
    steps: list[Change] = field(default_factory=list)
    applied_steps: list[bool] = field(default_factory=list)  # per step: applied by a targeted update
    applied: bool = False
    declined: bool = False
    finished: bool = False
    waiting: str = ""
    snapshots: str = ""  # what pruning expired snapshots did once the move finished


def move_job(ref: stackfile.StackRef, job_id: str, to: str, *, events: Callable[[], list[Event]],
             applier: Applier | None, out: Callable[[str], None] = print,
             confirm: pipeline.Confirm | None = None,
             now: Callable[[], datetime] = lambda: datetime.now(UTC),
             inventory: Callable[[StackConfig], Inventory] | None = None,
             replicas: list[str] | None = None, capacity: Capacity | None = None) -> MoveOutcome:
    """Move a job to zone ``to``: every step the situation allows now, each written and applied
    as its own targeted update (``--no-apply``: one step is written, nothing else).

    ``events`` is read before each decision (the new attempt's ``started`` gates the release).
    With ``inventory``, once the move finished, the stack's move snapshots older than the event
    retention are deleted (``orphans.prune_snapshots``; the ones just made are days younger).
    """
    result = MoveOutcome(job_id)
    cfg = stackfile.load(ref)
    try:
        job = cfg.job(job_id)
    except KeyError as exc:
        raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None
    if job.zone != to and to not in cfg.zones:
        raise ConfigError(str(ref.path), [f"job {job_id}: --to-zone {to!r} is not in spotctl:zones {cfg.zones}"])
    if replicas is not None and cfg.cloud != "gcp":
        raise ConfigError(str(ref.path), [f"job {job_id}: --replica-zones: regional persistent disks are a GCP option"])
    if applier is None and job.applying is not None:
        # The file's step was never applied (its update is pending): a next step written over it
        # (the release's end, `move: null`) would drop the old disks from the file unreleased.
        result.waiting = f"an update of the job is pending ({job.applying}); --no-apply writes no step over it"
        return result
    # The recorded step may not have been applied (a failed or interrupted update): apply it again.
    resuming = job.move is not None and job.move.to == to and applier is not None
    if resuming and not _step(ref, job_id, reapply, applier, out, confirm, result, inventory):
        return result
    while True:
        seen = events()
        if not _step(ref, job_id, lambda j, seen=seen: next_step(j, to, seen, now(), replicas, capacity), applier, out, confirm, result,
                     inventory) or applier is None:
            break
    if not result.finished and result.steps and "move" not in result.steps[-1].fields and stackfile.load(ref).job(job_id).zone == to:
        result.finished, result.waiting = True, ""  # a regional disk's move: one step, nothing to release
    if result.finished and inventory is not None and applier is not None:
        result.snapshots = _prune(ref, inventory, now())
    return result


def _prune(ref: stackfile.StackRef, inventory: Callable[[StackConfig], Inventory], now: datetime) -> str:
    """Expired move snapshots deleted; a cloud that cannot be asked is a line to show, not a failed move."""
    from cli.lifecycle.orphans import prune_snapshots

    try:
        found = prune_snapshots(ref, inventory, now, delete=None)
    except CloudError as exc:
        return f"expired snapshots not checked: {exc}"
    gone = [s.id for s, ok, _ in found if ok]
    return f"deleted {len(gone)} snapshot(s) older than eventRetentionDays: {', '.join(gone)}" if gone else ""


def _step(ref: stackfile.StackRef, job_id: str, decide: Callable[[Job], Change], applier: Applier | None,
          out: Callable[[str], None], confirm: pipeline.Confirm | None, result: MoveOutcome,
          inventory: Callable[[StackConfig], Inventory] | None = None) -> bool:
    """One step: written and applied; False when the move stops here (done, waiting, declined)."""
    job = stackfile.load(ref).job(job_id)
    change = decide(job)
    if change.noop:
        result.waiting = change.reason
        return False
    if change.fields.get("move", ...) is None:
        # The end: only the record is cleared (decided again under the lock; the release declared the rest).
        def end(current: Job) -> Change:
            again = decide(current)
            return again if again.fields.get("move", ...) is None else Change(job_id, {}, "the move went on meanwhile", noop=True)

        change = pipeline.change_job(ref, job_id, end, applier=None, out=out).change
        result.steps.append(change)
        result.applied_steps.append(False)
        result.finished = True
        return False
    record = change.fields.get("move") or {}
    release = None
    if record.get("step") == "release":
        release = _releaser(ref, job_id, applier, inventory)
    elif job.move is not None and record.get("to", job.move.to) != job.move.to:
        release = _forget_snapshots(ref, job_id, job)
    # A snapshot of a disk a VM still writes to is only crash-consistent: the VMs go first, by an update of their own.
    stop_first = "its disks are snapshotted" if record.get("step") == "snapshot" else ""
    if stop_first and job.state is S and applier is not None:
        _stray_vms_gone(ref, job_id, applier, out)
    try:
        outcome = pipeline.change_job(ref, job_id, decide, applier=applier, out=out, confirm=confirm, release=release,
                                        stop_first=stop_first)
    except ApplyError as exc:
        hint = _existing_snapshots(ref, job_id, f"{exc}\n{exc.detail}")
        if hint:
            raise ApplyError(f"{exc}\n{hint}", started=exc.started, detail=exc.detail) from None
        raise
    result.steps.append(outcome.change)
    result.applied_steps.append(outcome.applied)
    result.applied = result.applied or outcome.applied
    if outcome.declined:
        result.declined = True
        return False
    return True


def _stray_vms_gone(ref: stackfile.StackRef, job_id: str, applier: Applier, out: Callable[[str], None]) -> None:
    """A job written stopped whose VMs Pulumi's state still holds (a stop that failed midway, then
    the move run again): those VMs are deleted by an update of their own, before the snapshot step;
    the stopped job's plan no longer names them, so the snapshot step alone would not target them,
    and Pulumi deletes what it drops only last (pulumi/pulumi#16589)."""
    import re

    from cli.lifecycle.apply import change_targets, job_targets

    applier.preflight()
    with applier.exclusive(ref.path):
        new = job_targets(stackfile.load(ref), ref.name, job_id)
        held = applier.held()
        stray = sorted(u for u in held.under_job(new, job_id) - set(new) if re.search(r"/instance:Instance::", u))
        if not stray:
            return
        out(f"job {job_id}: deleting {len(stray)} VM(s) a failed stop left before its disks are snapshotted")
        # Only what the state holds: the file already declares the snapshots, and an update that created
        # them here would take them before its deletes (Pulumi deletes last), of disks the VMs still write.
        applier.up([u for u in change_targets(new, stray, lambda: held, job_id) if u in held.resources], out)


def _releaser(ref: stackfile.StackRef, job_id: str, applier: Applier | None,
              inventory: Callable[[StackConfig], Inventory] | None) -> pipeline.Release:
    """Approve deleting the disks a move left behind through the one deletion rule, decided under
    the stack file's lock on the real disks: each must carry this exact stack's ownership labels
    and the job's label in the cloud (``ownership.disks_owned``, as ``cleanup`` decides), else the
    release is refused naming it and every disk stays protected; else they are approved, to be
    unprotected right before the update that deletes them (after the preview and the question)."""
    from cli.lifecycle.ownership import disks_owned, physical_name

    def release(targets: list[str]) -> pipeline.Approved:
        with stackfile.locked(ref.path):
            current = stackfile.load(ref)
            job = current.job(job_id)
            if job.move is None or job.move.step != "release":
                return pipeline.Approved([])
            # What the job declared at step start (old disks and snapshots included), also when this
            # is a release applied again after an interruption (the file already says release).
            at_start = job.model_copy(update={"move": job.move.model_copy(update={"step": "start"})})
            before = current.model_copy(update={"jobs": [at_start if j.id == job_id else j for j in current.jobs]})
            plan = job_plan(before, ref.name, job_id, limits=False)
            gone = sorted(set(job_urns(plan, job_id)) - set(targets))
            disks = [r for r in plan.resources if r.urn in gone and (r.urn.endswith("-disk") or r.urn.endswith("-volume"))]
            if not disks:
                return pipeline.Approved(gone)
            if applier is None or inventory is None:
                raise LifecycleError(f"job {job_id}: the disks its move left are kept because their ownership labels "
                                     "could not be checked")
            held = applier.held()
            names = {d.urn: physical_name(d.inputs, current.cloud) for d in disks}
            try:
                listed = inventory(current).disks()
            except CloudError as exc:
                raise LifecycleError(f"job {job_id}: the disks its move left are kept because their ownership labels "
                                     f"could not be checked: {exc}") from None
            owned, why = disks_owned(listed, current, ref.name, job_id, names, held)
            ok, rule = may_delete_disks(job, force=False, owned=owned, moved_and_started=True)
            if not ok:
                raise LifecycleError(f"job {job_id}: the disks its move left are kept because {why if not owned else rule}; "
                                     "nothing deleted (if that disk is not this stack's, `pulumi state delete` its URN, "
                                     f"then run `spotctl move {job_id} --to-zone {job.zone}` again)")
            seen = (job.state, job.attempt, job.zone, job.move)

            def recheck() -> None:
                """The job as the file has it right before the unprotect is still the one approved (its
                state, attempt, zone and move record; the disks' labels were checked in the cloud above)."""
                with stackfile.locked(ref.path):
                    try:
                        now = stackfile.load(ref).job(job_id)
                    except KeyError:
                        raise LifecycleError(f"job {job_id} left the stack file while the disks its move left were "
                                             "being released; nothing deleted") from None
                if (now.state, now.attempt, now.zone, now.move) != seen:  # what the rule decided on
                    raise LifecycleError(f"job {job_id} changed while the disks its move left were being released (now "
                                         f"{now.state.value}, attempt {now.attempt}, {now.zone}); nothing deleted: run "
                                         f"`spotctl move {job_id} --to-zone {job.zone}` again to decide on the file as it is")

            # `state unprotect` of a URN the state does not hold fails: only those it holds protected
            return pipeline.Approved(gone, [d.urn for d in disks if d.urn in held.protected], recheck)

    return release


def _forget_snapshots(ref: stackfile.StackRef, job_id: str, before: Job) -> pipeline.Release:
    """Moving on drops the refused move's snapshots from the program (kept in the cloud:
    ``retain_on_delete``): target them so Pulumi's state forgets them now, as a release does. No
    disk may be among what the edit drops (every earlier disk is ``held``)."""

    def release(targets: list[str]) -> pipeline.Approved:
        current = stackfile.load(ref)
        was = current.model_copy(update={"jobs": [before if j.id == job_id else j for j in current.jobs]})
        gone = sorted(set(job_urns(job_plan(was, ref.name, job_id, limits=False), job_id)) - set(targets))
        disks = [u for u in gone if u.endswith("-disk") or u.endswith("-volume")]
        if disks:
            raise LifecycleError(f"job {job_id}: moving on would drop disk(s) {', '.join(disks)}: refused")
        return pipeline.Approved([u for u in gone if u.endswith("-snapshot")])

    return release


def _existing_snapshots(ref: stackfile.StackRef, job_id: str, text: str) -> str:
    """What to do when GCP refused a move's snapshot because one of its name exists: an earlier
    snapshot step's create outlived the provider's wait, which then forgot it while Compute Engine
    finished it (gcp.move-create-timeout), so applying the step again POSTs the same name. spotctl
    does not adopt it on its own: the user checks it is this job's (its labels) and ready, then
    imports it under the URN, parent and provider the program declares it with."""
    import re
    import shlex


    names = set(re.findall(r"snapshots/([a-z0-9-]+)'? already exists", text))
    if not names:
        return ""
    cfg = stackfile.load(ref)
    plan = job_plan(cfg, ref.name, job_id)
    lines = []
    for r in plan.resources:
        name = r.inputs.get("name")
        if not r.type.endswith("compute/snapshot:Snapshot") or name not in names:
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted((r.inputs.get("labels") or {}).items()))
        move = cfg.job(job_id).move
        lines += [
            f"snapshot {name} exists in project {cfg.project} but not in Pulumi's state: an earlier create outlived the "
            "provider's wait and was forgotten while Compute Engine finished it. Check it is this job's and ready "
            f"(status READY, labels {labels}):",
            f"  gcloud compute snapshots describe {shlex.quote(name)} --project {shlex.quote(cfg.project or '')} "
            "--format='value(status,labels)'",
            "then adopt it and continue the move:",
            f"  pulumi import gcp:compute/snapshot:Snapshot {shlex.quote(r.name)} "
            f"{shlex.quote(f'projects/{cfg.project}/global/snapshots/{name}')} "
            f"--parent {shlex.quote('parent=' + (r.parent or ''))} --provider {shlex.quote('gcp=' + r.provider.rsplit('::', 1)[0])} "
            f"--protect=false --stack {shlex.quote(ref.name)} --yes",
            f"  spotctl move {job_id} --to-zone {move.to if move else '<zone>'}",
            "If its labels are not these, it is not this job's: delete or rename it, then run the move again.",
        ]
    return "\n".join(lines)
