"""The job state machine and the lifecycle decisions built on it (pure: no I/O, clock injected).

Commands go observe -> decide -> act: they read the stack file and the job's recorded events,
call one of the ``decide_*`` functions here, and only then edit the file and apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cli.lifecycle.events import Event
from infra.basics import Capacity, JobState, without_moot

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    from infra.config import Job

P, R, PR, S, C, F = (
    JobState.PENDING,
    JobState.RUNNING,
    JobState.PREEMPTED,
    JobState.STOPPED,
    JobState.COMPLETED,
    JobState.FAILED,
)

# Every legal move, with why it happens. Anything else is refused with both states named.
TRANSITIONS: dict[tuple[JobState, JobState], str] = {
    (P, R): "the first attempt starts: its VMs are created on new disks",
    (R, R): "a new attempt of a running job (failover, or resume after a preemption seen in events): VMs replaced, disks kept",
    (R, PR): "a spot VM of the current attempt was preempted (event or cloud API)",
    (R, S): "a VM of the current attempt stopped without a preemption (host maintenance, a manual stop)",
    (R, C): "every node's command exited 0 (its `completed` event), or the user ran `spotctl complete`",
    (R, F): "the command exited non-zero, or the job disk could not be mounted",
    (PR, R): "resume: a new attempt on the same disks",
    (S, R): "resume after a stop (the infrastructure's, or the user's `spotctl stop`): a new attempt on the same disks",
    (F, R): "resume with --force: the failure was the infrastructure's, not the job's",
    (P, C): "complete: the user declares the job done before it ran",
    (PR, C): "complete: the user declares a preempted job done (its last checkpoint is the result)",
    (S, C): "complete: the user declares a stopped job done",
    (F, C): "complete: the user accepts a failed job's result",
    (P, S): "move: the job's VMs go so every node's disk can be snapshotted",
    (PR, S): "move: the job's VMs go so every node's disk can be snapshotted",
}


# The edges a user takes with `spotctl stop` (``stoppedBy: user``): the VMs go, the disks stay, and
# only `spotctl resume` leaves it: `spotctl watch` resumes every other stop, never this one.
USER_STOPS: dict[tuple[JobState, JobState], str] = {
    (R, S): "spotctl stop: the user stops a running job; its VMs go, its disks stay until `spotctl resume`",
    (PR, S): "spotctl stop: the user keeps a preempted job stopped (the watcher would resume it)",
    (S, S): "spotctl stop: the user keeps a stopped job stopped (the watcher would resume it)",
}


class LifecycleError(Exception):
    """A move the state machine or the job's situation does not allow; ``str()`` is the message."""


# The guard on every new attempt (resume, failover, the watcher's resume: all decide here, under the
# stack file's lock). Between a move's snapshot and start steps the job's disks in the zone it leaves
# are the ones the move's release deletes once the attempt in the new zone started: an attempt started
# there meanwhile would write work no snapshot holds, and lose it to that release.
MOVING = ("a job being moved accepts no new attempt except through the move (an attempt started in the zone it "
          "leaves would run on the disks the move's release deletes)")


def moving_guard(job: Job) -> None:
    """Refuse a new attempt outside the move while the job is between its move's snapshot and start
    steps (from the start step on it runs in the new zone on the restored disks, as any job)."""
    move = job.move
    if move is not None and moving_away(job):
        raise LifecycleError(f"job {job.id} is moving to {move.to} (step {move.step}): {MOVING}; "
                             f"`spotctl move {job.id} --to-zone {move.to}` continues the move, whose start step is "
                             "the next attempt")


def moving_away(job: Job) -> bool:
    """The job is between its move's snapshot and start steps (``moving_guard`` refuses new attempts)."""
    return job.move is not None and job.move.step in ("snapshot", "restore")


def check(job_id: str, old: JobState, new: JobState) -> str:
    """The reason for a legal transition; raises LifecycleError naming both states otherwise."""
    try:
        return TRANSITIONS[(old, new)]
    except KeyError:
        raise LifecycleError(f"job {job_id}: cannot go from {old.value} to {new.value}") from None


@dataclass(frozen=True)
class Change:
    """What to write into the job's entry of the stack file (camelCase keys, as in the file)."""

    job_id: str
    fields: dict[str, Any]
    reason: str
    noop: bool = False

    def describe(self) -> str:
        if self.noop:
            return f"job {self.job_id}: {self.reason}"
        # a field cleared (None: an update finished, a move done) is said by the reason, not as "k=None"
        parts = ", ".join(f"{k}={v}" for k, v in self.fields.items() if v is not None)
        return f"job {self.job_id}: {parts} ({self.reason})" if parts else f"job {self.job_id}: {self.reason}"


