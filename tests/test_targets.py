"""What a job change targets, checked against Pulumi's targeted-update semantics: the stateful fake
pulumi (tests/fixtures/fake_pulumi.py, $FAKE_PULUMI_STATEFUL) keeps a state and deletes only the
targeted resources the program no longer registers, as the engine does. A resource an edit drops
must be targeted, or its VM keeps running; a target neither in the state nor in the program fails
the update; a protected disk is never deleted by a job change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.app import app
from cli.lifecycle import pipeline, stackfile
from cli.lifecycle.apply import Applier, ApplyError, change_targets, job_targets
from cli.lifecycle.states import Change, LifecycleError
from tests.conftest import pulumi_calls

VM = "gcp:compute/instance:Instance::"


def applier(project: Path, stack: str) -> Applier:
    import os

    return Applier(project, stack, Path(os.environ["SPOTCTL_PULUMI_ROOT"]))


def up_targets(log: Path) -> list[list[str]]:
    return [[c[i + 1] for i, a in enumerate(c) if a == "--target"] for c in pulumi_calls(log) if "up" in c]


# ---- the rule (pure) ---------------------------------------------------------------------------------


def held(*urns: str, protected: tuple[str, ...] = ()):
    from cli.lifecycle.apply import Held

    return Held(frozenset(), frozenset(), {u: None for u in urns}, frozenset(protected))


def test_the_targets_are_the_new_plan_and_what_it_drops_that_the_state_holds():
    asked = []

    def state():
        asked.append(1)
        return held("a", "vm", "disk")

    assert change_targets(["a", "b"], ["a", "b"], state, "j") == ["a", "b"] and not asked  # nothing dropped: no export
    assert change_targets(["a"], ["a", "vm", "never-made"], state, "j") == ["a", "vm"]  # never-made: not a target
    with pytest.raises(LifecycleError, match="job j: this change would delete protected resource.s. disk; refused"):
        change_targets(["a"], ["a", "disk"], lambda: held("a", "disk", protected=("disk",)), "j")


# ---- against the stateful fake pulumi ----------------------------------------------------------------


def test_complete_deletes_the_vms_and_keeps_the_disk(project, runner, fake_pulumi, pulumi_state):
    """Before: `complete` targeted only the new plan (no VM): Pulumi never deleted the VM (the engine
    fails the update: the VM, a child of the targeted job, 'will be destroyed but was not specified')."""
    pulumi_state.seed("example-gcp")
    assert "job-vit-finetune-n0-vm" in pulumi_state.named("-vm")
    result = runner.invoke(app, ["complete", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    assert "job-vit-finetune-n0-vm" not in pulumi_state.named("-vm")
    assert pulumi_state.named("job-vit-finetune-n0-disk") == ["job-vit-finetune-n0-disk"]  # the disk stays
    assert [o.split("::")[-1] for o in pulumi_state.ops()[-1] if o.startswith("delete")] == ["job-vit-finetune-n0-vm"]


def test_a_vm_never_created_is_not_targeted(project, runner, fake_pulumi, pulumi_state):
    """A target neither in the state nor in the program fails the whole update in Pulumi
    ("Target ... could not be found in the stack"): the old plan's VM the cloud never got is left out."""
    pulumi_state.seed("example-gcp")
    state = json.loads(pulumi_state.path.read_text())
    state["deployment"]["resources"] = [r for r in state["deployment"]["resources"] if not r["urn"].endswith("::job-vit-finetune-n0-vm")]
    pulumi_state.path.write_text(json.dumps(state))
    result = runner.invoke(app, ["complete", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    assert not [t for t in up_targets(fake_pulumi)[-1] if t.endswith("-vm")]


def test_a_move_deletes_the_old_vms_before_the_snapshot_and_leaves_one_vm_per_node(project, runner, fake_pulumi, pulumi_state, gce):
    pulumi_state.seed("example-gcp")
    events = project / "events"
    events.mkdir()
    args = ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes", "--events-dir", str(events)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "stopping every node of attempt 1 before its disks are snapshotted" in result.output
    ops = [o for up in pulumi_state.ops() for o in up]
    vms_gone = max(i for i, o in enumerate(ops) if o.startswith("delete") and VM in o and "llm-pretrain" in o)
    snapped = min(i for i, o in enumerate(ops) if o.startswith("create") and o.endswith("-snapshot"))
    assert vms_gone < snapped
    stop = pulumi_state.ops()[0]  # the stop is an update of its own: the VMs go, nothing is snapshotted yet
    assert sorted(o.split("::")[-1] for o in stop if o.startswith("delete")) == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]
    assert not [o for o in stop if "snapshot" in o]
    # Pulumi refreshes before a targeted `up --refresh` and then needs every target in the state: an
    # update that creates (the snapshots, the disks, the VMs after the stop) refreshes the rest first.
    calls = [c for c in pulumi_calls(fake_pulumi) if {"up", "refresh"} & set(c)]
    creating = [i for i, c in enumerate(calls) if "up" in c and "--refresh" not in c]
    assert creating and all("refresh" in calls[i - 1] for i in creating)
    # The new attempt started in us-central1-b: one VM per node, the old disks still there (protected).
    assert [n for n in pulumi_state.named("-vm") if "llm-pretrain" in n] == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]
    assert pulumi_state.named("job-llm-pretrain-n0-disk") == ["job-llm-pretrain-n0-disk"]
    for rank in range(2):
        (events / f"n{rank}.jsonl").write_text(json.dumps({"job": "llm-pretrain", "attempt": 2, "node": rank, "event": "started",
                                                           "time": "2026-11-22T04:00:00Z"}) + "\n")
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "the move is finished" in result.output
    disks = [n for n in pulumi_state.named("-disk") if "llm-pretrain" in n]
    assert disks == ["job-llm-pretrain-n0-m1-disk", "job-llm-pretrain-n1-m1-disk"]  # the old disks went with the release
    assert [n for n in pulumi_state.named("-vm") if "llm-pretrain" in n] == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]


