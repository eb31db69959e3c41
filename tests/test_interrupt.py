"""An edit waiting for its confirmation is only a proposal: Ctrl-C, SIGTERM, SIGHUP or the end of
input at the question (or during the preview) put the stack file back byte for byte, as answering
no does, with the signal's exit code. Through CliRunner (the end of input) and through a real
process in a pty (pexpect) sent the signal at the question."""

from __future__ import annotations

import io
import signal
import sys
from pathlib import Path

import pexpect
import pytest

import cli.commands as commands
from cli.app import app
from cli.lifecycle import pipeline
from tests.test_confirm import verbs
from tests.test_terminal_session import ROOT, expect_or_dump, session, updates


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
    with pytest.raises(pipeline.Interrupted) as caught:
        pipeline.change_job(ref, "diffusion", lambda job: decide_resume(job, []), applier=applier_for(ref, False),
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
    expect_or_dump(child, pexpect.EOF, transcript)
    child.close()
    assert child.exitstatus == 128 + sig, transcript.getvalue()
    assert updates(log) == ["preview"]
    assert path.read_bytes() == before


def test_ctrl_c_at_the_question_is_heard_when_sigint_was_inherited_as_ignored(tmp_path):
    """A command started from a script's background job inherits SIGINT ignored (bash does that, and
    Python then installs no handler): Ctrl-C typed at the question still answers it (once, a whole
    suite started that way hung here for 90 s)."""
    project, spotctl, log, transcript = session(tmp_path)
    path = project / "stacks" / "Pulumi.team-a.yaml"
    before = path.read_bytes()
    child = spotctl("complete", "vit-finetune", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    child.expect(r"\[y/N\]: ")
    child.sendintr()
    expect_or_dump(child, r"job vit-finetune: interrupted \(SIGINT\) before the update started: the edit was undone",
                   transcript, timeout=30)
    expect_or_dump(child, pexpect.EOF, transcript)
    child.close()
    assert child.exitstatus == 130, transcript.getvalue()
    assert updates(log) == ["preview"] and path.read_bytes() == before


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


def asking_script(script: Path) -> tuple[pexpect.spawn, io.StringIO]:
    """``script`` (which asks through ``cli.commands._ask``) started in a pty, with its transcript."""
    transcript = io.StringIO()
    child = pexpect.spawn(sys.executable, [str(script)], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                                                              "PYTHONFAULTHANDLER": "1"}, encoding="utf-8", timeout=30)
    child.logfile_read = transcript
    return child, transcript


def test_a_signal_that_misses_the_read_at_the_question_is_still_heard(tmp_path):
    """CPython runs a Python handler only between bytecodes or when a blocked read() is interrupted: a
    SIGTERM landing after the prompt but before input()'s read() (once in a loaded suite run) left the
    question waiting for Enter forever. A signal caught on another thread never interrupts the main
    thread's read either, which makes that race deterministic here. The question's wait wakes every 0.2 s."""
    script = tmp_path / "ask.py"
    script.write_text(
        "import signal, sys, threading, time\n"
        "from cli.commands import _ask\n"
        "from cli.lifecycle.interrupts import Signalled, signals_raise\n"
        "def late():\n"
        "    time.sleep(0.5)  # the main thread waits for the answer by now\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # caught here; the main thread's read goes on\n"
        "with signals_raise():\n"
        "    threading.Thread(target=late).start()\n"
        "    try:\n"
        "        _ask('Proceed?')\n"
        "    except Signalled as exc:\n"
        "        print('heard', exc.signum)\n"
        "        sys.exit(3)\n")
    child, transcript = asking_script(script)
    child.expect(r"Proceed\? \[y/N\]: ")
    expect_or_dump(child, "heard 15", transcript, timeout=20)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3, transcript.getvalue()


@pytest.mark.parametrize(("typed", "answer"), [("y\r", True), ("yes\r", True), ("n\r", False), ("\r", False), ("maybe\ry\r", True)])
def test_the_question_on_a_terminal_reads_the_answer_as_click_does(tmp_path, typed, answer):
    script = tmp_path / "ask.py"
    script.write_text("from cli.commands import _ask\nprint('answer', _ask('Proceed?'))\n")
    child, _ = asking_script(script)
    child.expect(r"Proceed\? \[y/N\]: ")
    child.send(typed)
    child.expect(f"answer {answer}")
    if typed.startswith("maybe"):
        assert "Error: invalid input" in child.before
    child.expect(pexpect.EOF)


def test_two_answers_typed_at_once_answer_two_questions_out_of_line_mode(tmp_path):
    """Out of line mode (a terminal in cbreak mode) one read hands over every line typed so far: the
    second answer is kept for the second question (a move asks once per step), not left in a buffer
    the wait for the next answer cannot see."""
    script = tmp_path / "ask.py"
    script.write_text("import sys, tty\ntty.setcbreak(sys.stdin.fileno())\nfrom cli.commands import _ask\n"
                      "import time\nprint('ready', flush=True)\ntime.sleep(0.5)\n"
                      "print('first', _ask('One?'))\nprint('second', _ask('Two?'))\n")
    child, transcript = asking_script(script)
    child.expect("ready")
    child.send("y\nn\n")  # both before the first question is asked
    expect_or_dump(child, "first True", transcript, timeout=20)
    expect_or_dump(child, "second False", transcript, timeout=20)
    child.expect(pexpect.EOF)
