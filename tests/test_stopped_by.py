"""`resume` of a job the user stopped removes ``stoppedBy`` from its entry once its update is done
(no ``stoppedBy: null`` left); an interrupted resume's undo, in process or from a dead command's
proposal record, puts ``stoppedBy: user`` back, so the watcher never resumes a job the user stopped."""

from __future__ import annotations

from pathlib import Path

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError
from cli.lifecycle.stackfile import proposal, proposals


def _file(project: Path) -> Path:
    return project / "stacks" / "Pulumi.example-gcp.yaml"


def _entry(path: Path, job_id: str) -> str:
    """The job's block of the stack file, as text."""
    text = path.read_text()
    start = text.index(f"id: {job_id}")
    end = text.find("- id: ", start)
    return text[start:] if end < 0 else text[start:end]


def _job(job_id: str):
    return stackfile.load(stackfile.resolve("example-gcp", None)).job(job_id)


def _stopped(runner, pulumi_state) -> None:
    pulumi_state.seed("example-gcp")
    stopped = runner.invoke(app, ["stop", "vit-finetune", "--stack", "example-gcp", "--yes"])
    assert stopped.exit_code == 0, stopped.output
    assert _job("vit-finetune").stopped_by == "user"


def test_resume_removes_stopped_by(project, runner, pulumi_state):
    _stopped(runner, pulumi_state)
    resumed = runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--yes", "--capacity", "on-demand"])
    assert resumed.exit_code == 0, resumed.output
    job = _job("vit-finetune")
    assert (job.state.value, job.stopped_by) == ("running", None)
    assert "stoppedBy" not in _entry(_file(project), "vit-finetune")


def test_a_resume_whose_update_cannot_start_puts_stopped_by_user_back(project, runner, pulumi_state, monkeypatch):
    _stopped(runner, pulumi_state)
    before = _file(project).read_bytes()

    def up(self, targets, on_output):
        raise ApplyError("pulumi refresh failed: the backend is unreachable")

    monkeypatch.setattr(Applier, "up", up)
    resumed = runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--yes", "--capacity", "on-demand"])
    assert resumed.exit_code == 1 and "the backend is unreachable" in resumed.output
    assert _file(project).read_bytes() == before
    assert _job("vit-finetune").stopped_by == "user"


def test_a_dead_resumes_proposal_puts_stopped_by_user_back(project, runner, pulumi_state, monkeypatch):
    """The command died at its question: the next command undoes its edit from the record."""
    _stopped(runner, pulumi_state)
    path = _file(project)
    before = path.read_bytes()
    wrote = {"state": "running", "stoppedBy": None}  # as resume writes it until its update is done
    with stackfile.locked(path):
        proposal.note_proposal(path, "vit-finetune", {"state": "stopped", "stoppedBy": "user"}, wrote)
        stackfile.update_job(path, "vit-finetune", lambda current, written: dict(wrote))
        assert "stoppedBy: null" in _entry(path, "vit-finetune")
        monkeypatch.setattr(proposals, "_proposer_alive", lambda doc: False)
        proposals._drop_dead_proposal(path)
    assert path.read_bytes() == before
    assert _job("vit-finetune").stopped_by == "user"
