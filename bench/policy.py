"""Policies on the development traces: cost, misses and gap to the omniscient optimum.

For d in {0.05, 0.2} h and C/R in {0.6, 0.8, 0.92} (C = 48 h), on every development availability
trace (skypilot-spot-traces aws-10-26-2022, 8 zone/GPU series), the same random starts for every
policy. Prints one table per setting and the ratio of `default`'s cost to the cheaper of
uniform-progress with and without hysteresis, and the share of that UP's gap to the optimum that
`default` closes.

Run: uv run python bench/policy.py [--starts N] [--traces DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.simulate import Job, evaluate, load_trace, overall  # noqa: E402

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
    summary = []
    for d in (0.05, 0.2):
        for ratio in (0.6, 0.8, 0.92):
            job = Job(48.0, round(48.0 / ratio, 4), d)
            rows = overall(evaluate(traces, POLICIES, job, args.starts, args.seed))
            by = {r.policy: r for r in rows}
            print(f"d = {d} h, C/R = {ratio} (C = 48 h, R = {job.deadline_h} h)")
            print(f"  {'policy':<20} {'cost':>6} {'misses':>6} {'gap to opt':>10}")
            for r in rows:
                gap = "" if r.gap_to_opt is None else f"{100 * r.gap_to_opt:+.1f}%"
                print(f"  {r.policy:<20} {r.mean_norm_cost:>6.3f} {r.misses:>6} {gap:>10}")
            up = min((by["uniform-progress"], by["uniform-progress-nh"]), key=lambda r: r.mean_norm_cost)
            opt = by["omniscient"].mean_norm_cost
            ours = by["default"].mean_norm_cost
            closed = (up.mean_norm_cost - ours) / (up.mean_norm_cost - opt) if up.mean_norm_cost > opt else float("nan")
            summary.append((d, ratio, ours / up.mean_norm_cost, closed, by["default"].misses, up.policy))
            print(f"  default / {up.policy}: {ours / up.mean_norm_cost:.3f}   share of UP's gap closed: {closed:.2f}\n")
    print("setting              default/best-UP  gap closed  misses")
    for d, ratio, r, closed, misses, _ in summary:
        print(f"d={d:<5} C/R={ratio:<5}   {r:>14.3f}  {closed:>10.2f}  {misses:>6}")
    print(f"mean                  {np.mean([s[2] for s in summary]):>14.3f}  {np.mean([s[3] for s in summary]):>10.2f}")


if __name__ == "__main__":
    main()
