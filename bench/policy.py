"""`default` out of sample: leave-one-trace-out and across trace families, against Uniform Progress.

For d in {0.05, 0.2} h and C/R in {0.6, 0.8, 0.92} (C = 48 h), the same random starts for every
policy, two out-of-sample evaluations (development traces only, ../shared/traces/README.md):

- LOO: each Oct-2022 availability series (skypilot-spot-traces aws-10-26-2022, 8 zone/GPU series,
  600 s ticks) is run with the regimes fitted on the *other* seven only;
- cross-family: the regimes of all eight Oct-2022 series, run on the AWS `preemption/` traces
  (Apr 2023, 32-34 s ticks, aggregated to ten ticks per decision, a tick available only when every
  sub-tick was: 320-340 s). The GCP preemption copies are 45 h long, shorter than every deadline.

Per setting: the omniscient optimum, and `default`'s cost, relative to the cheaper Uniform Progress
variant (with or without hysteresis), the share of that UP's gap to the optimum `default` closes,
and its misses. `default` learns online in both (its own prequentially scored regime joins the mix).

Run: uv run python bench/policy.py [--starts N] [--settings 0.05:0.6,0.2:0.8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.policy.planning import fit_regime  # noqa: E402
from cli.policy.simulate import Job, Trace, evaluate, load_trace, overall  # noqa: E402

TRACES = ROOT.parent.parent / "shared" / "traces" / "skypilot-spot-traces"
if not TRACES.exists():  # a worktree under /work/wt/NAME, or the main checkout next to shared/
    TRACES = ROOT.parent / "shared" / "traces" / "skypilot-spot-traces"
DEV = TRACES / "availability" / "1-node" / "aws-10-26-2022"
PREEMPTION = [TRACES / "preemption" / "1-node" / "aws-04-22-2023", TRACES / "preemption" / "1-node" / "aws-04-19-2023"]
UP = ("uniform-progress", "uniform-progress-nh")
SETTINGS = [(d, r) for d in (0.05, 0.2) for r in (0.6, 0.8, 0.92)]


def coarsen(trace: Trace, factor: int) -> Trace:
    """``factor`` ticks as one, available only if all were (a preemption inside a tick ends the window)."""
    n = len(trace.available) // factor
    av = tuple(all(trace.available[i * factor:(i + 1) * factor]) for i in range(n))
    return Trace(trace.name, trace.gap_s * factor, av)


def score(traces: list[Trace], job: Job, starts: int, seed: int, regimes_for,
          extra_for=lambda trace: {}) -> tuple[float, float, float, int]:
    """(optimum / best UP, default / best UP, share of UP's gap closed, misses) over ``traces``;
    ``default`` gets ``regimes_for(trace)`` and the parameters ``extra_for(trace)``."""
    rows = evaluate(traces, list(UP), job, starts, seed)
    for trace in traces:
        (ours,) = evaluate([trace], ["default"], job, starts, seed, with_optimum=False,
                           params={"default": {"regimes": regimes_for(trace), **extra_for(trace)}})
        rows.append(ours)
    by = {r.policy: r for r in overall(rows)}
    up = min(by[name].mean_norm_cost for name in UP)
    opt = by["omniscient"].mean_norm_cost
    ours = by["default"].mean_norm_cost
    closed = (up - ours) / (up - opt) if up > opt else float("nan")
    return opt / up, ours / up, closed, by["default"].misses


def arguments(starts: int) -> tuple[argparse.Namespace, list[tuple[float, float]]]:
    """``--starts``, ``--seed`` and ``--settings`` (d:C/R pairs), as the policy benchmarks take them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=starts)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--settings", default="", help="d:C/R pairs, comma-separated (default: all six)")
    args = parser.parse_args()
    return args, [tuple(map(float, s.split(":"))) for s in args.settings.split(",") if s] or SETTINGS


def main() -> None:
    args, settings = arguments(30)
    dev = [load_trace(p) for p in sorted(DEV.glob("*.json"))]
    other = [coarsen(load_trace(p), 10) for folder in PREEMPTION for p in sorted(folder.glob("*.json"))]
    if not dev or not other:
        sys.exit(f"development traces not found under {TRACES}")
    fitted = {t.name: fit_regime(t.name, t.available, t.gap_s / 3600) for t in dev}
    print(f"LOO: {len(dev)} Oct-2022 series; cross-family: {len(other)} preemption traces; {args.starts} starts each\n")
    table = []
    for d, ratio in settings:
        began = time.time()
        job = Job(48.0, round(48.0 / ratio, 4), d)
        loo = score(dev, job, args.starts, args.seed, lambda t: [r for n, r in fitted.items() if n != t.name])
        cross = score(other, job, args.starts, args.seed, lambda t: list(fitted.values()))
        table.append((d, ratio, *loo, *cross))
        print(f"  d={d} C/R={ratio}: LOO {loo[1]:.3f} closed {loo[2]:.2f}; cross {cross[1]:.3f} closed {cross[2]:.2f}"
              f"  ({time.time() - began:.0f} s)", flush=True)
    print()
    print("                    leave-one-trace-out (Oct 2022)               cross-family (preemption traces)")
    print("setting             opt/UP  default/UP  gap closed  misses       opt/UP  default/UP  gap closed  misses")
    for d, ratio, o1, r1, c1, m1, o2, r2, c2, m2 in table:
        print(f"d={d:<5} C/R={ratio:<5} {o1:>7.3f} {r1:>11.3f} {c1:>11.2f} {m1:>7}      {o2:>7.3f} {r2:>11.3f} {c2:>11.2f} {m2:>7}")
    cols = np.array([row[2:] for row in table], dtype=float).mean(axis=0)
    print(f"mean                {cols[0]:>7.3f} {cols[1]:>11.3f} {cols[2]:>11.2f}              "
          f"{cols[4]:>7.3f} {cols[5]:>11.3f} {cols[6]:>11.2f}")


if __name__ == "__main__":
    main()
