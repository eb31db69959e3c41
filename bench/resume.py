"""spotctl's own time for one job's `resume JOB --no-apply` (the `default` policy's first decision
included), `failover JOB --no-apply` and `complete JOB --no-apply` on stacks of 1,000 and 5,000 jobs
(target: <= 0.3 s at 1,000 jobs, within 1.2 x of that at 5,000: the cost must not grow with the stack).

Per size, all in this one run: `first` is the command on a file just written by hand (the whole file is
read and validated, and indexed); `cli` the median whole command in a fresh process (interpreter start,
imports, read + validate, the policy's decision, locked atomic write) on the file as spotctl left it;
`in-process` the same steps without start-up and imports (the issue's "own work"; wall and CPU seconds, since
the machine may be shared; the stack file module's in-process caches emptied first, as in a new process).
`kernel` is the time the in-process command spent in the kernel's copy of the unchanged bytes into the
new file, fsync and rename (the stack file's atomic write and the index's rename): the kernel putting a
file five times larger on disk, which no whole-file atomic edit avoids, and the freeing of the replaced file;
`own` the in-process figure less that: spotctl's share of it (medians per command). Each repeat resumes another job.

Run: uv run python bench/resume.py [--repeat N] [--jobs 1000 5000] [--commands resume failover complete]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.lifecycle import capacity, stackfile  # noqa: E402
from cli.lifecycle import pipeline as jobs  # noqa: E402
from cli.lifecycle.states import decide_complete, decide_failover, decide_resume  # noqa: E402

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
      policy: default
      command: python train.py --ckpt-dir "$SPOTCTL_CHECKPOINT_DIR"
"""


def stack_text(n: int) -> str:
    head = (ROOT / "stacks" / "Pulumi.example-aws.yaml").read_text().split("  spotctl:jobs:")[0]
    return head + "  spotctl:jobs:\n" + "".join(JOB.format(i=i) for i in range(n))


def in_process(command: str, path: Path, job: str) -> None:
    """What `spotctl COMMAND JOB --stack-file PATH --no-apply` does after parsing its arguments."""
    ref = stackfile.resolve(None, path)
    if command == "resume":
        cfg = stackfile.load_job(ref, job)
        choose = capacity.stack_capacity(ref.path, ref.name, cfg)
        decide = lambda j: decide_resume(j, [], choose=choose)  # noqa: E731
    else:
        decide = (lambda j: decide_failover(j, None, None)) if command == "failover" else decide_complete
    outcome = jobs.change_job(ref, job, decide, applier=None)
    assert not outcome.change.noop, (command, job, outcome.change.reason)  # it did change the job


def forget() -> None:
    """Empty the stack file module's in-process caches: the next command runs as in a new process."""
    for cache in (stackfile._PARSED, stackfile._LAST_DIGEST, stackfile._LAST_PART, stackfile._RULES,
                  stackfile._LAST_READ, stackfile._LAST_WRITTEN):
        cache.clear()


class SyncCalls:
    """Times the kernel's share of a whole-file atomic edit made while it is entered: copying the
    unchanged bytes into the new file (``os.copy_file_range``: never through spotctl's memory) and the
    durability calls (``os.fsync``, ``os.replace``), which grow with the file whatever spotctl does (the
    bytes must reach the disk before the rename)."""

    CALLS = ("copy_file_range", "fsync", "replace")

    def __enter__(self) -> SyncCalls:
        self.seconds, self._saved = 0.0, tuple(getattr(os, name) for name in self.CALLS)

        def timed(call):
            def run(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - t0
            return run

        for name, call in zip(self.CALLS, self._saved, strict=True):
            setattr(os, name, timed(call))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, call in zip(self.CALLS, self._saved, strict=True):
            setattr(os, name, call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--commands", nargs="+", default=["resume", "failover", "complete"], choices=["resume", "failover", "complete"])
    args = parser.parse_args()
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k == "HOME"}}
    print(f"{'command':>9} {'jobs':>6} {'first s':>8} {'cli median s':>13} {'in-process median s':>20} {'its CPU s':>8} {'kernel s':>9} {'own s':>12}")
    for k, command in enumerate(args.commands):
        with contextlib.ExitStack() as stack:
            paths, firsts = {}, {}
            for n in args.jobs:
                project = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                shutil.copy(ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
                (project / "stacks").mkdir()
                paths[n] = project / "stacks" / "Pulumi.bench.yaml"
                paths[n].write_text(stack_text(n))
                firsts[n] = cli(env, command, project, "job-0000")
            times: dict[int, list[list[float]]] = {n: [[], [], [], [], []] for n in args.jobs}
            for r in range(1, args.repeat + 1):
                for n in args.jobs:  # the sizes in turn: a drift of the machine's speed weighs on both alike
                    cli_time = cli(env, command, paths[n].parent.parent, f"job-{(2 * r * 7 + 2 * k * 101) % n:04d}")
                    forget()
                    with SyncCalls() as sync:
                        t0, c0 = time.perf_counter(), time.process_time()
                        in_process(command, paths[n], f"job-{(2 * r * 7 + 2 * k * 101 + 1) % n:04d}")
                        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    for column, value in zip(times[n], (cli_time, wall, cpu, sync.seconds, wall - sync.seconds), strict=True):
                        column.append(value)
        figures = {n: tuple(statistics.median(column) for column in times[n]) for n in args.jobs}
        for n in args.jobs:
            print(f"{command:>9} {n:>6} {firsts[n]:>8.3f} {figures[n][0]:>13.3f} {figures[n][1]:>20.3f} {figures[n][2]:>8.3f}"
                  f" {figures[n][3]:>9.4f} {figures[n][4]:>12.4f}")
        small, large = min(figures), max(figures)
        if small != large:
            print(f"  {command}: {large} / {small} jobs: cli {figures[large][0] / figures[small][0]:.2f} x, in-process "
                  f"{figures[large][1] / figures[small][1]:.2f} x, its CPU {figures[large][2] / figures[small][2]:.2f} x (target <= 1.2 x); "
                  f"own (in-process less the kernel's copy, fsync and rename) {figures[large][4] / figures[small][4]:.2f} x")
        print(f"  {command}: in-process at {small} jobs: {figures[small][1]:.3f} s, CPU {figures[small][2]:.3f} s (target <= 0.3 s)")


def cli(env: dict[str, str], command: str, project: Path, job: str) -> float:
    """Wall seconds of ``spotctl COMMAND JOB --stack bench --no-apply`` in a new process."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli", command, job, "--stack", "bench", "--no-apply"],
                   cwd=project, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0

if __name__ == "__main__":
    main()
