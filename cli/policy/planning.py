"""Expected-cost planning for the ``default`` policy: a semi-Markov model of spot availability and
a backward dynamic program over it.

Spot availability is not memoryless: on the development traces a spot window or an outage that
has lasted an hour is much more likely to go on than one that began ten minutes ago. The model
therefore keeps, for up runs and for down runs, a hazard rate (ends per hour) for each *age
bucket* of the current run (``AGE_EDGES_H``). A :class:`Regime` is one such pair of hazard curves;
regimes are fitted from run lengths (:func:`fit_regime`) and the shipped ones come from the
development traces (``cli/policy/regimes.json``, written by ``bench/fit_regimes.py``).

:class:`Plan` solves, for one job (deadline, work, changeover, price ratio, tick) and one regime,
the expected minimum cost from every state (tick, work left, mode, availability, age bucket),
exactly in the simulator's integer units (``gcd(tick, changeover)``): launching costs the
changeover at the launched price without progress, a spot run ends (a preemption) when the
availability flips, an unfinished job at the deadline is infeasible. Infeasibility is the same
in every regime (on-demand is deterministic and every regime gives a preemption a positive
probability), so a plan never chooses a step that could make the deadline unreachable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

AGE_EDGES_H = (0.0, 1 / 6, 1 / 3, 2 / 3, 4 / 3, 8 / 3, 16 / 3)  # bucket b: (edge[b], edge[b+1]]; the last is open
B = len(AGE_EDGES_H)
INF = np.float32(1e12)
IDLE_M, SPOT_M, OD_M = 0, 1, 2
MAX_STATES = 1_500_000  # (steps + 1) * (work + 1) per plan: ~200 MB of float32 values
REGIMES_FILE = Path(__file__).with_name("regimes.json")


def bucket_of(age_h: float) -> int:
    """Age bucket of a run that has lasted ``age_h`` hours (counting the current tick)."""
    for b in range(B - 1, -1, -1):
        if age_h > AGE_EDGES_H[b] + 1e-9:
            return b
    return 0


@dataclass(frozen=True)
class Regime:
    """Hazard rates (run ends per hour) by age bucket, for spot windows (up) and outages (down)."""

    name: str
    up_rate: tuple[float, ...]
    down_rate: tuple[float, ...]

    def flip_prob(self, available: bool, bucket: int, tick_h: float) -> float:
        rate = (self.up_rate if available else self.down_rate)[bucket]
        return float(min(max(1 - math.exp(-rate * tick_h), 1e-4), 1 - 1e-4))


def runs(available: Sequence[bool]) -> tuple[list[int], list[int], tuple[bool, int] | None]:
    """Complete up and down run lengths (ticks) and the last, censored, run."""
    ups: list[int] = []
    downs: list[int] = []
    if not available:
        return ups, downs, None
    length = 1
    for prev, cur in zip(available, available[1:], strict=False):
        if cur == prev:
            length += 1
        else:
            (ups if prev else downs).append(length)
            length = 1
    return ups, downs, (bool(available[-1]), length)


def _rates(lengths: Sequence[int], censored: Sequence[int], tick_h: float, prior: Sequence[float] | None,
           prior_h: float) -> tuple[float, ...]:
    ends = np.zeros(B)
    exposure = np.zeros(B)
    for length, ended in [(n, True) for n in lengths] + [(n, False) for n in censored]:
        for g in range(1, length + 1):
            exposure[bucket_of(g * tick_h)] += tick_h
        if ended:
            ends[bucket_of(length * tick_h)] += 1
    if prior is None:
        return tuple(float(e / x) if x else 1.0 for e, x in zip(ends, exposure, strict=True))
    return tuple(float((e + p * prior_h) / (x + prior_h)) for e, x, p in zip(ends, exposure, prior, strict=True))


def fit_regime(name: str, available: Sequence[bool], tick_h: float, prior: Regime | None = None,
               prior_h: float = 1.0) -> Regime:
    """Hazard curves from one availability series; ``prior`` adds ``prior_h`` hours of its rates to each bucket."""
    ups, downs, last = runs(available)
    cu = [last[1]] if last and last[0] else []
    cd = [last[1]] if last and not last[0] else []
    return Regime(
        name,
        _rates(ups, cu, tick_h, prior.up_rate if prior else None, prior_h),
        _rates(downs, cd, tick_h, prior.down_rate if prior else None, prior_h),
    )


@cache
def shipped_regimes() -> tuple[Regime, ...]:
    """The regimes fitted on the development traces (cli/policy/regimes.json)."""
    doc = json.loads(REGIMES_FILE.read_text())
    return tuple(Regime(r["name"], tuple(r["up_rate"]), tuple(r["down_rate"])) for r in doc["regimes"])


@dataclass(frozen=True)
class Units:
    """A job on the integer timeline of the simulator: units of ``gcd(tick, changeover)`` seconds."""

    u_s: int
    tick: int
    change: int
    work: int
    deadline: int

    @classmethod
    def of(cls, tick_h: float, changeover_h: float, job_h: float, deadline_h: float) -> Units:
        tick_s = max(1, round(tick_h * 3600))
        d_s = round(changeover_h * 3600)
        u = math.gcd(tick_s, d_s) if d_s else tick_s
        return cls(u, tick_s // u, d_s // u, -(-round(job_h * 3600) // u), round(deadline_h * 3600) // u)

    @classmethod
    def fit(cls, tick_h: float, changeover_h: float, job_h: float, deadline_h: float,
            budget: int = MAX_STATES) -> tuple[Units, float]:
        """Units and planning tick for a job, coarsened until ``steps * work`` fits ``budget``.

        The exact units come first; then coarser units that divide the tick (the changeover rounded
        up: a cautious plan); then planning ticks that are whole multiples of the decision tick.
        """
        tick_s = max(1, round(tick_h * 3600))
        d_s = round(changeover_h * 3600)
        exact = cls.of(tick_h, changeover_h, job_h, deadline_h)
        if exact.size <= budget:
            return exact, tick_h
        fallback = None
        for m in range(1, 1000):
            plan_s = tick_s * m
            for u in _divisors(plan_s, at_least=exact.u_s):
                units = cls(u, plan_s // u, -(-d_s // u), -(-round(job_h * 3600) // u), round(deadline_h * 3600) // u)
                if units.size <= budget:
                    if units.change * u <= 1.5 * d_s or not d_s:
                        return units, plan_s / 3600
                    fallback = fallback or (units, plan_s / 3600)
                    break
        if fallback is None:
            raise ValueError(f"a {deadline_h} h deadline is too long to plan")
        return fallback

    @property
    def size(self) -> int:
        return (self.steps + 1) * (self.max_work + 1)

    @property
    def steps(self) -> int:
        return -(-self.deadline // self.tick)

    @property
    def max_work(self) -> int:
        return self.work + 2 * self.change


class Plan:
    """Expected cost-to-go for one job under one regime: ``V[i, mode, available, bucket, work left]``."""

    def __init__(self, regime: Regime, units: Units, price_ratio: float, tick_h: float):
        self.regime, self.units, self.k, self.tick_h = regime, units, price_ratio, tick_h
        self.flip = np.array([[regime.flip_prob(bool(a), b, tick_h) for b in range(B)] for a in (0, 1)], np.float32)
        widths = np.diff(AGE_EDGES_H)
        self.advance = np.append(np.minimum(1.0, tick_h / widths), 0.0).astype(np.float32)
        self.V = self._solve()

    def _next_expectations(self, Vn: np.ndarray, a: int) -> dict[tuple[int, int], np.ndarray]:
        """E[V(next) | availability a, each bucket], for (mode if spot stays, mode if it flips)."""
        flip = self.flip[a][:, None]
        adv = self.advance[:, None]
        out = {}
        for stay, flipped in ((IDLE_M, IDLE_M), (OD_M, OD_M), (SPOT_M, IDLE_M)):
            if stay == SPOT_M and a == 0:
                continue
            same = Vn[stay, a]
            aged = np.concatenate([same[1:], same[-1:]], axis=0)
            out[stay, flipped] = (1 - flip) * ((1 - adv) * same + adv * aged) + flip * Vn[flipped, 1 - a, 0][None, :]
        return out

    def _run(self, E: np.ndarray, price: float, launch: bool, remaining: int) -> np.ndarray:
        """Cost of running one tick (or finishing within it) from every work-left value."""
        u = self.units
        W = u.max_work
        e = np.arange(W + 1) + (u.change if launch else 0)
        q = np.full(E.shape, INF, np.float32)
        finish = e <= min(u.tick, remaining)
        q[:, finish] = price * e[finish]
        cont = ~finish & (e > u.tick) & (e - u.tick <= W)
        q[:, cont] = price * u.tick + E[:, e[cont] - u.tick]
        return q

    def _solve(self) -> np.ndarray:
        u = self.units
        W = u.max_work
        V = np.full((u.steps + 1, 3, 2, B, W + 1), INF, np.float32)
        V[..., 0] = 0.0
        for i in range(u.steps - 1, -1, -1):
            remaining = u.deadline - i * u.tick
            for a in (0, 1):
                E = self._next_expectations(V[i + 1], a)
                idle = E[IDLE_M, IDLE_M]
                od = {launch: self._run(E[OD_M, OD_M], self.k, launch, remaining) for launch in (False, True)}
                spot = ({launch: self._run(E[SPOT_M, IDLE_M], 1.0, launch, remaining) for launch in (False, True)}
                        if a else None)
                for m in (IDLE_M, SPOT_M, OD_M):
                    if m == SPOT_M and not a:
                        continue
                    best = np.minimum(idle, od[m != OD_M])
                    if spot is not None:
                        best = np.minimum(best, spot[m != SPOT_M])
                    V[i, m, a] = best
            V[i, ..., 0] = 0.0
        return V

    def q_values(self, step: int, mode: int, available: bool, bucket: int, work_left: int) -> dict[int, float]:
        """Expected cost of each allowed action now (mode indices) from one state."""
        u = self.units
        if step + 1 > u.steps:
            return {OD_M: 0.0}
        a = int(available)
        w = min(work_left, u.max_work)
        Vn = self.V[step + 1]
        flip = float(self.flip[a][bucket])
        adv = float(self.advance[bucket])
        nb = min(bucket + 1, B - 1)
        remaining = u.deadline - step * u.tick

        def expect(stay: int, flipped: int, x: int) -> float:
            same = (1 - adv) * Vn[stay, a, bucket, x] + adv * Vn[stay, a, nb, x]
            return float((1 - flip) * same + flip * Vn[flipped, 1 - a, 0, x])

        def run(price: float, launch: bool, stay: int, flipped: int) -> float:
            e = w + (u.change if launch else 0)
            if e <= min(u.tick, remaining):
                return price * e
            if e <= u.tick or e - u.tick > u.max_work:
                return float(INF)
            return price * u.tick + expect(stay, flipped, e - u.tick)

        out = {IDLE_M: expect(IDLE_M, IDLE_M, w), OD_M: run(self.k, mode != OD_M, OD_M, OD_M)}
        if available:
            out[SPOT_M] = run(1.0, mode != SPOT_M, SPOT_M, IDLE_M)
        return out


def _divisors(n: int, at_least: int) -> list[int]:
    small = [x for x in range(1, math.isqrt(n) + 1) if n % x == 0]
    return sorted(x for x in {*small, *(n // x for x in small)} if x >= at_least)


_PLANS: dict[tuple, Plan] = {}


def plan_for(regime: Regime, units: Units, price_ratio: float, tick_h: float) -> Plan:
    """Plans are pure functions of their inputs: solved once per process (the last few kept)."""
    key = (regime, units, round(price_ratio, 9), round(tick_h, 9))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 12:
            _PLANS.pop(next(iter(_PLANS)))
        plan = _PLANS[key] = Plan(regime, units, price_ratio, tick_h)
    return plan
