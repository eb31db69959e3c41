"""The live policy path: a job about to be resumed, seen as the policy engine sees it (its measured
progress, changeover and spot windows, and the availability its events reveal), what the stack's
history taught (``spotctl policy fit``), and the capacity its policy picks.

Measured, not assumed: an attempt's changeover runs from its ``started`` event to its first
``progress`` (or ``checkpoint``) event; the job's changeover is the median over its attempts that have
one (``DEFAULT_CHANGEOVER_H`` until one does); progress is running time minus changeovers. A spot
window is an attempt that ended ``preempted``: from ``started`` to the preemption; a spot attempt
(its ``started`` event's ``capacity``) that is still running or that we ended is a window at least
that long. A window is evidence about the zone and machine type it ran in (``attempt_pools``): the
zone of its attempt in the job's ``zoneHistory`` and the ``machineType`` its ``started`` event
records, not the job's zone now.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cli.lifecycle.events import Event, Timeline
from infra.config import Capacity, Job, StackConfig

DEFAULT_CHANGEOVER_H = 0.2
DEFAULT_PRICE_RATIO = 3.0
TICK_H = 1 / 6
HISTORY_SPAN_H = 90 * 24  # the availability a policy replays: the last 90 days at most (observation_for)
PROGRESS_EVENTS = ("progress", "checkpoint")
LEARNED_VERSION = 1
LIVE_STATES = 150_000  # one plan of a one-off decision: ~0.15 s on an idle core (bench/policy_latency.py)


@dataclass(frozen=True)
class Measured:
    """What a job's own events say: changeover (measured or default), progress, spot windows."""

    changeover_h: float
    measured_changeovers: int
    progress_h: float
    windows_h: tuple[float, ...]  # complete spot windows: started -> preempted
    censored_h: tuple[float, ...]  # spot attempts still running or ended by us: windows at least this long


def _hours(a: datetime, b: datetime) -> float:
    return max(0.0, (b - a).total_seconds() / 3600)


def measure(events: Iterable[Event], now: datetime, default_changeover_h: float = DEFAULT_CHANGEOVER_H,
            attempts: Container[int] | None = None) -> Measured:
    """Changeover, progress and spot windows from one job's events (see the module docstring);
    with ``attempts``, of those attempts only (the ones that ran in one zone on one machine type)."""
    events = list(events)
    if attempts is not None:
        events = [e for e in events if e.attempt in attempts]
    tl = Timeline.of(events, now)
    first_progress: dict[int, datetime] = {}
    started: dict[int, datetime] = {}
    capacity: dict[int, str] = {}
    for e in events:
        if e.event == "started":
            started[e.attempt] = min(started.get(e.attempt, e.time), e.time)
            capacity[e.attempt] = e.details.get("capacity", "") or capacity.get(e.attempt, "")
        elif e.event in PROGRESS_EVENTS:
            first_progress[e.attempt] = min(first_progress.get(e.attempt, e.time), e.time)
    changeovers = [_hours(started[a], t) for a, t in first_progress.items() if a in started and t >= started[a]]
    changeover = statistics.median(changeovers) if changeovers else default_changeover_h
    progress = 0.0
    windows: list[float] = []
    censored: list[float] = []
    by_start = {t: a for a, t in started.items()}
    for a, b, how in tl.runs:
        attempt = by_start.get(a)
        begin = first_progress.get(attempt) if attempt is not None else None
        lost = _hours(a, begin) if begin is not None and begin <= b else changeover
        progress += max(0.0, _hours(a, b) - lost)
        if how == "preempted":
            windows.append(_hours(a, b))
        elif capacity.get(attempt) == "spot":  # still running, or ended by us: the window lasted at least this
            censored.append(_hours(a, b))
    return Measured(changeover, len(changeovers), progress, tuple(windows), tuple(censored))


