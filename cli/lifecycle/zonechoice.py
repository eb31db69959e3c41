"""The live zone choice: what the stack's events say about spot in each of its zones for a job's
machine type, and where the job should run next (``cli.policy.zones.choose_zone``), for ``resume``'s
preview and ``watch``'s action after a preemption.

Evidence is every job's, not only this one's: an attempt is evidence about the zone and machine
type it ran in (``capacity.attempt_pools``). Its complete spot windows (started -> preempted) and
spot attempts still running or ended by us (at least that long) are the zone's windows; spot is up
there *now* while a spot attempt runs there, and down for ``FRESH_H`` after a preemption there
with no spot start since. Outages are not measured (nothing probes a zone whose VM is gone): the
prior's stand.

A move's time is ``capacity.move_changeover_h`` (the job's past moves, else an hour; a regional
disk's force-attach: its own, else 0); its price (snapshot storage, cents) is left out as in
``cli.policy.failover``. A job that never started has an empty disk: its first placement is free.
The same bounds as the capacity failover: ``moveOnCapacity: false`` keeps the job where it is, and
neither a zone it left recently nor more than ``MOVE_BUDGET`` moves a day (``eligible_zones``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from cli.lifecycle.capacity import DEFAULT_PRICE_RATIO, _hours, attempt_pools, measure, move_changeover_h, observation_for
from cli.lifecycle.events import Event, Timeline
from infra.config import Capacity, Job, StackConfig

FRESH_H = 1.0  # a preemption says "down now" for this long: the development series' mean outage (cli/policy/zones.py)


def zone_stats(jobs: Iterable[Job], events_of: Mapping[str, list[Event]], machine: str, zones: Iterable[str],
               now: datetime):
    """What every job's events say of spot in each of ``zones`` for ``machine`` (``ZoneStats``, in order)."""
    from cli.policy.zones import ZoneStats

    wanted = list(dict.fromkeys(zones))
    windows: dict[str, list[float]] = {z: [] for z in wanted}
    censored: dict[str, list[float]] = {z: [] for z in wanted}
    latest: dict[str, tuple[datetime, bool, float]] = {}  # zone -> (when, up now, age h): the freshest evidence wins
    for job in jobs:
        events = job.mine(list(events_of.get(job.id, [])))
        by_zone: dict[str, set[int]] = {}
        for attempt, pool in attempt_pools(job, events).items():
            zone, _, kind = pool.partition("/")
            if kind == machine and zone in windows:
                by_zone.setdefault(zone, set()).add(attempt)
        for zone, attempts in by_zone.items():
            m = measure(events, now, attempts=attempts)
            windows[zone] += m.windows_h
            censored[zone] += m.censored_h
            spot = {e.attempt for e in events if e.event == "started" and e.details.get("capacity") == "spot"}
            for begun, ended, how in Timeline.of([e for e in events if e.attempt in attempts & spot], now).runs:
                seen = (begun, True, _hours(begun, now)) if how == "running" else (
                    (ended, False, _hours(ended, now)) if how == "preempted" and _hours(ended, now) < FRESH_H else None)
                if seen is not None and (zone not in latest or seen[0] > latest[zone][0]):
                    latest[zone] = seen
    out = []
    for zone in wanted:
        _, up, age = latest.get(zone, (None, None, 0.0))
        out.append(ZoneStats(zone, tuple(windows[zone]), (), tuple(censored[zone]), up, age))
    return tuple(out)


def decide_zone(cfg: StackConfig, job: Job, events_of: Mapping[str, list[Event]], now: datetime,
                price_ratio: float = DEFAULT_PRICE_RATIO, in_place: Callable[[], Capacity] | None = None):
    """Where ``job`` should run next (a ``cli.policy.zones.ZoneDecision``), or None when it has no
    choice (one zone, a move under way, ``moveOnCapacity: false``) or nothing is known of any zone.
    ``in_place()``: the job's policy's capacity in its zone (on-demand: it would not wait out an outage there)."""
    from cli.policy.failover import MOVE_BUDGET, MOVE_WINDOW_H, eligible_zones
    from cli.policy.zones import ZoneObservation, choose_zone

    zones = list(dict.fromkeys([job.zone, *(job.disk_replica_zones or cfg.zones)]))
    if len(zones) < 2 or job.move is not None or not job.move_on_capacity or job.boot_disk == "keep":
        return None
    machine = job.machine_type or job.instance_type or "?"
    stats = zone_stats(cfg.jobs, events_of, machine, zones, now)
    if not any(z.now is not None or z.up_h or z.open_up_h for z in stats):
        return None  # nothing known of any zone: the prior alone never tells them apart
    events = job.mine(list(events_of.get(job.id, [])))
    obs, _ = observation_for(job, events, now, price_ratio=price_ratio)
    move_h, _ = move_changeover_h(job, events)
    left: dict[str, float] = {}
    for stay in job.zone_history:
        if stay.move_began is not None:
            left[stay.zone] = min(left.get(stay.zone, math.inf), _hours(stay.move_began, now))
    _, blocked = eligible_zones(job.zone, zones, {}, left)
    first = not any(e.event == "started" for e in events)
    moves = sum(_hours(s.move_began, now) < MOVE_WINDOW_H for s in job.zone_history if s.move_began is not None)
    if moves >= MOVE_BUDGET and not first:
        blocked = tuple(f"{z}: the move budget is spent ({moves} in {MOVE_WINDOW_H:g} h)" for z in zones if z != job.zone)
    return choose_zone(ZoneObservation(
        here=job.zone, zones=stats, work_left_h=obs.work_left_h,
        time_left_h=obs.time_left_h, changeover_h=obs.changeover_h, price_ratio=obs.price_ratio, move_h=move_h,
        first_launch=first, tick_h=obs.tick_h, blocked=blocked,
        on_demand_while_down=in_place is not None and in_place() is Capacity.ON_DEMAND))


def preview(job: Job, decision) -> str:
    """``resume``'s words about the zone: the choice, why, and how to follow it (a job that never
    ran has no disk to move: its ``zone`` is edited before its first start)."""
    if decision is None:
        return ""
    if not decision.move:
        return f"zone: {decision.reason}"
    if job.state.value == "pending":
        return f"zone: {decision.reason}; set the job's `zone: {decision.zone}` in the stack file before it starts"
    return f"zone: {decision.reason}; `spotctl move {job.id} --to-zone {decision.zone}` moves it"
