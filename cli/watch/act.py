"""The watcher's act step: one action on one job through the lifecycle core
(``cli.lifecycle.pipeline.change_job``), decided again under the stack-file lock with the state
machine, with its intent journaled first so a crash mid-action is finished, never repeated."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cli.lifecycle import applying, pipeline, stackfile
from cli.lifecycle.apply import Applier, ApplyError
from cli.lifecycle.events import Event
from cli.lifecycle.states import Change, LifecycleError, decide_complete, decide_resume
from cli.watch.decide import Action, backoff, is_capacity_refusal, mark_failed, still_current
from cli.watch.journal import Journal, refusals_of
from infra.config import Capacity, ConfigError, Job


@dataclass
class Result:
    """How one action ended: ``status`` is applied | written | noop | waiting-for-capacity |
    retrying-apply | error; ``ok`` is False for anything that did not succeed."""

    action: Action
    status: str
    ok: bool
    detail: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    next_try: datetime | None = None


def act(ref: stackfile.StackRef, action: Action, events: list[Event], journal: Journal, *,
        applier: Applier | None, choose: Callable[[Job, list[Event]], Capacity], now: datetime,
        rng: random.Random, out: Callable[[str], None], inventory=None) -> Result:
    """Carry out ``action``; every outcome is written to the journal before this returns.
    ``inventory`` (the stack's cloud inventory) lets a finished move prune expired snapshots."""
    memo = journal.job(action.job)
    # What ends the current attempt decides whether to resume (idempotency: only this attempt's outcome
    # counts); the capacity is chosen on the job's whole history, every attempt, as `resume` chooses it.
    # (a host maintenance notice too: it tells a gang's failures apart from the job's, states.maintained)
    facts = [e for e in events if e.attempt == action.attempt
             and e.event in ("preempted", "stopped", "failed", "completed", "maintenance-notice")]
    own = [e for e in events if e.job == action.job]

    def choose_own(job: Job, _facts: list[Event]) -> Capacity:
        return choose(job, own)

    def decide(job: Job) -> Change:
        stale = still_current(job, action)
        if stale:
            return Change(job.id, {}, stale, noop=True)
        if action.kind == "resume":
            change = decide_resume(job, facts, force=action.force, choose=choose_own)
        elif action.kind == "complete":
            change = decide_complete(job, by_events=True)
        elif action.kind == "mark-failed":
            change = mark_failed(job, action.reason)
        else:  # retry-capacity: same attempt, the capacity decided (on-demand in place) or the policy's now
            cap = Capacity(action.capacity) if action.capacity else choose(job, own)
            change = Change(job.id, {"capacity": cap.value}, f"{action.reason}: {cap.value}")
        if applier is not None and not change.noop:
            # Under the stack lock, before the file is written: a crash from here on is finished by
            # the next watcher (it re-applies when the file shows this target), never repeated.
            target = {**{"attempt": job.attempt, "state": job.state.value}, **change.fields}
            memo["intent"] = {"kind": action.kind, "attempt": target["attempt"], "state": target["state"],
                              "consumes": list(action.consumes)}
            journal.save(now)
        return change

    try:
        if action.kind == "reapply":  # its own crashed update, or one another spotctl left (the job's `applying`)
            return _apply_again(ref, action, journal, memo, now, applier, out, only_pending=not memo.get("intent"))
        if action.kind == "retry-apply":  # the same decision again: what the file says, nothing re-decided
            stale = still_current(stackfile.load(ref).job(action.job), action)
            if stale:
                return _done(journal, action, memo, now, "noop", {}, stale)
            return _apply_again(ref, action, journal, memo, now, applier, out)
        if action.kind == "move":
            return _move(ref, action, events, journal, memo, applier=applier, now=now, out=out, inventory=inventory)
        outcome = pipeline.change_job(ref, action.job, decide, applier=applier, out=out)
    except ApplyError as exc:
        text = f"{exc}\n{getattr(exc, 'detail', '')}"
        memo.pop("intent", None)
        if not exc.started:  # the edit was undone: the facts stay unhandled and count again next cycle
            memo.update(status="error", last_error=str(exc), at=now.isoformat())
            journal.save(now)
            return Result(action, "error", False, str(exc))
        job = stackfile.load(ref).job(action.job)
        again = memo.get("waiting_attempt") == job.attempt
        tries = int(memo.get("tries", 0)) + 1 if again else 1
        nxt = now + backoff(tries, rng)
        status = "waiting-for-capacity" if is_capacity_refusal(text) else "retrying-apply"
        refusals = refusals_of(memo) if again else 0
        if status == "waiting-for-capacity":  # what the zone failover weighs: since when, and which zones refused
            memo["refused"] = {**memo.get("refused", {}), job.zone: now.isoformat()}
            if not again or "refused_since" not in memo:
                memo["refused_since"] = now.isoformat()
            refusals += 1
        memo["refusals"] = refusals  # only capacity refusals: any other failure is retried as decided
        memo["retrying_apply"] = status == "retrying-apply"  # kept by an "error" row: what the next try is
        memo.update(status=status, waiting_attempt=job.attempt, tries=tries, next_try=nxt.isoformat(),
                    last_error=str(exc), at=now.isoformat(), last_action=f"{action.kind} (attempt {job.attempt}): {status}")
        journal.handle(action.consumes, now)
        journal.save(now)
        return Result(action, status, False, str(exc), next_try=nxt)
    except (LifecycleError, ConfigError) as exc:
        memo.pop("intent", None)
        memo.update(status="error", last_error=str(exc), at=now.isoformat())
        if isinstance(exc, LifecycleError):  # the state machine refuses: these facts will not change that
            journal.handle(action.consumes, now)
        journal.save(now)
        return Result(action, "error", False, str(exc))
    change = outcome.change
    status = "noop" if change.noop else ("applied" if outcome.applied else "written")
    return _done(journal, action, memo, now, status, change.fields, change.reason)


def _move(ref: stackfile.StackRef, action: Action, events: list[Event], journal: Journal, memo: dict, *,
          applier: Applier | None, now: datetime, out: Callable[[str], None], inventory=None) -> Result:
    """Move the job to ``action.zone`` through the lifecycle's move core, every step it allows now
    (it stops waiting for the new attempt's ``started`` before the old disks go). No intent is
    journaled: the stack file records the move's step, and the next watcher continues from it."""
    from cli.lifecycle.mover import move_job

    job = stackfile.load(ref).job(action.job)
    starts = job.move is None or job.move.to != action.zone  # a new move (or moving on), not the one in progress
    if starts and (job.attempt != action.attempt or job.state.value != "running"):
        return _done(journal, action, memo, now, "noop", {}, f"the stack file is at attempt {job.attempt} "
                     f"({job.state.value}) now: no move")
    assert action.zone is not None
    if job.applying is not None and applier is not None:  # a pending step: leave it to a live spotctl applying it
        try:
            with applier.exclusive(ref.path, wait=False):
                pass
        except ApplyError:
            return Result(action, "noop", True, "another spotctl is updating the stack now")  # as _apply_again
    moved = move_job(ref, action.job, action.zone, events=lambda: events, applier=applier, out=out, now=lambda: now,
                     inventory=inventory)
    if not moved.steps:
        return Result(action, "noop", True, moved.waiting or action.reason)
    fields = dict(moved.steps[-1].fields)
    status = "moved" if moved.finished else "moving"
    what = ", ".join(c.reason.split(":")[0] for c in moved.steps)
    pruned = f"; {moved.snapshots}" if moved.snapshots else ""
    return _done(journal, action, memo, now, status, fields, f"{action.reason} ({what}){pruned}")


def _done(journal: Journal, action: Action, memo: dict, now: datetime, status: str, fields: dict, reason: str = "") -> Result:
    for key in ("intent", "waiting_attempt", "tries", "next_try", "last_error", "refused_since", "refusals", "retrying_apply"):
        memo.pop(key, None)
    what = ", ".join(f"{k}={v}" for k, v in fields.items())
    memo.update(status=status, at=now.isoformat(), last_action=f"{action.kind}{' ' + what if what else ''} ({status})")
    journal.handle(action.consumes, now)
    journal.save(now)
    return Result(action, status, True, reason or action.reason, fields)


def _apply_again(ref: stackfile.StackRef, action: Action, journal: Journal, memo: dict, now: datetime,
                 applier: Applier | None, out: Callable[[str], None], only_pending: bool = False) -> Result:
    """Apply what the stack file already says for the job (``applying.reapply``)."""
    if applier is None:
        return _done(journal, action, memo, now, "noop", {})
    status = applying.reapply(ref, action.job, applier, out, only_pending=only_pending)
    if status == "busy":  # a live spotctl is applying the stack now: look again next cycle
        return Result(action, "noop", True, "another spotctl is updating the stack now")
    return _done(journal, action, memo, now, status, {})
