"""``spotctl move``: a job and its disks to another zone of the stack, one resumable step at a time.

The move is code in the stack file: the job's ``move`` record names the last step written
(``snapshot`` -> ``restore`` -> ``start`` -> ``release``; what each step declares is
``infra.common.node_disks``) and ``zoneHistory`` the zones it left. Deciding the next step is pure
(``next_step``: the job as written and its events); acting writes it under the stack lock and
applies a targeted update of the job (``cli.lifecycle.pipeline.change_job``). An interrupted move
is continued by running the same command again: the recorded step is applied again (a no-op when
it was applied), then the next ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cli.cloud import CloudError, Inventory
from cli.lifecycle import pipeline, stackfile
from cli.lifecycle.apply import Applier, ApplyError, job_plan, job_urns
from cli.lifecycle.events import Event
from cli.lifecycle.states import C, Change, F, LifecycleError, R, S, attempt_outcome, check, may_delete_disks
from infra.config import ConfigError, Job, StackConfig

REASONS = {
    "snapshot": "the job's VMs go (state stopped) and every node's disk is snapshotted in {frm}",
    "restore": "new disks are restored from the snapshots in {to} (protected; the old disks stay)",
    "start": "attempt {attempt} starts in {to} on the restored disks (SPOTCTL_RESUME from the disk)",
    "release": "attempt {attempt} started in {to}: the disks in {frm} are deleted; the snapshots are kept",
}


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _record(job: Job, step: str) -> dict[str, Any]:
    assert job.move is not None
    began = {"began": _iso(job.move.began)} if job.move.began else {}
    held = {"held": list(job.move.held)} if job.move.held else {}
    replicas = {"replicaZones": list(job.move.replica_zones)} if job.move.replica_zones else {}
    attempt = {"attempt": job.move.attempt} if job.move.attempt is not None else {}
    return {"from": job.move.from_, "to": job.move.to, "step": step} | began | held | replicas | attempt


def _history(job: Job) -> list[dict[str, Any]]:
    """The job's zone history as written in the stack file (before a stay is added)."""
    return [_stay(z.zone, z.last_attempt, z.move_began) | ({"sameDisk": True} if z.same_disk else {}) for z in job.zone_history]


def _stay(zone: str, last_attempt: int, began: datetime | None) -> dict[str, Any]:
    return {"zone": zone, "lastAttempt": last_attempt} | ({"moveBegan": _iso(began)} if began else {})


def next_step(job: Job, to: str, events: list[Event], now: datetime | None = None,
              replicas: list[str] | None = None) -> Change:
    """The next step of moving ``job`` to zone ``to`` (pure), as the fields to write and why.

    A noop Change when there is nothing to do now (already there, or waiting for the new attempt's
    ``started`` event before the old disks may go); LifecycleError when the job cannot move.
    ``now`` is recorded as the move's start (its changeover is measured from there). ``replicas``
    (GCP): the move converts the job's zonal disk into a regional one replicated in those two
    zones (``to`` one of them, possibly the job's own zone): the same steps, the restored disks regional.
    """
    move = job.move
    if replicas is not None and (move is None or move.replica_zones != replicas):
        return _conversion(job, to, replicas, now, events)
    if move is None:
        if job.zone == to:
            return Change(job.id, {}, f"is already in zone {to}", noop=True)
        _movable(job, events)
        if job.disk_replica_zones:
            return _regional(job, to, now)
        fields: dict[str, Any] = {"move": {"from": job.zone, "to": to, "step": "snapshot", "attempt": job.attempt}
                                  | ({"began": _iso(now)} if now else {})}
        reason = REASONS["snapshot"].format(frm=job.zone)
        if job.state is not S:
            check(job.id, job.state, S)
            fields["state"] = S.value
        return Change(job.id, fields, f"move step snapshot: {reason}")
    if move.to != to:
        if move.step == "start" and _not_started(job, events):
            return _move_on(job, to, now)
        raise LifecycleError(f"job {job.id} is moving to {move.to} (step {move.step}); "
                             f"`spotctl move {job.id} --to-zone {move.to}` finishes that move first"
                             + (" (its new attempt started there)" if move.step == "start" else ""))
    words = {"frm": move.from_, "to": move.to, "attempt": job.attempt}
    if move.step == "snapshot":
        return Change(job.id, {"move": _record(job, "restore")}, "move step restore: " + REASONS["restore"].format(**words))
    if move.step == "restore":
        _snapshot_current(job)
        history = _history(job)
        fields = {"zone": move.to, "attempt": job.attempt + 1, "state": "running",
                  "zoneHistory": history + [_stay(move.from_, job.attempt, move.began)],
                  "move": _record(job, "start")}
        if move.replica_zones:  # from here on the job runs on its regional disk
            fields |= {"diskReplicaZones": list(move.replica_zones), "diskKind": "regional"}
        check(job.id, S, R)
        return Change(job.id, fields, "move step start: " + REASONS["start"].format(**words | {"attempt": job.attempt + 1}))
    if move.step == "start":
        missing = _not_started(job, events)
        if missing:
            return Change(job.id, {}, f"waiting for attempt {job.attempt} to start in {move.to} (no `started` event from node "
                          f"{', '.join(map(str, missing))} yet); the disks in {move.from_} stay protected. Run "
                          f"`spotctl move {job.id} --to-zone {move.to}` again once it started", noop=True)
        _left_unused(job, events)
        return Change(job.id, {"move": _record(job, "release")}, "move step release: " + REASONS["release"].format(**words))
    return Change(job.id, {"move": None}, f"moved to {move.to}: the move is finished")


