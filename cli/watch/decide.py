"""The watcher's decisions (pure: no I/O, the clock and the randomness are passed in).

Events in, actions out, each with its reason. Only *facts* about the job's *current* attempt act:
``preempted``/``stopped`` on any node -> resume (the gang restarts), ``failed`` -> retry while the
job's ``maxFailures`` allows, else mark failed; ``completed`` on every node -> complete. Notices
(interruption warning, rebalance recommendation, maintenance) are recorded and make the watcher
look at the job's VMs, never act. Events of an older attempt are stale and only noted; one of a
newer attempt (this watcher's copy of the stack file lags behind the one that started it) waits,
neither acted on nor handled, until the file reaches that attempt.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from cli.lifecycle.events import Event
from cli.lifecycle.states import PENDING_GRACE, Change, check, maintained, pending_since
from infra.basics import JobState, ended_nodes, is_moot

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    import random

    from infra.config import Job

FACTS = ("started", "preempted", "stopped", "failed", "completed")
ENDS = ("preempted", "stopped", "failed", "completed")

# What a due retry after capacity refusals does: a ``cli.policy.failover.FailoverDecision`` (or None).
Failover = Callable[["Job", list[Event], "JobMemory", datetime], Any]
# Where a preempted job runs next: a ``cli.policy.zones.ZoneDecision`` (or None: no zone to choose).
ZoneChoice = Callable[["Job", datetime], Any]

BACKOFF_BASE_S = 30.0
BACKOFF_CAP_S = 30 * 60.0

# Capacity and quota refusals, as the providers word them in the error pulumi relays:
# AWS EC2 API error codes InsufficientInstanceCapacity, InsufficientCapacity, VcpuLimitExceeded,
# MaxSpotInstanceCountExceeded, InstanceLimitExceeded (docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html);
# GCE ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS), QUOTA_EXCEEDED and "Quota '...' exceeded"
# (cloud.google.com/compute/docs/troubleshooting/troubleshooting-vm-creation).
CAPACITY_RE = re.compile(
    r"InsufficientInstanceCapacity|InsufficientCapacity|VcpuLimitExceeded|MaxSpotInstanceCountExceeded|"
    r"InstanceLimitExceeded|ZONE_RESOURCE_POOL_EXHAUSTED|QUOTA_EXCEEDED|Quota '[^']*' exceeded|"
    r"does not have enough resources available"
)


@dataclass(frozen=True)
class Seen:
    """An event as the watcher saw it: where from, and an id that is the same whichever source
    (or redelivery) brought it, so the same fact is handled once."""

    event: Event
    source: str
    id: str


def event_id(e: Event) -> str:
    """Recorded events (bucket, events dir) are the same document wherever they are read: hash it.
    What the cloud reports (poll, queue, subscription) has no time of its own: one id per VM fact."""
    if e.details.get("source") == "cloud":
        return f"cloud:{e.job}:{e.attempt}:{e.node}:{e.event}"
    text = "\0".join((e.job, str(e.attempt), str(e.node), e.event, e.time.isoformat()))
    return "rec:" + hashlib.sha256(text.encode()).hexdigest()[:20]


def seen(e: Event, source: str) -> Seen:
    return Seen(e, source, event_id(e))


def merge(*batches: list[Seen]) -> dict[str, list[Seen]]:
    """Every source's events by job, each fact once (the first source named wins), sorted by time."""
    by_id: dict[str, Seen] = {}
    for batch in batches:
        for s in batch:
            by_id.setdefault(s.id, s)
    out: dict[str, list[Seen]] = {}
    for s in sorted(by_id.values(), key=lambda s: (s.event.time, s.event.attempt, s.event.node, s.id)):
        out.setdefault(s.event.job, []).append(s)
    return out


@dataclass(frozen=True)
class JobMemory:
    """What the journal remembers of one job (see ``journal``)."""

    waiting_attempt: int | None = None  # an update of this attempt failed: retried at ``next_try``
    next_try: datetime | None = None
    tries: int = 0  # failed updates of ``waiting_attempt`` (the backoff's count)
    intent: dict | None = None  # an action started and not known finished: {"kind", "attempt", "state"}
    refused_since: datetime | None = None  # the first capacity refusal of ``waiting_attempt``
    refused: dict[str, datetime] = field(default_factory=dict)  # zone -> its last capacity refusal
    refusals: int = 0  # of those tries, the ones the cloud refused for capacity or quota (what the failover weighs)
    # The last failure was not a capacity refusal (pulumi failed otherwise): the same update is tried
    # again after the backoff, the policy and the zone failover are not asked (nothing says capacity lacks).
    retrying_apply: bool = False


