"""How far a reader follows one job_id through a change: the pipeline's steps in order, and every call
from the pipeline module into another spotctl module (a hop), counted per module, plus the calls that
climb back into the pipeline from below (its own callbacks, handed down). Not a timing: counts.

One `resume --force` of a failed job and one `cleanup` of a completed job, asked and answered yes, on
a generated stack, with a recording applier (no Pulumi, no cloud): every step runs, update included.

Run: uv run python bench/change_hops.py
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stacks import write_stack  # noqa: E402

OURS = ("cli.", "infra.", "agent.")


class Applier:
    """Records nothing but lets every step run: the state holds every URN the plan names."""

    def step(self, text: str) -> None:
        pass

    def preflight(self) -> None:
        pass

    def exclusive(self, path):
        return contextlib.nullcontext()

    def unprotect(self, urns) -> None:
        pass

    def protect(self, urns) -> None:
        pass

    def preview(self, targets, out) -> str:
        return ""

    def up(self, targets, out) -> None:
        pass

    def held(self):
        from cli.lifecycle.apply import Held

        class Everything(dict):
            def __contains__(self, urn: object) -> bool:
                return True

        return Held(frozenset(), frozenset(), Everything(), frozenset())


class Inventory:
    def __init__(self, disks):
        self.listed = disks

    def disks(self):
        return list(self.listed)


def traced(run) -> tuple[list[str], collections.Counter, collections.Counter]:
    """The steps announced, the hops out of the pipeline (callee module -> count), and the calls back
    into it from another spotctl module (caller module -> count)."""
    from cli.lifecycle import pipeline

    steps: list[str] = []
    out: collections.Counter = collections.Counter()
    back: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee, caller = frame.f_globals.get("__name__", ""), (frame.f_back.f_globals.get("__name__", "") if frame.f_back else "")
        if not callee.startswith(OURS) or not caller.startswith(OURS) or callee == caller:
            return
        if caller == "cli.lifecycle.pipeline":
            out[callee] += 1
        elif callee == "cli.lifecycle.pipeline":
            back[caller] += 1

    pipeline.on_step = steps.append
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return steps, out, back


def report(name: str, steps: list[str], out: collections.Counter, back: collections.Counter) -> None:
    print(f"{name}: steps {' -> '.join(steps)}")
    print(f"  hops out of cli.lifecycle.pipeline: {sum(out.values())} calls into {len(out)} modules")
    for module, n in out.most_common():
        print(f"    {n:4d}  {module}")
    print(f"  calls back into the pipeline from below: {sum(back.values())} "
          f"({', '.join(f'{m} {n}' for m, n in back.most_common()) or 'none'})")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_stack(Path(tmp), 20)
        text = path.read_text()
        path.write_text(text.replace("    - id: job-0000\n", "    - id: job-0000\n", 1)
                        .replace("state: preempted", "state: failed", 1).replace("state: running", "state: completed", 1))
        os.chdir(tmp)
        from cli.cloud import CloudDisk
        from cli.lifecycle import pipeline, stackfile
        from cli.lifecycle.states import decide_resume
        from infra.naming import disk_name, gcp_labels, stack_slug

        ref = stackfile.resolve("bench", None)
        cfg = stackfile.load(ref)
        failed = next(j.id for j in cfg.jobs if j.state.value == "failed")
        done = next(j.id for j in cfg.jobs if j.state.value == "completed")
        report(f"resume --force {failed}", *traced(lambda: pipeline.change_job(
            ref, failed, lambda j: decide_resume(j, [], force=True), applier=Applier(), out=lambda line: None,
            confirm=lambda question: True)))
        job = cfg.job(done)
        disks = [CloudDisk(disk_name(stack_slug("bench"), done, 0), job.zone, {**gcp_labels("bench", {}, job=done), "spotctl-node": "0"})]
        report(f"cleanup {done}", *traced(lambda: pipeline.remove_job(
            ref, done, force=False, applier=Applier(), inventory=lambda c: Inventory(disks), out=lambda line: None,
            confirm=lambda question: True)))


if __name__ == "__main__":
    main()
