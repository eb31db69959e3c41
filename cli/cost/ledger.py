"""The cost ledger (pure): a job's recorded events -> its attempts with capacity, machine type,
node count and VM-hours, then dollars at given prices. The clock is passed in; nothing here reads
files or asks a cloud.

An attempt runs from its first ``started`` event to its first end event (``preempted``,
``stopped``, ``failed``, ``completed``) of any node, as ``cli.lifecycle.events.Timeline`` has it;
VM-hours are nodes x those wall hours. Time a VM spends booting before the script records
``started`` is not seen, so costs are a lower bound by that much per attempt.

Work lost by a preemption: the progress since the last ``checkpoint`` event (the scripts record
them from the trainer's ``SPOTCTL_CHECKPOINT N`` lines, rate-limited, and always the newest one when
the trainer stops; a ``preempted`` or ``preemption-notice`` event carries ``progress``, the newest
``SPOTCTL_PROGRESS`` step). A checkpoint the attempt wrote at or after its preemption (the trainer
saving on SIGTERM) means nothing was lost.

Zone moves (``spotctl move``, or ``watch``'s failover): the stack file's ``zoneHistory`` says after
which attempt the job left each zone and when the move began (``moveBegan``; ``move.began`` while it
runs). The move's changeover runs from then to the first attempt in the new zone (or now, while it
runs): snapshot, restore and boot. A move recorded without its start is taken to begin when that
attempt ended (then any wait before the move counts too). Its snapshots (one per node, at most the
disk's size: clouds bill the data stored) are kept after the move, so their storage accrues from the
move's start until now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from infra.basics import MAX_JOB_NODES, Capacity, attempt_end

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    from infra.config import Job

END_EVENTS = ("preempted", "stopped", "failed", "completed")
PROGRESS_KEYS = ("progress", "step")
HOURS_PER_MONTH = 730  # 8,760 h / 12: how a per-GB-month storage price becomes an hourly one


class EventLike(Protocol):
    """What the ledger reads of an event (``cli.lifecycle.events.Event`` fits)."""

    attempt: int
    node: int
    event: str
    time: datetime
    details: Mapping[str, str]


@dataclass(frozen=True)
class Price:
    """USD per VM-hour, and where the numbers came from (the report names it)."""

    spot: float
    on_demand: float
    source: str

    def rate(self, capacity: str) -> float:
        return self.spot if capacity == Capacity.SPOT.value else self.on_demand


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job as its events tell it."""

    attempt: int
    capacity: str  # "spot" | "on-demand"
    machine_type: str
    nodes: int
    start: datetime
    end: datetime
    outcome: str  # an END_EVENTS name, "running", "replaced" (a later attempt started) or "ended"
    # Where capacity / machine type / nodes came from: the `started` event, or the stack file
    # (older scripts recorded no details; the file may have moved on since).
    from_events: bool
    lost_hours: float | None = None  # wall hours since the last checkpoint, for a preempted attempt
    lost_steps: int | None = None

    @property
    def hours(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds() / 3600)

    @property
    def vm_hours(self) -> float:
        return self.nodes * self.hours


@dataclass(frozen=True)
class SnapshotPrice:
    """USD per GB-month of snapshot storage, and its source."""

    per_gb_month: float
    source: str


@dataclass(frozen=True)
class ZoneMove:
    """A move of the job to another zone, as the stack file and the events tell it."""

    from_zone: str
    to_zone: str
    after_attempt: int  # the last attempt in ``from_zone``
    start: datetime | None  # when the move began (recorded, else that attempt's end; None: unknown)
    end: datetime | None  # the first attempt in ``to_zone`` started (None: not yet)
    in_progress: bool  # the stack file's ``move`` record is still there
    snapshot_gb: int  # nodes x disk size: the most the move's snapshots hold
    now: datetime

    @property
    def changeover_hours(self) -> float | None:
        return None if self.start is None else max(0.0, ((self.end or self.now) - self.start).total_seconds() / 3600)

    @property
    def snapshot_hours(self) -> float | None:
        """How long the snapshots have been kept so far (spotctl never deletes them)."""
        return None if self.start is None else max(0.0, (self.now - self.start).total_seconds() / 3600)

    def storage_cost(self, price: SnapshotPrice | None) -> float | None:
        h = self.snapshot_hours
        return None if price is None or h is None else self.snapshot_gb * price.per_gb_month * h / HOURS_PER_MONTH


