"""Spot vs on-demand policies: after every observation, run on spot, on on-demand, or wait.

Every policy is one registered class, named as users write it in stack config (``policy:``), and
returns a decision; it never acts and never sees the future. ``make_policy(name)`` builds a fresh one
per job run (policies may keep state: the availability history they have observed).

The model is the one of "Can't Be Late" (NSDI'24): a job needs ``job_h`` hours of compute before
``deadline_h``; spot costs 1/h, on-demand ``price_ratio``/h; every launch costs ``changeover_h``
hours, billed, without progress; spot may vanish (a preemption), on-demand never does.

``default`` — ours. Three ideas on top of Uniform Progress (UP):

1. Slack is the budget, not progress. What can be spent on waiting for spot is the slack
   ``(deadline - now) - work left``. A safety net keeps enough of it to finish on on-demand,
   including one more changeover, so no feasible deadline is missed.
2. Spend slack where it buys spot, at a rate the trace has earned. UP spends slack uniformly over
   time (it goes on-demand as soon as progress falls behind the straight line). We instead wait
   for spot while the slack left exceeds a reserve that shrinks with the time left, scaled by how
   often spot has been unavailable so far (the empirical availability) and by how long outages
   have lasted (the empirical wait distribution): a trace whose outages are short lets us wait
   more; one whose outages are long makes waiting pointless, so we go on-demand early and keep
   the slack for the next spot window.
3. Leave on-demand only when it pays. A switch back to spot costs a changeover now and probably
   another one at the next preemption; we switch when the empirical spot lifetime seen so far
   makes the expected saving exceed that cost and the slack can absorb the changeovers (the
   preemption-loop guard the INCL seed asks for: repeated short spot lifetimes stop the switching).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from cli.planning import IDLE_M, OD_M, SPOT_M, Regime, Units, bucket_of, plan_for, shipped_regimes

Decision = Literal["spot", "on-demand", "idle"]
SPOT: Decision = "spot"
ON_DEMAND: Decision = "on-demand"
IDLE: Decision = "idle"


@dataclass(frozen=True)
class Observation:
    """What a policy may know at one decision point (hours throughout)."""

    elapsed_h: float
    progress_h: float
    job_h: float
    deadline_h: float
    changeover_h: float
    price_ratio: float
    current: Decision
    spot_available: bool
    preemptions: int
    tick_h: float = 0.0  # how long until the next decision (0 = unknown)

    @property
    def work_left_h(self) -> float:
        return max(0.0, self.job_h - self.progress_h)

    @property
    def time_left_h(self) -> float:
        return self.deadline_h - self.elapsed_h

    @property
    def slack_h(self) -> float:
        return self.time_left_h - self.work_left_h


class Policy:
    """Base class: subclasses set ``name`` and implement ``decide``."""

    name: ClassVar[str]
    registry: ClassVar[dict[str, type[Policy]]] = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if getattr(cls, "name", None):
            Policy.registry[cls.name] = cls

    def decide(self, obs: Observation) -> Decision:
        raise NotImplementedError


def must_go_on_demand(obs: Observation, margin_h: float = 0.0) -> bool:
    """The safety net: finishing on on-demand from now needs all the slack that is left.

    Leaving on-demand, or waiting one more tick, could then make the deadline unreachable.
    """
    launch = 0.0 if obs.current == ON_DEMAND else obs.changeover_h
    return obs.slack_h - launch <= obs.tick_h + margin_h


class OnDemand(Policy):
    """Always on-demand: the cost every saving is measured against."""

    name = "on-demand"

    def decide(self, obs: Observation) -> Decision:
        return ON_DEMAND


class Greedy(Policy):
    """Spot whenever available, wait otherwise; on-demand only when the deadline forces it, then for good."""

    name = "greedy"

    def __init__(self) -> None:
        self.committed = False

    def decide(self, obs: Observation) -> Decision:
        if self.committed or must_go_on_demand(obs):
            self.committed = True
            return ON_DEMAND
        return SPOT if obs.spot_available else IDLE


class NPreemptions(Policy):
    """The industry baseline: retry spot until ``n`` preemptions, then on-demand for good (with a safety net)."""

    name = "n-preemptions"

    def __init__(self, n: int = 3) -> None:
        self.n = n
        self.committed = False

    def decide(self, obs: Observation) -> Decision:
        if self.committed or obs.preemptions >= self.n or must_go_on_demand(obs):
            self.committed = True
            return ON_DEMAND
        return SPOT if obs.spot_available else IDLE


class UniformProgress(Policy):
    """Uniform Progress with hysteresis, the paper's four rules.

    Expected progress ep(t) = job_h * t / deadline_h. (1) Idle and behind ep(t): on-demand.
    (2) Spot whenever available, even when behind; stay until preempted. (3) On on-demand, stay
    until progress >= ep(t + 2d). (4) Safety net: remaining time < remaining work + 2d: on-demand
    until the end. ``hysteresis=False`` drops rule 3 (leave on-demand as soon as spot is back).

    Decisions are made once per tick, so rule 4 is checked one tick ahead (remaining time minus a
    tick); taken literally it fires too late whenever 2d is shorter than a tick, and misses deadlines.
    """

    name = "uniform-progress"

    def __init__(self, hysteresis: bool = True) -> None:
        self.hysteresis = hysteresis
        self.committed = False

    def decide(self, obs: Observation) -> Decision:
        d = obs.changeover_h
        if self.committed or obs.time_left_h - obs.tick_h < obs.work_left_h + 2 * d:
            self.committed = True
            return ON_DEMAND
        ep = obs.job_h * obs.elapsed_h / obs.deadline_h
        if obs.current == ON_DEMAND:
            ahead = obs.progress_h >= obs.job_h * (obs.elapsed_h + 2 * d) / obs.deadline_h
            if self.hysteresis and not ahead:
                return ON_DEMAND
            if obs.spot_available:
                return SPOT
            return ON_DEMAND if obs.progress_h < ep else IDLE
        if obs.spot_available:
            return SPOT
        return ON_DEMAND if obs.progress_h < ep else IDLE


class UniformProgressNoHysteresis(UniformProgress):
    """UP without rule 3: often cheaper than with it when changeovers are short."""

    name = "uniform-progress-nh"

    def __init__(self) -> None:
        super().__init__(hysteresis=False)


class Default(Policy):
    """spotctl's policy: expected-cost planning under a mixture of availability regimes (module docstring)."""

    name = "default"

    def __init__(self, regimes: Sequence[Regime] | None = None, temperature: float = 1.0):
        self.regimes = tuple(regimes) if regimes is not None else shipped_regimes()
        if not self.regimes:
            raise ValueError("default policy: no availability regimes")
        self.temperature = temperature
        self.loglik = np.zeros(len(self.regimes))
        self.previous: bool | None = None
        self.age_ticks = 0

    def _observe(self, available: bool, tick_h: float) -> None:
        """Bayes' rule over the regimes, one tick of availability at a time; track the current run's age."""
        if self.previous is None:
            self.age_ticks = 1
        else:
            bucket = bucket_of(self.age_ticks * tick_h)
            flipped = available != self.previous
            for j, regime in enumerate(self.regimes):
                p = regime.flip_prob(self.previous, bucket, tick_h)
                self.loglik[j] += math.log(p if flipped else 1 - p)
            self.age_ticks = 1 if flipped else self.age_ticks + 1
        self.previous = available

    def posterior(self) -> np.ndarray:
        w = np.exp((self.loglik - self.loglik.max()) * self.temperature)
        return w / w.sum()

    def decide(self, obs: Observation) -> Decision:
        tick_h = obs.tick_h or DEFAULT_TICK_H
        self._observe(obs.spot_available, tick_h)
        if must_go_on_demand(obs):
            return ON_DEMAND
        units, plan_tick_h = Units.fit(tick_h, obs.changeover_h, obs.job_h, obs.deadline_h)
        step = int(obs.elapsed_h * 3600 + 1e-6) // (units.tick * units.u_s)
        work_left = -(-round(obs.work_left_h * 3600) // units.u_s)
        bucket = bucket_of(self.age_ticks * tick_h)
        mode = _MODE[obs.current]
        post = self.posterior()
        q: dict[int, float] = {}
        for j in np.flatnonzero(post > 1e-4):
            plan = plan_for(self.regimes[j], units, obs.price_ratio, plan_tick_h)
            for action, value in plan.q_values(step, mode, obs.spot_available, bucket, work_left).items():
                q[action] = q.get(action, 0.0) + float(post[j]) * value
        best = min(q, key=q.__getitem__)
        if mode in q and q[mode] <= q[best] + 1e-6:
            best = mode  # ties keep the current mode: no changeover for nothing
        return _DECISION[best]


_MODE = {IDLE: IDLE_M, SPOT: SPOT_M, ON_DEMAND: OD_M}
_DECISION = {v: k for k, v in _MODE.items()}
DEFAULT_TICK_H = 1 / 6


def policy_names() -> list[str]:
    return sorted(Policy.registry)


def make_policy(name: str, **params) -> Policy:
    """A fresh policy object for one job run.

    Raises:
        KeyError: unknown name (the message lists the valid ones).
    """
    try:
        cls = Policy.registry[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; valid: {', '.join(policy_names())}") from None
    return cls(**params)
