"""One job's events folded once into its attempts' runs, for the zone choice's evidence
(``cli.lifecycle.zonechoice``): the same runs, windows and "spot now" as ``Timeline.of`` and
``capacity.measure`` give per zone, from one pass over the events instead of two timelines and a
sort per attempt and zone (a stack's first decision reads every job's whole history).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from cli.lifecycle.events import Event
from infra.basics import ENDED_ON_ITS_OWN, MOOT_AFTER_ITS_OWN_END

_STOPS = ("preempted", "stopped", "failed")  # (attempt_end's: the first of these ends an attempt)


@dataclass(frozen=True, slots=True)
class Run:
    """An attempt that started: from its first ``started`` to the event that ended it (``attempt_end``),
    else to now (``how`` "running")."""

    attempt: int
    begun: datetime
    ended: datetime
    how: str
    capacity: str  # the last non-empty ``capacity`` its started events give (``measure``'s)
    spot: bool  # any started event says spot
    order: int  # its first started event's place among the job's events


def fold(events: Iterable[Event], now: datetime) -> list[Run]:
    """The runs of ``events``' attempts, by attempt (attempts never started have none)."""
    acc: dict[int, list] = {}  # attempt -> [begun, capacity, spot, order, ended nodes, stop, completed]
    stops: list[Event] = []
    for i, e in enumerate(events):
        a = acc.get(e.attempt)
        if a is None:
            a = acc[e.attempt] = [None, "", False, -1, set(), None, None]
        kind = e.event
        if kind == "started":
            if a[0] is None or e.time < a[0]:
                a[0] = e.time
            if a[3] < 0:
                a[3] = i
            cap = e.details.get("capacity", "")
            a[1] = cap or a[1]
            a[2] = a[2] or cap == "spot"
        if kind in ENDED_ON_ITS_OWN:
            a[4].add(e.node)
        if kind in _STOPS:
            stops.append(e)
        elif kind == "completed" and (a[6] is None or e.time >= a[6].time):
            a[6] = e  # the last completion (the later one of equal times, as a stable sort leaves it)
    for e in stops:  # (once every node's own end is known: a stop after it is moot)
        a = acc[e.attempt]
        if e.event in MOOT_AFTER_ITS_OWN_END and e.node in a[4]:
            continue
        if a[5] is None or e.time < a[5].time:
            a[5] = e  # the first stop (the earlier one of equal times)
    out = []
    for attempt in sorted(acc):
        begun, cap, spot, order, _, stop, done = acc[attempt]
        if begun is None:
            continue
        end = stop or done
        out.append(Run(attempt, begun, end.time if end else now, end.event if end else "running", cap, spot, order))
    return out


def capacity_of_runs(runs: list[Run]) -> dict[datetime, str]:
    """The start -> capacity ``measure`` counts a run not preempted at: it finds a run's attempt by its
    start time, so of attempts started at the same instant the one whose start was recorded last."""
    wanted = {r.begun for r in runs if r.how != "preempted"}
    out: dict[datetime, Run] = {}
    for r in runs:
        if r.begun in wanted and (r.begun not in out or r.order > out[r.begun].order):
            out[r.begun] = r
    return {t: r.capacity for t, r in out.items()}