@dataclass(frozen=True)
class Action:
    """What to do to one job, and why. ``attempt`` is the attempt the facts are about: the act step
    re-checks it under the stack lock, so a signal for an old attempt never touches a new one."""

    job: str
    kind: str  # resume | complete | mark-failed | retry-capacity | retry-apply | reapply | move
    attempt: int
    reason: str
    consumes: tuple[str, ...] = ()
    force: bool = False
    zone: str | None = None  # move: the target zone
    capacity: str | None = None  # retry-capacity: the capacity decided (None: ask the policy)


@dataclass(frozen=True)
class Note:
    """Something seen and recorded without acting: a notice, a stale event, a wait."""

    job: str
    kind: str  # notice | stale | waiting-for-capacity | retrying-apply | waiting-for-nodes | update-pending | maintenance
    reason: str
    ids: tuple[str, ...] = ()
    look: bool = False  # ask the cloud about this job's VMs now
    attempt: int | None = None  # the job's attempt when it was noted (as an Action's); only on the notes `watch` prints


@dataclass
class Decisions:
    actions: list[Action] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)


# What of a job's earlier attempts decides its future, read each cycle beside its current attempt's
# events (the rest of its history only when an action chooses a capacity): its failures
# (``maxFailures``) and the host maintenance that excuses a gang's (``states.maintained``).
PAST_FACTS = ("failed", "maintenance-notice", "stopped")


def failures(events: list[Seen]) -> int:
    """Attempts that ended in ``failed`` (each counted once); not one host maintenance ended
    (``states.maintained``: its gang's failures are the maintenance's)."""
    evs = [s.event for s in events]
    return len({e.attempt for e in evs if e.event == "failed" and not maintained(evs, e.attempt)})