def test_failover_leaves_exactly_one_vm_per_node(project, runner, fake_pulumi, pulumi_state):
    pulumi_state.seed("example-gcp")
    result = runner.invoke(app, ["failover", "vit-finetune", "--to", "spot", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    assert [n for n in pulumi_state.named("-vm") if "vit-finetune" in n] == ["job-vit-finetune-n0-vm"]


def test_a_change_that_drops_a_protected_disk_fails_and_the_file_is_restored(project, fake_pulumi, pulumi_state):
    """Before: the update ran; Pulumi refused to delete the disk midway and the file kept the edit."""
    pulumi_state.seed("example-gcp")
    ref = stackfile.resolve("example-gcp", None)
    before = ref.path.read_bytes()
    with pytest.raises(LifecycleError, match=r"job llm-pretrain: this change would delete protected resource\(s\) job-llm-pretrain-n1-disk"):
        pipeline.change_job(ref, "llm-pretrain", lambda j: Change(j.id, {"nodes": 1}, "one node"),
                              applier=applier(project, "example-gcp"))
    assert ref.path.read_bytes() == before
    assert not up_targets(fake_pulumi)
    assert pulumi_state.named("job-llm-pretrain-n1-disk") == ["job-llm-pretrain-n1-disk"]


def test_the_fake_engine_refuses_to_delete_a_protected_disk(project, fake_pulumi, pulumi_state):
    """The guard behind the rule: a targeted update that would delete a protected disk fails, the disk stays."""
    pulumi_state.seed("example-gcp")
    ref = stackfile.resolve("example-gcp", None)
    old = stackfile.load(ref)
    stackfile.update_job(ref.path, "llm-pretrain", lambda current, written: {"nodes": 1})
    targets = sorted(set(job_targets(old, "example-gcp", "llm-pretrain")))
    with pytest.raises(ApplyError) as exc:
        applier(project, "example-gcp").up(targets, lambda line: None)
    assert "cannot be deleted" in exc.value.detail and "because it is protected" in exc.value.detail
    assert pulumi_state.named("job-llm-pretrain-n1-disk") == ["job-llm-pretrain-n1-disk"]


def test_the_fake_engine_refreshes_only_what_the_state_holds(project, fake_pulumi, pulumi_state):
    """`pulumi up --refresh --target URN` of a URN the update would create fails in Pulumi's refresh
    (the targets are checked against the state before the program runs)."""
    import os
    import subprocess

    pulumi_state.seed("example-gcp")
    new = "urn:pulumi:example-gcp::spotctl::spotctl:gcp:TrainingJob$gcp:compute/snapshot:Snapshot::job-llm-pretrain-n0-m1-snapshot"
    exe = str(Path(os.environ["SPOTCTL_PULUMI_ROOT"]) / "bin" / "pulumi")
    done = subprocess.run([exe, "up", "--refresh", "--target", new, "--stack", "example-gcp"], capture_output=True, text=True)
    assert done.returncode == 255 and f"Target '{new}' could not be found in the stack." in done.stderr