def attempt_outcome(events: Iterable[Event], attempt: int, nodes: int = 1) -> JobState | None:
    """What the events of one attempt say happened to it (any node counts: one preempted node
    stops the whole gang; completed takes every node), or None when they say nothing conclusive.

    Informational events (``progress``, a rebalance recommendation, a checkpoint timeout) say
    nothing either way: an attempt that reported its first progress and then completed is completed.
    Nor does a preemption notice alone (``noticed``): the VM is checkpointing until it is gone (up to
    2 minutes on AWS, 30 s on GCP); a new attempt then would replace it mid-checkpoint. ``watch``
    acts on it only once the VM is gone (``cli.watch.decide``), and so do ``resume`` and ``status``.
    """
    events = list(events)
    mine = without_moot(e for e in events if e.attempt == attempt)  # a node's stop after its trainer ended on its own ends nothing
    done = {e.node for e in mine if e.event == "completed"}
    kinds = {e.event for e in mine}
    if "preempted" in kinds:
        return PR
    held = maintained(events, attempt)
    if held and "failed" in kinds:
        # The gang's failures follow a node's host maintenance (its peers lose it mid-collective): the
        # attempt was stopped, not failed, once every such node stopped (until then it may checkpoint).
        stopped = {e.node for e in events if e.attempt == attempt and e.event == "stopped"}
        return S if held <= stopped else None
    if "failed" in kinds:
        return F
    if "stopped" in kinds:
        return S
    if done and done >= set(range(nodes)):
        return C
    return None


# GCE stops GPU VMs for host maintenance ("Compute Engine gives GPU VMs a 1-hour stopping notice, while normal
# VMs receive only a 60-second notice", https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance): the
# VM records ``maintenance-notice`` then, and ``stopped`` with reason ``host-maintenance`` when it stops.
MAINTENANCE_REASONS = ("host-maintenance", "maintenance")


def maintained(events: Iterable[Event], attempt: int) -> set[int]:
    """The nodes of the attempt that host maintenance stops (their notice, or a stop it caused)."""
    return {e.node for e in events if e.attempt == attempt and (
        e.event == "maintenance-notice" or (e.event == "stopped" and e.details.get("reason") in MAINTENANCE_REASONS))}


def noticed(events: Iterable[Event], attempt: int) -> bool:
    """Whether a preemption notice of the attempt was recorded (``attempt_outcome`` says nothing yet)."""
    return any(e.attempt == attempt and e.event == "preemption-notice" for e in events)


# ---- decisions --------------------------------------------------------------------------------------------

CapacityChooser = Callable[["Job", list[Event]], Capacity]


def keep_spot(job: Job, events: list[Event]) -> Capacity:
    return Capacity.SPOT


def retried(job: Job, from_attempt: int | None) -> Change | None:
    """A retry of a change made from attempt ``from_attempt`` (what the caller saw): a no-op when
    the job already moved past it (the first try landed), refused when the job is behind it."""
    if from_attempt is None or job.attempt == from_attempt:
        return None
    if job.attempt > from_attempt:
        return Change(job.id, {}, f"is already at attempt {job.attempt}, past --from-attempt {from_attempt}: "
                      "this retry was applied before", noop=True)
    raise LifecycleError(f"job {job.id} is at attempt {job.attempt}, not {from_attempt} (--from-attempt)")


def decide_resume(job: Job, events: list[Event], *, capacity: Capacity | None = None, force: bool = False,
                  choose: CapacityChooser = keep_spot, from_attempt: int | None = None) -> Change:
    """Resume: a new attempt when the current one is over (preempted, stopped, or failed with --force).

    Idempotent: only an outcome of the *current* attempt starts a new one, so running the same
    resume twice (or two resumes racing under the stack lock) makes exactly one new attempt.
    """
    if job.state is C:
        raise LifecycleError(f"job {job.id} is completed; there is nothing to resume (spotctl cleanup {job.id} deletes its disks)")
    if (again := retried(job, from_attempt)) is not None:
        return again
    moving_guard(job)
    state = job.state
    if state is R:
        seen = attempt_outcome(events, job.attempt, job.nodes)
        if seen is None:
            if not force and noticed(events, job.attempt):
                return Change(job.id, {}, f"attempt {job.attempt} got a preemption notice and its VM may still be checkpointing: "
                              "resumed once a `preempted` event or the cloud (--observe) says it is gone (--force starts a new "
                              "attempt now, replacing the VM mid-checkpoint)", noop=True)
            if not force:
                return Change(job.id, {}, f"is running attempt {job.attempt}; nothing says it stopped (use --force to start a new attempt anyway)", noop=True)
        elif seen is C:
            raise LifecycleError(f"job {job.id}: attempt {job.attempt} completed; run `spotctl complete {job.id}`")
        else:
            state = seen
    if state is F and not force:
        raise LifecycleError(f"job {job.id} failed (its command exited non-zero); resume it anyway with --force")
    if state is P:
        check(job.id, P, R)
        fields = {"state": R.value}
        cap = capacity or choose(job, events)
        if cap is not job.capacity:
            fields["capacity"] = cap.value
        return Change(job.id, fields, TRANSITIONS[(P, R)])
    reason = check(job.id, state, R) if state is not R else TRANSITIONS[(R, R)]
    if state is S and (held := maintained(events, job.attempt)):
        reason = (f"host maintenance stopped node(s) {', '.join(map(str, sorted(held)))} of attempt {job.attempt} (GCE's notice): "
                  f"not the job's failure; {reason}")
    cap = capacity or choose(job, events)
    fields = {"attempt": job.attempt + 1, "state": R.value}
    if cap is not job.capacity:
        fields["capacity"] = cap.value
    return Change(job.id, fields, reason)


