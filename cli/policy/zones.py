"""Where to run: at a job's first launch and whenever it is not running on spot (a preemption, a wait,
on-demand), which of the stack's zones for its machine type, and whether getting there pays.

Pure: ``choose_zone`` sees what the stack knows of each zone (``ZoneStats``: the spot windows and
outages its jobs and pools recorded there, and whether spot is up there now and since when) and
what a move costs, and returns a ``ZoneDecision`` with its reason; it never acts. Spot vs on-demand
in the chosen zone stays the job's policy's (``cli.policy.policies``).

The model, in the policy engine's units (spot costs 1 per hour, on-demand ``price_ratio``, a launch
``changeover_h`` billed hours without progress):

1. Each zone is an alternating renewal process: spot windows of mean ``U`` and outages of mean
   ``D`` (the zone's observed runs, shrunk towards ``PRIOR_UP_H`` / ``PRIOR_DOWN_H`` by
   ``PRIOR_RUNS`` pseudo-runs, so one lucky window is not a zone). Availability ``f = U / (U + D)``.
   The rest of a run of a given age: the zone's own longer runs (heavy tails), a window at least
   as long again as it has lasted.
2. The expected cost of the work left if the job goes to a zone now (``zone_cost``): for the next
   ``horizon`` hours there, the move, the wait for spot (waited out, or on on-demand when the job's
   policy would run on-demand rather than wait), its current window, then its own availability,
   each window paying a changeover; after that every zone alike at the job's zone's long-run rate
   (``fluid_cost``: what spot can do before the deadline at ``f * (1 - d / U)`` hours of progress
   per hour, the rest on on-demand), since the job may move again later. Spot dearer per hour of
   progress than on-demand is not taken at all. The horizon is a window and an outage, longer when
   moves are dear (the zone chosen then stays the job's for longer).
3. A move costs its time (``move_h``: snapshot and restore, or a regional disk's force-attach),
   taken from the time left, and its price (``move_price``, spot-hours); the time is priced at
   on-demand's premium as well, since the policies' safety nets turn lost slack into on-demand
   hours. It is made only when the expected cost there, all of that included, is below staying's
   by more than ``MARGIN``: a move never costs more than it is expected to gain. A paid move goes
   only where spot is seen up now: zones of a region share outages, so a zone nobody runs in while
   the job's zone is down is taken to be down too.
4. The deadline: a zone is a target only if, after the move, on-demand could still finish with a
   changeover, a decision tick and (a paid move) ``RESERVE_FRAC`` of the work left to spare;
   staying needs nothing, so a move can never be what makes a deadline unreachable.
5. A first launch of an empty disk moves for free (nothing to carry). When moving is free and the
   costs tie (slack to spare everywhere), the zone where spot is up sooner wins, then the more
   available one, then the job's own zone.

Without a deadline, zones are ranked by cost per hour of progress (``per_hour``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

# The prior of a zone nothing has been seen of: the development series (Oct-2022 us-west-2a/2b,
# skypilot-spot-traces aws-10-26-2022, v100_1) have mean windows of 3.7 and 2.7 h and mean
# outages of 1.1 h in both zones (bench/multizone.py --stats prints them).
PRIOR_UP_H = 3.0
PRIOR_DOWN_H = 1.0
PRIOR_RUNS = 1.0  # pseudo-runs of the prior in every estimate
HORIZON_H = PRIOR_UP_H + PRIOR_DOWN_H  # a zone chosen now is the job's for about a window and an outage...
HORIZON_MOVES = 4.0  # ...and, when moving costs time, for long enough to earn it back several times over
RESERVE_FRAC = 0.05  # a paid move leaves at least this share of the work left as slack (rule 4)
MARGIN = 1e-6  # spot-hours: a move must gain more than this (float noise is no gain)
SLACK_EPS_H = 1e-6


@dataclass(frozen=True)
class ZoneStats:
    """What the stack knows of spot in one zone for the job's machine type (hours)."""

    zone: str
    up_h: tuple[float, ...] = ()  # complete spot windows seen
    down_h: tuple[float, ...] = ()  # complete outages seen
    open_up_h: tuple[float, ...] = ()  # windows still running or ended by us: at least this long
    now: bool | None = None  # spot up there now; None: not known
    age_h: float = 0.0  # how long it has been so (when ``now`` is known)

    @property
    def mean_up_h(self) -> float:
        """Windows' mean (censored ones count their hours, not a run end: the exponential MLE)."""
        return (sum(self.up_h) + sum(self.open_up_h) + PRIOR_RUNS * PRIOR_UP_H) / (len(self.up_h) + PRIOR_RUNS)

    @property
    def mean_down_h(self) -> float:
        return (sum(self.down_h) + PRIOR_RUNS * PRIOR_DOWN_H) / (len(self.down_h) + PRIOR_RUNS)

    @property
    def availability(self) -> float:
        up, down = self.mean_up_h, self.mean_down_h
        return up / (up + down)

    def residual_up_h(self) -> float:
        """Expected rest of the current window, given its age (heavy tails: the zone's own longer windows)."""
        longer = [u - self.age_h for u in self.up_h if u > self.age_h]
        # The prior term: a window as old as this one is expected to last as long again (Lindy), at least a mean one.
        return (sum(longer) + PRIOR_RUNS * max(self.mean_up_h, self.age_h)) / (len(longer) + PRIOR_RUNS)

    def delay_h(self, after_h: float = 0.0) -> float:
        """Expected hours until spot is up there, counted from ``after_h`` from now (a move's end)."""
        mean = self.mean_down_h
        if self.now is None:
            return (1 - self.availability) * mean
        if self.now:  # still up at arrival with the window's survival, else a whole outage
            return (1 - math.exp(-after_h / self.residual_up_h())) * mean if after_h > 0 else 0.0
        longer = [d - self.age_h for d in self.down_h if d > self.age_h]
        rest = (sum(longer) + PRIOR_RUNS * mean) / (len(longer) + PRIOR_RUNS)
        return max(0.0, rest - after_h) if rest > after_h else (1 - self.availability) * mean


