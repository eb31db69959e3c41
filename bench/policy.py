"""Policies on the development traces: cost, misses and gap to the omniscient optimum.

For d in {0.05, 0.2} h and C/R in {0.6, 0.8, 0.92} (C = 48 h), on every development availability
trace (skypilot-spot-traces aws-10-26-2022, 8 zone/GPU series), the same random starts for every
policy. Prints one table per setting and the ratio of `default`'s cost to the cheaper of
uniform-progress with and without hysteresis, and the share of that UP's gap to the optimum that
`default` closes.

`default` ships availability regimes fitted on these very traces (cli/policy/regimes.json), so its row is
in-sample. The row `default (LOO)` is the honest out-of-sample figure: for each trace it runs with
the regimes of the *other* seven traces only (leave one trace out).

Run: uv run python bench/policy.py [--starts N] [--traces DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.policy.planning import fit_regime  # noqa: E402
from cli.policy.simulate import Job, evaluate, load_trace, overall  # noqa: E402

DEV = ROOT.parent / "shared" / "traces" / "skypilot-spot-traces" / "availability" / "1-node" / "aws-10-26-2022"
POLICIES = ["default", "uniform-progress", "uniform-progress-nh", "greedy", "n-preemptions", "on-demand"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--traces", type=Path, default=DEV)
    args = parser.parse_args()
    traces = [load_trace(p) for p in sorted(args.traces.glob("*.json"))]
    if not traces:
        sys.exit(f"no traces in {args.traces}")
    print(f"{len(traces)} traces from {args.traces}, {args.starts} starts each, seed {args.seed}\n")
    regimes = {t.name: fit_regime(t.name, t.available, t.gap_s / 3600) for t in traces}
    summary = []
    for d in (0.05, 0.2):
        for ratio in (0.6, 0.8, 0.92):
            job = Job(48.0, round(48.0 / ratio, 4), d)
            per_trace = evaluate(traces, POLICIES, job, args.starts, args.seed)
            for trace in traces:
                others = [regimes[t.name] for t in traces if t.name != trace.name]
                (loo,) = evaluate([trace], ["default"], job, args.starts, args.seed, with_optimum=False,
                                  params={"default": {"regimes": others}})
                loo.policy = "default (LOO)"
                per_trace.append(loo)
            rows = overall(per_trace)
            by = {r.policy: r for r in rows}
            print(f"d = {d} h, C/R = {ratio} (C = 48 h, R = {job.deadline_h} h)")
            print(f"  {'policy':<20} {'cost':>6} {'misses':>6} {'gap to opt':>10}")
            for r in rows:
                gap = "" if r.gap_to_opt is None else f"{100 * r.gap_to_opt:+.1f}%"
                print(f"  {r.policy:<20} {r.mean_norm_cost:>6.3f} {r.misses:>6} {gap:>10}")
            up = min((by["uniform-progress"], by["uniform-progress-nh"]), key=lambda r: r.mean_norm_cost)
            opt = by["omniscient"].mean_norm_cost
            row = [d, ratio, opt / up.mean_norm_cost]
            for name in ("default", "default (LOO)"):
                ours = by[name].mean_norm_cost
                closed = (up.mean_norm_cost - ours) / (up.mean_norm_cost - opt) if up.mean_norm_cost > opt else float("nan")
                row += [ours / up.mean_norm_cost, closed, by[name].misses]
                print(f"  {name} / {up.policy}: {ours / up.mean_norm_cost:.3f}   share of UP's gap closed: {closed:.2f}")
            summary.append(row)
            print()
    print("                     omniscient  default (in-sample regimes)     default (LOO regimes)")
    print("setting              /best-UP    /best-UP  gap closed  misses    /best-UP  gap closed  misses")
    for d, ratio, o, r, closed, misses, r2, closed2, misses2 in summary:
        print(f"d={d:<5} C/R={ratio:<5}   {o:>9.3f}  {r:>9.3f}  {closed:>10.2f}  {misses:>6}  {r2:>9.3f}  {closed2:>10.2f}  {misses2:>6}")
    cols = np.array([s[2:] for s in summary], dtype=float).mean(axis=0)
    print(f"mean                  {cols[0]:>9.3f}  {cols[1]:>9.3f}  {cols[2]:>10.2f}          {cols[4]:>9.3f}  {cols[5]:>10.2f}")


if __name__ == "__main__":
    main()
