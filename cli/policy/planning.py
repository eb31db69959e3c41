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
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from cli.policy.grid import Units

AGE_EDGES_H = (0.0, 1 / 6, 1 / 3, 2 / 3, 4 / 3, 8 / 3, 16 / 3)  # bucket b: (edge[b], edge[b+1]]; the last is open
B = len(AGE_EDGES_H)
INF = np.float32(1e12)
IDLE_M, SPOT_M, OD_M = 0, 1, 2
MAX_PLANS_CACHED = int(os.environ.get("SPOTCTL_PLAN_CACHE", "12"))  # each plan up to ~67 MB
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


def fit_windows(name: str, windows_h: Sequence[float], censored_h: Sequence[float], prior: Regime,
                prior_h: float = 1.0) -> Regime:
    """A regime whose spot-window hazards come from observed window lengths (hours; ``censored_h`` are
    windows still open or ended by us), shrunk towards ``prior`` by ``prior_h`` hours per bucket;
    outages keep the prior's rates (a job's events do not show how long the zone was out)."""
    ends = np.zeros(B)
    exposure = np.zeros(B)
    edges = np.array(AGE_EDGES_H[1:] + (math.inf,))
    lows = np.array(AGE_EDGES_H)
    for length, ended in [(w, True) for w in windows_h] + [(w, False) for w in censored_h]:
        exposure += np.clip(np.minimum(edges, length) - lows, 0.0, None)
        if ended:
            ends[bucket_of(length)] += 1
    up = tuple(float((e + p * prior_h) / (x + prior_h)) for e, x, p in zip(ends, exposure, prior.up_rate, strict=True))
    return Regime(name, up, prior.down_rate)


def quantized(regime: Regime, name: str | None = None, step: float = 0.25) -> Regime:
    """Rates rounded on a log2 grid (``step`` = 19 % apart): nearby estimates share one cached plan."""
    q = lambda r: float(2 ** (round(math.log2(max(r, 1e-4)) / step) * step))  # noqa: E731
    return Regime(name or regime.name, tuple(map(q, regime.up_rate)), tuple(map(q, regime.down_rate)))


def mixed(regimes: Sequence[Regime], weights: Sequence[float], name: str = "mixed") -> Regime:
    """Hazards averaged with ``weights`` (geometric: rates span orders of magnitude), quantized coarsely
    (41 % apart) so a drifting posterior re-solves its plan rarely."""
    w = np.asarray(weights, float) / float(np.sum(weights))
    up = np.exp(sum(wi * np.log(np.maximum(r.up_rate, 1e-4)) for wi, r in zip(w, regimes, strict=True)))
    down = np.exp(sum(wi * np.log(np.maximum(r.down_rate, 1e-4)) for wi, r in zip(w, regimes, strict=True)))
    return quantized(Regime(name, tuple(map(float, up)), tuple(map(float, down))), step=0.5)


@cache
def pooled_regime() -> Regime:
    """The shipped regimes averaged: the prior of a zone nothing is known about yet."""
    regimes = shipped_regimes()
    return mixed(regimes, [1.0] * len(regimes), "pooled")


class OnlineRegime:
    """Hazards learned from the availability one job observes, tick by tick, starting from a prior.

    ``prob`` is the prediction before a tick is seen and ``update`` learns from it afterwards, so the
    log-likelihood a policy accumulates with it is prequential (each tick scored by a model that had
    not seen it), comparable with the fixed regimes'.
    """

    def __init__(self, prior: Regime, prior_h: float = 1.0, name: str = "online"):
        self.prior, self.prior_h, self.name = prior, prior_h, name
        self.ends = np.zeros((2, B))
        self.exposure = np.zeros((2, B))
        self._snapshot: Regime | None = None
        self._snapshot_h = 0.0

    def rate(self, available: bool, bucket: int) -> float:
        p = (self.prior.up_rate if available else self.prior.down_rate)[bucket]
        a = int(available)
        return float((self.ends[a, bucket] + p * self.prior_h) / (self.exposure[a, bucket] + self.prior_h))

    def prob(self, available: bool, bucket: int, tick_h: float) -> float:
        return float(min(max(1 - math.exp(-self.rate(available, bucket) * tick_h), 1e-4), 1 - 1e-4))

    def update(self, available: bool, bucket: int, flipped: bool, tick_h: float) -> None:
        self.exposure[int(available), bucket] += tick_h
        self.ends[int(available), bucket] += flipped

    @property
    def seen_h(self) -> float:
        return float(self.exposure.sum())

    def regime(self) -> Regime:
        """The estimate, refreshed each time the hours seen double and quantized: a plan is re-solved
        a handful of times per job, not every tick."""
        if self._snapshot is None or self.seen_h >= 2 * max(self._snapshot_h, 1.0):
            self._snapshot_h = self.seen_h
            self._snapshot = quantized(Regime(self.name, tuple(self.rate(True, b) for b in range(B)),
                                              tuple(self.rate(False, b) for b in range(B))))
        return self._snapshot