def decide_job(job: Job, events: list[Seen], memory: JobMemory, handled: set[str], now: datetime,
               failover: Failover | None = None, zone_choice: ZoneChoice | None = None) -> tuple[Action | None, list[Note]]:
    """The one action for ``job`` (or none) and what was noted, from everything seen about it.

    ``failover(job, events, memory, now)`` decides what a due retry after capacity refusals does
    (wait, on-demand in place, or move to another zone); without it the policy is asked again in place.
    ``zone_choice(job, now)`` decides where a preempted job runs next: a move when it says so, else a resume.
    """
    notes: list[Note] = []
    if memory.intent and memory.intent.get("attempt") == job.attempt and memory.intent.get("state") == job.state.value:
        # A crash between writing the stack file and the end of its update: apply what the file says.
        return Action(job.id, "reapply", job.attempt, f"an earlier watcher wrote attempt {job.attempt} ({job.state.value}) "
                      "and stopped before its update finished: applying it", tuple(memory.intent.get("consumes", ()))), notes
    waiting = memory.waiting_attempt == job.attempt and memory.next_try is not None
    if waiting and now < memory.next_try and (job.state is JobState.RUNNING or job.move is not None):
        if memory.retrying_apply:
            return None, [Note(job.id, "retrying-apply", f"next try {memory.next_try.isoformat()} (try {memory.tries + 1}) "
                               "of an update that failed (not a capacity refusal)")]
        return None, [Note(job.id, "waiting-for-capacity", f"next try {memory.next_try.isoformat()} (try {memory.tries + 1})")]
    if job.applying is not None and not waiting:
        # Another spotctl (a CLI killed mid-update, a watcher replaced, on any machine: the mark travels
        # with the shared copy) started an update of the job and never finished it: apply what the file
        # says. A live spotctl still applying it holds the stack's update lock (this machine's) or
        # Pulumi's stack lock once its update runs; a young mark is left alone (``PENDING_GRACE``), as
        # another machine's CLI may be between writing it and taking Pulumi's lock.
        since = pending_since(job.applying)
        if since is not None and now - since < PENDING_GRACE:
            return None, [Note(job.id, "update-pending", f"an update began at {since.isoformat()} ({job.applying}); "
                               f"applied again from {(since + PENDING_GRACE).isoformat()} if it never finishes")]
        if job.move is not None and job.move.step == "release":
            # A move's release drops the old disks, which the state protects: only the move's own
            # release may approve that (ownership decided again on the cloud's disks, under the lock).
            return Action(job.id, "move", job.attempt, f"a move's release was started and never finished "
                          f"({job.applying}): continuing the move to {job.move.to}", zone=job.move.to), notes
        return Action(job.id, "reapply", job.attempt, f"an update of the job was started and never finished "
                      f"({job.applying}): applying it"), notes
    if job.stopped_by == "user" and job.state is JobState.STOPPED:
        return None, notes  # `spotctl stop`: only `spotctl resume` brings it back, whatever its events say
    if job.move is not None and (waiting or not _awaiting_start(job, [s.event for s in events])):
        return _moving(job, [s.event for s in events], waiting, memory, now, failover), notes
    # A move at step ``start`` whose new attempt has not started (every node) falls through: the facts
    # about that attempt (preempted, stopped, failed before ``started``) act as in any zone. A resume
    # keeps the move at ``start`` (same zone and disks, a new attempt); its refusals reach the failover.
    moving = f" (the move to {job.move.to} stays at step start)" if job.move is not None else ""
    if waiting and job.state is JobState.RUNNING and memory.retrying_apply:
        return Action(job.id, "retry-apply", job.attempt, f"try {memory.tries + 1} after a failed update (not a capacity "
                      f"refusal): the stack file's attempt {job.attempt} applied again, as decided"), notes
    if waiting and job.state is JobState.RUNNING:
        why = f"try {memory.tries + 1} after a capacity refusal"
        return _after_refusal(job, why, failover(job, [s.event for s in events], memory, now) if failover else None), notes
    fresh = [s for s in events if s.id not in handled]
    # Only an OLDER attempt's end is stale for good. A newer one's is left unhandled (not in the journal,
    # its message not acknowledged): once the file reaches that attempt it is the current attempt's fact.
    stale = [s for s in fresh if s.event.attempt < job.attempt and s.event.event in ENDS]
    if stale:
        notes.append(Note(job.id, "stale", f"{len(stale)} event(s) of attempt(s) {sorted({s.event.attempt for s in stale})}, "
                          f"not the current attempt {job.attempt}: ignored", tuple(s.id for s in stale), attempt=job.attempt))
    if job.state in (JobState.PREEMPTED, JobState.STOPPED):
        return Action(job.id, "resume", job.attempt, f"the stack file says {job.state.value}: needs resume"), notes
    if job.state is not JobState.RUNNING:
        return None, notes
    # A node's preemption or stop recorded as well as its trainer's own end (completed or failed: the
    # VM went between the trainer's exit and the end of its run) ends nothing more.
    ended = ended_nodes(s.event for s in events)
    current = [s for s in fresh if s.event.attempt == job.attempt and not is_moot(s.event, ended)]
    facts = [s for s in current if s.event.event in ENDS]
    notices = [s for s in current if s.event.event not in FACTS]
    ids = tuple(s.id for s in facts)

    def first(kind: str) -> Seen | None:
        return next((s for s in facts if s.event.event == kind), None)

    for kind in ("preempted", "stopped"):
        hit = first(kind)
        where = zone_choice(job, now) if hit and kind == "preempted" and zone_choice and job.move is None else None
        if where is not None and where.move:
            return Action(job.id, "move", job.attempt, f"node {hit.event.node} of attempt {job.attempt} preempted "
                          f"(seen in {hit.source}): {where.reason}", ids, zone=where.zone), notes
        if hit:  # one node is enough: the whole gang gets the new attempt
            return Action(job.id, "resume", job.attempt, f"node {hit.event.node} of attempt {job.attempt} {kind} "
                          f"(seen in {hit.source}){moving}", ids), notes
    hit = first("failed")
    held = maintained([s.event for s in events], job.attempt) if hit else set()
    if hit and held:  # stopped ones resumed above; a node still checkpointing for its maintenance is waited for
        return None, [*notes, Note(job.id, "maintenance", f"node(s) {', '.join(map(str, sorted(held)))} of attempt "
                                   f"{job.attempt} got a host maintenance notice: the gang's failures follow it, not the "
                                   "job's; resumed once those nodes stopped")]
    if hit:
        n = failures(events)
        if n <= job.max_failures:
            return Action(job.id, "resume", job.attempt, f"node {hit.event.node} of attempt {job.attempt} failed: "
                          f"failure {n} of maxFailures {job.max_failures}, retrying{moving}", ids, force=True), notes
        return Action(job.id, "mark-failed", job.attempt, f"node {hit.event.node} of attempt {job.attempt} failed "
                      f"({n} failure(s), maxFailures {job.max_failures}): no retry{moving}", ids), notes
    done = {s.event.node for s in facts if s.event.event == "completed"}
    if done and done >= set(range(job.nodes)):
        return Action(job.id, "complete", job.attempt, f"every node of attempt {job.attempt} completed", ids), notes
    if done:
        missing = sorted(set(range(job.nodes)) - done)
        notes.append(Note(job.id, "waiting-for-nodes", f"attempt {job.attempt}: nodes {missing} have not completed yet"))
    if notices:
        kinds = sorted({s.event.event for s in notices})
        notes.append(Note(job.id, "notice", f"{', '.join(kinds)} for attempt {job.attempt}: recorded, not acted on "
                          "until the VM is gone", tuple(s.id for s in notices), look=True, attempt=job.attempt))
    return None, notes