@dataclass(frozen=True)
class ZoneObservation:
    """The job, where it is, and what a move costs (hours; prices in spot-hours)."""

    here: str | None  # the job's zone; None: not placed yet
    zones: tuple[ZoneStats, ...]  # every zone it may run in (its own included)
    work_left_h: float  # inf when unknown
    time_left_h: float  # until the deadline; inf without one
    changeover_h: float
    price_ratio: float
    move_h: float  # a move's time: snapshot + restore (or force-attach); 0 when free
    move_price: float = 0.0  # a move's price in spot-hours (snapshot storage)
    first_launch: bool = False  # the disk is empty: moving carries nothing, costs nothing
    tick_h: float = 1 / 6  # a decision tick: the deadline check's margin
    on_demand_while_down: bool = False  # the job's policy runs on-demand rather than wait for spot
    blocked: tuple[str, ...] = ()  # zones that are no target now, each "zone: why"


@dataclass(frozen=True)
class ZoneDecision:
    zone: str
    move: bool  # True: the job should be in ``zone``, not where it is
    reason: str
    costs: dict[str, float] = field(default_factory=dict)  # expected cost per zone (spot-hours), move included


def efficiency(z: ZoneStats, d: float) -> float:
    """Hours of progress per billed hour of spot there: each window pays a changeover."""
    return max(0.0, 1 - d / z.mean_up_h)


def fluid_cost(z: ZoneStats, work_h: float, time_h: float, d: float, k: float) -> float:
    """Expected cost (spot-hours) of ``work_h`` at zone ``z``'s long-run availability with ``time_h``
    to the deadline (module docstring, rule 2); inf when on-demand could not finish in time."""
    if work_h <= 0:
        return 0.0
    if math.isfinite(time_h) and time_h < work_h + d - SLACK_EPS_H:
        return math.inf
    eff = efficiency(z, d)
    if eff <= 0 or 1 / eff >= k:
        return (work_h + d) * k
    room = max(0.0, time_h - d)  # (an on-demand launch at the end)
    on_spot = min(work_h, z.availability * eff * room)
    rest = work_h - on_spot
    return on_spot / eff + (rest + (d if rest > 0 else 0.0)) * k


