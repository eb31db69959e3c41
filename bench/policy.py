"""`default` out of sample: leave-one-trace-out and across trace families, against Uniform Progress.

For d in {0.05, 0.2} h and C/R in {0.6, 0.8, 0.92} (C = 48 h), the same random starts for every
policy, two out-of-sample evaluations (development traces only, ../shared/traces/README.md):

- LOO: each Oct-2022 availability series (skypilot-spot-traces aws-10-26-2022, 8 zone/GPU series,
  600 s ticks) is run with the regimes fitted on the *other* seven only;
- cross-family: the regimes of all eight Oct-2022 series, run on the AWS `preemption/` traces
  (Apr 2023, 32-34 s ticks, aggregated to ten ticks per decision, a tick available only when every
  sub-tick was: 320-340 s). The GCP preemption copies are 45 h long, shorter than every deadline.

Per setting: the omniscient optimum, and `default`'s cost, relative to the cheaper Uniform Progress
variant (with or without hysteresis), the share of that UP's gap to the optimum `default` closes
with its standard error (bootstrap over the starts, resampled within each trace), and its misses.
`default` learns online in both (its own prequentially scored regime joins the mix).

``--held-out``: instead, the held-out Feb-2023 zones (aws-02-15-2023, nine p3.2xlarge zones, 195 s
ticks; ../shared/traces/README.md keeps them for independent evaluation: never tune on them), `default`
as shipped (its regimes fitted on the development traces), against both UP variants and the optimum.

Run: uv run python bench/policy.py [--starts N] [--workers N] [--settings 0.05:0.6,0.2:0.8] [--held-out]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.policy.planning import fit_regime  # noqa: E402
from cli.policy.policies import make_policy  # noqa: E402
from cli.policy.simulate import Job, Trace, load_trace, omniscient, simulate, starts_for  # noqa: E402

TRACES = ROOT.parent.parent / "shared" / "traces" / "skypilot-spot-traces"
if not TRACES.exists():  # a worktree under /work/wt/NAME, or the main checkout next to shared/
    TRACES = ROOT.parent / "shared" / "traces" / "skypilot-spot-traces"
DEV = TRACES / "availability" / "1-node" / "aws-10-26-2022"
HELD_OUT = TRACES / "availability" / "1-node" / "aws-02-15-2023"
PREEMPTION = [TRACES / "preemption" / "1-node" / "aws-04-22-2023", TRACES / "preemption" / "1-node" / "aws-04-19-2023"]
UP = ("uniform-progress", "uniform-progress-nh")
SETTINGS = [(d, r) for d in (0.05, 0.2) for r in (0.6, 0.8, 0.92)]
BOOTSTRAP = 1000


def coarsen(trace: Trace, factor: int) -> Trace:
    """``factor`` ticks as one, available only if all were (a preemption inside a tick ends the window)."""
    n = len(trace.available) // factor
    av = tuple(all(trace.available[i * factor:(i + 1) * factor]) for i in range(n))
    return Trace(trace.name, trace.gap_s * factor, av)


@dataclass(frozen=True)
class Score:
    """One setting on one set of traces: means over every (trace, start)."""

    opt: float  # omniscient / better UP
    ours: float  # default / better UP
    closed: float  # share of the better UP's gap to the optimum closed
    se: float  # its standard error (bootstrap over starts within traces)
    misses: int


def _costs(task: tuple) -> tuple[float, float, float, float, bool]:
    """(optimum, UP, UP-nh, default, default missed) on one start: one process-pool task."""
    trace, start, job, params = task
    ups = [simulate(make_policy(name), trace, start, job).cost for name in UP]
    ours = simulate(make_policy("default", **params), trace, start, job)
    return omniscient(trace, start, job), *ups, ours.cost, ours.missed


def closed_share(costs: np.ndarray) -> tuple[float, float, float]:
    """(optimum / better UP, default / better UP, share of the gap closed) of rows (opt, UP, UP-nh, default)."""
    opt, up, nh, ours = costs[:, :4].mean(axis=0)
    best = min(up, nh)
    return opt / best, ours / best, (best - ours) / (best - opt) if best > opt else float("nan")


def score(traces: list[Trace], job: Job, starts: int, seed: int, params_for, pool: Executor) -> Score:
    """``default`` with the parameters ``params_for(trace)`` (its regimes among them) on ``starts``
    starts of every trace, against the optimum and both UP variants on the same starts."""
    tasks = [(t, s, job, params_for(t)) for t in traces for s in starts_for(t, job, starts, seed)]
    rows = np.array(list(pool.map(_costs, tasks)), dtype=float)
    opt, ours, closed = closed_share(rows)
    rng = np.random.default_rng(seed)
    per = rows.reshape(len(traces), starts, -1)
    draws = [closed_share(np.concatenate([p[rng.integers(0, starts, starts)] for p in per]))[2]
             for _ in range(BOOTSTRAP)] if starts > 1 else [np.nan]
    return Score(opt, ours, closed, float(np.std(draws)), int(rows[:, 4].sum()))


def arguments(starts: int) -> tuple[argparse.Namespace, list[tuple[float, float]]]:
    """``--starts``, ``--seed``, ``--workers`` and ``--settings`` (d:C/R pairs), as the policy benchmarks take them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=starts)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--workers", type=int, default=1, help="processes (the runs are independent)")
    parser.add_argument("--settings", default="", help="d:C/R pairs, comma-separated (default: all six)")
    parser.add_argument("--held-out", action="store_true", help="the held-out Feb-2023 zones (final evaluation only)")
    args = parser.parse_args()
    return args, [tuple(map(float, s.split(":"))) for s in args.settings.split(",") if s] or SETTINGS


