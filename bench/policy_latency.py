"""The first decision of a job on `resume`: time and peak memory of asking its policy.

Each case runs in a fresh process (imports, replaying the job's recorded history, planning the one
decision) and reports wall and CPU time (wall suffers on a loaded machine) and the peak RSS growth over an idle interpreter with the
same imports. Target: <= 0.5 s and <= 100 MB for `default` (a decision inside a short command), next to uniform-progress.

Run: uv run python bench/policy_latency.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
from datetime import UTC, datetime, timedelta
sys.path.insert(0, {root!r})
from cli.lifecycle.capacity import policy_capacity
from cli.lifecycle.events import Event
from infra.config import Job
import cli.policy.policies, cli.policy.planning, numpy  # imports are not the decision
policy, job_h, deadline_h, runs = {args}
t0 = datetime(2026, 11, 21, tzinfo=UTC)
events = []
for n, (a, b) in enumerate(runs, start=1):
    events += [Event("j", n, 0, "started", t0 + timedelta(hours=a), {{"capacity": "spot"}}),
               Event("j", n, 0, "preempted", t0 + timedelta(hours=b))]
job = Job.model_validate({{"id": "j", "instanceType": "p3.2xlarge", "zone": "us-east-1a", "command": "x", "policy": policy,
                          "state": "preempted", "attempt": len(runs), "jobHours": job_h, "deadlineHours": deadline_h}})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
now = t0 + timedelta(hours=runs[-1][1] + 0.25)
began, cpu = time.perf_counter(), time.process_time()
choice = policy_capacity(now=lambda: now)(job, events)
took = time.perf_counter() - began
print(json.dumps({{"s": took, "cpu": time.process_time() - cpu, "mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, "choice": choice.value}}))
"""

CASES = [
    ("first decision, 48 h job, 60 h deadline", (48.0, 60.0, [(0.0, 2.0)])),
    ("after 4 preemptions, 48 h job, 60 h deadline", (48.0, 60.0, [(0, 2), (2.5, 3), (4, 7), (7.5, 9)])),
    ("first decision, 200 h job, 300 h deadline", (200.0, 300.0, [(0.0, 1.0)])),
    ("no deadline", (None, None, [(0, 0.1), (0.5, 0.6), (1, 1.1)])),
]


def run(policy: str, job_h, deadline_h, runs) -> dict:
    code = CHILD.format(root=str(ROOT), args=repr((policy, job_h, deadline_h, runs)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    print(f"{'case':<48} {'policy':<18} {'seconds':>8} {'cpu s':>6} {'peak MB':>8}  choice")
    for label, (job_h, deadline_h, runs) in CASES:
        for policy in ("default", "uniform-progress"):
            r = run(policy, job_h, deadline_h, runs)
            print(f"{label:<48} {policy:<18} {r['s']:>8.3f} {r['cpu']:>6.3f} {r['mb']:>8.1f}  {r['choice']}")


if __name__ == "__main__":
    main()
