"""``spotctl move``: a job and its disks to another zone of the stack, one resumable step at a time.

The move is code in the stack file: the job's ``move`` record names the last step written
(``snapshot`` -> ``restore`` -> ``start`` -> ``release``; what each step declares is
``infra.common.node_disks``) and ``zoneHistory`` the zones it left. Deciding the next step is pure
(``next_step``: the job as written and its events); acting (``mover``) writes it under the stack lock
and applies a targeted update of the job (``cli.lifecycle.pipeline.change_job``). An interrupted move
is continued by running the same command again: the recorded step is applied again (a no-op when
it was applied), then the next ones.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cli.lifecycle.events import Event
from cli.lifecycle.states import C, Change, F, LifecycleError, R, S, attempt_outcome, check
from infra.config import Capacity, Job

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
              replicas: list[str] | None = None, capacity: Capacity | None = None) -> Change:
    """The next step of moving ``job`` to zone ``to`` (pure), as the fields to write and why.

    A noop Change when there is nothing to do now (already there, or waiting for the new attempt's
    ``started`` event before the old disks may go); LifecycleError when the job cannot move.
    ``now`` is recorded as the move's start (its changeover is measured from there). ``replicas``
    (GCP): the move converts the job's zonal disk into a regional one replicated in those two
    zones (``to`` one of them, possibly the job's own zone): the same steps, the restored disks regional.
    ``capacity``: the new attempt's (``resume`` following the zone choice), else the job's.
    """
    move = job.move
    if replicas is not None and (move is None or move.replica_zones != replicas):
        return _conversion(job, to, replicas, now, events)
    if move is None:
        if job.zone == to:
            return Change(job.id, {}, f"is already in zone {to}", noop=True)
        _movable(job, events)
        if job.disk_replica_zones:
            return _capacity(_regional(job, to, now), job, capacity)
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
        return _capacity(Change(job.id, fields, "move step start: " + REASONS["start"].format(**words | {"attempt": job.attempt + 1})),
                         job, capacity)
    if move.step == "start":
        missing = _not_started(job, events)
        if missing:
            return Change(job.id, {}, f"waiting for attempt {job.attempt} to start in {move.to} (no `started` event from node "
                          f"{', '.join(map(str, missing))} yet); the disks in {move.from_} stay protected. Run "
                          f"`spotctl move {job.id} --to-zone {move.to}` again once it started", noop=True)
        _left_unused(job, events)
        return Change(job.id, {"move": _record(job, "release")}, "move step release: " + REASONS["release"].format(**words))
    return Change(job.id, {"move": None}, f"moved to {move.to}: the move is finished")


def _capacity(change: Change, job: Job, capacity: Capacity | None) -> Change:
    """The step that starts the new attempt, on ``capacity`` when it is not the job's."""
    if capacity is None or capacity is job.capacity:
        return change
    return Change(change.job_id, change.fields | {"capacity": capacity.value}, f"{change.reason}, on {capacity.value}")


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