def _after_refusal(job: Job, why: str, choice: Any) -> Action:
    """A due retry after capacity refusals, as the zone failover decided it (None: no failover)."""
    if choice is None or choice.choice == "stay":
        detail = f" ({choice.reason})" if choice else ""
        return Action(job.id, "retry-capacity", job.attempt, f"{why}; the policy is asked again{detail}")
    if choice.choice == "wait":  # spot in place: try again
        return Action(job.id, "retry-capacity", job.attempt, f"{why}: {choice.reason}", capacity="spot")
    if choice.choice == "on-demand":
        return Action(job.id, "retry-capacity", job.attempt, f"{why}: {choice.reason}", capacity="on-demand")
    return Action(job.id, "move", job.attempt, f"{why}: {choice.reason}", zone=choice.zone)


def _moving(job: Job, events: list[Event], retry_due: bool, memory: JobMemory, now: datetime,
            failover: Failover | None) -> Action | None:
    """A move in progress (``spotctl move`` or an earlier watcher): the next step, once its new
    attempt started (the old disks wait for that). When that attempt was refused for capacity in
    the target zone and the retry is due, the zone failover decides again, as in any zone: retry
    there (spot or on-demand: the start step applied again with that capacity) or move on to a
    zone that may move (the refused move's disks stay protected until an attempt started)."""
    move = job.move
    assert move is not None
    if retry_due and not memory.retrying_apply and _awaiting_start(job, events) and failover is not None:
        why = f"try {memory.tries + 1} after a capacity refusal in {move.to}, the zone the job is moving to"
        return _after_refusal(job, why, failover(job, events, memory, now))
    again = f"; try {memory.tries + 1} after a failed update (not a capacity refusal)" if retry_due and memory.retrying_apply else ""
    return Action(job.id, "move", job.attempt, f"continuing the move to {move.to} (step {move.step} recorded){again}", zone=move.to)


def _awaiting_start(job: Job, events: list[Event]) -> bool:
    """A move at step ``start`` whose new attempt has not started on every node yet (a node that
    wrote ``completed`` had started: its ``started`` may be lost)."""
    if job.move is None or job.move.step != "start":
        return False
    started = {e.node for e in events if e.attempt == job.attempt and e.event in ("started", "completed")}
    return not started >= set(range(job.nodes))


def decide(jobs: list[Job], events: dict[str, list[Seen]], memory: dict[str, JobMemory], handled: set[str],
           now: datetime, failover: Failover | None = None, zone_choice: ZoneChoice | None = None) -> Decisions:
    """Every job's action (at most one each) and notes, in the stack's job order."""
    out = Decisions()
    for job in jobs:
        mine = job.mine(events.get(job.id, []), lambda s: s.event.attempt)  # an earlier job of this id's left out
        action, notes = decide_job(job, mine, memory.get(job.id, JobMemory()), handled, now, failover, zone_choice)
        out.notes += notes
        if action:
            out.actions.append(action)
    return out


# ---- what the act step writes under the lock ------------------------------------------------------------


def still_current(job: Job, action: Action) -> str | None:
    """None when the action still applies to the job as the file has it now; else why not."""
    if job.attempt != action.attempt:
        return f"the stack file is at attempt {job.attempt} now (the signal was for attempt {action.attempt}): nothing to do"
    if job.state in (JobState.COMPLETED, JobState.FAILED) and action.kind != "reapply":
        return f"is {job.state.value} now: nothing to do"
    if job.stopped_by == "user" and job.state is JobState.STOPPED and action.kind != "reapply":
        return "was stopped by the user (`spotctl stop`) now: only `spotctl resume` brings it back"
    return None


def mark_failed(job: Job, reason: str) -> Change:
    return Change(job.id, {"state": JobState.FAILED.value}, f"{check(job.id, job.state, JobState.FAILED)}: {reason}")


def is_capacity_refusal(text: str) -> bool:
    return bool(CAPACITY_RE.search(text))


def backoff(tries: int, rng: random.Random, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> timedelta:
    """Exponential backoff with jitter: base * 2^(tries-1), capped, times a random factor in [0.5, 1)
    so many jobs refused together do not all come back at the same second."""
    span = min(cap_s, base_s * 2 ** max(0, tries - 1))
    return timedelta(seconds=span * (0.5 + rng.random() / 2))


def mean_backoff(tries: int, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> timedelta:
    """``backoff``'s expected value (the jitter's mean factor is 0.75)."""
    return timedelta(seconds=min(cap_s, base_s * 2 ** max(0, tries - 1)) * 0.75)
