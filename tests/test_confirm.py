"""Preview, then confirm: resume/failover/complete/cleanup show Pulumi's preview of the targeted
update and ask; --yes skips both, --preview-only stops after the preview, no terminal refuses.
Against the fake pulumi, which records the preview call (and the stack file it saw)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli.commands as commands
import cli.commands.cleanup as cleanup_commands
from cli.app import app
from cli.lifecycle import pipeline, stackfile
from cli.lifecycle.states import decide_failover
from tests.conftest import pulumi_calls

QUESTION = "Do you want to perform this update of job diffusion?"


@pytest.fixture
def tty(monkeypatch):
    """Answer questions as if a person sat at a terminal (CliRunner's stdin is not one)."""
    monkeypatch.setattr(commands, "interactive", lambda: True)
    monkeypatch.setattr(cleanup_commands, "interactive", lambda: True)


def verbs(log: Path) -> list[str]:
    return [next(a for a in call if not a.startswith("-")) for call in pulumi_calls(log) if call[:1] != ["version"]]


def test_resume_previews_asks_and_applies_on_yes(project, runner, fake_pulumi, tty):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws"], input="y\n")
    assert result.exit_code == 0, result.output
    preview_at = result.output.index("Previewing update (example-aws):")
    assert "+-  aws:ec2/instance:Instance" in result.output and "replace" in result.output
    assert result.output.index(QUESTION + " [y/N]: ") > preview_at
    assert result.stdout.endswith("— applied\n")
    assert [v for v in verbs(fake_pulumi) if v in ("preview", "up")] == ["preview", "up"]
    (preview,) = [c for c in pulumi_calls(fake_pulumi) if "preview" in c]
    (up,) = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    targets = lambda call: sorted(call[i + 1] for i, a in enumerate(call) if a == "--target")  # noqa: E731
    # exactly the job's resources (its component and everything under it), as planned from the edited file
    from cli.lifecycle.apply import job_urns
    from cli.plan import mocks as planner

    expected = sorted(job_urns(planner.run(stackfile.load(stackfile.resolve(None, path)), "example-aws"), "diffusion"))
    assert targets(preview) == targets(up) == expected and len(expected) >= 4
    seen = [json.loads(line) for line in Path(str(fake_pulumi) + ".stackfiles").read_text().splitlines()]
    assert "attempt: 3" in seen[0]  # the preview ran the program on the edited file
    assert "attempt: 3" in path.read_text()
    # The state is read once for the targets, the preview and the update (the lock held throughout);
    # the stack is never selected (every call names it).
    calls = pulumi_calls(fake_pulumi)
    assert [c for c in calls if c[1:3] in (["stack", "select"], ["stack", "export"]) or c == ["version"]] == [
        ["version"], ["--non-interactive", "stack", "export", "--stack", "example-aws"]]


def test_resume_answered_no_changes_nothing(project, runner, fake_pulumi, tty):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws"], input="n\n")
    assert result.exit_code == 0, result.output
    assert QUESTION in result.output
    assert result.stdout.endswith("not confirmed: nothing changed\n")
    assert "preview" in verbs(fake_pulumi) and "up" not in verbs(fake_pulumi)
    assert path.read_text() == before  # byte for byte


def test_complete_of_a_running_job_asks_before_deleting_its_vms(project, runner, fake_pulumi, tty):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["complete", "vit-finetune", "--stack", "example-gcp"], input="\n")  # default: no
    assert result.exit_code == 0, result.output
    assert "Do you want to perform this update of job vit-finetune? [y/N]: " in result.output
    assert "up" not in verbs(fake_pulumi) and path.read_text() == before