def launch_economics(regime: Regime, changeover_h: float, age_h: float = 0.0, work_h: float = math.inf,
                     dt_h: float = 1 / 60) -> tuple[float, float]:
    """Expected (hours billed, hours of progress) of one spot launch into a window that has already
    lasted ``age_h``: billed until the window ends (or the work is done), and at least through the
    changeover (see ``spot_cost_per_progress``), progress after the changeover."""
    horizon = min(work_h + changeover_h, 24 * 14)
    n = max(1, int(math.ceil(horizon / dt_h)))
    t = (np.arange(n) + 0.5) * dt_h
    rates = _rates_at(regime, age_h + t)
    alive = np.exp(-np.concatenate([[0.0], np.cumsum(rates * dt_h)]))[:-1]  # P(window still open at t)
    billed = float(np.sum(np.where(t <= changeover_h, 1.0, alive)) * dt_h)
    progress = float(np.sum(alive[t > changeover_h]) * dt_h)
    if math.isinf(work_h):  # beyond the horizon the last bucket's rate holds: an exponential tail
        tail = alive[-1] * math.exp(-rates[-1] * dt_h) / max(rates[-1], 1e-6)
        billed += tail
        progress += tail
    return billed, progress


def spot_cost_per_progress(windows_h: Sequence[float], censored_h: Sequence[float], changeover_h: float,
                           prior: Regime, prior_windows: float = 0.1, work_h: float = math.inf) -> float:
    """Spot's cost per hour of progress, renewal-reward style: hours billed over hours of progress per
    launch, from observed spot windows (each launch pays the changeover again), plus ``prior_windows``
    pseudo-windows of ``prior`` so a handful of observations override it. A censored window (still
    open, or ended by us) counts with the prior's expected remainder. ``inf`` when nothing progresses.

    A launch costs at least its changeover, whether or not its window outlived it: a window shorter
    than the changeover makes no progress and is billed as the changeover, not as the window. Why
    not the window: a window runs from ``started``, but the cloud bills from launch (the boot before
    ``started`` is not recorded, so not measured), at least a minute a launch ("Every time you start
    your instance, Amazon EC2 charges a one-minute minimum for instance usage, and thereafter charges
    per second", docs.aws.amazon.com/cli/v1/reference/ec2/start-instances.html), and a relaunch also
    spends the job's time with no progress. Billing the window alone made a zone that preempts every
    VM at once look free (a 0-minute window cost nothing: such a job stayed on spot forever); with
    the floor the cost per hour of progress never falls as windows get shorter (a shorter window
    never bills less past the changeover nor progresses more). It overstates a failed launch's bill
    by at most the changeover minus the window, only where spot made no progress at all.
    """
    cap = work_h + changeover_h
    billed = progress = 0.0
    for w in windows_h:
        billed += max(min(w, cap), changeover_h)
        progress += max(0.0, min(w, cap) - changeover_h)
    for w in censored_h:
        b, p = launch_economics(prior, max(0.0, changeover_h - w), age_h=w, work_h=max(0.0, work_h - w))
        billed += min(w, cap) + b
        progress += max(0.0, min(w, cap) - changeover_h) + p
    b, p = launch_economics(prior, changeover_h, work_h=work_h)
    billed += prior_windows * b
    progress += prior_windows * p
    return billed / progress if progress > 1e-9 else math.inf


def _rates_at(regime: Regime, ages: np.ndarray) -> np.ndarray:
    """Spot-window hazard at each age (vectorized ``bucket_of``)."""
    idx = np.searchsorted(np.array(AGE_EDGES_H) + 1e-9, ages, side="left") - 1
    return np.array(regime.up_rate)[np.clip(idx, 0, B - 1)]


