"""The public ADRS "cant_be_late" single-region protocol: spotctl's policies on the leaderboard's 1,080 runs.

Protocol (UCB-ADRS/ADRS-Leaderboard @ f856497d, problems/cant_be_late/resources/evaluator/evaluator_real30.py
and run_evaluator_real30.py): 6 environments x 30 evenly spaced windows (of the lexicographically sorted
``random_start/*.json``) x deadlines {52, 70} h x changeovers {0.02, 0.05, 0.1} h, a 48 h job, 600 s ticks.
Windows come from ../shared/traces/adrs-leaderboard/cant_be_late_real_traces.tar.gz, read in place;
their encoding is inverted (1 = spot unavailable). They are cut from the development Oct-2022 series.

The simulator rules are the evaluator's own (sky_spot/strategies/strategy.py ``Strategy.step``, sky_spot/env.py,
sky_spot/simulate.py ``_simulate_one``), reproduced here:

- every tick the VM type used during the previous tick is billed a whole tick (on-demand $3.06/h, spot
  $3.06/COST_K = $0.9731/h), including the tick the job finishes in and the decision made on that tick;
- a launch (any change to spot or on-demand) sets a changeover that eats the start of the tick, unpaid in
  progress; a preemption is seen at the tick boundary and the VM becomes "none";
- the evaluator's "strong guarantee" overrides every policy: once ceil((W + d)/gap) >= floor(T/gap) ticks,
  on-demand, except that a policy last on spot without changeover left is kept on spot (and then, if spot is
  gone, idles a tick: the evaluator's own quirk, kept);
- spot requested while unavailable becomes "none".

The evaluator does not check deadlines; this bench counts a run late when its work completes after the deadline.
Score = (OD_anchor - average cost) / (OD_anchor - SPOT_anchor) x 100 with the anchors 48 h all on-demand and
all on spot (unrounded here; the leaderboard rounds it). The omniscient optimum is an exact dynamic program
over the same rules knowing the whole window.

Reference Uniform Progress: sky_spot/strategies/rc_cr_threshold.py ("Our policy: Uniform Progress", with the
on-demand hysteresis) and rc_cr_threshold_no_condition2.py (without), ported as written.

Ceilings (``--policies default-oracle,default-self,default-self-plan``): how far planning on run-age
hazards can go here, however well the hazards are known (``strategy_for``).

Run: uv run python bench/adrs.py [--policies default,greedy] [--workers N] [--limit N]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
import tarfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.policy.planning import fit_regime, shipped_regimes  # noqa: E402
from cli.policy.policies import IDLE, ON_DEMAND, SPOT, Default, Observation, make_policy  # noqa: E402

SHARED = ROOT.parent.parent / "shared" / "traces"
if not SHARED.exists():  # a worktree under /work/wt/NAME, or the main checkout next to shared/
    SHARED = ROOT.parent / "shared" / "traces"
TARBALL = SHARED / "adrs-leaderboard" / "cant_be_late_real_traces.tar.gz"
ENVS = ("us-west-2a_k80_8", "us-west-2b_k80_1", "us-west-2b_k80_8",
        "us-west-2a_v100_1", "us-west-2a_v100_8", "us-west-2b_v100_1")
JOB_H = 48.0
DEADLINES_H = (52.0, 70.0)
OVERHEADS_H = (0.02, 0.05, 0.1)
PER_ENV = 30
OD_PRICE = 3.06  # sky_spot/utils.py DEVICE_COSTS (every device 3.06 "to be consistent with the original results")
SPOT_PRICE = OD_PRICE / (3.06 / 0.9731)  # COSTS[ON_DEMAND] / COST_K
NONE = "none"
PRICE = {NONE: 0.0, SPOT: SPOT_PRICE, ON_DEMAND: OD_PRICE}
OD_ANCHOR, SPOT_ANCHOR = OD_PRICE * JOB_H, SPOT_PRICE * JOB_H


@dataclass(frozen=True)
class Scenario:
    env: str
    window: str
    deadline_h: float
    overhead_h: float
    gap_s: int
    available: tuple[bool, ...]


def evenly_spaced(names: list[str], k: int = PER_ENV) -> list[str]:
    """The evaluator's pick of ``k`` files out of the sorted list (``build_trace_pool``)."""
    if len(names) <= k:
        return names
    out, prev, last = [], -1, len(names) - 1
    for j in range(k):
        raw = round(j * last / (k - 1))
        raw = min(max(raw, prev + 1), last)
        out.append(raw)
        prev = raw
    return [names[i] for i in out]