def observation_for(job: Job, events: list[Event], now: datetime, changeover_h: float | None = None,
                    price_ratio: float = DEFAULT_PRICE_RATIO):
    """The policy's view of a job about to be resumed, and the availability history to replay (from
    the job's attempts in its zone and machine type now: see ``attempt_pools``).

    Without ``deadlineHours`` (or without ``jobHours``, when a deadline cannot be weighed) the
    deadline is ``inf``: the policies then weigh cost per hour of progress, or preemptions.
    """
    from cli.policy.policies import IDLE, Observation

    m = measure(events, now)
    tl = Timeline.of(events, now)
    start = tl.first_start or now
    history: list[bool] = []
    here = _here(job, events)  # the availability replayed is this zone's (and machine type's) only
    seen_here = Timeline.of([e for e in events if e.attempt in here], now)
    # The replay covers at most the last HISTORY_SPAN_H, in time order (a run is clipped to the span, to
    # what came before it and to now): one element per tick, so however far apart the events' times
    # are, at most HISTORY_SPAN_H / TICK_H of them.
    cursor = max(seen_here.first_start or now, now - timedelta(hours=HISTORY_SPAN_H))
    for a, b, _ in seen_here.runs:
        a = min(max(a, cursor), now)
        b = min(max(b, a), now)
        history += [False] * int(_hours(cursor, a) / TICK_H)
        history += [True] * int(_hours(a, b) / TICK_H)
        cursor = b
    history += [False] * int(_hours(cursor, now) / TICK_H)
    obs = Observation(
        elapsed_h=_hours(start, now), progress_h=m.progress_h, job_h=job.job_hours or math.inf,
        deadline_h=(job.deadline_hours if job.job_hours else None) or math.inf, changeover_h=m.changeover_h if changeover_h is None else changeover_h,
        price_ratio=price_ratio, current=IDLE, spot_available=True,
        preemptions=sum(how == "preempted" for _, _, how in tl.runs), tick_h=TICK_H,
    )
    return obs, history


# ---- what the stack's history taught: stacks/.spotctl/<stack>.policy.json ------------------------


def learned_path(stack_path: Path, stack: str) -> Path:
    """Where ``spotctl policy fit`` writes and ``resume`` reads: next to the stack file."""
    return stack_path.parent / ".spotctl" / f"{stack}.policy.json"


def pool_key(job: Job) -> str:
    """Jobs share what they learn with jobs in the same zone on the same machine type (the job's now)."""
    return f"{job.zone}/{job.machine_type or job.instance_type or '?'}"


def attempt_pools(job: Job, events: Iterable[Event]) -> dict[int, str]:
    """The pool (zone/machine type) each attempt in ``events`` ran in: its zone from ``zoneHistory``
    (attempts up to a stay's ``lastAttempt`` ran in that zone; later ones in the job's zone: during a
    move's snapshot and restore steps the job's zone is still the one it leaves), its machine type
    from its ``started`` event's ``machineType`` (the scripts record it), else the job's."""
    stays = sorted(job.zone_history, key=lambda s: s.last_attempt)
    machine: dict[int, str] = {}
    for e in events:
        if e.event == "started" and e.details.get("machineType"):
            machine.setdefault(e.attempt, e.details["machineType"])
    attempts = {e.attempt for e in events}
    default_machine = job.machine_type or job.instance_type or "?"
    out = {}
    for a in attempts:
        zone = next((s.zone for s in stays if a <= s.last_attempt), job.zone)
        out[a] = f"{zone}/{machine.get(a, default_machine)}"
    return out


def _here(job: Job, events: list[Event]) -> set[int]:
    """The job's attempts that ran in its pool now: the only ones that are evidence about it."""
    key = pool_key(job)
    return {a for a, pool in attempt_pools(job, events).items() if pool == key}


def fit(jobs: Iterable[Job], events_of: Callable[[str], list[Event]], now: datetime) -> dict[str, Any]:
    """The stack's history per zone and machine type: spot windows, changeovers, fitted hazards.

    The shipped regimes are the prior; the stack's windows override them as they accumulate.
    """
    from cli.policy.planning import AGE_EDGES_H, fit_windows, launch_economics, pooled_regime

    pools: dict[str, dict[str, Any]] = {}
    for job in jobs:
        events = job.mine(list(events_of(job.id)))  # (an earlier job of this id's windows are not this one's)
        by_pool: dict[str, set[int]] = {pool_key(job): set()}
        for attempt, key in attempt_pools(job, events).items():
            by_pool.setdefault(key, set()).add(attempt)
        for key, attempts in by_pool.items():  # each attempt's windows where it ran, not where the job is now
            m = measure(events, now, attempts=attempts)
            entry = pools.setdefault(key, {"jobs": {}, "windows_h": [], "censored_h": [], "changeovers_h": []})
            entry["jobs"][job.id] = {"windows_h": [round(w, 4) for w in m.windows_h],
                                     "censored_h": [round(w, 4) for w in m.censored_h],
                                     "changeover_h": round(m.changeover_h, 4) if m.measured_changeovers else None}
            entry["windows_h"] += m.windows_h
            entry["censored_h"] += m.censored_h
            if m.measured_changeovers:
                entry["changeovers_h"].append(m.changeover_h)
    out = {}
    for key, entry in sorted(pools.items()):
        regime = fit_windows(key, entry["windows_h"], entry["censored_h"], pooled_regime())
        billed, progress = launch_economics(regime, 0.0)
        out[key] = {
            "jobs": entry["jobs"],
            "spot_windows": len(entry["windows_h"]),
            "open_windows": len(entry["censored_h"]),
            "changeover_h": round(statistics.median(entry["changeovers_h"]), 4) if entry["changeovers_h"] else None,
            "mean_window_h": round(billed, 3),
            "up_rate": [round(x, 5) for x in regime.up_rate],
            "down_rate": [round(x, 5) for x in regime.down_rate],
        }
    return {"version": LEARNED_VERSION, "fitted_at": now.isoformat(), "age_edges_h": [round(x, 5) for x in AGE_EDGES_H],
            "units": "hazards: spot windows (up) and outages (down) ending per hour, by age bucket", "pools": out}


