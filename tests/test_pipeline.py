"""Every applying command goes through the change pipeline's steps in order (recorded through
``pipeline.on_step``), and an update that cannot start runs the undo step, leaving the stack file
byte for byte as it was. Real stack files, the fake pulumi."""

from __future__ import annotations

import pytest

import cli.commands as commands
import cli.commands.cleanup as cleanup_commands
from cli.app import app
from cli.lifecycle import pipeline
from cli.lifecycle.apply import Applier, ApplyError
from tests.conftest import pulumi_calls

ASKED = ["observe", "decide", "preview", "confirm", "write", "apply"]
UNASKED = ["observe", "decide", "preview", "write", "apply"]


@pytest.fixture
def steps(monkeypatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(pipeline, "on_step", seen.append)
    return seen


@pytest.fixture
def tty(monkeypatch):
    monkeypatch.setattr(commands, "interactive", lambda: True)
    monkeypatch.setattr(cleanup_commands, "interactive", lambda: True)


@pytest.mark.parametrize("args", [
    ["resume", "diffusion", "--stack", "example-aws"],
    ["failover", "sweep-07", "--stack", "example-aws", "--to", "on-demand"],
    ["complete", "vit-finetune", "--stack", "example-gcp"],
    ["stop", "vit-finetune", "--stack", "example-gcp"],
    ["launch", "--id", "sweep-08", "--machine", "g2-standard-8", "--gpus", "nvidia-l4:1", "--command", "python train.py",
     "--stack", "example-gcp"],
], ids=lambda a: a[0])
def test_each_applying_command_goes_through_the_steps_in_order(project, runner, fake_pulumi, tty, steps, args):
    result = runner.invoke(app, args, input="y\n")
    assert result.exit_code == 0, result.output
    assert steps == ASKED
    assert any("up" in c for c in pulumi_calls(fake_pulumi))


def test_a_move_goes_through_the_steps_for_each_of_its_changes(project, runner, fake_pulumi, pulumi_state, gce, steps):
    pulumi_state.seed("example-gcp")
    (project / "events").mkdir()
    result = runner.invoke(app, ["move", "llm-pretrain", "--to-zone", "us-central1-b", "--stack", "example-gcp", "--yes",
                                 "--events-dir", str(project / "events")])
    assert result.exit_code == 0, result.output
    runs = " ".join(steps).split("observe ")[1:]
    assert len(runs) >= 3 and all(("observe " + run).split() == UNASKED for run in runs), steps


@pytest.mark.parametrize("yes", [True, False], ids=["yes", "asked"])
def test_an_update_that_cannot_start_runs_undo_and_leaves_the_file_as_it_was(project, runner, fake_pulumi, tty, steps,
                                                                              monkeypatch, yes):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_bytes()

    def up(self, targets, on_output):
        raise ApplyError("pulumi refresh failed: the backend is unreachable")  # before the update began

    monkeypatch.setattr(Applier, "up", up)
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", *(["--yes"] if yes else [])], input="y\n")
    assert result.exit_code == 1 and "pulumi refresh failed: the backend is unreachable" in result.output
    assert steps == [*(UNASKED if yes else ASKED), "undo"]
    assert path.read_bytes() == before


@pytest.mark.parametrize("yes", [True, False], ids=["yes", "asked"])
def test_cleanup_goes_through_the_steps_in_order(project, runner, fake_pulumi, pulumi_state, gce, tty, steps, yes):
    pulumi_state.seed("example-gcp")
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", *(["--yes"] if yes else [])], input="y\n")
    assert result.exit_code == 0, result.output
    assert steps == (UNASKED if yes else ASKED)
    assert not [u for u in pulumi_state.resources() if "bert-eval" in u]


def test_a_cleanup_whose_update_cannot_start_runs_undo_and_leaves_the_file_as_it_was(project, runner, fake_pulumi,
                                                                                    pulumi_state, gce, steps, monkeypatch):
    pulumi_state.seed("example-gcp")
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_bytes()

    def up(self, targets, on_output):
        raise ApplyError("pulumi refresh failed: the backend is unreachable")  # before the update began

    monkeypatch.setattr(Applier, "up", up)
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "the cleanup's update did not start: the job is kept in the stack file" in result.output
    assert steps == [*UNASKED, "undo"]
    assert path.read_bytes() == before


def test_a_declined_cleanup_stops_at_the_question(project, runner, fake_pulumi, pulumi_state, tty, steps):
    pulumi_state.seed("example-gcp")
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp"], input="n\n")
    assert result.exit_code == 0 and result.stdout.endswith("nothing changed (not confirmed)\n")
    assert steps == ["observe", "decide", "preview", "confirm"]


def test_a_launch_of_an_id_the_stack_has_is_refused_by_decide(project, steps):
    """The check that the id is free is the decide step's, under the lock (the command's early check
    before packing code is a courtesy): nothing is written."""
    from cli.lifecycle import launch, stackfile
    from cli.lifecycle.states import LifecycleError

    ref = stackfile.resolve("example-gcp", None)
    before = ref.path.read_bytes()
    entry = {"id": "vit-finetune", "machineType": "g2-standard-8", "zone": "us-central1-a", "command": "python train.py"}
    with pytest.raises(LifecycleError, match=r"job vit-finetune already exists in .* \(state running, attempt 3\)"):
        pipeline.change_job(ref, "vit-finetune", launch.first_attempt, applier=None, new=entry)
    assert steps == ["observe", "decide"] and ref.path.read_bytes() == before


def test_a_launch_whose_update_cannot_start_takes_the_entry_out_again(project, runner, fake_pulumi, steps, monkeypatch):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_bytes()

    def up(self, targets, on_output):
        raise ApplyError("pulumi refresh failed: the backend is unreachable")  # before the update began

    monkeypatch.setattr(Applier, "up", up)
    result = runner.invoke(app, ["launch", "--id", "sweep-08", "--machine", "g2-standard-8", "--command", "python train.py",
                                 "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "job sweep-08 was taken out of stacks/Pulumi.example-gcp.yaml again" in result.output
    assert steps == [*UNASKED, "undo"] and path.read_bytes() == before