def zone_cost(z: ZoneStats, common: ZoneStats, work_h: float, time_h: float, move_h: float, horizon_h: float,
              d: float, k: float, on_demand_while_down: bool = False) -> float:
    """Expected cost (spot-hours) of going to ``z`` now (``move_h`` to get there): the next
    ``horizon_h`` there (the move, then spot's outage waited out or, ``on_demand_while_down``, run
    through on on-demand as the job's policy would, then its current window if up, then its own
    availability), the rest at ``common``'s rate, the same for every zone (the job can move again
    later); inf when on-demand could no longer finish in time."""
    if work_h <= 0:
        return 0.0
    if time_h - move_h < work_h + d - SLACK_EPS_H:
        return math.inf
    span_h = min(horizon_h, time_h)
    eff = efficiency(z, d)
    cost = progress = 0.0
    if eff > 0 and 1 / eff < k:
        wait = min(z.delay_h(move_h), max(0.0, span_h - move_h))
        if on_demand_while_down and wait > d:
            progress, cost = wait - d, wait * k
        room = max(0.0, span_h - move_h - wait)
        first = z.residual_up_h() if z.now and wait == 0 else z.mean_up_h
        later = max(0.0, room - first) * z.availability
        up_h = min(room, first) + later
        progress += max(0.0, up_h - d * (1 + later / z.mean_up_h))
        cost += up_h
        if progress >= work_h:  # done within the horizon
            return (work_h / progress) * cost
    return cost + fluid_cost(common, work_h - progress, time_h - span_h, d, k)


def per_hour(z: ZoneStats, d: float, k: float) -> float:
    """Cost per hour of progress there without a deadline: spot's (with its launches) or on-demand's."""
    efficiency = max(0.0, 1 - d / z.mean_up_h)
    return min(1 / efficiency if efficiency > 0 else math.inf, k)


def horizon(move_h: float) -> float:
    """How long a zone chosen now is expected to be the job's (module docstring, rule 2)."""
    return HORIZON_H + HORIZON_MOVES * move_h


def choose_zone(obs: ZoneObservation) -> ZoneDecision:
    """The zone the job should be in now, and why (module docstring)."""
    if not obs.zones:
        raise ValueError("choose_zone: no zones")
    free = obs.first_launch or obs.here is None or (obs.move_h <= 0 and obs.move_price <= 0)
    blocked = {b.split(":", 1)[0] for b in obs.blocked}
    here = obs.here if obs.here in {z.zone for z in obs.zones} else None
    d, k = obs.changeover_h, obs.price_ratio
    seen = [z.now for z in obs.zones if z.now is not None and (here is None or z.zone == here)]
    if seen and not any(seen):
        # Outages are shared across a region's zones: on the development series, us-west-2b's spot is
        # up 72 % of the time but only 31 % while 2a's is down (v100_1; 22 % vs 47 % for v100_8). A
        # zone not seen now is taken to be in the same outage as the job's zone (before the job is
        # placed: as every zone seen now), just begun.
        obs = replace(obs, zones=tuple(replace(z, now=False, age_h=0.0) if z.now is None else z for z in obs.zones))
    byname = {z.zone: z for z in obs.zones}
    common = byname[here] if here is not None else max(obs.zones, key=lambda z: z.availability)
    costs: dict[str, float] = {}
    unreachable: list[str] = []
    for z in obs.zones:
        stay = z.zone == here
        if z.zone in blocked and not stay:
            continue
        move_h = 0.0 if stay or free else obs.move_h
        if not (stay or free or z.now):
            continue  # a paid move goes only where spot is seen up now (outages are shared, see above)
        # A paid move's time is priced at on-demand's premium too (as ``failover.move_saving`` does):
        # the policies' safety nets turn lost slack into on-demand hours, which the expected costs miss.
        price = 0.0 if stay or free else obs.move_price + (k - 1) * move_h
        time_h = obs.time_left_h - move_h
        reserve = d + obs.tick_h + (0.0 if free else RESERVE_FRAC * obs.work_left_h)
        if not stay and math.isfinite(obs.time_left_h) and time_h - obs.work_left_h < reserve + SLACK_EPS_H:
            unreachable.append(z.zone)  # on-demand could no longer finish after the move (rule 4)
            continue
        if math.isfinite(obs.time_left_h) and math.isfinite(obs.work_left_h):
            costs[z.zone] = zone_cost(z, common, obs.work_left_h, obs.time_left_h, obs.time_left_h - time_h,
                                      horizon(obs.move_h), d, k, obs.on_demand_while_down) + price
        else:  # open-ended: per hour of progress; a move's price is paid once over unbounded work
            costs[z.zone] = per_hour(z, d, k)
    if not costs:  # nowhere else can still make the deadline, and the job has no zone yet: the first one
        zone = here or obs.zones[0].zone
        return ZoneDecision(zone, False, f"stays in {zone}: no zone can be reached with time for on-demand to "
                            "finish before the deadline", costs)
    stats = {z.zone: z for z in obs.zones}

    def rank(name: str) -> tuple:
        tie = (round(costs[name], 6),)
        if free:  # rule 5: among equal costs, spot sooner, then more of it, then the job's zone
            tie += (round(stats[name].delay_h(), 6), -round(stats[name].availability, 6))
        return tie + (name != here,)

    best = min(costs, key=rank)
    if here is None:
        return ZoneDecision(best, True, f"first placement in {best}: {_why(stats[best], costs[best])}", costs)
    if best == here:
        return ZoneDecision(here, False, f"stays in {here}: {_stay_why(stats[here], costs, unreachable, obs.blocked)}", costs)
    gain = costs.get(here, math.inf) - costs[best]
    if not (gain > MARGIN or (free and rank(best) < rank(here))):
        return ZoneDecision(here, False, f"stays in {here}: {_stay_why(stats[here], costs, unreachable, obs.blocked)}", costs)
    what = "free (the disk is empty)" if obs.first_launch else (
        "free" if free else f"{obs.move_h:.2f} h{f' and {obs.move_price:.2f} spot-hours' if obs.move_price else ''}")
    return ZoneDecision(best, True, f"moves to {best} (the move: {what}): {_why(stats[best], costs[best])}; "
                        f"staying in {here} is expected to cost {_cost(costs.get(here, math.inf))}", costs)