def _movable(job: Job, events: list[Event]) -> None:
    if job.state is C:
        raise LifecycleError(f"job {job.id} is completed; there is nothing to move (spotctl cleanup {job.id} deletes its disks)")
    if job.state is F:
        raise LifecycleError(f"job {job.id} failed; `spotctl resume {job.id} --force` first, then move it")
    if job.state is R and attempt_outcome(events, job.attempt, job.nodes) is C:
        # The job finished and the file is not marked yet (no watcher ran since): a move would stop
        # it and start a new attempt from its last checkpoint. As ``resume`` says (decide_resume).
        raise LifecycleError(f"job {job.id}: attempt {job.attempt} completed (its events say so); there is nothing "
                             f"to move: run `spotctl complete {job.id}`")


def _snapshot_current(job: Job) -> None:
    """The snapshots hold the work of the attempt the move recorded; an attempt that ran on the
    disks it leaves since (a spotctl without the move guard, a hand edit) is not in them: the move
    stops before its start step, the disks where that attempt ran kept."""
    move = job.move
    if move is not None and move.attempt is not None and job.attempt != move.attempt:
        raise LifecycleError(f"job {job.id}: attempt {job.attempt} ran in {move.from_} after the move snapshotted its disks "
                             f"(at attempt {move.attempt}): the snapshots miss its work, so the move stops before its "
                             f"start step and the disks in {move.from_} are kept")


def _left_unused(job: Job, events: list[Event]) -> None:
    """The release's half of the move guard (``states.moving_guard``): no attempt newer than the
    move's ran on the disks it leaves. The zone history says which attempts ran there; with the
    move's attempt recorded, a later one there is refused; without it (a record written before),
    a ``started`` event there later than the move's beginning is."""
    move = job.move
    assert move is not None
    stay = job.zone_history[-1] if job.zone_history else None
    if stay is None:
        return
    mine = move.attempt if move.attempt is not None else stay.last_attempt
    late = {e.attempt for e in events if mine < e.attempt <= stay.last_attempt} | ({stay.last_attempt} if stay.last_attempt > mine else set())
    if move.attempt is None and move.began is not None:
        # (with the attempt recorded, its own VM booting after the move began is no matter: the
        # snapshot step stopped it before the snapshot)
        late |= {e.attempt for e in events if e.event == "started" and e.attempt <= stay.last_attempt and e.time > move.began}
    if late:
        raise LifecycleError(f"job {job.id}: attempt(s) {', '.join(map(str, sorted(late)))} ran in {move.from_} after the move "
                             f"snapshotted its disks (at attempt {mine}): the disks its move left hold their work and "
                             "are kept; nothing deleted")


def _conversion(job: Job, to: str, replicas: list[str], now: datetime | None, events: list[Event]) -> Change:
    """The snapshot step of a move that restores the job's zonal disks as regional ones (``replicas``)."""
    if job.move is not None:
        raise LifecycleError(f"job {job.id} is moving to {job.move.to} (step {job.move.step}); "
                             f"`spotctl move {job.id} --to-zone {job.move.to}` finishes that move first")
    _movable(job, events)
    if job.disk_replica_zones == replicas and job.zone == to:
        return Change(job.id, {}, f"runs on a regional disk replicated in {', '.join(replicas)} in zone {to} already", noop=True)
    if job.disk_replica_zones:
        raise LifecycleError(f"job {job.id}'s disk is regional already (diskReplicaZones {job.disk_replica_zones}); "
                             "there is nothing to convert")
    if to not in replicas:
        raise LifecycleError(f"job {job.id}: --to-zone {to} is not one of --replica-zones {replicas}")
    record = ({"from": job.zone, "to": to, "step": "snapshot", "replicaZones": list(replicas), "attempt": job.attempt}
              | ({"began": _iso(now)} if now else {}))
    fields: dict[str, Any] = {"move": record}
    if job.state is not S:
        check(job.id, job.state, S)
        fields["state"] = S.value
    return Change(job.id, fields, f"move step snapshot: {REASONS['snapshot'].format(frm=job.zone)}; its disks are "
                  f"restored as regional disks replicated in {', '.join(replicas)} (a new generation, a new name)")


