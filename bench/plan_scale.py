"""`spotctl plan` against raw Pulumi SDK registration of the same resources under the same mocks
(target, so plan stays usable at scale: <= 1.15 x raw time and <= 2 x raw peak memory at 1,000 and 5,000 jobs).

Each side runs in its own fresh process (all in this one run): `plan` evaluates the real program
(config validation, components, contract checks, recording monitor); each baseline registers the
resources `plan` recorded (same types, names, inputs in plain values) with the same mock answers:

- ``tree``: bare ``CustomResource``/``ComponentResource``/``ProviderResource`` with plain dicts and
  the same parents, explicit provider, protect/deleteBeforeReplace/ignoreChanges, dependencies and
  ``register_outputs`` on every component: the registrations the engine gets from `plan`, made
  directly through the SDK.
- ``typed``: the same through the provider SDK's own classes (``pulumi_gcp.compute.Instance(...)``),
  as a hand-written program of these resources declares them (and as spotctl's program must: the
  classes check required arguments and translate names for a real ``pulumi up``); each typed resource
  makes an Output for every property of its class.
- ``flat``: bare classes with no parents, options or providers (this script's first baseline;
  components are registered but not as parents).

The target's raw is each of these as a plain program runs under the mocks. `plan` also makes its own
evaluation cheaper, and the stricter rows give the baseline those optimizations too: `plan` pauses
Python's cyclic garbage collector while the program runs (``cli.plan.runtime``: "GC paused" rows),
and skips what the mocks never read, the SDK's per-resource stack walk (source positions) and debug
messages the root logger would drop ("all plan's shortcuts" rows: GC paused as well). Those rows
measure how far `plan` is from an equally optimized program, not the target. Both sides import
``pulumi`` before their clock starts.

Times are wall and CPU seconds (every thread) of the timed part; CPU is the steadier figure on a
shared machine. Run on an idle machine, without PYTHONDONTWRITEBYTECODE.

Run: uv run python bench/plan_scale.py [--jobs 1000 5000] [--only tree typed ...]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child_plan(stack_file: str, dump: str) -> None:
    import pulumi  # noqa: F401 - imported before the clock starts, as in child_raw (~0.13 s)

    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner

    t0, c0 = time.perf_counter(), time.process_time()
    ref = stackfile.resolve(None, Path(stack_file))
    plan = planner.run(stackfile.load(ref), ref.name)
    figures = measured(time.perf_counter() - t0, time.process_time() - c0, len(plan.resources))  # before the dump below, which is this script's, not plan's
    Path(dump).write_text(json.dumps({"resources": [
        {"urn": r.urn, "type": r.type, "name": r.name, "custom": r.custom, "inputs": r.inputs, "parent": r.parent,
         "provider": r.provider.rsplit("::", 1)[0] if r.provider else None, "protect": r.protect,
         "deleteBeforeReplace": r.delete_before_replace, "dependsOn": list(r.dependencies),
         "ignoreChanges": list(r.ignore_changes)} for r in plan.resources]}))
    print(json.dumps(figures))


def _snake_keys(value):
    """Wire (camelCase) keys -> the provider SDK's Python names, nested ``*ArgsDict`` keys included."""
    if isinstance(value, dict):
        return {re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", k).lower() if re.fullmatch(r"[a-z][A-Za-z0-9]*", k) else k:
                _snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


def child_raw(dump: str, region: str, project: str, mode: str) -> None:
    """Register the recorded resources with plain values (no Output chains, no transformation, no recording).

    ``flat``: bare ``CustomResource``/``ComponentResource`` with no parents, options or providers;
    ``tree``: the same with the same parents, explicit provider, options and dependencies, and
    ``register_outputs`` on every component (the registrations the engine gets from `plan`);
    ``typed``: ``tree`` through the provider SDK's own classes (``pulumi_gcp.compute.Instance(...)``),
    as a hand-written Pulumi program of these resources would declare them."""
    import importlib

    import pulumi

    from cli.plan import runtime
    from cli.plan.mocks import _mock_outputs

    resources = json.loads(Path(dump).read_text())["resources"]
    mode, *flags = mode.split("+")
    if "nogc" in flags:  # as `plan` evaluates the program (cli.plan.runtime.no_cyclic_gc)
        gc.disable()
    shortcuts = contextlib.ExitStack()  # left open: the process ends after the measurement
    if "short" in flags:  # plan's other SDK shortcuts: no stack walk per resource, no debug messages
        shortcuts.enter_context(runtime.no_source_positions())
        shortcuts.enter_context(runtime.no_debug_log())
    t0, c0 = time.perf_counter(), time.process_time()

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            return _mock_outputs(args.typ, args.name, args.inputs, project, region)

        def call(self, args):
            return {}  # the GCP bench stack makes no invokes

    pulumi.runtime.set_mocks(Mocks(), project="spotctl", stack="bench", preview=False)

    tree, typed = mode in ("tree", "typed"), mode == "typed"

    def typed_class(token: str):
        package, module, cls = token.split(":")[0], token.split(":")[1].split("/")[0], token.split(":")[-1]
        return getattr(importlib.import_module(f"pulumi_{package}" + (f".{module}" if module != "index" else "")), cls)

    @pulumi.runtime.test
    def register():
        made: dict[str, pulumi.Resource] = {}
        outs = []
        for r in resources:
            if r["type"].startswith("pulumi:providers:"):
                if typed:
                    package = r["type"].split(":")[-1]
                    made[r["urn"]] = importlib.import_module(f"pulumi_{package}").Provider(r["name"], **_snake_keys(r["inputs"]))
                elif tree:
                    made[r["urn"]] = pulumi.ProviderResource(r["type"].split(":")[-1], r["name"], dict(r["inputs"]))
                continue
            opts = None
            if tree:
                opts = pulumi.ResourceOptions(
                    parent=made.get(r["parent"]) if r["parent"] else None,
                    provider=made.get(r["provider"]) if r["provider"] else None,
                    protect=r["protect"], delete_before_replace=r["deleteBeforeReplace"],
                    depends_on=[made[u] for u in r["dependsOn"] if u in made],
                    ignore_changes=r["ignoreChanges"] or None)
            if r["custom"] and typed:
                res = typed_class(r["type"])(r["name"], opts=opts, **_snake_keys(r["inputs"]))
            elif r["custom"]:
                res = pulumi.CustomResource(r["type"], r["name"], dict(r["inputs"]), opts)
            else:
                res = pulumi.ComponentResource(r["type"], r["name"], None, opts)
                if tree:
                    res.register_outputs({})
            made[r["urn"]] = res
            outs.append(res.urn)
        return pulumi.Output.all(*outs)

    register()
    print(json.dumps(measured(time.perf_counter() - t0, time.process_time() - c0, len(resources))))


def measured(seconds: float, cpu: float, count: int) -> dict:
    """Wall and CPU seconds (every thread of the process; steadier than wall time on a loaded machine)
    of the timed part, and the process's peak resident memory so far."""
    return {"seconds": seconds, "cpu": cpu, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "resources": count}


def run(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-plan":
        return child_plan(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1 and sys.argv[1] == "--child-raw":
        return child_raw(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--only", nargs="+", metavar="MODE", help="baselines to run, by child mode (e.g. typed+nogc tree+nogc)")
    args = parser.parse_args()
    from bench._stacks import write_stack

    baselines = {  # name -> child mode: first the target's raw (plain programs), then the stricter rows
        "tree": "tree",
        "typed": "typed",
        "flat": "flat",
        "tree, GC paused as in plan": "tree+nogc",
        "typed, GC paused as in plan": "typed+nogc",
        "tree, all plan's shortcuts": "tree+nogc+short",
        "typed, all plan's shortcuts": "typed+nogc+short",
    }
    if args.only:
        baselines = {name: mode for name, mode in baselines.items() if mode in args.only}
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory() as tmp:
            stack = write_stack(Path(tmp), jobs)
            dump = str(Path(tmp) / "plan.json")
            plan = run(["--child-plan", str(stack), dump])
            print(f"{jobs} jobs, {plan['resources']} resources: plan {plan['seconds']:.2f} s wall, {plan['cpu']:.2f} s CPU, "
                  f"{plan['peak_mb']:.0f} MB peak (cyclic GC paused while the program runs)", flush=True)
            print(f"  {'baseline':<28} {'wall s':>7} {'CPU s':>7} {'MB':>6}  {'x wall':>6} {'x CPU':>6} (<= 1.15) {'x MB':>5} (<= 2)")
            for name, mode in baselines.items():
                b = run(["--child-raw", dump, "us-central1", "bench-project", mode])
                print(f"  {name:<28} {b['seconds']:7.2f} {b['cpu']:7.2f} {b['peak_mb']:6.0f}  {plan['seconds'] / b['seconds']:6.2f}"
                      f" {plan['cpu'] / b['cpu']:6.2f}           {plan['peak_mb'] / b['peak_mb']:5.2f}", flush=True)

if __name__ == "__main__":
    main()
