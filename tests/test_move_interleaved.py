"""A move interleaved with resume, failover, watch, complete and cleanup, each possibly killed (kill -9)
before or after any of its updates, against the stateful fake `pulumi`: no disk that holds an
attempt's work no other disk holds is ever deleted while its job is in the stack file.

Each disk's lineage is the set of attempts whose work it holds: an attempt's VMs write to the disks
they attach (the stack file at that update says which: the generation its zone history counts), a
snapshot copies its disk's lineage, and a disk restored from it starts with that lineage."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.lifecycle import apply, stackfile

JOB = "llm-pretrain"
NODES = 2
DISK = re.compile(rf"::job-{JOB}-n(\d)(?:-m(\d+))?-disk$")
SNAP = re.compile(rf"::job-{JOB}-n(\d)-m(\d+)-snapshot$")


class Killed(BaseException):
    """kill -9: nothing after it runs in that command (no undo, no mark cleared)."""


@dataclass
class Lineage:
    disks: dict[tuple[int, int], set[int]] = field(default_factory=dict)  # (node, generation) -> attempts
    snaps: dict[tuple[int, int], set[int]] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)

    def after_up(self, job, targets: list[str], before: set[str], after: set[str]) -> None:
        for urn in sorted(after - before):
            if m := SNAP.search(urn):
                node, gen = int(m[1]), int(m[2])
                self.snaps[(node, gen)] = set(self.disks.get((node, gen - 1), set()))
        for urn in sorted(after - before):
            if m := DISK.search(urn):
                node, gen = int(m[1]), int(m[2] or 0)
                self.disks[(node, gen)] = set(self.snaps.get((node, gen), set()))
        if job is not None and job.state.value == "running":
            gen = sum(not s.same_disk for s in job.zone_history)
            for node in range(job.nodes):
                vm = f"::job-{JOB}-n{node}-vm"
                if any(t.endswith(vm) for t in targets) and any(u.endswith(vm) for u in after):
                    self.disks.setdefault((node, gen), set()).add(job.attempt)
        for urn in sorted(before - after):
            if (m := DISK.search(urn)) and job is not None:  # (a job out of the file: its cleanup, decided done)
                node, gen = int(m[1]), int(m[2] or 0)
                gone = self.disks.pop((node, gen), set())
                kept = set().union(*(a for (n, _), a in self.disks.items() if n == node))
                if gone - kept:
                    self.lost.append(f"{urn.rsplit('::', 1)[-1]} held attempt(s) {sorted(gone - kept)} no other disk holds")


def _job_in_file():
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    return next((j for j in cfg.jobs if j.id == JOB), None)


STEP = st.one_of(
    st.tuples(st.just("move"), st.one_of(st.none(), st.integers(1, 5)), st.booleans()),
    st.tuples(st.sampled_from(["resume", "resume-force", "failover", "watch", "complete", "cleanup"]),
              st.one_of(st.none(), st.integers(1, 2)), st.booleans()),
    st.tuples(st.sampled_from(["preempted", "started"]), st.none(), st.just(False)),
)

# The data loss found by hand: the move killed before its restore step's update, a resume, the move finished.
LOSS = [("move", 3, True), ("resume-force", None, False), ("move", None, False), ("started", None, False),
        ("move", None, False)]
# The same through failover, the move killed after its snapshot step applied, and a watcher.
LOSS_FAILOVER = [("move", 2, False), ("failover", None, False), ("watch", None, False), ("started", None, False),
                 ("watch", None, False), ("move", None, False)]


@pytest.fixture
def interleaved(project, runner, fake_pulumi, pulumi_state, gce, monkeypatch):
    pristine = {p: p.read_bytes() for p in (project / "stacks").iterdir() if p.is_file()}
    return project, runner, fake_pulumi, pulumi_state, monkeypatch, pristine


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=2, max_size=6))
@example(steps=LOSS)
@example(steps=LOSS_FAILOVER)
def test_no_disk_with_unique_work_is_deleted(interleaved, steps):
    project, runner, log, state, monkeypatch, pristine = interleaved
    _fresh(project, log, state, pristine)
    first = _job_in_file()
    lineage = Lineage({(node, 0): {first.attempt} for node in range(NODES)})  # the seeded disks: the running attempt's
    real_up = apply.Applier.up
    kill: dict[str, object] = {}

    def up(self, targets, out):
        kill["n"] = int(kill["n"]) + 1
        if kill.get("at") == kill["n"] and kill.get("before"):
            raise Killed
        job, before = _job_in_file(), set(state.resources())
        real_up(self, targets, out)
        lineage.after_up(job, targets, before, set(state.resources()))
        if kill.get("at") == kill["n"]:
            raise Killed

    monkeypatch.setattr(apply.Applier, "up", up)
    events = project / "events"
    for kind, at, before in steps:
        kill.update(n=0, at=at, before=before)
        job = _job_in_file()
        if kind in ("preempted", "started"):
            if job is not None:
                _event(events, job.attempt, kind, range(1 if kind == "preempted" else job.nodes))
            continue
        try:
            runner.invoke(app, _args(kind, events), catch_exceptions=False)
        except Killed:
            pass
        except Exception as exc:  # noqa: BLE001 - a refusal ends as exit 1; anything else is a defect
            raise AssertionError(f"{kind} after {steps}: {exc!r}") from exc
        assert not lineage.lost, (steps, lineage.lost)
    assert not lineage.lost, (steps, lineage.lost)


def _args(kind: str, events: Path) -> list[str]:
    at = ["--stack", "example-gcp"]
    src = ["--events-dir", str(events)]
    return {
        "move": ["move", JOB, "--to-zone", "us-central1-b", *at, "--yes", *src],
        "resume": ["resume", JOB, *at, "--yes", *src],
        "resume-force": ["resume", JOB, "--force", *at, "--yes", *src],
        "failover": ["failover", JOB, *at, "--yes"],
        "watch": ["watch", *at, "--once", "--no-poll", *src],
        "complete": ["complete", JOB, *at, "--yes"],
        "cleanup": ["cleanup", JOB, *at, "--yes"],
    }[kind]


def _event(events: Path, attempt: int, kind: str, nodes) -> None:
    with (events / f"a{attempt}-{kind}.jsonl").open("a") as fh:
        for node in nodes:
            fh.write(json.dumps({"job": JOB, "attempt": attempt, "node": node, "event": kind,
                                 "time": f"2026-11-22T04:{attempt % 60:02d}:{node:02d}Z"}) + "\n")


def _fresh(project: Path, log: Path, state, pristine: dict[Path, bytes]) -> None:
    """Every example from the shipped stack file, a seeded state, no events, no side files."""
    stacks = project / "stacks"
    for p in stacks.iterdir():
        if p not in pristine:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    for p, data in pristine.items():
        p.write_bytes(data)
    for p in log.parent.glob(log.name + "*"):
        p.unlink()
    shutil.rmtree(project / "events", ignore_errors=True)
    (project / "events").mkdir()
    state.seed("example-gcp")