@dataclass(frozen=True)
class JobLedger:
    """A job's attempts and what happened between them."""

    job: str
    state: str
    attempts: list[Attempt]
    changeover_hours: float
    running: bool
    moves: list[ZoneMove] = field(default_factory=list)

    def vm_hours(self, capacity: str) -> float:
        return sum(a.vm_hours for a in self.attempts if a.capacity == capacity)

    @property
    def preemptions(self) -> int:
        return sum(a.outcome == "preempted" for a in self.attempts)

    @property
    def machine_types(self) -> list[str]:
        return sorted({a.machine_type for a in self.attempts})


def job_ledger(job: Job, events: Iterable[EventLike], now: datetime) -> JobLedger:
    """The attempts of ``job`` from its events; ``now`` ends an attempt still running."""
    by_attempt: dict[int, list[EventLike]] = {}
    for e in job.mine(list(events)):  # an earlier job of this id (spotctl:retiredJobs) is not this one's cost
        by_attempt.setdefault(e.attempt, []).append(e)
    checkpoints = sorted((Checkpoint(_checkpoint_time(e), _int(e.details.get("step")), e.attempt)
                          for evs in by_attempt.values() for e in evs if e.event == "checkpoint"), key=lambda c: c.time)
    numbers = sorted(n for n, evs in by_attempt.items() if any(e.event == "started" for e in evs))
    attempts: list[Attempt] = []
    for i, number in enumerate(numbers):
        evs = sorted(by_attempt[number], key=lambda e: e.time)
        started = [e for e in evs if e.event == "started"]
        start = started[0].time
        details = next((e.details for e in started if e.details.get("capacity")), {})
        nodes = n if (n := _int(details.get("nodes"))) is not None and 0 < n <= MAX_JOB_NODES else job.nodes
        last = attempt_end([e for e in evs if e.event in END_EVENTS and e.time >= start], nodes)
        later = [by_attempt[n] for n in numbers[i + 1:]]
        if last is not None:
            end, outcome = last.time, last.event
        elif number == job.attempt and job.active and not later:
            end, outcome = max(now, start), "running"
        elif later:
            end, outcome = min(e.time for e in later[0] if e.event == "started"), "replaced"
        else:
            end, outcome = evs[-1].time, "ended"
        lost_h, lost_steps = _work_lost(number, evs, checkpoints, start, end) if outcome == "preempted" else (None, None)
        attempts.append(Attempt(
            attempt=number,
            # an event's details are data from a VM: only known values count, else the stack file's
            capacity=details.get("capacity") if details.get("capacity") in ("spot", "on-demand") else job.capacity.value,
            machine_type=details.get("machineType") or job.machine_type or job.instance_type or "",
            nodes=nodes,
            start=start, end=end, outcome=outcome, from_events=bool(details),
            lost_hours=lost_h, lost_steps=lost_steps,
        ))
    gaps = [(b.start - a.end).total_seconds() / 3600 for a, b in zip(attempts, attempts[1:], strict=False)]
    return JobLedger(job.id, job.state.value, attempts, sum(g for g in gaps if g > 0),
                     running=bool(attempts) and attempts[-1].outcome == "running", moves=_moves(job, attempts, now))


def _moves(job: Job, attempts: list[Attempt], now: datetime) -> list[ZoneMove]:
    """The job's zone moves: one per ``zoneHistory`` entry, plus the move still at its snapshot or
    restore step (the history gains its entry only at step start). A move starts when it was
    recorded to begin (``move.began`` / ``moveBegan``), else when the last attempt in the old zone ended.
    A move between a regional disk's replica zones (``sameDisk``) takes no snapshot: no storage."""
    stays = [(z.zone, z.last_attempt, z.move_began, z.same_disk) for z in job.zone_history]
    destination = job.zone
    if job.move is not None and job.move.step in ("snapshot", "restore"):
        stays.append((job.move.from_, job.attempt, job.move.began, False))
        destination = job.move.to
    targets = [s[0] for s in stays[1:]] + [destination]
    moves = []
    for (zone, last, began, same_disk), to in zip(stays, targets[:len(stays)], strict=True):
        left = began or next((a.end for a in attempts if a.attempt == last), None)
        arrived = next((a.start for a in attempts if a.attempt > last), None)
        moving = job.move is not None and job.move.to == to and (zone, last, began, same_disk) == stays[-1]
        snapshot_gb = 0 if same_disk else job.nodes * job.disk_gb
        moves.append(ZoneMove(zone, to, last, left, arrived, moving, snapshot_gb, now))
    return moves


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Checkpoint:
    time: datetime
    step: int | None
    attempt: int