def decide_failover(job: Job, to: Capacity | None, from_attempt: int | None = None) -> Change:
    """Switch capacity (default: the other one) with a new attempt; with ``from_attempt`` a retry
    of the same failover is a no-op (without it, each call is a new switch)."""
    if job.state is C:
        raise LifecycleError(f"job {job.id} is completed; there is nothing to fail over")
    if (again := retried(job, from_attempt)) is not None:
        return again
    moving_guard(job)
    target = to or (Capacity.ON_DEMAND if job.capacity is Capacity.SPOT else Capacity.SPOT)
    if job.state is F:
        raise LifecycleError(f"job {job.id} failed; `spotctl resume {job.id} --force --capacity {target.value}` retries it")
    if job.state is P:
        return Change(job.id, {"capacity": target.value}, "capacity of a job that has not started yet")
    if target is job.capacity and job.state is R:
        return Change(job.id, {}, f"already on {target.value} (attempt {job.attempt})", noop=True)
    reason = check(job.id, job.state, R)
    return Change(job.id, {"capacity": target.value, "attempt": job.attempt + 1, "state": R.value}, f"failover to {target.value}: {reason}")


def decide_complete(job: Job, *, by_events: bool = False) -> Change:
    """Mark the job completed. ``by_events``: every node of its attempt recorded ``completed`` (the
    watcher); otherwise the user ran ``spotctl complete`` and the reason says so (status and history
    must not claim a command exited 0 that nobody saw)."""
    if job.state is C:
        return Change(job.id, {}, "is already completed", noop=True)
    reason = check(job.id, job.state, C)
    if job.state is R:
        reason = (f"every node's command exited 0 in attempt {job.attempt} (their `completed` events)" if by_events
                  else "completed by `spotctl complete`: the user declares a running job done")
    return Change(job.id, {"state": C.value}, reason)


def decide_stop(job: Job) -> Change:
    """``spotctl stop``: the job's VMs go (it declares none once stopped), its disks stay, and it
    stays stopped until ``spotctl resume`` (``stoppedBy: user``: the watcher never resumes it)."""
    if job.state in (C, F):
        raise LifecycleError(f"job {job.id} is {job.state.value}: it has no VMs to stop")
    if job.move is not None:
        raise LifecycleError(f"job {job.id} is moving to {job.move.to} (step {job.move.step}): finish the move first "
                             f"(`spotctl move {job.id} --to-zone {job.move.to}`), then stop it")
    if job.stopped_by == "user":
        return Change(job.id, {}, "is already stopped by the user; `spotctl resume` brings it back", noop=True)
    if job.state is P:  # (its update would create the disks of a job nothing started; the watcher never starts one)
        raise LifecycleError(f"job {job.id} is pending: nothing of it runs yet, and only `spotctl resume {job.id}` "
                             "starts it")
    try:
        reason = USER_STOPS[(job.state, S)]
    except KeyError:
        raise LifecycleError(f"job {job.id}: cannot go from {job.state.value} to stopped") from None
    return Change(job.id, {"state": S.value, "stoppedBy": "user"}, reason)


def may_delete_disks(job: Job | None, *, force: bool, owned: bool, moved_and_started: bool = False) -> tuple[bool, str]:
    """The one rule for deleting a job's disks: the job completed (or failed, with --force) and the
    disk carries this stack's ownership label/tag. ``job`` None means no job declares the disk
    (an orphan), which is allowed only for owned disks. ``moved_and_started``: the disk is one a
    move left behind and the attempt on the restored disks has started (``spotctl move``)."""
    if not owned:
        return False, "it does not carry this stack's ownership label"
    if job is None:
        return True, "no job of this stack declares it"
    if moved_and_started:
        return True, f"its job moved to {job.zone} and attempt {job.attempt} started there on the restored disks"
    if job.state is C:
        return True, "its job completed"
    if job.state is F and force:
        return True, "its job failed and --force was given"
    return False, f"its job is {job.state.value}" + (" (use --force for a failed job)" if job.state is F else "")


PENDING_GRACE = timedelta(minutes=10)
"""How long a watcher leaves another spotctl's ``applying`` mark alone: the update lock is only this
machine's, and between writing the mark and taking Pulumi's own stack lock (``up``, or the refresh
before it) another machine's CLI needs seconds; ten minutes cover that and any clock skew."""


PENDING_STAMP = "%Y-%m-%dT%H:%M:%SZ"  # the time in an ``applying`` mark: ``(since <UTC time>)``


def pending_since(text: str) -> datetime | None:
    """When the update an ``applying`` mark records began (None for a mark without the time)."""
    import re

    m = re.search(r"\(since (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\)$", text or "")
    return datetime.strptime(m[1], PENDING_STAMP).replace(tzinfo=UTC) if m else None
