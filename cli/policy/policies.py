"""Spot vs on-demand policies: after every observation, run on spot, on on-demand, or wait.

Every policy is one registered class, named as users write it in stack config (``policy:``), and
returns a decision; it never acts and never sees the future. ``make_policy(name)`` builds a fresh one
per job run (policies may keep state: the availability history they have observed).

The model is the one of "Can't Be Late" (NSDI'24): a job needs ``job_h`` hours of compute before
``deadline_h``; spot costs 1/h, on-demand ``price_ratio``/h; every launch costs ``changeover_h``
hours, billed, without progress; spot may vanish (a preemption), on-demand never does.

``default`` — ours: a few rules first (cli/policy/reserve.py: a slack reserve never spent waiting, spot
at every return from idle while a launch leaves the way back, from on-demand only above a slack pace and
past flickering windows, then as the plan weighs it, on-demand kept while spot is down, off spot within
three preemptions of short windows), then, above the reserve with spot down, plan, don't follow a rule. UP keeps progress on a straight line whatever the
trace does; the omniscient optimum waits through short outages, covers long ones with on-demand
and keeps just enough slack to use spot to the end. ``default`` approximates that online:

1. Spot availability has memory. On the development traces a spot window or an outage that has
   lasted an hour is far more likely to continue than one that began ten minutes ago (the heavy
   tails INCL and the GCP lifetime data show too). We model it as semi-Markov: hazard rates (run
   ends per hour) by the age of the current run, for up runs and for down runs (cli/policy/planning.py).
2. Traces differ by an order of magnitude (12 % to 89 % availability), so instead of one model we
   keep a small set of *regimes* fitted on the development traces (cli/policy/regimes.json) and, every
   tick, update a posterior over them from what this job has observed (Bayes' rule on the
   availability flips: INCL's "empirical data", as likelihoods).
3. For each regime a backward dynamic program gives the expected cost-to-go of every state (time,
   work left, mode, availability, age of the current run) under the simulator's exact rules:
   changeovers billed without progress, preemption when spot flips, the deadline as a hard wall.
   The decision is the action with the least posterior-weighted expected cost (QMDP); near-ties
   keep the current run, else take spot. Waiting, failing over and coming back from on-demand
   are weighed by what they are expected to cost, the preemption loop included: in a regime of
   short spot windows another launch looks as expensive as it is.
4. Deadlines are never at risk: on-demand is deterministic and every regime gives a preemption a
   positive probability, so a plan never takes a step from which on-demand could no longer
   finish; the same safety net as the other policies sits in front of it anyway, and every move
   is checked on the decision tick (``unsafe_moves``): a plan on a coarser grid cannot see it.

5. It learns: a regime fitted online from this job's own ticks joins the mixture, scored
   prequentially (each tick predicted before it is learned from), so when the zone fits none of the
   shipped regimes the learned one takes the posterior; the stack's history (``spotctl policy fit``)
   adds a learned regime and is the online one's prior.
6. When the zone fits none of the regimes, it does not trust a plan: each fixed regime's
   log-likelihood of the observed ticks is compared with what that regime would score if it were
   the truth (``fitcheck.FitCheck``, a calibrated z-test). Once every regime's z is below
   ``-FIT_Z`` (after ``FIT_MIN_FLIPS`` run ends), it acts as Uniform Progress — with hysteresis
   for loose deadlines (C/R < 0.7), without for tight ones: the better variant on the development
   traces in every setting of bench/policy.py — and ``reason`` says so. Every decision leaves its reason in ``Default.reason``.
7. Hysteresis (in the rules): from on-demand it takes spot only once the window has
   outlasted a changeover (UP's rule 3 in spirit). The plan's hazards of young windows are the
   regimes', fitted on 600 s probes that never see a window shorter than a tick; where windows
   flicker more than that (finer ticks, a zone outside the prior), a window that ends before its
   changeover is paid costs that changeover and another at the on-demand price to come back, for
   no progress, and the plan keeps trying (bench/policy.py, cross-family at d = 0.2 h). It waits
   at most one changeover of a spot window, so where the model is right it costs little.
8. Without a deadline (``deadline_h`` = inf) there is nothing to plan against: it compares the cost
   per hour of progress of spot (hours billed over hours of progress per launch, from the windows
   seen: each launch pays the changeover again) with on-demand's, and leaves on-demand only after a
   quiet spell of spot (``QUIET_H``), so a zone of short windows cannot make it loop.

Before the rules (not re-measured since), weakest out of sample (bench/policy.py, 16 starts): long changeovers (d = 0.2 h) with C/R = 0.92,
where it closes 0.38 (LOO) / 0.41 (cross-family) of UP's gap to the optimum, and C/R = 0.8
cross-family (0.38); it never costs more than the better UP. Planning on each zone's own hazards
closes 0.39 / 0.43 and 0.47 there (bench/policy_ceiling.py): below 0.5 even with the zone known, so
the regime model is the limit (better learning could win up to ~0.09 at C/R = 0.8 cross-family).

Plans are solved per (regime, job shape) and cached (``SPOTCTL_PLAN_CACHE`` plans, ~67 MB each at
most: long jobs are planned on a coarser grid, ``Units.fit``); a one-off decision (``resume``) plans
on one regime, on a coarser grid, keeping one layer of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from cli.policy.fitcheck import FitCheck
from cli.policy.grid import MAX_STATES, Units
from cli.policy.planning import (
    IDLE_M,
    OD_M,
    SPOT_M,
    OnlineRegime,
    Regime,
    bucket_of,
    mixed,
    plan_for,
    shipped_regimes,
    spot_cost_per_progress,
)
from cli.policy.reserve import round_trip_loses, short_windows, single_zone_rule

Decision = Literal["spot", "on-demand", "idle"]
SPOT: Decision = "spot"
ON_DEMAND: Decision = "on-demand"
IDLE: Decision = "idle"

FIT_Z = 5.5  # a regime fits unless its z is below -FIT_Z (fitcheck.FitCheck); the lowest on the dev traces: -5.0
FALLBACK_HYSTERESIS_BELOW = 0.7  # fallback UP with hysteresis for jobs with C/R below this, else without
FIT_MIN_FLIPS = 3  # run ends seen before a misfit can be declared: one surprise is not a zone


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
    return obs.slack_h - launch <= obs.tick_h + margin_h + SLACK_EPS_H


SLACK_EPS_H = 1e-6  # hours are sums of floats: a slack of exactly one tick must count as one tick


def unsafe_moves(obs: Observation) -> set[Decision]:
    """Moves after which on-demand might no longer finish in time, were spot lost at the next tick.

    ``must_go_on_demand`` covers staying put; a *move* spends slack first: waiting a tick costs the
    tick (and on-demand then needs a changeover), launching spot costs a changeover (its part in this
    tick, the rest while running) and leaves one more changeover to pay to get back on on-demand.
    A plan on a grid coarser than the decision tick cannot see these (bench/policy.py found a miss).
    """
    d, tick = obs.changeover_h, obs.tick_h
    out: set[Decision] = set()
    if obs.current != SPOT and obs.slack_h - min(d, tick) < d + SLACK_EPS_H:
        out.add(SPOT)
    if obs.slack_h - tick < d + SLACK_EPS_H:
        out.add(IDLE)
    return out


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
            return SPOT if obs.spot_available else ON_DEMAND  # the paper keeps the on-demand VM
        if obs.spot_available:
            return SPOT
        return ON_DEMAND if obs.progress_h < ep else IDLE


class UniformProgressNoHysteresis(UniformProgress):
    """UP without rule 3: often cheaper than with it when changeovers are short."""

    name = "uniform-progress-nh"

    def __init__(self) -> None:
        super().__init__(hysteresis=False)


class Default(Policy):
    """spotctl's policy: expected-cost planning under a mixture of availability regimes (module docstring).

    Args:
        regimes: the fixed regimes of the mixture (default: the shipped ones).
        learned: a regime learned from the stack's history (``spotctl policy fit``): joins the mixture
            and is the prior of the online regime.
        windows, censored: spot windows (hours) already observed in this zone, complete or still open.
        online: add a regime learned from this job's own observations, scored prequentially.
        max_plans: plan on at most this many regimes (the most probable); while the posterior is
            nearly flat, on the prior alone (a job's first decision: one plan, not eight).
        one_layer: keep one layer per plan (a one-off decision, as on ``resume``: a few MB).
        budget: states per plan (``Units.fit``); a one-off decision can afford a coarser grid.
        hysteresis: from on-demand, take spot only once its window has outlasted a changeover (step 7).
    """

    name = "default"

    def __init__(self, regimes: Sequence[Regime] | None = None, temperature: float = 1.0, learned: Regime | None = None,
                 windows: Sequence[float] = (), censored: Sequence[float] = (), online: bool = True,
                 max_plans: int = 3, one_layer: bool = False, budget: int = MAX_STATES,
                 fit_z: float | None = FIT_Z, fallback_hysteresis: bool | None = None, online_prior_h: float = 1.0,
                 hysteresis: bool = True, plan: bool = True):
        fixed = tuple(regimes) if regimes is not None else shipped_regimes()
        if not fixed:
            raise ValueError("default policy: no availability regimes")
        self.prior = learned or mixed(fixed, [1.0] * len(fixed), "pooled")
        self.regimes = fixed + ((learned,) if learned is not None else ())
        self.online = OnlineRegime(self.prior, prior_h=online_prior_h) if online else None
        self.temperature, self.max_plans, self.one_layer, self.budget = temperature, max_plans, one_layer, budget
        self.fit = FitCheck(len(self.regimes) + (self.online is not None))
        self.fit_z, self.fallback_hysteresis, self.hysteresis = fit_z, fallback_hysteresis, hysteresis
        self.plan = plan
        self.fallback: UniformProgress | None = None
        self.reason = ""
        self.fallback_ticks = 0
        self.previous: bool | None = None
        self.age_ticks = 0
        self.windows = list(windows)
        self.censored = list(censored)

    def observe(self, available: bool, tick_h: float) -> None:
        """Bayes' rule over the regimes, one tick of availability at a time; track the current run's age."""
        if self.previous is None:
            self.age_ticks = 1
        else:
            bucket = bucket_of(self.age_ticks * tick_h)
            flipped = available != self.previous
            probs = [regime.flip_prob(self.previous, bucket, tick_h) for regime in self.regimes]
            if self.online is not None:  # scored before it learns from this tick: prequential
                probs.append(self.online.prob(self.previous, bucket, tick_h))
                self.online.update(self.previous, bucket, flipped, tick_h)
            self.fit.add(np.array(probs), flipped)
            if flipped and self.previous:
                self.windows.append(self.age_ticks * tick_h)
            self.age_ticks = 1 if flipped else self.age_ticks + 1
        self.previous = available

    _observe = observe

    @property
    def loglik(self) -> np.ndarray:
        return self.fit.loglik

    def posterior(self) -> np.ndarray:
        w = np.exp((self.loglik - self.loglik.max()) * self.temperature)
        return w / w.sum()

    def mixture(self) -> list[Regime]:
        return list(self.regimes) + ([self.online.regime()] if self.online is not None else [])

    def decide(self, obs: Observation) -> Decision:
        tick_h = obs.tick_h or DEFAULT_TICK_H
        self.observe(obs.spot_available, tick_h)
        if not math.isfinite(obs.deadline_h):
            return self._open_ended(obs, tick_h)
        if must_go_on_demand(obs):
            self.reason = "safety net: finishing on on-demand needs all the slack left"
            return ON_DEMAND
        if self.fallback is None and self.fit_z is not None:
            hysteresis = self.fallback_hysteresis
            if hysteresis is None:  # the better variant on the development traces (bench/policy.py)
                hysteresis = obs.job_h < FALLBACK_HYSTERESIS_BELOW * obs.deadline_h
            self.fallback = UniformProgress(hysteresis=hysteresis)
        shadow = self.fallback.decide(obs) if self.fallback is not None else None  # fed every tick: its state is current
        ruled = self._rule(obs, tick_h)
        if ruled is not None:
            return ruled
        misfit = self.misfit()
        if shadow is not None and misfit:
            self.fallback_ticks += 1
            self.reason = f"{misfit}: acting as {_up_name(self.fallback)}"
            return shadow
        units, plan_tick_h = Units.fit(tick_h, obs.changeover_h, obs.job_h, obs.deadline_h, budget=self.budget)
        step = int(obs.elapsed_h * 3600 + 1e-6) // (units.tick * units.u_s)
        work_left = -(-round(obs.work_left_h * 3600) // units.u_s)
        bucket = bucket_of(self.age_ticks * tick_h)
        mode = _MODE[obs.current]
        q: dict[int, float] = {}
        planned = self._planned()
        for regime, weight in planned:
            plan = plan_for(regime, units, obs.price_ratio, plan_tick_h,
                            keep_from=step + 1 if self.one_layer else 0)
            for action, value in plan.q_values(step, mode, obs.spot_available, bucket, work_left).items():
                q[action] = q.get(action, 0.0) + weight * value
        for unsafe in unsafe_moves(obs):
            q.pop(_MODE[unsafe], None)  # on-demand is always allowed: q is never empty
        least = min(q.values())
        near = {a for a, v in q.items() if v <= least + 1e-4 * abs(least) + 1e-6}
        # Among (near) ties: keep running where we run (no changeover for nothing), else take spot
        # (progress now is what a wrong model cannot take back), else keep waiting.
        self.reason = "least expected cost over the availability regimes " + ", ".join(
            f"{r.name} {w:.2f}" for r, w in planned)
        choice = next((c for c in ((mode,) if mode != IDLE_M else ()) + (SPOT_M, mode) if c in near),
                      min(q, key=q.__getitem__))
        return _DECISION[choice]

    def _rule(self, obs: Observation, tick_h: float) -> Decision | None:
        """The single-zone rules (``reserve``) before any plan: None leaves the choice to the plan."""
        short = short_windows(self.windows, obs.changeover_h, obs.price_ratio)
        age_h = self.age_ticks * tick_h if obs.spot_available else 0.0
        ruled = single_zone_rule(obs.current, obs.spot_available, obs.slack_h, obs.work_left_h,
                                 obs.changeover_h, tick_h, age_h, short, self.hysteresis, plan_return=self.plan,
                                 flicker=round_trip_loses(self.windows, obs.changeover_h, obs.price_ratio))
        if ruled is None and not self.plan:
            ruled = (IDLE, "waiting: slack above the reserve") if IDLE not in unsafe_moves(obs) else (
                ON_DEMAND, "too little slack to wait a tick")
        if ruled is None:
            return None
        self.reason = ruled[1]
        return ruled[0]

    def misfit(self) -> str:
        """Why no fixed regime (shipped or learned) fits what this job has seen, or "" if one does.

        Every regime's goodness-of-fit ``z`` (fitcheck.FitCheck) below ``-fit_z``, after at least
        ``FIT_MIN_FLIPS`` runs ended: the zone is outside the prior, and a plan on a wrong model could
        cost more than a rule that assumes nothing.
        """
        if self.fit_z is None or self.fit.flips < FIT_MIN_FLIPS:
            return ""
        z = self.fit.z()[: len(self.regimes)]
        best = int(np.argmax(z))
        if z[best] >= -self.fit_z:
            return ""
        return (f"the observed availability fits no regime (best {self.regimes[best].name}: z = {z[best]:.1f} "
                f"< -{self.fit_z:g} over {self.fit.flips} run ends)")

    def _planned(self) -> list[tuple[Regime, float]]:
        """The regimes to plan on, with weights: the few most probable, renormalized; while the
        posterior is still nearly flat (a job's first decisions), the prior regime alone."""
        post = self.posterior()
        if post.max() < 2 / len(post):
            return [(self.prior, 1.0)]
        regimes = self.mixture()
        top = [j for j in np.argsort(-post, kind="stable")[: self.max_plans] if post[j] > 1e-4]
        mass = float(post[top].sum())
        return [(regimes[j], float(post[j]) / mass) for j in top]

    def _open_ended(self, obs: Observation, tick_h: float) -> Decision:
        """No deadline: the cheaper per hour of progress, spot (from the windows seen) or on-demand.

        Back from on-demand only after a quiet spell: spot up for ``QUIET_H`` (and four changeovers)
        and a window that old expected to pay for the changeover. A flickering zone never gets there,
        so there is no loop; a zone that recovered does, and its window then counts as evidence.
        """
        d, k = obs.changeover_h, obs.price_ratio
        if obs.current == SPOT and obs.spot_available:
            return SPOT  # already paid the changeover; progressing
        work = obs.work_left_h if math.isfinite(obs.job_h) else math.inf
        od = k * (1 + (0.0 if obs.current == ON_DEMAND else d) / work) if math.isfinite(work) and work > 0 else k
        up_h = self.age_ticks * tick_h if obs.spot_available else 0.0
        spot = spot_cost_per_progress(self.windows, self.censored, d, self.prior, work_h=work)
        if obs.current == ON_DEMAND:
            if obs.spot_available and up_h >= max(QUIET_H, 4 * d) and spot_cost_per_progress(
                    [], [up_h], d, self.prior, prior_windows=0.0, work_h=work) < od:
                return SPOT
            return ON_DEMAND
        if not obs.spot_available:  # waiting is free but progress-less: not for longer than a quiet spell
            return ON_DEMAND if self.age_ticks * tick_h >= max(QUIET_H, 4 * d) else IDLE
        return SPOT if spot <= od else ON_DEMAND


def _up_name(up: UniformProgress) -> str:
    return UniformProgress.name if up.hysteresis else UniformProgressNoHysteresis.name


_MODE = {IDLE: IDLE_M, SPOT: SPOT_M, ON_DEMAND: OD_M}
_DECISION = {v: k for k, v in _MODE.items()}
DEFAULT_TICK_H = 1 / 6
QUIET_H = 1.0  # open-ended jobs: spot up this long before leaving on-demand; the longest wait for spot


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
