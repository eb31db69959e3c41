"""Preemption notice -> SIGTERM at the trainer: the Python agent beside the bash scripts it replaced.

Both versions run the same measurement (a LocalVM against the emulator; the trainer fixture writes the
wall-clock second its SIGTERM arrived): GCP from the metadata server flipping `preempted` (GCE starts
the shutdown script at once) to the SIGTERM; AWS from `spot/instance-action` appearing in IMDS to the
SIGTERM (the watcher's 1 s poll included). The baseline is a git ref checked out in a temporary
worktree (default: the last commit with the bash scripts).

Run: uv run python bench/agent_latency.py [--runs N] [--baseline REF]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "bbea2da"  # the bash scripts' last commit


def one(cloud: str, tmp: Path) -> float:
    from cli.drill.emulator import Emulator
    from cli.drill.localvm import LocalVM, local_context
    from infra.render import ScriptContext

    trainer = ROOT / "tests" / "fixtures" / "trainer.py"
    with Emulator() as emu:
        ctx = ScriptContext(cloud=cloud, stack="bench", kind="job", name="train", event_bucket="b", region="us-east-1",
                            command=f"{sys.executable} {trainer}", env={"CKPT_S": "0.05"}, poll_interval_s=1)
        vm = LocalVM(local_context(ctx, emu, tmp / "disk", tmp / "state"), tmp / "vm")
        try:
            vm.boot()
            vm.wait_for(lambda: vm.alive("trainer.pid"), 15)
            time.sleep(0.5)
            t0 = time.time()
            if cloud == "gcp":
                emu.preempt_gcp()
                vm.shutdown()  # GCE runs the shutdown script at preemption
            else:
                emu.notice_aws()
            ckpt = vm.disk / "checkpoints" / "ckpt.json"
            vm.wait_for(lambda: ckpt.exists() and "term_at" in ckpt.read_text(), 30)
            return json.loads(ckpt.read_text())["term_at"] - t0
        finally:
            vm.kill_all()


def measure(runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for cloud in ("gcp", "aws"):
        for i in range(runs):
            with tempfile.TemporaryDirectory() as d:
                out.setdefault(cloud, []).append(one(cloud, Path(d) / str(i)))
    return out


def baseline(ref: str, runs: int) -> dict[str, list[float]]:
    """The same measurement with ``ref``'s code (this file's functions, that tree's modules)."""
    with tempfile.TemporaryDirectory() as d:
        tree = Path(d) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), ref], check=True)
        try:
            done = subprocess.run([sys.executable, __file__, "--measure", "--root", str(tree), "--runs", str(runs)],
                                  capture_output=True, text=True, check=True)
            return json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def main() -> None:
    global ROOT
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.root:
        ROOT = Path(args.root)
    sys.path.insert(0, str(ROOT))
    if args.measure:
        print(json.dumps(measure(args.runs)))
        return
    agent = measure(args.runs)
    bash = baseline(args.baseline, args.runs)
    print(f"{'cloud':6} {'runs':>4} {'agent med s':>12} {'bash med s':>11} {'agent max s':>12} {'bash max s':>11} {'med ratio':>10}")
    for cloud in ("gcp", "aws"):
        a, b = agent[cloud], bash[cloud]
        print(f"{cloud:6} {len(a):>4} {statistics.median(a):>12.2f} {statistics.median(b):>11.2f} {max(a):>12.2f} "
              f"{max(b):>11.2f} {statistics.median(a) / statistics.median(b):>10.2f}")


if __name__ == "__main__":
    main()
