"""How fast a preemption becomes a recorded event, with the real rendered bootstrap, the VM agent and
its budgets.

GCP: seconds from the metadata server flipping `preempted` (and GCE starting the shutdown script)
to the `preempted` event arriving at the bucket; target <= 2 s.
AWS: seconds from `spot/instance-action` appearing in IMDS to the `preemption-notice` event arriving;
target <= 5 s + the poll interval (5 s).

Run: uv run python bench/scripts_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.drill.emulator import Emulator  # noqa: E402
from cli.drill.localvm import LocalVM, local_context  # noqa: E402
from infra.render import ScriptContext  # noqa: E402

TRAINER = ROOT / "tests" / "fixtures" / "trainer.py"


def one(cloud: str, tmp: Path) -> float:
    with Emulator() as emu:
        ctx = ScriptContext(cloud=cloud, stack="bench", kind="job", name="train", event_bucket="b", region="us-east-1",
                            command=f"{sys.executable} {TRAINER}", env={"CKPT_S": "0.2"})
        vm = LocalVM(local_context(ctx, emu, tmp / "disk", tmp / "state"), tmp / "vm")
        try:
            vm.boot()
            vm.wait_for(lambda: vm.alive("trainer.pid"), 15)
            time.sleep(0.5)
            if cloud == "gcp":
                t0 = emu.preempt_gcp()
                vm.shutdown()  # GCE runs the shutdown script at preemption
                wanted = "preempted"
            else:
                t0 = emu.notice_aws()
                wanted = "preemption-notice"
            vm.wait_for(lambda: any(e["event"] == wanted for e in emu.events()), 30)
            return next(u.received for u in emu.uploads() if u.body["event"] == wanted) - t0
        finally:
            vm.kill_all()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    targets = {"gcp": 2.0, "aws": 5.0 + 5.0}
    print(f"{'cloud':6} {'runs':>4} {'median s':>9} {'max s':>7} {'target s':>9} {'max/target':>11}")
    for cloud, target in targets.items():
        samples = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as d:
                samples.append(one(cloud, Path(d) / str(i)))
        worst = max(samples)
        print(f"{cloud:6} {len(samples):>4} {statistics.median(samples):>9.2f} {worst:>7.2f} {target:>9.1f} {worst / target:>11.2f}")


if __name__ == "__main__":
    main()