def fit_stack(stack_path: Path, stack: str, jobs: Iterable[Job], events_of: Callable[[str], list[Event]],
              now: datetime) -> tuple[Path, dict[str, Any]]:
    """``spotctl policy fit``: learn from the stack's history and write it where ``resume`` reads it
    (atomically: a reader sees the old file or the new one)."""
    from cli.lifecycle.stackfile import atomic_write

    doc = fit(jobs, events_of, now)
    doc["stack"] = stack
    path = learned_path(stack_path, stack)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path, doc


def stack_capacity(stack_path: Path, stack: str, cfg: StackConfig,
                   now: Callable[[], datetime] = lambda: datetime.now(UTC)):
    """The CapacityChooser of ``resume``: the job's policy with what the stack has learned, at the
    job's price ratio (``spotctl:prices`` or the shipped price table; ``DEFAULT_PRICE_RATIO`` where unknown)."""
    return policy_capacity(now, learned=read_learned(learned_path(stack_path, stack)),
                           price_ratio=lambda job: job_price_ratio(cfg, job))


def job_price_ratio(cfg: StackConfig, job: Job) -> float:
    """On-demand / spot for the job's machine type (``spotctl:prices`` or the shipped price table;
    ``DEFAULT_PRICE_RATIO`` where unknown)."""
    from cli.cost.prices import price_ratio

    spot_over_od = price_ratio(cfg, job.machine_type or job.instance_type or "")
    return 1 / spot_over_od if spot_over_od and 0 < spot_over_od < 1 else DEFAULT_PRICE_RATIO


def read_learned(path: Path) -> Mapping[str, Any]:
    """The learned file, or nothing (absent, unreadable or another version: the shipped prior holds)."""
    from cli.lifecycle.cachefile import read_bounded

    try:
        doc = json.loads(read_bounded(path) or b"null")  # (a team may share it through the repository: bounded)
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) and doc.get("version") == LEARNED_VERSION else {}


def _policy_params(job: Job, learned: Mapping[str, Any], m: Measured) -> dict[str, Any]:
    """What ``default`` gets on top of the job's own replay: the pool's fitted regime and windows."""
    from cli.policy.planning import Regime

    pool = (learned.get("pools") or {}).get(pool_key(job)) or {}
    windows, censored = list(m.windows_h), list(m.censored_h)
    regime = None
    try:
        if pool.get("up_rate") and pool.get("down_rate"):
            regime = Regime(f"learned:{pool_key(job)}", tuple(map(float, pool["up_rate"])), tuple(map(float, pool["down_rate"])))
        for other, seen in (pool.get("jobs") or {}).items():
            if other != job.id:  # this job's own windows come from its events, fresher than the file
                windows += [float(w) for w in seen.get("windows_h", [])]
                censored += [float(w) for w in seen.get("censored_h", [])]
    except (TypeError, ValueError, AttributeError):
        regime, windows, censored = None, list(m.windows_h), list(m.censored_h)  # a damaged file teaches nothing
    return {"learned": regime, "windows": windows, "censored": censored, "one_layer": True, "max_plans": 1,
            "budget": LIVE_STATES}


def policy_capacity(now: Callable[[], datetime] = lambda: datetime.now(UTC), learned: Mapping[str, Any] | None = None,
                    price_ratio: Callable[[Job], float] | None = None):
    """A CapacityChooser that asks the job's policy (see cli/policy/policies.py), replaying its history.

    ``learned`` is what ``spotctl policy fit`` wrote for the stack; ``price_ratio`` the job's
    on-demand / spot price (``DEFAULT_PRICE_RATIO`` where unknown).
    """
    from cli.policy.policies import ON_DEMAND, Default, Observation, make_policy

    def choose(job: Job, events: list[Event]) -> Capacity:
        if job.spot_only:
            return Capacity.SPOT  # GCE has no on-demand VMs of its machine type (validate refuses them too)
        events = job.mine(list(events))  # an earlier job of this id (spotctl:retiredJobs) is not this one's history
        at = now()
        ratio = price_ratio(job) if price_ratio else DEFAULT_PRICE_RATIO
        obs, history = observation_for(job, events, at, price_ratio=ratio)
        if job.policy == Default.name:
            # The windows weighed are this zone's and machine type's: the job's own elsewhere are not
            # evidence about them (the changeover and progress, in ``obs``, are the whole job's).
            policy = make_policy(job.policy, **_policy_params(job, learned or {}, measure(events, at, attempts=_here(job, events))))
        else:
            policy = make_policy(job.policy)
        if math.isfinite(obs.deadline_h):
            for i, available in enumerate(history):
                if isinstance(policy, Default):
                    policy.observe(available, TICK_H)  # the posterior only: no plan for the past
                    continue
                t = i * TICK_H
                policy.decide(Observation(
                    elapsed_h=t, progress_h=min(obs.progress_h, t), job_h=obs.job_h, deadline_h=obs.deadline_h,
                    changeover_h=obs.changeover_h, price_ratio=obs.price_ratio, current="idle",
                    spot_available=available, preemptions=0, tick_h=TICK_H,
                ))
        return Capacity.ON_DEMAND if policy.decide(obs) == ON_DEMAND else Capacity.SPOT

    return choose


