"""`spotctl watch` on a 1,000-job stack: event arrival -> resume decided -> update started.

A preempted event lands in the events dir (the watcher's previous cycle has read the stack file, as
in a running watcher: an unchanged file is not parsed again); the next cycle reads every source, decides,
edits the stack file under its lock and hands the targeted update to pulumi (the fake pulumi of
the tests: no cloud). Prints spotctl's own time per phase and end to end, against the issue's
targets (<= 1 s of spotctl's own work, <= 10 s end to end including the wait for the next cycle
at the default --interval). No assertions: numbers vary with the machine.

Run: uv run python bench/watch.py [--jobs 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.cloud import Cloud  # noqa: E402
from cli.lifecycle import stackfile  # noqa: E402
from cli.lifecycle.apply import Applier  # noqa: E402
from cli.watch import act as acting  # noqa: E402
from cli.watch import decide as deciding  # noqa: E402
from cli.watch import observe  # noqa: E402

DEFAULT_INTERVAL_S = 5.0  # spotctl watch --interval default

JOB = """    - id: job-{i:04d}
      # a comment per job, kept by every edit
      instanceType: p4d.24xlarge
      zone: us-east-1b
      capacity: spot
      attempt: {attempt}
      state: running
      command: python train.py --ckpt-dir "$SPOTCTL_CHECKPOINT_DIR"
"""


class TimedApplier(Applier):
    """The real Automation API adapter; notes when the update is handed to pulumi."""

    started: float = 0.0

    def up(self, targets, on_output):
        self.started = time.perf_counter()
        return super().up(targets, on_output)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    phases: dict[str, list[float]] = {"observe": [], "decide": [], "edit+plan (to update start)": [], "own work": []}
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        shutil.copy(ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
        (project / "stacks").mkdir()
        pulumi = project / "pulumi" / "bin"
        pulumi.mkdir(parents=True)
        shutil.copy(ROOT / "tests" / "fixtures" / "fake_pulumi.py", pulumi / "pulumi")
        (pulumi / "pulumi").chmod(0o755)
        os.environ["FAKE_PULUMI_LOG"] = str(project / "pulumi.log")
        os.chdir(project)
        head = (ROOT / "stacks" / "Pulumi.example-aws.yaml").read_text().split("  spotctl:jobs:")[0]
        path = project / "stacks" / "Pulumi.bench.yaml"
        ref = stackfile.StackRef("bench", path)
        events = project / "events"
        events.mkdir()
        # A running watcher has imported the Pulumi program (pulumi, pulumi_aws) at its first
        # action; time that once, apart from the per-event figures.
        path.write_text(head + "  spotctl:jobs:\n" + JOB.format(i=0, attempt=2))
        from cli.lifecycle.apply import job_targets

        t = time.perf_counter()
        job_targets(stackfile.load(ref), "bench", "job-0000")
        warm_up = time.perf_counter() - t
        for r in range(args.repeat):
            # A different file each run (attempts differ), so no run reuses the previous run's parse.
            path.write_text(head + "  spotctl:jobs:\n" + "".join(JOB.format(i=i, attempt=2 + r) for i in range(args.jobs)))
            for f in project.glob("stacks/.Pulumi.bench.yaml.watch*"):
                f.unlink()
            target = f"job-{(r * 397) % args.jobs:04d}"
            now = datetime.now(UTC)
            (events / f"{r}.json").write_text(json.dumps({"job": target, "attempt": 2 + r, "node": 0, "event": "preempted",
                                                          "time": now.isoformat()}))
            applier = TimedApplier(project, "bench", project / "pulumi")
            stackfile.load(ref)  # the watcher's previous cycle read this file (nothing happened then)
            t0 = time.perf_counter()  # the event has arrived
            cfg = stackfile.load(ref)
            from cli.watch.journal import Journal

            journal = Journal.load(path)
            seen = observe.observe(Cloud(cfg, "bench"), cfg, "bench", observe.Sources(events_dir=events, poll=False), now,
                                   poll_due=False, handled=set(journal.handled), warn=print)
            t1 = time.perf_counter()
            decisions = deciding.decide(list(cfg.jobs), seen.events, journal.memory(), set(journal.handled), now)
            t2 = time.perf_counter()
            (action,) = [a for a in decisions.actions if a.job == target]
            result = acting.act(ref, action, [s.event for s in seen.events[target]], journal, applier=applier,
                                choose=lambda j, e: j.capacity, now=now, rng=random.Random(r), out=lambda line: None)
            assert result.ok, result.detail
            phases["observe"].append(t1 - t0)
            phases["decide"].append(t2 - t1)
            phases["edit+plan (to update start)"].append(applier.started - t2)
            phases["own work"].append(applier.started - t0)
    own = statistics.median(phases["own work"])
    print(f"first action of a new watcher: {warm_up:.3f} s importing the Pulumi program (once per process)")
    print(f"{args.jobs} jobs, median of {args.repeat} runs (event arrival -> resume decided -> targeted update started)")
    for name, values in phases.items():
        print(f"  {name:<30} {statistics.median(values):8.3f} s")
    worst = DEFAULT_INTERVAL_S + own
    print(f"  own work / 1 s target          {own / 1.0:8.2f}")
    print(f"  worst case end to end          {worst:8.3f} s  (interval {DEFAULT_INTERVAL_S:.0f} s + own work); / 10 s target {worst / 10:.2f}")


if __name__ == "__main__":
    main()
