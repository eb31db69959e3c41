"""`spotctl launch` and `spotctl stop` on real stack files with the fake pulumi: the entry written
under the lock with the file's other lines kept, only the new job's resources applied, an existing id
refused with its state, a declined launch leaving the file byte for byte; stop then resume on the same
disk; the watcher never resuming a job the user stopped; no command changing the selected stack."""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cli import commands
from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.events import Event
from cli.watch import decide as d
from tests.conftest import pulumi_calls

NEW = ["launch", "--id", "sweep-08", "--machine", "g2-standard-8", "--gpus", "nvidia-l4:1", "--command", "python train.py",
       "--stack", "example-gcp"]


@pytest.fixture
def tty(monkeypatch):
    monkeypatch.setattr(commands, "interactive", lambda: True)


def gcp_file(project: Path) -> Path:
    return project / "stacks" / "Pulumi.example-gcp.yaml"


def targets(call: list[str]) -> list[str]:
    return sorted(call[i + 1] for i, a in enumerate(call) if a == "--target")


def job_of(job_id: str, stack: str = "example-gcp"):
    return stackfile.load(stackfile.resolve(stack, None)).job(job_id)


def test_launch_no_apply_shows_the_cost_and_writes_the_entry_after_the_last_job(project, runner):
    path = gcp_file(project)
    before = path.read_text()
    result = runner.invoke(app, [*NEW, "--job-hours", "6", "--deadline-hours", "12", "--no-apply"])
    assert result.exit_code == 0, result.output
    assert "job sweep-08  g2-standard-8" in result.output and "$0.48" in result.output and "$0.85" in result.output
    assert "job sweep-08, policy default: expected $" in result.output
    assert result.stdout.endswith("job sweep-08: written to stacks/Pulumi.example-gcp.yaml (state pending); "
                                  "`spotctl resume sweep-08` applies it\n")
    after = path.read_text()
    assert after.startswith(before)  # every line and comment as it was; the job's lines come last
    assert after[len(before):] == ("    - id: sweep-08\n"
                                   "      machineType: g2-standard-8\n"
                                   "      accelerator: {type: nvidia-l4, count: 1}\n"
                                   "      zone: us-central1-a\n"
                                   "      deadlineHours: 12\n"
                                   "      jobHours: 6\n"
                                   "      command: python train.py\n")
    assert job_of("sweep-08").state.value == "pending"