class Plan:
    """Expected cost-to-go for one job under one regime: ``V[i, mode, available, bucket, work left]``.

    ``keep_from`` keeps only the steps from there on (a decision at step i needs steps i + 1 onwards);
    ``one_layer`` keeps step ``keep_from`` alone (a one-off decision: a few MB instead of the plan).
    """

    def __init__(self, regime: Regime, units: Units, price_ratio: float, tick_h: float, keep_from: int = 0,
                 one_layer: bool = False):
        self.regime, self.units, self.k, self.tick_h = regime, units, price_ratio, tick_h
        self.keep_from = max(0, min(keep_from, units.steps))
        self.one_layer = one_layer
        self.flip = np.array([[regime.flip_prob(bool(a), b, tick_h) for b in range(B)] for a in (0, 1)], np.float32)
        widths = np.diff(AGE_EDGES_H)
        self.advance = np.append(np.minimum(1.0, tick_h / widths), 0.0).astype(np.float32)
        self.V = self._solve()

    def _next_expectations(self, Vn: np.ndarray, a: int) -> dict[tuple[int, int], np.ndarray]:
        """E[V(next) | availability a, each bucket], for (mode if spot stays, mode if it flips)."""
        flip = self.flip[a][:, None]
        adv = self.advance[:, None]
        keep, stay_ = 1 - flip, 1 - adv
        out = {}
        for stay, flipped in ((IDLE_M, IDLE_M), (OD_M, OD_M), (SPOT_M, IDLE_M)):
            if stay == SPOT_M and a == 0:
                continue
            same = Vn[stay, a]
            # (1 - flip) * ((1 - adv) * same + adv * <each bucket's next, the last its own>) + flip * V[flipped,
            # not a, bucket 0], in place: the same values with fewer copies.
            e = stay_ * same
            e[:-1] += adv[:-1] * same[1:]
            e[-1:] += adv[-1:] * same[-1:]
            e *= keep
            e += flip * Vn[flipped, 1 - a, 0][None, :]
            out[stay, flipped] = e
        return out

    def _run(self, E: np.ndarray, price: float, launch: bool, remaining: int) -> np.ndarray:
        """Cost of running one tick (or finishing within it) from every work-left value x: with e = x
        plus the changeover on a launch, e <= min(tick, remaining) finishes (cost e), e > tick runs a
        tick, then E at e - tick; both are ranges of x, hence slices (the hot loop: masks were 3x slower)."""
        u, c = self.units, (self.units.change if launch else 0)
        q = np.empty(E.shape, np.float32)
        n = max(0, min(min(u.tick, remaining) - c, u.max_work) + 1)
        q[:, :n] = price * np.arange(c, n + c)
        lo, hi = max(n, u.tick - c + 1), min(u.max_work, u.max_work + u.tick - c)
        q[:, n:lo] = INF  # the deadline comes within the tick before the work is done
        q[:, max(lo, hi + 1):] = INF  # more work than a plan holds
        if lo <= hi:
            q[:, lo:hi + 1] = price * u.tick + E[:, lo + c - u.tick:hi + c - u.tick + 1]
        return q

    def _solve(self) -> np.ndarray:
        u = self.units
        W = u.max_work
        k0 = self.keep_from
        # Not np.full (tens of MB, a sixth of the solve): the loop writes each layer's allowed rows; the
        # last layer (nothing left to decide) and spot while unavailable stay INF.
        V = np.empty((2 if self.one_layer else u.steps + 1 - k0, 3, 2, B, W + 1), np.float32)
        V[-1] = V[0] = INF  # (one layer: the two rolling layers)
        V[:, SPOT_M, 0] = INF
        V[..., 0] = 0.0
        for i in range(u.steps - 1, k0 - 1, -1):
            remaining = u.deadline - i * u.tick
            if self.one_layer:  # two rolling layers; the one at k0 ends up in V[0]
                after, now = V[(i + 1 - k0) % 2], V[(i - k0) % 2]
            else:
                after, now = V[i + 1 - k0], V[i - k0]
            for a in (0, 1):
                E = self._next_expectations(after, a)
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
                    now[m, a] = best
            now[..., 0] = 0.0
        return V[:1] if self.one_layer else V

    def q_values(self, step: int, mode: int, available: bool, bucket: int, work_left: int) -> dict[int, float]:
        """Expected cost of each allowed action now (mode indices) from one state."""
        u = self.units
        if step + 1 > u.steps:
            return {OD_M: 0.0}
        if step + 1 < self.keep_from or (self.one_layer and step + 1 != self.keep_from):
            raise ValueError(f"plan kept from step {self.keep_from}, asked about step {step}")
        a = int(available)
        w = min(work_left, u.max_work)
        Vn = self.V[step + 1 - self.keep_from]
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


_PLANS: dict[tuple, Plan] = {}


def plan_for(regime: Regime, units: Units, price_ratio: float, tick_h: float, keep_from: int = 0) -> Plan:
    """Plans are pure functions of their inputs: solved once per process (the last few kept).

    ``keep_from`` > 0 asks for a one-off decision at step ``keep_from - 1``: one layer, not cached.
    """
    if keep_from:
        return Plan(regime, units, price_ratio, tick_h, keep_from=keep_from, one_layer=True)
    key = (regime, units, round(price_ratio, 9), round(tick_h, 9))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= MAX_PLANS_CACHED:
            _PLANS.pop(next(iter(_PLANS)))
        plan = _PLANS[key] = Plan(regime, units, price_ratio, tick_h)
    return plan
