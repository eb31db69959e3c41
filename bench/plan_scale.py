"""`spotctl plan` against raw Pulumi SDK registration of the same resources under the same mocks
(issue 20: <= 1.15 x raw time and <= 2 x raw peak memory at 1,000 and 5,000 jobs).

Each side runs in its own fresh process (one process pair per size, in this one run): `plan` evaluates
the real program (config validation, components, contract checks, recording monitor); `raw` registers
the resources `plan` recorded (same types, names, inputs) as bare CustomResources with the same mock
answers, which is the floor any Pulumi program of that size pays.

Run: uv run python bench/plan_scale.py [--jobs 1000 5000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child_plan(stack_file: str, dump: str) -> None:
    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner

    t0 = time.perf_counter()
    ref = stackfile.resolve(None, Path(stack_file))
    plan = planner.run(stackfile.load(ref), ref.name)
    seconds = time.perf_counter() - t0
    Path(dump).write_text(json.dumps({"resources": [
        {"type": r.type, "name": r.name, "custom": r.custom, "inputs": r.inputs} for r in plan.resources]}))
    report(seconds, len(plan.resources))


def child_raw(dump: str, region: str, project: str) -> None:
    import pulumi

    from cli.plan.mocks import _mock_call, _mock_outputs

    resources = json.loads(Path(dump).read_text())["resources"]
    t0 = time.perf_counter()

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            return _mock_outputs(args.typ, args.name, args.inputs, project, region)

        def call(self, args):
            return _mock_call(args.token, dict(args.args), region)

    pulumi.runtime.set_mocks(Mocks(), project="spotctl", stack="bench", preview=False)

    @pulumi.runtime.test
    def register():
        outs = []
        for r in resources:
            if r["type"].startswith("pulumi:providers:"):
                continue
            if r["custom"]:
                outs.append(pulumi.CustomResource(r["type"], r["name"], dict(r["inputs"])).urn)
            else:
                outs.append(pulumi.ComponentResource(r["type"], r["name"]).urn)
        return pulumi.Output.all(*outs)

    register()
    report(time.perf_counter() - t0, len(resources))


def report(seconds: float, count: int) -> None:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_mb": peak_kb / 1024, "resources": count}))


def run(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-plan":
        return child_plan(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1 and sys.argv[1] == "--child-raw":
        return child_raw(sys.argv[2], sys.argv[3], sys.argv[4])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000])
    args = parser.parse_args()
    from bench._stacks import write_stack

    print(f"{'jobs':>6} {'resources':>9} {'plan s':>8} {'raw s':>8} {'x raw':>6} (<= 1.15) {'plan MB':>8} {'raw MB':>7} {'x raw':>6} (<= 2)")
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory() as tmp:
            stack = write_stack(Path(tmp), jobs)
            dump = str(Path(tmp) / "plan.json")
            plan = run(["--child-plan", str(stack), dump])
            raw = run(["--child-raw", dump, "us-central1", "bench-project"])
        print(f"{jobs:>6} {plan['resources']:>9} {plan['seconds']:8.2f} {raw['seconds']:8.2f} {plan['seconds'] / raw['seconds']:6.2f}"
              f"           {plan['peak_mb']:8.0f} {raw['peak_mb']:7.0f} {plan['peak_mb'] / raw['peak_mb']:6.2f}")


if __name__ == "__main__":
    main()
