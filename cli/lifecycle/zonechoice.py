"""The live zone choice: what the stack's events say about spot in each of its zones for a job's
machine type, and where the job should run next (``cli.policy.zones.choose_zone``), for ``resume``'s
preview and ``watch``'s action after a preemption.

Evidence is every job's, not only this one's: an attempt is evidence about the zone and machine
type it ran in (``capacity.attempt_pools``). Its complete spot windows (started -> preempted) and
spot attempts still running or ended by us (at least that long) are the zone's windows; spot is up
there *now* while a spot attempt runs there, and down for ``FRESH_H`` after a preemption there
with no spot start since. The stack's pools are evidence too (``pool_evidence``): a pool VM of the
job's machine type preempted in a zone (its events carry the zone its VM ran in) was a spot VM
there, up from its first event to its preemption, and spot is down there for ``FRESH_H`` after.
(A pool VM still running says nothing: its part may be the on-demand base.) A launch the cloud
refused for capacity in a zone (``watch``'s journal, which ``resume`` reads too: any job of the
machine type) says spot is down there for ``FRESH_H`` too. The recorded history
(``spotctl policy fit``'s learned file, ``capacity.learned_path``) adds the windows of jobs whose
events are no longer read (a job since removed from the stack file). Outages are not measured
(nothing probes a zone whose VM is gone): the prior's stand.

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
from typing import Any

from cli.lifecycle.attemptfold import Run, capacity_of_runs, fold
from cli.lifecycle.capacity import DEFAULT_PRICE_RATIO, _hours, attempt_pools, move_changeover_h, observation_for
from cli.lifecycle.events import Event
from infra.config import Capacity, Job, Pool, StackConfig

FRESH_H = 1.0  # a preemption says "down now" for this long: the development series' mean outage (cli/policy/zones.py)


def zone_stats(jobs: Iterable[Job], events_of: Mapping[str, list[Event]], machine: str, zones: Iterable[str],
               now: datetime, pools: Iterable[Pool] = (), learned: Mapping[str, Any] | None = None,
               refused: Iterable[tuple[str, str, datetime]] = ()):
    """What every job's and pool's events (and the learned file's jobs not among ``jobs``) say of spot
    in each of ``zones`` for ``machine`` (``ZoneStats``, in order). ``refused``: (machine, zone, when)
    of launches refused for capacity."""
    from cli.policy.zones import ZoneStats

    jobs = list(jobs)
    wanted = list(dict.fromkeys(zones))
    windows: dict[str, list[float]] = {z: [] for z in wanted}
    censored: dict[str, list[float]] = {z: [] for z in wanted}
    latest: dict[str, tuple[datetime, bool, float]] = {}  # zone -> (when, up now, age h): the freshest evidence wins
    _learned(learned or {}, machine, {j.id for j in jobs}, windows, censored)
    for pool in pools:
        if machine in pool_types(pool):
            pool_evidence(events_of.get(pool.name, []), now, windows, latest)
    for kind, zone, when in refused:
        age = _hours(when, now)
        if kind == machine and zone in windows and 0 <= age < FRESH_H and (zone not in latest or when > latest[zone][0]):
            latest[zone] = (when, False, age)
    for job in jobs:
        job_evidence(job, job.mine(list(events_of.get(job.id, []))), machine, now, windows, censored, latest)
    out = []
    for zone in wanted:
        _, up, age = latest.get(zone, (None, None, 0.0))
        out.append(ZoneStats(zone, tuple(windows[zone]), (), tuple(censored[zone]), up, age))
    return tuple(out)


def job_evidence(job: Job, events: list[Event], machine: str, now: datetime, windows: dict[str, list[float]],
                 censored: dict[str, list[float]], latest: dict[str, tuple[datetime, bool, float]]) -> None:
    """One job's attempts on ``machine`` in the zones of ``windows``, folded once (``attemptfold``): per
    zone what ``measure`` counts of them (windows, censored), and its spot attempts' news of now."""
    pools = attempt_pools(job, events)
    runs: dict[str, list[Run]] = {}
    for run in fold(events, now):
        zone, _, kind = pools[run.attempt].partition("/")
        if kind == machine and zone in windows:
            runs.setdefault(zone, []).append(run)
    for zone, theirs in runs.items():
        capacity = capacity_of_runs(theirs)
        got, cut = windows[zone], censored[zone]
        for r in theirs:
            if r.how == "preempted":
                got.append(_hours(r.begun, r.ended))
            elif capacity[r.begun] == "spot":  # still running, or ended by us: the window lasted at least this
                cut.append(_hours(r.begun, r.ended))
            if not r.spot or r.how not in ("running", "preempted"):
                continue
            # (the freshest news wins: its age is worked out only for news fresher than what is known)
            when = r.begun if r.how == "running" else r.ended
            if zone in latest and when <= latest[zone][0]:
                continue
            age = _hours(when, now)
            if r.how == "running" or age < FRESH_H:
                latest[zone] = (when, r.how == "running", age)


def pool_types(pool: Pool) -> set[str]:
    return {t for t in [pool.machine_type, *(pool.instance_types or [])] if t}


def pool_evidence(events: list[Event], now: datetime, windows: dict[str, list[float]],
                  latest: dict[str, tuple[datetime, bool, float]]) -> None:
    """A pool's preempted VMs, each by its instance and the zone it ran in: a spot window from its first
    event to its preemption, and spot down there for ``FRESH_H`` after (module docstring)."""
    first: dict[str, datetime] = {}
    for e in sorted(events, key=lambda e: e.time):
        if not e.instance or e.zone not in windows:
            continue
        first.setdefault(e.instance, e.time)
        if e.event != "preempted":
            continue
        windows[e.zone].append(_hours(first[e.instance], e.time))
        first.pop(e.instance)  # (a name reused by a later VM starts a new window)
        age = _hours(e.time, now)
        if age < FRESH_H and (e.zone not in latest or e.time > latest[e.zone][0]):
            latest[e.zone] = (e.time, False, age)


def _learned(doc: Mapping[str, Any], machine: str, read: set[str], windows: dict[str, list[float]],
             censored: dict[str, list[float]]) -> None:
    """The learned file's windows per ``zone/machine`` of the jobs whose events are not read here."""
    pools = doc.get("pools")
    for key, entry in (pools.items() if isinstance(pools, dict) else ()):
        zone, _, kind = str(key).partition("/")
        if kind != machine or zone not in windows or not isinstance(entry, dict) or not isinstance(entry.get("jobs"), dict):
            continue
        for job_id, seen in entry["jobs"].items():
            if job_id in read or not isinstance(seen, dict):
                continue
            windows[zone] += [float(w) for w in seen.get("windows_h") or () if isinstance(w, (int, float)) and w > 0]
            censored[zone] += [float(w) for w in seen.get("censored_h") or () if isinstance(w, (int, float)) and w > 0]


def decide_zone(cfg: StackConfig, job: Job, events_of: Mapping[str, list[Event]], now: datetime,
                price_ratio: float = DEFAULT_PRICE_RATIO, in_place: Callable[[], Capacity] | None = None,
                learned: Mapping[str, Any] | None = None, refused: Iterable[tuple[str, str, datetime]] = ()):
    """Where ``job`` should run next (a ``cli.policy.zones.ZoneDecision``), or None when it has no
    choice (one zone, a move under way, ``moveOnCapacity: false``) or nothing is known of any zone.
    ``in_place()``: the job's policy's capacity in its zone (on-demand: it would not wait out an outage there);
    ``learned``: the learned file (``capacity.read_learned``); ``refused``: (machine, zone, when) of capacity refusals."""
    from cli.policy.failover import MOVE_BUDGET, MOVE_WINDOW_H, eligible_zones
    from cli.policy.zones import ZoneObservation, choose_zone

    zones = list(dict.fromkeys([job.zone, *(job.disk_replica_zones or cfg.zones)]))
    if len(zones) < 2 or job.move is not None or not job.move_on_capacity or job.boot_disk == "keep":
        return None
    machine = job.machine_type or job.instance_type or "?"
    stats = zone_stats(cfg.jobs, events_of, machine, zones, now, cfg.pools, learned, refused)
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


def preview(job: Job, decision, why_here: str = "") -> str:
    """``resume``'s words about the zone when it resumes in place (``why_here``: why, though the
    choice says move: ``--no-move``, a forced capacity), and the command that would follow the choice."""
    if decision is None:
        return ""
    if not decision.move:
        return f"zone: {decision.reason}"
    if job.state.value == "pending":
        return f"zone: {decision.reason}; {why_here}: set the job's `zone: {decision.zone}` in the stack file to follow it"
    return f"zone: {decision.reason}; {why_here}: `spotctl move {job.id} --to-zone {decision.zone}` moves it"