def _move_on(job: Job, to: str, now: datetime | None) -> Change:
    """The move's new attempt never started in its target zone (refused for capacity): move on from
    there to ``to`` as a new move. Its disks there (restored, never used by a whole gang) are
    snapshotted like any job disk; the disks the job left before stay protected (``held``) until
    the attempt in ``to`` has started, and go with this move's release."""
    move = job.move
    assert move is not None
    if move.replica_zones:
        raise LifecycleError(f"job {job.id}: its disk is being converted to a regional one in {move.to}; a conversion "
                             f"does not move on (retry it there: `spotctl move {job.id} --to-zone {move.to}`)")
    held = [*move.held, move.from_]
    record = {"from": job.zone, "to": to, "step": "snapshot", "held": held, "attempt": job.attempt} | ({"began": _iso(now)} if now else {})
    if job.state is not S:  # stopped already: its VMs went (the stop before moving on was applied, then interrupted)
        check(job.id, job.state, S)
    reason = (f"move step snapshot: attempt {job.attempt} never started in {job.zone}; moving on to {to}: "
              + REASONS["snapshot"].format(frm=job.zone) + f"; the disks in {', '.join(held)} stay protected until "
              f"an attempt has started in {to}")
    return Change(job.id, {"move": record, "state": S.value}, reason)


def _regional(job: Job, to: str, now: datetime | None) -> Change:
    """A job with a regional disk moves to its other replica zone in one step: the next attempt
    starts there on the same disk (force-attached: infra/gcp.py), nothing is snapshotted or deleted."""
    replicas = job.disk_replica_zones or []
    if to not in replicas:
        raise LifecycleError(f"job {job.id}: its regional disk is replicated in {replicas}; it can move only there "
                             f"(not {to}); do not drop diskReplicaZones from a job that has run: "
                             f"its disk would be declared anew, empty")
    if job.state is not R:
        check(job.id, job.state, R)
    history = _history(job)
    fields = {"zone": to, "attempt": job.attempt + 1, "state": R.value,
              "zoneHistory": history + [_stay(job.zone, job.attempt, now) | {"sameDisk": True}]}
    return Change(job.id, fields, f"regional disk: attempt {job.attempt + 1} starts in {to} on the same disk "
                  f"(its replica there, force-attached); no snapshot, nothing deleted")


def move_changeovers(job: Job, events: list[Event], same_disk: bool = False) -> list[float]:
    """Hours each of the job's past moves took, from its start (the snapshot step written) to the
    first ``started`` event of the attempt it started in the new zone: snapshot, restore and boot
    (``same_disk``: the regional disk's moves instead, boot only)."""
    out = []
    for stay in job.zone_history:
        if stay.move_began is None or stay.same_disk != same_disk:
            continue
        starts = [e.time for e in events if e.attempt == stay.last_attempt + 1 and e.event == "started"]
        if starts and min(starts) >= stay.move_began:
            out.append((min(starts) - stay.move_began).total_seconds() / 3600)
    return out


def _not_started(job: Job, events: list[Event]) -> list[int]:
    """Nodes of the current attempt without a ``started`` event (a gang starts when every node did)."""
    # A node that wrote ``completed`` had started (its ``started`` may be lost).
    started = {e.node for e in events if e.attempt == job.attempt and e.event in ("started", "completed")}
    return [r for r in range(job.nodes) if r not in started]


def reapply(job: Job) -> Change:
    """The recorded step written again, so it is applied again (a move continued after an interruption);
    nothing once the move finished meanwhile (another spotctl carried it on while this one waited)."""
    if job.move is None:
        return Change(job.id, {}, "the move finished meanwhile", noop=True)
    return Change(job.id, {"move": _record(job, job.move.step)},
                  f"move step {job.move.step} again (continuing a move that may have been interrupted)")


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
             replicas: list[str] | None = None) -> MoveOutcome:
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
        if not _step(ref, job_id, lambda j, seen=seen: next_step(j, to, seen, now(), replicas), applier, out, confirm, result,
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
