"""spotctl's own time for `spotctl resume JOB --no-apply` on stacks of 10, 100 and 1,000 jobs.

Measures the whole command in a fresh process (interpreter start, imports, read + validate, decide,
locked atomic write) and, separately, the in-process part without start-up. Target: <= 1 s at 1,000 jobs.

Run: uv run python bench/resume.py [--repeat N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.lifecycle import operations as jobs  # noqa: E402
from cli.lifecycle import stackfile  # noqa: E402
from cli.lifecycle.states import decide_resume  # noqa: E402

JOB = """    - id: job-{i:04d}
      # a comment per job, kept by every edit
      instanceType: p4d.24xlarge
      accelerator: {{type: nvidia-a100, count: 8}}
      diskGb: 1000
      zone: us-east-1b
      capacity: spot
      attempt: 2
      state: preempted
      deadlineHours: 48
      jobHours: 20
      policy: n-preemptions
      command: python train.py --ckpt-dir "$SPOTCTL_CHECKPOINT_DIR"
"""


def stack_text(n: int) -> str:
    head = (ROOT / "stacks" / "Pulumi.example-aws.yaml").read_text().split("  spotctl:jobs:")[0]
    return head + "  spotctl:jobs:\n" + "".join(JOB.format(i=i) for i in range(n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'jobs':>6} {'cli median s':>13} {'in-process median s':>20} {'cli / 1 s target':>17}")
    for n in (10, 100, 1000):
        with tempfile.TemporaryDirectory() as tmp:
            project = Path(tmp)
            shutil.copy(ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
            (project / "stacks").mkdir()
            path = project / "stacks" / "Pulumi.bench.yaml"
            cli_times, core_times = [], []
            for r in range(args.repeat):
                path.write_text(stack_text(n))
                target = f"job-{(r * 7) % n:04d}"
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "cli", "resume", target, "--stack", "bench", "--no-apply"],
                               cwd=project, check=True, capture_output=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
                cli_times.append(time.perf_counter() - t0)
                path.write_text(stack_text(n))
                ref = stackfile.StackRef("bench", path)
                t0 = time.perf_counter()
                jobs.change_job(ref, target, lambda j: decide_resume(j, []), applier=None)
                core_times.append(time.perf_counter() - t0)
            cli = statistics.median(cli_times)
            print(f"{n:>6} {cli:>13.3f} {statistics.median(core_times):>20.3f} {cli / 1.0:>17.2f}")


if __name__ == "__main__":
    main()