def scenarios(tarball: Path = TARBALL) -> list[Scenario]:
    """The 1,080 runs, in the evaluator's order of configs (deadline-major, then changeover, env, window)."""
    pattern = re.compile(r"real/ddl=search\+task=48\+overhead=([0-9.]+)/real/([^/]+)/traces/random_start/([^/]+\.json)$")
    files: dict[tuple[str, str], dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            m = pattern.search(member.name)
            if m and member.isfile() and m.group(2) in ENVS and float(m.group(1)) in OVERHEADS_H:
                files[(m.group(1), m.group(2))][member.name] = tar.extractfile(member).read()
    out = []
    for deadline in DEADLINES_H:
        for overhead in OVERHEADS_H:
            for env in ENVS:
                chosen = files[(f"{overhead:.2f}", env)]
                for name in evenly_spaced(sorted(chosen)):  # sorted full paths: "10.json" < "2.json"
                    doc = json.load(io.BytesIO(chosen[name]))
                    gap = int(doc["metadata"]["gap_seconds"])
                    if len(doc["data"]) * gap / 3600 + 1e-9 < max(DEADLINES_H):
                        continue
                    out.append(Scenario(env, Path(name).stem, deadline, overhead, gap,
                                        tuple(int(v) == 0 for v in doc["data"])))
    return out


@dataclass(frozen=True)
class State:
    """What an ADRS strategy sees at one decision (seconds)."""

    elapsed_s: float
    done_s: float
    task_s: float
    deadline_s: float
    overhead_s: float
    gap_s: float
    last: str  # the VM type of the previous tick (before a preemption is applied: the evaluator's last_cluster_type)
    current: str  # after it (env.cluster_type)
    has_spot: bool
    remaining_overhead_s: float
    preemptions: int


@dataclass(frozen=True)
class Result:
    cost: float
    finish_h: float
    late: bool


def strong_guarantee(s: State, proposed: str) -> str:
    """``Strategy._apply_strong_guarantee``, as the evaluator applies it to every strategy."""
    remaining_time = math.floor((s.deadline_s - s.elapsed_s) / s.gap_s) * s.gap_s
    left = s.task_s - s.done_s
    if left <= 1e-3:
        return proposed
    if math.ceil((left + s.overhead_s) / s.gap_s) * s.gap_s >= remaining_time:
        if s.last == SPOT and s.remaining_overhead_s < 1e-3:
            return SPOT
        return ON_DEMAND
    return proposed


def run(strategy, sc: Scenario, job_h: float = JOB_H) -> Result:
    """One run under the evaluator's rules; ``strategy(state) -> 'spot' | 'on-demand' | 'none'``.

    As ``_simulate_one``: step (observe, bill, account, decide) until the work is done, then one more
    observe that bills the decision made on the tick the work completed.
    """
    gap, task, deadline, d = sc.gap_s, job_h * 3600, sc.deadline_h * 3600, sc.overhead_h * 3600
    cluster, cost, done, remaining_oh, preemptions = NONE, 0.0, 0.0, 0.0, 0
    finish = None
    tick = 0
    while True:
        has_spot = sc.available[tick]  # IndexError past the window, as the evaluator's ValueError
        last = cluster
        cost += PRICE[last] * gap / 3600
        if finish is not None:
            break  # the final observe after the loop: billed, nothing decided
        if cluster == SPOT and not has_spot:
            cluster, preemptions = NONE, preemptions + 1
        if last != NONE:
            used_oh = min(remaining_oh, gap)
            dt = max(gap - remaining_oh, 0)
            remaining_oh -= gap - dt
            if remaining_oh < 1e-3:
                remaining_oh = 0
            dt = min(dt, task - done)
            done += dt
            if task - done <= 1e-8:
                finish = (tick - 1) * gap + used_oh + dt
        state = State(tick * gap, done, task, deadline, d, gap, last, cluster, has_spot, remaining_oh, preemptions)
        request = strong_guarantee(state, strategy(state))
        if request == SPOT and not has_spot:
            request = NONE
        if cluster != request and request != NONE:
            remaining_oh = d
        cluster = request
        tick += 1
    return Result(cost, finish / 3600, finish > deadline + 1e-6)


class SpotctlAdapter:
    """A spotctl policy (``cli.policy.policies``) as an ADRS strategy: it sees an ``Observation``."""

    def __init__(self, name: str = "", policy=None, **params):
        self.policy = policy if policy is not None else make_policy(name, **params)

    def __call__(self, s: State) -> str:
        if s.task_s - s.done_s <= 1e-3:
            return NONE
        obs = Observation(
            elapsed_h=s.elapsed_s / 3600, progress_h=s.done_s / 3600, job_h=s.task_s / 3600,
            deadline_h=s.deadline_s / 3600, changeover_h=s.overhead_s / 3600, price_ratio=OD_PRICE / SPOT_PRICE,
            current={NONE: IDLE, SPOT: SPOT, ON_DEMAND: ON_DEMAND}[s.current], spot_available=s.has_spot,
            preemptions=s.preemptions, tick_h=s.gap_s / 3600)
        decision = self.policy.decide(obs)
        return NONE if decision == IDLE else decision


class ReferenceUP:
    """sky_spot's ``rc_cr_threshold`` (hysteresis=True) / ``rc_cr_threshold_no_condition2``, as written."""

    def __init__(self, hysteresis: bool = True):
        self.hysteresis = hysteresis

    def __call__(self, s: State) -> str:
        remaining_time = math.floor((s.deadline_s - s.elapsed_s) / s.gap_s) * s.gap_s
        left = s.task_s - s.done_s
        if left <= 1e-3:
            return NONE
        request = SPOT if s.has_spot else NONE
        if s.done_s - s.elapsed_s * s.task_s / s.deadline_s < 0:  # behind uniform progress
            request = SPOT if s.has_spot else ON_DEMAND
        ahead2d = (s.elapsed_s + 2 * s.overhead_s) * s.task_s / s.deadline_s - s.done_s < 0
        if s.current == ON_DEMAND and (not s.has_spot or (self.hysteresis and not ahead2d)):
            request = ON_DEMAND  # keep the on-demand VM
        if (math.ceil((left + 2 * s.overhead_s) / s.gap_s) * s.gap_s >= remaining_time
                and s.current in (NONE, ON_DEMAND)):
            request = ON_DEMAND
        if math.ceil((left + s.overhead_s) / s.gap_s) * s.gap_s >= remaining_time:
            request = SPOT if s.current == SPOT and s.remaining_overhead_s < 1e-3 else ON_DEMAND
        return request


def omniscient(sc: Scenario, job_h: float = JOB_H) -> float:
    """Least cost to finish by the deadline knowing the window, under the same rules (billing by whole ticks)."""
    d_s = round(sc.overhead_h * 3600)
    q = math.gcd(sc.gap_s, d_s) if d_s else sc.gap_s
    T, D, P = sc.gap_s // q, d_s // q, -(-round(job_h * 3600) // q)
    deadline = round(sc.deadline_h * 3600) // q
    price = (0.0, SPOT_PRICE * sc.gap_s / 3600, OD_PRICE * sc.gap_s / 3600)
    cost = np.full((3, P), np.inf)  # mode after the boundary (0 none, 1 spot, 2 on-demand) x progress units
    cost[0, 0] = 0.0
    best = math.inf
    for i in range(-(-deadline // T)):
        a = sc.available[i]
        if not a:  # a preemption at this boundary
            cost[0] = np.minimum(cost[0], cost[1])
            cost[1] = np.inf
        new = np.full_like(cost, np.inf)
        new[0] = cost.min(axis=0)
        for m2 in (1, 2):
            if m2 == 1 and not a:
                continue
            for m in range(3):
                src = cost[m]
                use = 0 if m == m2 else D
                gain = T - use
                first = max(P - gain, 0)
                tail = src[first:]
                if np.isfinite(tail).any():
                    p = np.arange(first, P)
                    ok = i * T + use + (P - p) <= deadline
                    if ok.any():
                        best = min(best, float(tail[ok].min()) + price[m2])
                if P - gain > 0:
                    new[m2, gain:] = np.minimum(new[m2, gain:], src[: P - gain] + price[m2])
        cost = new
    return best


BASELINES = ("greedy", "uniform-progress", "uniform-progress-nh")


class _PlanOnly(Default):
    """``default`` without its single-zone rules (reserve.py): the plan and the deadline net alone."""

    name = ""  # not registered: a bench variant, not a policy users can name

    def _rule(self, obs, tick_h):
        return None


# Ceilings of planning on run-age hazards: ``default`` told the run's regime instead of learning it
# ("-oracle": the shipped regime fitted on the run's own series; "-self": hazards fitted, in sample, on
# the very window it runs, the future included), with and without its rules ("-plan").
CEILINGS = ("default-oracle", "default-self", "default-self-plan")


def strategy_for(name: str, sc: Scenario | None = None):
    if name == "up-reference":
        return ReferenceUP(True)
    if name == "up-nh-reference":
        return ReferenceUP(False)
    if name in CEILINGS:
        if name == "default-oracle":
            regime = next(r for r in shipped_regimes() if r.name == sc.env)
        else:
            ticks = int(sc.deadline_h * 3600 // sc.gap_s) + 1
            regime = fit_regime("self", sc.available[:ticks], sc.gap_s / 3600)
        told = (_PlanOnly if name.endswith("-plan") else Default)(regimes=[regime], online=False, fit_z=None)
        return SpotctlAdapter(policy=told)
    return SpotctlAdapter(name)


def _one(task: tuple[str, Scenario]) -> tuple[float, float, bool]:
    name, sc = task
    if name == "omniscient":
        return omniscient(sc), 0.0, False
    r = run(strategy_for(name, sc), sc)
    return r.cost, r.finish_h, r.late


def score(avg_cost: float) -> float:
    return (OD_ANCHOR - avg_cost) / (OD_ANCHOR - SPOT_ANCHOR) * 100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policies", default="default," + ",".join(BASELINES) + ",up-reference,up-nh-reference,omniscient")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="every k-th scenario only (quick looks)")
    parser.add_argument("--worst", type=int, default=0, help="print the N costliest runs of the first policy")
    args = parser.parse_args()
    if not TARBALL.exists():
        sys.exit(f"ADRS windows not found: {TARBALL}")
    scs = scenarios()
    if args.limit:
        scs = scs[:: args.limit]
    print(f"{len(scs)} runs ({len(ENVS)} environments, deadlines {DEADLINES_H}, changeovers {OVERHEADS_H})")
    print(f"{'policy':<22} {'avg $':>8} {'score':>6} {'late':>5} {'$ dl=52':>8} {'$ dl=70':>8} {'worst $':>8} {'s':>6}")
    results = {}
    with ProcessPoolExecutor(args.workers) as pool:
        for name in args.policies.split(","):
            began = time.time()
            rows = list(pool.map(_one, [(name, sc) for sc in scs], chunksize=8))
            results[name] = rows
            costs = np.array([r[0] for r in rows])
            by = {dl: float(np.mean([c for c, sc in zip(costs, scs, strict=True) if sc.deadline_h == dl]))
                  for dl in DEADLINES_H}
            late = sum(r[2] for r in rows)
            print(f"{name:<22} {costs.mean():>8.2f} {score(costs.mean()):>6.1f} {late:>5} {by[52.0]:>8.2f} "
                  f"{by[70.0]:>8.2f} {costs.max():>8.2f} {time.time() - began:>6.0f}", flush=True)
    print("score: (all on-demand - avg) / (all on-demand - all spot) x 100, unrounded; late: work done after the deadline")
    if args.worst:
        first = args.policies.split(",")[0]
        opt = results.get("omniscient")
        order = sorted(range(len(scs)), key=lambda i: -results[first][i][0])[: args.worst]
        for i in order:
            sc = scs[i]
            extra = f" opt ${opt[i][0]:.2f}" if opt else ""
            print(f"  {sc.env} {sc.window} dl={sc.deadline_h:g} d={sc.overhead_h}: ${results[first][i][0]:.2f}{extra}")


if __name__ == "__main__":
    main()