def _checkpoint_time(e: EventLike) -> datetime:
    """When the checkpoint was written: ``at`` when the scripts recorded it later (the rate limit
    held it back), else the event's time."""
    try:
        at = datetime.fromisoformat(e.details["at"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return e.time
    at = at if at.tzinfo else at.replace(tzinfo=e.time.tzinfo)
    return at if at <= e.time else e.time


def _work_lost(number: int, evs: list[EventLike], checkpoints: list[Checkpoint], start: datetime,
               end: datetime) -> tuple[float | None, int | None]:
    """Work preemption ``end`` of attempt ``number`` threw away, where the events say: the time since
    the last checkpoint (or since the attempt started, if it never checkpointed), none if the attempt
    checkpointed at or after the preemption (on SIGTERM); and, when the checkpoint and the
    preemption carry steps, the steps. A job that records no checkpoint events: unknown (None)."""
    if not checkpoints:
        return None, None
    own = [c for c in checkpoints if c.attempt == number]
    # The step the next attempt resumes from: this attempt's newest checkpoint, else the one it started from.
    resumed = [c for c in checkpoints if c.time <= start and c.attempt < number]
    newest = own[-1] if own else (resumed[-1] if resumed else None)
    progress = next((p for e in reversed(evs) if e.event in ("preempted", "preemption-notice")
                     for p in [_int(next((e.details[k] for k in PROGRESS_KEYS if k in e.details), None))] if p is not None), None)
    steps = max(0, progress - newest.step) if progress is not None and newest is not None and newest.step is not None else None
    # Saved on SIGTERM: a checkpoint stamped after the preemption, or one holding every step the
    # preemption saw (its clock may read a moment earlier than the `preempted` event's).
    saved_after = any(c.time >= end for c in own) or (steps == 0 and bool(own))
    last = max([c.time for c in checkpoints if c.time <= end] or [start])
    hours = 0.0 if saved_after else (end - max(start, last)).total_seconds() / 3600
    return hours, steps


# ---- dollars ---------------------------------------------------------------------------------


def money(x: float) -> float:
    """Dollars rounded to the cent, half up (what a bill shows)."""
    from decimal import ROUND_HALF_UP, Decimal

    return float(Decimal(repr(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def hours(x: float) -> float:
    return round(x, 4)


def percent(part: float, whole: float) -> float | None:
    """``part`` as a % of ``whole``; None (JSON null, never NaN) when there is no whole."""
    return round(100 * part / whole, 1) if whole > 0 else None


@dataclass
class Costed:
    """A job's ledger at prices: unrounded dollars (rounded only when shown)."""

    ledger: JobLedger
    prices: dict[str, Price | None]
    cost: float | None = None
    on_demand_cost: float | None = None
    lost_cost: float | None = None
    attempt_costs: list[tuple[float, float] | None] = field(default_factory=list)
    snapshot_price: SnapshotPrice | None = None

    @property
    def unpriced(self) -> list[str]:
        return sorted(t for t, p in self.prices.items() if p is None)


def cost_job(ledger: JobLedger, price_of: Callable[[str], Price | None], snapshot: SnapshotPrice | None = None) -> Costed:
    """Dollars for each attempt (VM-hours x the attempt's capacity's price) and what the same
    VM-hours would have cost on on-demand. A job with an unpriced machine type has no cost.
    ``snapshot`` prices the storage of its zone moves' snapshots (reported apart from ``cost``)."""
    prices = {t: price_of(t) for t in ledger.machine_types}
    out = Costed(ledger, prices, snapshot_price=snapshot)
    for a in ledger.attempts:
        p = prices[a.machine_type]
        out.attempt_costs.append((a.vm_hours * p.rate(a.capacity), a.vm_hours * p.on_demand) if p else None)
    if ledger.attempts and all(c is not None for c in out.attempt_costs):
        out.cost = sum(c[0] for c in out.attempt_costs if c)
        out.on_demand_cost = sum(c[1] for c in out.attempt_costs if c)
        lost = [(a, prices[a.machine_type]) for a in ledger.attempts if a.lost_hours is not None]
        out.lost_cost = sum(a.lost_hours * a.nodes * p.rate(a.capacity) for a, p in lost if p and a.lost_hours) if lost else None
    elif not ledger.attempts:
        out.cost = out.on_demand_cost = 0.0
    return out


def _opt(x: float | None, fn=money) -> float | None:
    return None if x is None else fn(x)


def _sum_or_none(values: list[float | None]) -> float | None:
    """The sum, or None when any part is unknown (0.0 for nothing)."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def moves_json(c: Costed) -> dict[str, Any]:
    """A job's zone moves: each with its changeover and its snapshots' storage so far."""
    moves = c.ledger.moves
    return {
        "moves": [{"from": m.from_zone, "to": m.to_zone, "after_attempt": m.after_attempt,
                   "start": m.start.isoformat() if m.start else None, "end": m.end.isoformat() if m.end else None,
                   "in_progress": m.in_progress, "changeover_hours": _opt(m.changeover_hours, hours),
                   "snapshot_gb": m.snapshot_gb, "snapshot_hours": _opt(m.snapshot_hours, hours),
                   "snapshot_storage_cost": _opt(m.storage_cost(c.snapshot_price))} for m in moves],
        "move_changeover_hours": _opt(_sum_or_none([m.changeover_hours for m in moves]), hours),
        "snapshot_storage_cost": _opt(_sum_or_none([m.storage_cost(c.snapshot_price) for m in moves])),
    }


def job_json(c: Costed) -> dict[str, Any]:
    """The report of one job (``--json``): hours are VM-hours, dollars rounded to the cent."""
    led = c.ledger
    lost = [a for a in led.attempts if a.lost_hours is not None]
    steps = [a.lost_steps for a in lost if a.lost_steps is not None]
    savings = None if c.cost is None or c.on_demand_cost is None else c.on_demand_cost - c.cost
    return {
        "id": led.job,
        "state": led.state,
        "running": led.running,
        "spot_hours": hours(led.vm_hours(Capacity.SPOT.value)),
        "on_demand_hours": hours(led.vm_hours(Capacity.ON_DEMAND.value)),
        "changeover_hours": hours(led.changeover_hours),
        "preemptions": led.preemptions,
        "work_lost_hours": hours(sum(a.lost_hours * a.nodes for a in lost if a.lost_hours)) if lost else None,
        "work_lost_steps": sum(steps) if steps else None,
        "work_lost_cost": _opt(c.lost_cost),
        "cost": _opt(c.cost),
        "on_demand_cost": _opt(c.on_demand_cost),
        "savings": _opt(savings),
        "savings_pct": percent(savings, c.on_demand_cost) if savings is not None and c.on_demand_cost else None,
        "unpriced": c.unpriced,
        "prices": {t: ({"spot": p.spot, "on_demand": p.on_demand, "source": p.source} if p else None)
                   for t, p in c.prices.items()},
        "attempts": [_attempt_json(a, cost) for a, cost in zip(led.attempts, c.attempt_costs, strict=True)],
        # A job that ran (any state but pending) with no event read: its figures are unknown, not 0.
        "no_events": not led.attempts and led.state != "pending",
        **moves_json(c),
    }


def _attempt_json(a: Attempt, cost: tuple[float, float] | None) -> dict[str, Any]:
    return {
        "attempt": a.attempt, "capacity": a.capacity, "machine_type": a.machine_type, "nodes": a.nodes,
        "start": a.start.isoformat(), "end": a.end.isoformat(), "outcome": a.outcome,
        "hours": hours(a.hours), "vm_hours": hours(a.vm_hours), "from_events": a.from_events,
        "work_lost_hours": None if a.lost_hours is None else hours(a.lost_hours * a.nodes),
        "work_lost_steps": a.lost_steps,
        "cost": money(cost[0]) if cost else None, "on_demand_cost": money(cost[1]) if cost else None,
    }


def total_json(costed: list[Costed]) -> dict[str, Any]:
    """The stack's total over the priced jobs (unpriced ones are named, never guessed)."""
    priced = [c for c in costed if c.cost is not None and c.on_demand_cost is not None]
    cost = sum(c.cost or 0.0 for c in priced)
    od = sum(c.on_demand_cost or 0.0 for c in priced)
    return {
        "cost": money(cost),
        "on_demand_cost": money(od),
        "savings": money(od - cost),
        "savings_pct": percent(od - cost, od),
        "running_cost": money(sum(c.cost or 0.0 for c in priced if c.ledger.running)),
        "spot_hours": hours(sum(c.ledger.vm_hours(Capacity.SPOT.value) for c in costed)),
        "on_demand_hours": hours(sum(c.ledger.vm_hours(Capacity.ON_DEMAND.value) for c in costed)),
        "changeover_hours": hours(sum(c.ledger.changeover_hours for c in costed)),
        "preemptions": sum(c.ledger.preemptions for c in costed),
        "unpriced_jobs": [c.ledger.job for c in costed if c not in priced],
        # Zone moves: their changeovers, and their snapshots' storage so far where a price is known
        # (apart from `cost`: an upper bound, the disks' full size).
        "moves": sum(len(c.ledger.moves) for c in costed),
        "move_changeover_hours": hours(sum(m.changeover_hours or 0.0 for c in costed for m in c.ledger.moves)),
        "snapshot_storage_cost": money(sum(m.storage_cost(c.snapshot_price) or 0.0 for c in costed for m in c.ledger.moves)),
    }