def _cost(x: float) -> str:
    return "more than on-demand allows in time" if not math.isfinite(x) else f"{x:.2f} spot-hours"


def _seen(z: ZoneStats) -> str:
    now = "unknown now" if z.now is None else (f"up for {z.age_h:.2f} h" if z.now else f"down for {z.age_h:.2f} h")
    return (f"spot {now}, {z.availability:.0%} available over {len(z.up_h) + len(z.open_up_h)} window(s) "
            f"(mean {z.mean_up_h:.1f} h)")


def _why(z: ZoneStats, cost: float) -> str:
    return f"{_seen(z)}; expected {_cost(cost)} for the work left"


def _stay_why(z: ZoneStats, costs: dict[str, float], unreachable: Sequence[str], blocked: Sequence[str]) -> str:
    if unreachable and len(costs) == 1:
        return f"{_seen(z)}; a move would leave on-demand too little time before the deadline"
    if blocked and len(costs) == 1:
        return f"{_seen(z)}; no move now ({'; '.join(blocked)})"
    return f"{_seen(z)}; no other zone is expected to cost less once the move is paid"


# ---- what a stream of availability ticks says: the simulator's (and a replayed history's) ZoneStats ----


class RunTracker:
    """One zone's availability, tick by tick (None: not observed), summarised as ``ZoneStats``.

    A gap in the observations ends nothing and starts nothing: the run before it is not counted
    as complete (we do not know when it ended), the run after it starts unknown-aged at 0.
    """

    def __init__(self, zone: str, tick_h: float):
        self.zone, self.tick_h = zone, tick_h
        self.up: list[float] = []
        self.down: list[float] = []
        self.censored: list[float] = []  # windows whose start or end was not seen: at least this long
        self.state: bool | None = None
        self.ticks = 0  # the current run's length so far
        self.whole = False  # the current run's start was observed

    def add(self, available: bool | None) -> None:
        if available == self.state and available is not None:
            self.ticks += 1
            return
        if self.state is not None:
            if self.whole and available is not None:
                (self.up if self.state else self.down).append(self.ticks * self.tick_h)
            elif self.state:
                self.censored.append(self.ticks * self.tick_h)
        self.whole = self.state is not None and available is not None
        self.state, self.ticks = available, (0 if available is None else 1)

    def stats(self) -> ZoneStats:
        open_up = tuple(self.censored) + ((self.ticks * self.tick_h,) if self.state is True else ())
        return ZoneStats(self.zone, tuple(self.up), tuple(self.down), open_up, self.state,
                         self.ticks * self.tick_h if self.state is not None else 0.0)