def test_preview_only_previews_and_stops(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["failover", "sweep-07", "--stack", "example-aws", "--to", "on-demand", "--preview-only", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["declined"] is True and out["applied"] is False and out["changed"] is False
    assert "Previewing update (example-aws):" in result.output and "Do you want" not in result.output
    assert verbs(fake_pulumi).count("preview") == 1 and "up" not in verbs(fake_pulumi)
    assert path.read_text() == before


def test_no_terminal_and_no_yes_refuses_before_anything(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws"])
    assert result.exit_code == 1
    assert result.output == ("error: stdin is not a terminal: pass --yes to apply without a question, "
                             "or --preview-only to only see the preview\n")
    assert pulumi_calls(fake_pulumi) == [] and path.read_text() == before


def test_yes_applies_without_preview(project, runner, fake_pulumi):
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "-y"])
    assert result.exit_code == 0, result.output
    assert "preview" not in verbs(fake_pulumi) and "up" in verbs(fake_pulumi)


def test_failed_preview_undoes_the_edit(project, runner, fake_pulumi, monkeypatch, tty):
    monkeypatch.setenv("FAKE_PULUMI_PREVIEW_EXIT", "1")
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws"], input="y\n")
    assert result.exit_code == 1 and "error: pulumi preview failed" in result.output
    assert "up" not in verbs(fake_pulumi) and path.read_text() == before


def test_automation_passes_no_confirm_and_is_never_asked(project, fake_pulumi):
    """What `watch` does: the operation itself, no confirm callback: no preview, no question."""
    ref = stackfile.resolve("example-aws", None)
    outcome = pipeline.change_job(ref, "sweep-07", lambda j: decide_failover(j, None),
                                    applier=commands.applier_for(ref, False), out=lambda line: None)
    assert outcome.applied and "preview" not in verbs(fake_pulumi)


def test_cleanup_lists_asks_and_deletes_on_yes(project, runner, fake_pulumi, pulumi_state, tty, gce):
    pulumi_state.seed("example-gcp")
    # Its disk still protected in the state (the job was marked completed by hand: never applied).
    doc = json.loads(pulumi_state.path.read_text())
    for r in doc["deployment"]["resources"]:
        r["protect"] = r["protect"] or r["urn"].endswith("::job-bert-eval-n0-disk")
    pulumi_state.path.write_text(json.dumps(doc))
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    no = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp"], input="n\n")
    assert no.exit_code == 0, no.output
    assert "  - delete gcp:compute:Disk job-bert-eval-n0-disk\n" in no.output
    assert "Delete job bert-eval's disks and resources? [y/N]: " in no.output
    assert no.stdout.endswith("nothing changed (not confirmed)\n")
    # The listing reads Pulumi's state (what a completion never applied is listed too); nothing changed it.
    assert [c for c in verbs(fake_pulumi) if c not in ("version", "stack")] == [] and path.read_text() == before
    assert [c[1:3] for c in pulumi_calls(fake_pulumi) if c[:1] != ["version"]] == [["stack", "export"]]
    yes = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp"], input="y\n")
    assert yes.exit_code == 0, yes.output
    assert verbs(fake_pulumi).index("state") < verbs(fake_pulumi).index("up")  # unprotect, then the update
    assert "bert-eval" not in {j.id for j in stackfile.load(stackfile.resolve("example-gcp", None)).jobs}


def test_resume_that_applies_finds_the_events_in_the_stacks_event_bucket_output(project, runner, fake_pulumi, moto_server,
                                                                               monkeypatch):
    """No --events-bucket, no sync: a resume that runs pulumi anyway asks it for the eventBucket output
    (on the same selected stack) and sees the running attempt's preemption there."""
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="evts")
    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket="evts", Key="example-aws/llm-pretrain/attempt-4/node-0/1-preempted.json",
        Body=json.dumps({"job": "llm-pretrain", "stack": "example-aws", "attempt": 4, "node": 0, "event": "preempted",
                         "time": "2026-11-21T10:00:00+00:00", "details": {}}).encode())
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", json.dumps({"eventBucket": "evts"}))
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-aws", "--yes", "--capacity", "spot"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("job llm-pretrain: attempt=5, state=running") and result.stdout.endswith("— applied\n")
    assert "attempt: 5" in path.read_text()
    calls = pulumi_calls(fake_pulumi)
    assert [c for c in calls if "select" in c] == []  # the stack is named, never selected
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", "{}")  # not deployed: nothing known, as before
    again = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-aws", "--yes"])
    assert again.exit_code == 0 and "nothing says it stopped" in again.stdout and "no events source was found" in again.stdout
