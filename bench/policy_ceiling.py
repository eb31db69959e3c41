"""How much of Uniform Progress's gap to the omniscient optimum *any* online policy can close.

bench/policy.py measures ``default`` out of sample; this script asks what the goal (0.5 of UP's gap
closed) is worth per setting, with the same jobs (C = 48 h, d in {0.05, 0.2} h, C/R in {0.6, 0.8,
0.92}), the same metric and development traces only (../shared/traces/README.md):

- ``own regime``: ``default`` planning on each Oct-2022 series' *own* fitted regime (in sample, no
  learning, no fallback): what perfect identification of a zone's hazards would give on the real
  traces; the distance from bench/policy.py's figures is what learning could still win.
- ``own regime, cross-family``: the same on the AWS ``preemption/`` traces of bench/policy.py (ten
  ticks per decision), each planned on its own fitted regime: the ceiling of its cross-family column.
- ``in model``: traces sampled from the eight fitted regimes themselves (semi-Markov, exact ages,
  27 days of 600 s ticks each), and ``default`` planning on the regime that generated each one: the
  expected-cost plan under the true model is (up to its age buckets and grid) the best an online
  policy can do there, so its share is the ceiling wherever availability behaves like the model.
  The omniscient optimum knows when each window ends; no policy that sees only the past does.

Each share comes with its standard error (bootstrap over starts within traces, bench/policy.py).

Run: uv run python bench/policy_ceiling.py [--starts N] [--workers N] [--settings 0.2:0.92]
"""

from __future__ import annotations

import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.policy import DEV, PREEMPTION, Score, arguments, coarsen, score  # noqa: E402
from cli.policy.planning import Regime, bucket_of, fit_regime  # noqa: E402
from cli.policy.simulate import Job, Trace, load_trace  # noqa: E402


def sample(regime: Regime, ticks: int, gap_s: int, seed: str) -> Trace:
    """A series drawn from ``regime``: each tick the current run ends with the hazard of its exact age."""
    rng = random.Random(seed)
    tick_h = gap_s / 3600
    state, age, out = rng.random() < 0.5, 0, []
    for _ in range(ticks):
        age += 1
        out.append(state)
        if rng.random() < regime.flip_prob(state, bucket_of(age * tick_h), tick_h):
            state, age = not state, 0
    return Trace(f"{regime.name}-sampled", gap_s, tuple(out))


def closed(traces: list[Trace], regime_of: dict[str, Regime], job: Job, starts: int, seed: int, pool) -> Score:
    """``default`` planning on each trace's regime (passed as ``learned`` too: the plan is on that
    regime itself, not on a quantized mix), without learning or fallback."""
    return score(traces, job, starts, seed, lambda t: {"regimes": [regime_of[t.name]], "learned": regime_of[t.name],
                                                        "online": False, "fit_z": None}, pool)


def main() -> None:
    args, settings = arguments(16)
    dev = [load_trace(p) for p in sorted(DEV.glob("*.json"))]
    other = [coarsen(load_trace(p), 10) for folder in PREEMPTION for p in sorted(folder.glob("*.json"))]
    if not dev or not other:
        sys.exit(f"development traces not found under {DEV}")
    own, own_other = ({t.name: fit_regime(t.name, t.available, t.gap_s / 3600) for t in ts} for ts in (dev, other))
    sampled = [sample(own[t.name], len(t.available), t.gap_s, f"{args.seed}/{t.name}") for t in dev]
    generator = {s.name: own[t.name] for s, t in zip(sampled, dev, strict=True)}
    print(f"{len(dev)} Oct-2022 series, {len(other)} preemption traces and one sampled series per Oct-2022 regime; "
          f"{args.starts} starts each (share of UP's gap closed, standard error in brackets)\n")
    print("setting             own regime (Oct 2022)   own regime (cross-family)   in model (sampled)")
    with ProcessPoolExecutor(args.workers) as pool:
        for d, ratio in settings:
            began = time.time()
            job = Job(48.0, round(48.0 / ratio, 4), d)
            real = closed(dev, own, job, args.starts, args.seed, pool)
            cross = closed(other, own_other, job, args.starts, args.seed, pool)
            model = closed(sampled, generator, job, args.starts, args.seed, pool)
            print(f"d={d:<5} C/R={ratio:<5} {real.closed:>12.2f} ({real.se:.2f}) {cross.closed:>18.2f} ({cross.se:.2f})"
                  f" {model.closed:>15.2f} ({model.se:.2f})   ({time.time() - began:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
