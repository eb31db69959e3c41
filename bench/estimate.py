"""What the expected cost adds to a preview: CPU time of one job's policy replayed for its expected
cost (``cli.lifecycle.estimate.expected_cost``, STARTS runs on a sampled 30-day trace) over the time
of planning that job's resources under mocks (``cli.lifecycle.apply.job_plan``, which every apply of a
job does before its preview), per policy and job size. The replay of `default` plans each run's
decisions, so it grows with the job's hours.

Run: uv run python bench/estimate.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.lifecycle import estimate  # noqa: E402
from infra.config import validate  # noqa: E402

STACK = {"cloud": "gcp", "project": "p-1", "region": "us-central1", "zones": ["us-central1-a"], "jobs": []}
CASES = [("uniform-progress", 10, 24), ("default", 10, 24), ("default", 60, 96)]


def cpu(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.process_time()
        fn()
        best = min(best, time.process_time() - began)
    return best


def main() -> None:
    from cli.lifecycle.apply import job_plan

    print(f"{'policy':<18} {'job h':>6} {'deadline h':>10} {'plan s':>8} {'expected s':>11} {'ratio':>7}")
    for policy, job_h, deadline_h in CASES:
        job = {"id": "j", "machineType": "a2-highgpu-1g", "zone": "us-central1-a", "command": "x", "policy": policy,
               "jobHours": job_h, "deadlineHours": deadline_h}
        cfg = validate({**STACK, "jobs": [job]}, "bench")
        j = cfg.jobs[0]
        plan = cpu(lambda cfg=cfg: job_plan(cfg, "bench", "j"))
        replay = cpu(lambda cfg=cfg, j=j: estimate.expected_cost(cfg, j, {}, lambda p: None), 1)
        print(f"{policy:<18} {job_h:>6} {deadline_h:>10} {plan:>8.3f} {replay:>11.3f} {replay / plan:>6.1f}x")


if __name__ == "__main__":
    main()
