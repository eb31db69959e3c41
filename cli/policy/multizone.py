"""Replay time-aligned spot traces of several zones: the zone choice (``cli.policy.zones``) picks
where, the job's policy (``cli.policy.policies``) spot / on-demand / wait there.

The rules are ``cli.policy.simulate``'s (integer units, every launch ``changeover_h`` billed without
progress, a missed job finishes on on-demand and is flagged) plus moves: a move takes ``move_h``
(rounded up to whole ticks) during which no VM runs and nothing progresses, and costs
``move_price`` spot-hours; the job then waits in the new zone until its policy launches. A move
before the job's first launch is free (the disk is empty). Unlike the ADRS multi-region simulator,
a running spot VM never changes zone for free: leaving a zone always means a new launch.

What the zone choice sees (``knowledge``):

- ``probe``: every zone's availability up to now (as a stack with a pool or a job in each zone,
  or a probe, sees it; the ADRS simulator lets a strategy read every region's);
- ``own``: only the zone the job is in, while it is there (what one job alone learns);
- ``stay``: no zone choice: the job stays where it was placed (the one-zone baseline).

``history_ticks`` of each zone's past before the start are known too (the stack's recorded
history), in ``probe`` mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cli.policy.policies import IDLE, ON_DEMAND, SPOT, Decision, Observation, make_policy
from cli.policy.simulate import Job, Meter, Timeline, Trace, load_trace
from cli.policy.zones import RunTracker, ZoneDecision, ZoneObservation, choose_zone

Knowledge = Literal["probe", "own", "stay"]
KNOWLEDGE: tuple[Knowledge, ...] = ("probe", "own", "stay")


@dataclass(frozen=True)
class Zones:
    """Aligned traces: tick ``i`` of every zone is the same moment."""

    gap_s: int
    traces: tuple[Trace, ...]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.traces]

    @property
    def ticks(self) -> int:
        return min(len(t.available) for t in self.traces)


def aligned(traces: Sequence[Trace]) -> Zones:
    """Traces of one tick, cut to the shortest; ValueError naming the odd one otherwise."""
    if not traces:
        raise ValueError("no traces")
    gap = traces[0].gap_s
    for t in traces:
        if t.gap_s != gap:
            raise ValueError(f"{t.name}: a tick of {t.gap_s} s, not {gap} s like {traces[0].name}: not aligned")
    if len({t.name for t in traces}) != len(traces):
        raise ValueError("two traces have the same name: name each zone once")
    n = min(len(t.available) for t in traces)
    return Zones(gap, tuple(Trace(t.name, gap, t.available[:n]) for t in traces))


def load_zones(paths: Sequence[Path], inverted: bool = False, names: Sequence[str] | None = None) -> Zones:
    traces = [load_trace(p, inverted=inverted) for p in paths]
    if names is not None:
        traces = [Trace(n, t.gap_s, t.available) for n, t in zip(names, traces, strict=True)]
    return aligned(traces)


@dataclass(frozen=True)
class Move:
    hours: float = 0.0  # snapshot + restore (or force-attach), without a VM
    price: float = 0.0  # spot-hours


@dataclass
class ZoneRun:
    cost: float  # spot-hours
    finish_h: float
    missed: bool
    preemptions: int
    launches: int
    moves: int
    spot_h: float
    od_h: float
    zones: list[str]  # where each launch ran
    reasons: list[str]  # the zone choice's reason for every move


Chooser = Callable[[ZoneObservation], ZoneDecision]


def simulate_zones(policy: str, zones: Zones, start: int, job: Job, move: Move = Move(), knowledge: Knowledge = "probe",
                   first: int = 0, params: dict | None = None, history_ticks: int = 0,
                   chooser: Chooser = choose_zone) -> ZoneRun:
    """One job from tick ``start``, placed in zone ``first`` unless the zone choice places it."""
    if knowledge not in KNOWLEDGE:
        raise ValueError(f"knowledge {knowledge!r}: one of {', '.join(KNOWLEDGE)}")
    tl = Timeline.of(zones.traces[0], job)
    tick_h = tl.h(tl.tick)
    k = job.price_ratio
    move_ticks = math.ceil(move.hours * 3600 / zones.gap_s - 1e-9) if move.hours > 0 else 0
    trackers = [RunTracker(t.name, tick_h) for t in zones.traces]
    if knowledge == "probe":
        for j in range(max(0, start - history_ticks), start):
            for tr, trace in zip(trackers, zones.traces, strict=True):
                tr.add(trace.available[j])
    pol = make_policy(policy, **(params or {}))
    here, target, moving = first, first, 0
    m = Meter(tl, k)
    preemptions = moves = 0
    used: list[str] = []
    reasons: list[str] = []
    i = 0

    def observe(zone: int) -> Observation:
        return Observation(
            elapsed_h=tl.h(t), progress_h=tl.h(m.progress), job_h=job.job_h, deadline_h=job.deadline_h,
            changeover_h=job.changeover_h, price_ratio=k, current=m.mode, spot_available=avail[zone],
            preemptions=preemptions, tick_h=tick_h)

    while True:
        t = i * tl.tick
        idx = start + i
        avail = [tr.available[idx] if idx < len(tr.available) else False for tr in zones.traces]
        if moving:
            moving -= 1
            here = here if moving else target
        for z, tr in enumerate(trackers):
            tr.add(avail[z] if knowledge == "probe" or (z == here and not moving) else None)
        if moving:
            i += 1
            continue
        if m.mode == SPOT and not avail[here]:
            m.mode, m.over, preemptions = IDLE, 0, preemptions + 1
        if t >= tl.deadline:
            decision: Decision = ON_DEMAND
        else:
            decision = pol.decide(observe(here))
            fresh = m.launches == 0
            if knowledge != "stay" and ((decision != SPOT and m.mode == IDLE) or fresh):
                choice = chooser(ZoneObservation(
                    here=zones.names[here], zones=tuple(tr.stats() for tr in trackers),
                    work_left_h=tl.h(tl.work - m.progress), time_left_h=tl.h(tl.deadline - t),
                    changeover_h=job.changeover_h, price_ratio=k, move_h=move_ticks * tick_h, move_price=move.price,
                    first_launch=fresh, tick_h=tick_h, on_demand_while_down=decision == ON_DEMAND))
                if choice.move and zones.names.index(choice.zone) != here:
                    target = zones.names.index(choice.zone)
                    moves += not fresh
                    reasons.append(choice.reason)
                    m.mode, m.over = IDLE, 0  # (an on-demand VM left behind is gone)
                    if fresh or move_ticks == 0:
                        here = target
                        decision = pol.decide(observe(here))
                    else:
                        m.cost_units += move.price / tl.h(1)
                        moving = move_ticks
                        i += 1
                        continue
            if decision == SPOT and not avail[here]:
                decision = IDLE
        launches = m.launches
        spent = m.step(decision)
        if m.launches > launches:
            used.append(zones.names[here])
        if spent is not None:
            return ZoneRun(tl.h(m.cost_units), tl.h(t + spent), t + spent > tl.deadline, preemptions, m.launches, moves,
                           tl.h(m.spot_u), tl.h(m.od_u), used, reasons)
        i += 1


@dataclass
class ZoneSummary:
    policy: str
    knowledge: str
    runs: int
    mean_norm_cost: float  # mean cost / all-on-demand cost
    misses: int
    moves: float  # per run


def evaluate_zones(zones: Zones, policies: Sequence[str], job: Job, n_starts: int, seed: int, move: Move,
                   history_ticks: int = 0) -> list[ZoneSummary]:
    """Every policy with every ``knowledge`` on the same random starts of the aligned zones."""
    from cli.policy.simulate import all_on_demand_cost, starts_for

    starts = starts_for(Trace("+".join(zones.names), zones.gap_s, zones.traces[0].available[:zones.ticks]), job,
                        n_starts, seed)
    base = all_on_demand_cost(job)
    out = []
    for name in policies:
        for knowledge in KNOWLEDGE:
            runs = [simulate_zones(name, zones, s, job, move, knowledge, history_ticks=history_ticks) for s in starts]
            out.append(ZoneSummary(name, knowledge, len(runs), sum(r.cost for r in runs) / len(runs) / base,
                                   sum(r.missed for r in runs), sum(r.moves for r in runs) / len(runs)))
    return out


def render_zones(rows: Sequence[ZoneSummary], move: Move) -> str:
    header = f"{'policy':<20} {'zones':<6} {'runs':>5} {'cost':>7} {'miss':>5} {'moves':>6}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.policy:<20} {r.knowledge:<6} {r.runs:>5} {r.mean_norm_cost:>7.3f} {r.misses:>5} {r.moves:>6.2f}")
    lines.append(f"cost: mean cost / all-on-demand; a move takes {move.hours:g} h. zones: stay = never moves,")
    lines.append("own = moves on what the job saw, probe = sees every zone's spot (a pool in each)")
    return "\n".join(lines) + "\n"