def held_out(args: argparse.Namespace, settings: list[tuple[float, float]]) -> None:
    """`default` as shipped on the Feb-2023 zones: cost against the better UP, misses."""
    traces = [load_trace(p) for p in sorted(HELD_OUT.glob("*.json"))]
    if not traces:
        sys.exit(f"held-out traces not found under {HELD_OUT}")
    print(f"held out: {len(traces)} Feb-2023 zones, {args.starts} starts each; default as shipped\n")
    print("setting             opt/UP  default/UP  UP/UP-nh  gap closed (se)  misses")
    with ProcessPoolExecutor(args.workers) as pool:
        for d, ratio in settings:
            job = Job(48.0, round(48.0 / ratio, 4), d)
            tasks = [(t, s, job, {}) for t in traces for s in starts_for(t, job, args.starts, args.seed)]
            rows = np.array(list(pool.map(_costs, tasks)), dtype=float)
            opt, ours, closed = closed_share(rows)
            up, nh = rows[:, 1].mean(), rows[:, 2].mean()
            rng = np.random.default_rng(args.seed)
            per = rows.reshape(len(traces), args.starts, -1)
            se = float(np.std([closed_share(np.concatenate([p[rng.integers(0, args.starts, args.starts)] for p in per]))[2]
                               for _ in range(BOOTSTRAP)]))
            print(f"d={d:<5} C/R={ratio:<5} {opt:>7.3f} {ours:>11.3f} {up / nh:>9.3f} {closed:>11.2f} ({se:.2f}) "
                  f"{int(rows[:, 4].sum()):>7}", flush=True)


def main() -> None:
    args, settings = arguments(16)
    if args.held_out:
        held_out(args, settings)
        return
    dev = [load_trace(p) for p in sorted(DEV.glob("*.json"))]
    other = [coarsen(load_trace(p), 10) for folder in PREEMPTION for p in sorted(folder.glob("*.json"))]
    if not dev or not other:
        sys.exit(f"development traces not found under {TRACES}")
    fitted = {t.name: fit_regime(t.name, t.available, t.gap_s / 3600) for t in dev}
    print(f"LOO: {len(dev)} Oct-2022 series; cross-family: {len(other)} preemption traces; {args.starts} starts each\n")
    table = []
    with ProcessPoolExecutor(args.workers) as pool:
        for d, ratio in settings:
            began = time.time()
            job = Job(48.0, round(48.0 / ratio, 4), d)
            loo = score(dev, job, args.starts, args.seed,
                        lambda t: {"regimes": [r for n, r in fitted.items() if n != t.name]}, pool)
            cross = score(other, job, args.starts, args.seed, lambda t: {"regimes": list(fitted.values())}, pool)
            table.append((d, ratio, loo, cross))
            print(f"  d={d} C/R={ratio}: LOO {loo.ours:.3f} closed {loo.closed:.2f} ± {loo.se:.2f}; "
                  f"cross {cross.ours:.3f} closed {cross.closed:.2f} ± {cross.se:.2f}  ({time.time() - began:.0f} s)",
                  flush=True)
    print()
    print("                    leave-one-trace-out (Oct 2022)                    cross-family (preemption traces)")
    print("setting             opt/UP  default/UP  gap closed (se)  misses       opt/UP  default/UP  gap closed (se)  misses")
    for d, ratio, a, b in table:
        print(f"d={d:<5} C/R={ratio:<5} {a.opt:>7.3f} {a.ours:>11.3f} {a.closed:>11.2f} ({a.se:.2f}) {a.misses:>7}      "
              f"{b.opt:>7.3f} {b.ours:>11.3f} {b.closed:>11.2f} ({b.se:.2f}) {b.misses:>7}")
    mean = lambda f: float(np.mean([f(row) for row in table]))  # noqa: E731
    print(f"{'mean':<18}{mean(lambda r: r[2].opt):>7.3f} {mean(lambda r: r[2].ours):>11.3f} "
          f"{mean(lambda r: r[2].closed):>11.2f}{'':<21}{mean(lambda r: r[3].opt):>7.3f} "
          f"{mean(lambda r: r[3].ours):>11.3f} {mean(lambda r: r[3].closed):>11.2f}")


if __name__ == "__main__":
    main()
