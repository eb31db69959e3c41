"""An edit waiting for its confirmation is only a proposal: Ctrl-C, SIGTERM, SIGHUP or the end of
input at the question (or during the preview) put the stack file back byte for byte, as answering
no does, with the signal's exit code. Through CliRunner (the end of input) and through a real
process in a pty (pexpect) sent the signal at the question."""

from __future__ import annotations

import signal
from pathlib import Path

import pexpect
import pytest

import cli.commands as commands
from cli.app import app
from cli.lifecycle import operations
from tests.test_confirm import verbs
from tests.test_terminal_session import expect_or_dump, session, updates


@pytest.fixture
def tty(monkeypatch):
    monkeypatch.setattr(commands, "interactive", lambda: True)


@pytest.mark.parametrize(("args", "stack"), [(["resume", "diffusion"], "example-aws"),
                                             (["complete", "vit-finetune"], "example-gcp"),
                                             (["move", "llm-pretrain", "--to-zone", "us-central1-b"], "example-gcp")])
def test_end_of_input_at_the_question_undoes_the_edit(project, runner, fake_pulumi, tty, args, stack):
    path = project / "stacks" / f"Pulumi.{stack}.yaml"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))  # CRLF kept too
    before = path.read_bytes()
    (project / "events").mkdir()
    extra = ["--events-dir", str(project / "events")] if args[0] == "move" else []
    result = runner.invoke(app, [*args, "--stack", stack, *extra], input="")  # EOF: click's Abort
    assert result.exit_code == 130, result.output
    assert "Do you want to perform this update of job" in result.output
    assert f"job {args[1]}: interrupted (SIGINT) before the update started: the edit was undone" in result.stderr
    assert "up" not in verbs(fake_pulumi)
    assert path.read_bytes() == before


def test_an_interruption_during_the_preview_undoes_the_edit(project, runner, fake_pulumi, tty, monkeypatch):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_bytes()

    def preview(self, targets, out):
        assert b"attempt: 3" in path.read_bytes()  # the preview sees the edit
        raise KeyboardInterrupt

    monkeypatch.setattr("cli.lifecycle.apply.Applier.preview", preview)
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws"])
    assert result.exit_code == 130 and "the edit was undone" in result.stderr
    assert path.read_bytes() == before


def test_signal_handlers_are_put_back(project, fake_pulumi, monkeypatch):
    from cli.lifecycle import stackfile

    ref = stackfile.resolve("example-aws", None)
    before = ref.path.read_bytes()
    seen = {}

    def ask(question):
        seen["term"] = signal.getsignal(signal.SIGTERM)
        signal.raise_signal(signal.SIGHUP)  # as if the terminal went away at the question
        return True

    from cli.commands import applier_for
    from cli.lifecycle.states import decide_resume

    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    with pytest.raises(operations.Interrupted) as caught:
        operations.change_job(ref, "diffusion", lambda job: decide_resume(job, []), applier=applier_for(ref, False),
                              out=lambda line: None, confirm=ask)
    assert caught.value.signum == signal.SIGHUP and "SIGHUP" in str(caught.value)
    assert seen["term"] not in old  # raised, not the default (which ends the process before the undo)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == old
    assert ref.path.read_bytes() == before


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")])
@pytest.mark.parametrize("command", ["complete", "resume"])
def test_a_signal_at_the_question_in_a_terminal_undoes_the_edit(tmp_path, sig, name, command):
    project, spotctl, log, transcript = session(tmp_path)
    path = project / "stacks" / "Pulumi.team-a.yaml"
    before = path.read_bytes()
    child = spotctl(command, "vit-finetune", *(["--events-dir", "events"] if command == "resume" else []))
    child.expect(r"Do you want to perform this update of job vit-finetune\? \[y/N\]: ")
    assert path.read_bytes() != before  # the preview ran on the edited file
    if sig == signal.SIGINT:
        child.sendintr()  # Ctrl-C typed at the terminal
    else:
        child.kill(sig)
    expect_or_dump(child, rf"job vit-finetune: interrupted \({name}\) before the update started: the edit was undone", transcript)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 128 + sig, transcript.getvalue()
    assert updates(log) == ["preview"]
    assert path.read_bytes() == before


def test_resume_after_an_interrupted_question_still_resumes(tmp_path):
    project, spotctl, log, transcript = session(tmp_path)
    child = spotctl("resume", "vit-finetune", "--events-dir", "events")
    child.expect(r"\[y/N\]: ")
    child.kill(signal.SIGTERM)
    expect_or_dump(child, pexpect.EOF, transcript)
    again = spotctl("resume", "vit-finetune", "--events-dir", "events", "--yes")
    again.expect(r"job vit-finetune: attempt=4, state=running .*— applied")
    again.expect(pexpect.EOF)
    again.close()
    assert again.exitstatus == 0, transcript.getvalue()
    assert "attempt: 4" in Path(project / "stacks" / "Pulumi.team-a.yaml").read_text()