def test_an_existing_id_is_refused_with_its_state(project, runner):
    path = gcp_file(project)
    before = path.read_text()
    result = runner.invoke(app, ["launch", "--id", "vit-finetune", "--machine", "a2-highgpu-1g", "--command", "x",
                                 "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert result.output == ("error: job vit-finetune already exists in stacks/Pulumi.example-gcp.yaml (state running, "
                             "attempt 3): pick another id, or `spotctl resume vit-finetune` / `spotctl status vit-finetune`\n")
    assert path.read_text() == before


def test_a_job_file_with_a_wrong_key_is_refused_naming_the_file_and_key(project, runner, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("id: sweep-09\nmachineTyp: g2-standard-8\ncommand: python train.py\n")
    before = gcp_file(project).read_text()
    result = runner.invoke(app, ["launch", str(job_file), "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert f"error: {job_file}: machineTyp: unknown key (did you mean 'machineType'?)" in result.output
    assert gcp_file(project).read_text() == before


def test_launch_applies_only_the_new_jobs_resources(project, runner, pulumi_state):
    pulumi_state.seed("example-gcp")
    others = set(pulumi_state.resources())
    result = runner.invoke(app, [*NEW, "--yes"])
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("job sweep-08: state=running (the first attempt starts: its VMs are created on new disks) — applied\n")
    (up,) = [c for c in pulumi_calls(pulumi_state.log) if "up" in c]
    assert targets(up) and all("job-sweep-08" in t for t in targets(up))  # nothing of another job or pool
    (ops,) = pulumi_state.ops()
    assert ops and all(op.startswith("create ") and "sweep-08" in op for op in ops)
    assert set(pulumi_state.resources()) - others == {t for t in targets(up)}
    assert pulumi_state.named("-disk") == sorted([*(u.rsplit("::", 1)[-1] for u in others if u.endswith("-disk")),
                                                  "job-sweep-08-n0-disk"])
    assert job_of("sweep-08").state.value == "running" and job_of("sweep-08").applying is None


def test_a_declined_launch_leaves_the_file_as_it_was(project, runner, fake_pulumi, tty):
    path = gcp_file(project)
    before = path.read_bytes()
    result = runner.invoke(app, NEW, input="n\n")
    assert result.exit_code == 0, result.output
    assert "Do you want to perform this update of job sweep-08? [y/N]" in result.output
    assert result.stdout.endswith("job sweep-08: not confirmed: nothing changed, stacks/Pulumi.example-gcp.yaml is as it was\n")
    assert path.read_bytes() == before
    assert not any("up" in c for c in pulumi_calls(fake_pulumi))


def test_without_a_terminal_launch_refuses_before_writing(project, runner, fake_pulumi):
    before = gcp_file(project).read_bytes()
    result = runner.invoke(app, NEW)
    assert result.exit_code == 1 and "stdin is not a terminal: pass --yes" in result.output
    assert gcp_file(project).read_bytes() == before and pulumi_calls(fake_pulumi) == []


def test_stop_then_resume_round_trip_on_the_same_disk(project, runner, pulumi_state):
    pulumi_state.seed("example-gcp")
    disk = "job-vit-finetune-n0-disk"
    stopped = runner.invoke(app, ["stop", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.startswith("job vit-finetune: state=stopped, stoppedBy=user (spotctl stop: the user stops")
    job = job_of("vit-finetune")
    assert (job.state.value, job.stopped_by, job.attempt) == ("stopped", "user", 3)
    (ops,) = pulumi_state.ops()
    assert [op.rsplit("::", 1)[-1] for op in ops if op.startswith("delete ")] == ["job-vit-finetune-n0-vm"]
    assert not any(op.startswith("create ") for op in ops)
    assert disk in pulumi_state.named("-disk") and not pulumi_state.named("job-vit-finetune-n0-vm")
    again = runner.invoke(app, ["stop", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert again.exit_code == 0 and "is already stopped by the user" in again.stdout
    resumed = runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--yes", "--capacity", "on-demand"])
    assert resumed.exit_code == 0, resumed.output
    job = job_of("vit-finetune")
    assert (job.state.value, job.stopped_by, job.attempt) == ("running", None, 4)
    *_, last = pulumi_state.ops()
    assert any(op.startswith("create ") and op.endswith("job-vit-finetune-n0-vm") for op in last)
    assert [op.split()[0] for op in last if op.endswith(f"::{disk}")] == ["update"]  # the same disk, kept
    assert disk in pulumi_state.named("-disk")


def test_stop_is_refused_for_a_completed_job(project, runner):
    result = runner.invoke(app, ["stop", "bert-eval", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1 and result.output == "error: job bert-eval is completed: it has no VMs to stop\n"


T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def test_the_watcher_never_resumes_a_job_the_user_stopped(project, runner):
    assert runner.invoke(app, ["stop", "vit-finetune", "--stack", "example-gcp", "--no-apply"]).exit_code == 0
    job = job_of("vit-finetune")
    seen = [d.seen(Event("vit-finetune", 3, 0, kind, T0 + timedelta(minutes=m), {}), "test")
            for kind, m in (("started", 0), ("stopped", 5))]
    action, _ = d.decide_job(job, seen, d.JobMemory(), set(), T0)
    assert action is None
    # A stop of the infrastructure (no stoppedBy) is resumed, as before.
    action, _ = d.decide_job(job.model_copy(update={"stopped_by": None}), seen, d.JobMemory(), set(), T0)
    assert action is not None and action.kind == "resume"


def test_a_watcher_that_decided_before_the_users_stop_does_not_resume_it(project, runner, tmp_path):
    """The watcher decided to resume (a preemption of the running job); the user's stop lands before its
    act step takes the lock: the act step decides again on the file as it is then and does nothing."""
    from cli.watch.act import act
    from cli.watch.journal import Journal

    ref = stackfile.resolve("example-gcp", None)
    events = [Event("vit-finetune", 3, 0, "started", T0, {}), Event("vit-finetune", 3, 0, "preempted", T0 + timedelta(minutes=5), {})]
    action, _ = d.decide_job(job_of("vit-finetune"), [d.seen(e, "test") for e in events], d.JobMemory(), set(), T0)
    assert action.kind == "resume"
    assert runner.invoke(app, ["stop", "vit-finetune", "--stack", "example-gcp", "--no-apply"]).exit_code == 0
    result = act(ref, action, events, Journal(tmp_path / "journal.json"), applier=None, choose=lambda j, e: j.capacity,
                 now=T0, rng=random.Random(0), out=lambda line: None)
    assert result.status == "noop" and "stopped by the user" in result.detail
    job = job_of("vit-finetune")
    assert (job.state.value, job.stopped_by, job.attempt) == ("stopped", "user", 3)


def selection_file(project: Path) -> Path:
    digest = hashlib.sha1(str(project.resolve() / "Pulumi.yaml").encode()).hexdigest()
    return project / "pulumi-home" / "workspaces" / f"spotctl-{digest}-workspace.json"


def test_no_command_changes_the_selected_stack(project, runner, fake_pulumi):
    """The user selected another stack; resume, failover, complete, launch and stop of example-aws (and
    launch with --no-apply, then stop) leave Pulumi's workspace file byte for byte as it was."""
    path = selection_file(project)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"stack": "example-gcp"}))
    before = path.read_bytes()
    for args in (["resume", "diffusion"], ["failover", "llm-pretrain", "--to", "on-demand"], ["complete", "sweep-07"],
                 ["launch", "--id", "new-one", "--machine", "g5.2xlarge", "--command", "python train.py"],
                 ["stop", "new-one"]):
        result = runner.invoke(app, [*args, "--stack", "example-aws", "--yes"])
        assert result.exit_code == 0, (args, result.output)
        assert path.read_bytes() == before, args
    calls = pulumi_calls(fake_pulumi)
    # (6 updates: the two-node llm-pretrain's failover stops its gang first)
    assert sum("up" in c for c in calls) == 6 and not any("select" in c for c in calls)
    assert all("--stack" in c for c in calls if c[:1] != ["version"])  # every call names the stack


def test_the_fake_pulumi_records_a_selection_as_pulumi_does(project, fake_pulumi):
    """What the test above guards against: `pulumi stack select` rewrites the workspace file."""
    import os
    import subprocess

    exe = Path(os.environ["SPOTCTL_PULUMI_ROOT"]) / "bin" / "pulumi"
    subprocess.run([str(exe), "stack", "select", "--stack", "example-aws"], cwd=project, check=True)
    assert json.loads(selection_file(project).read_text()) == {"stack": "example-aws"}


def test_a_second_launch_of_the_same_id_meanwhile_is_refused(project):
    """Both commands checked the id before either wrote: the pipeline's decide, under the lock, refuses the second."""
    from cli.lifecycle import launch, pipeline
    from cli.lifecycle.states import LifecycleError

    ref = stackfile.resolve("example-gcp", None)
    entry = {"id": "twice", "machineType": "g2-standard-8", "zone": "us-central1-a", "command": "python train.py"}
    launch.check_new(ref, entry, "test")
    launch.check_new(ref, entry, "test")
    pipeline.change_job(ref, "twice", launch.first_attempt, applier=None, new=entry)
    before = ref.path.read_bytes()
    with pytest.raises(LifecycleError, match=r"job twice already exists in stacks/Pulumi.example-gcp.yaml \(state pending, attempt 1\)"):
        pipeline.change_job(ref, "twice", launch.first_attempt, applier=None, new=entry)
    assert [j.id for j in stackfile.load(ref).jobs].count("twice") == 1 and ref.path.read_bytes() == before


def test_a_state_in_the_job_file_is_refused(project, runner, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text("id: sweep-09\nmachineType: g2-standard-8\ncommand: x\nstate: running\n")
    result = runner.invoke(app, ["launch", str(job_file), "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert result.output == f"error: {job_file}: state: a new job is pending until launch applies it: remove the key\n"


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\x00"), min_size=1, max_size=60)
       .filter(lambda c: c.strip() == c and c))
def test_any_command_is_written_as_given_and_the_rest_of_the_file_kept(project, command):
    from cli.lifecycle import launch, pipeline

    ref = stackfile.resolve("example-gcp", None)
    path = gcp_file(project)
    original = path.read_text()
    entry = {"id": "any", "machineType": "g2-standard-8", "zone": "us-central1-a", "command": command}
    try:
        launch.check_new(ref, entry, "test")
        pipeline.change_job(ref, "any", launch.first_attempt, applier=None, new=entry)
        assert stackfile.load(ref).job("any").command == command
        assert path.read_text().startswith(original)  # spliced after the last job: every other line as it was
    finally:
        path.write_text(original)