# ---- a zone failover: wait, on-demand in place, or move (``spotctl watch``) --------------------------

# A move's changeover before the job has moved once: an assumption, not a published figure. Neither
# cloud publishes a snapshot or restore rate to scale by disk size: AWS says creation "can take
# several hours to complete, depending on the number of modified blocks"
# (docs.aws.amazon.com/ebs/latest/userguide/ebs-creating-snapshot.html) and that there is no way to
# predict it (repost.aws/knowledge-center/ebs-incremental-snapshot-creation-slow); a job's first
# snapshot is a full copy (cloud.google.com/compute/docs/disks/create-snapshots). One hour is
# deliberately long, so an unmeasured move must earn its place; the job's own moves replace it.
DEFAULT_MOVE_H = 1.0


def move_changeover_h(job: Job, events: list[Event]) -> tuple[float, int]:
    """A move's changeover for ``job``: the median of its past moves (``cli.lifecycle.move``), else
    ``DEFAULT_MOVE_H``; and how many moves it was measured on. A regional disk moves without a
    snapshot: its moves' own median, else 0 (the launch is the policy's changeover already)."""
    from cli.lifecycle.move import move_changeovers

    regional = bool(job.disk_replica_zones)
    seen = move_changeovers(job, events, same_disk=regional)
    return (statistics.median(seen), len(seen)) if seen else (0.0 if regional else DEFAULT_MOVE_H, 0)


def decide_zone_failover(job: Job, events: list[Event], *, zones: list[str], refused: Mapping[str, datetime],
                         refusals: int, refused_since: datetime | None, next_wait_h: float,
                         in_place: Callable[[], Capacity], now: datetime, price_ratio: float = DEFAULT_PRICE_RATIO):
    """The zone failover's decision (``cli.policy.failover``) for a job whose resume was refused for
    capacity ``refusals`` times in its zone: the job's measured changeovers, progress and deadline,
    the zones it may move to (``eligible_zones``: refusals from the journal, departures from the
    zone history) and its moves within the move window (the zone history: durable across watchers).
    ``in_place()`` asks the job's policy for its zone, only when a move is possible at all."""
    from cli.policy.failover import MOVE_WINDOW_H, FailoverObservation, eligible_zones, make_failover

    events = job.mine(list(events))  # (an earlier job of this id's attempts are not this one's)
    obs, _ = observation_for(job, events, now, price_ratio=price_ratio)
    move_h, _ = move_changeover_h(job, events)
    reachable = job.disk_replica_zones or zones  # a regional disk moves only between its two zones
    left: dict[str, float] = {}
    for stay in job.zone_history:
        if stay.move_began is not None:
            left[stay.zone] = min(left.get(stay.zone, math.inf), _hours(stay.move_began, now))
    candidates, blocked = eligible_zones(job.zone, reachable, {z: _hours(t, now) for z, t in refused.items()}, left)
    if job.move is not None and job.move.replica_zones:  # a conversion to a regional disk does not move on
        candidates, blocked = (), (f"the job's disk is being converted to a regional one in {job.zone}: it moves only "
                                   "once that move is released",)
    moves = sum(_hours(s.move_began, now) < MOVE_WINDOW_H for s in job.zone_history if s.move_began is not None)
    allowed = job.move_on_capacity and job.boot_disk != "keep"
    return make_failover().decide(FailoverObservation(
        refusals=refusals, waited_h=_hours(refused_since, now) if refused_since else 0.0, next_wait_h=next_wait_h,
        move_h=move_h, changeover_h=obs.changeover_h, price_ratio=obs.price_ratio, work_left_h=obs.work_left_h,
        slack_h=obs.slack_h if math.isfinite(obs.deadline_h) else math.inf,
        in_place="on-demand" if allowed and (candidates or blocked) and in_place() is Capacity.ON_DEMAND else "spot",
        candidates=candidates, allowed=allowed, tick_h=obs.tick_h, blocked=blocked, moves_in_window=moves))
