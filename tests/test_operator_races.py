"""What an operator does between a command's edit and its update: a kill -9 while the targets are
planned, a hand edit (an editor saving its older copy) at the question, a watcher cycle while the
question waits, one stack file named by two paths (a symbolic link), a preemption notice seen before
the VM is gone, and a completed job's disks after ``cleanup --no-apply``. Found by an operator audit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli import commands
from cli.app import app
from cli.lifecycle import stackfile
from tests.test_watch import AWS_STACK, events_file, the_job, ups, watch

ROOT = Path(__file__).resolve().parent.parent
PREEMPTED = (("train", 3, 0, "started", 0), ("train", 3, 0, "preempted", 30))


@pytest.fixture
def aws_stack(project: Path) -> Path:
    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text(AWS_STACK)
    return path


def test_a_kill_while_the_targets_are_planned_leaves_a_mark_the_next_command_applies(aws_stack, runner, fake_pulumi, tmp_path):
    """`resume --yes` edits the file, then plans the job's resources (seconds) before its update: a
    kill -9 there left `attempt 4, running` with no `applying` mark, and nothing ever started it."""
    ev = events_file(tmp_path / "ev.jsonl", *PREEMPTED)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from cli.lifecycle import operations
        operations.job_targets = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        from cli.app import app
        sys.argv = ["spotctl", "resume", "train", "--stack", "team", "--events-dir", {str(ev)!r}, "--yes"]
        app()
    """))
    killed = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, env=os.environ.copy(), timeout=120)
    assert killed.returncode == -9, killed.stderr
    job = the_job()
    assert (job.attempt, job.state.value) == (4, "running") and job.applying and "attempt=4" in job.applying
    assert not ups(fake_pulumi)
    status = runner.invoke(app, ["status", "train", "--stack", "team", "--events-dir", str(ev)])
    assert "update-pending" in status.output, status.output
    again = runner.invoke(app, ["resume", "train", "--stack", "team", "--events-dir", str(ev), "--yes"])
    assert again.exit_code == 0, again.output
    assert len(ups(fake_pulumi)) == 1 and the_job().applying is None and the_job().attempt == 4  # applied once, no attempt 5


def test_a_hand_edit_at_the_question_is_not_applied_and_not_reported_as_done(aws_stack, runner, fake_pulumi, tmp_path, monkeypatch):
    """An editor opened before the command saves its buffer (attempt 3, a changed command) while the
    question waits: the yes applied that unpreviewed file and reported attempt 4 as applied."""
    ev = events_file(tmp_path / "ev.jsonl", *PREEMPTED)
    original = aws_stack.read_text()
    edited = original.replace("command: python train.py", "command: python train.py --lr 3e-4")

    def ask(question: str) -> bool:
        aws_stack.write_text(edited)
        return True

    monkeypatch.setattr(commands, "interactive", lambda: True)
    monkeypatch.setattr(commands, "_ask", ask)
    result = runner.invoke(app, ["resume", "train", "--stack", "team", "--events-dir", str(ev)])
    assert result.exit_code == 1, result.output
    assert "job train: the stack file changed while this command ran" in result.output and "Nothing was applied" in result.output
    assert not ups(fake_pulumi)  # previews only
    assert aws_stack.read_text() == edited  # the hand edit stands, untouched


def test_a_watcher_cycle_during_the_question_leaves_the_job_to_the_answer(aws_stack, runner, fake_pulumi, tmp_path, monkeypatch):
    """While `resume` waits for its answer, the file holds attempt 4: a watcher cycle then marked the
    attempt-3 preemption stale (handled for good), so after a no the job was never resumed."""
    ev = events_file(tmp_path / "ev.jsonl", *PREEMPTED)
    during: list[dict] = []

    def ask(question: str) -> bool:
        # Another spotctl process on this machine: the proposal record names this (live) process.
        cycle = subprocess.run([sys.executable, "-m", "cli", "watch", "--stack", "team", "--once", "--json", "--no-poll",
                                "--no-apply", "--events-dir", str(ev)], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        during.extend(__import__("json").loads(line) for line in cycle.stdout.splitlines() if line.startswith("{"))
        return False

    monkeypatch.setattr(commands, "interactive", lambda: True)
    monkeypatch.setattr(commands, "_ask", ask)
    declined = runner.invoke(app, ["resume", "train", "--stack", "team", "--events-dir", str(ev)])
    assert declined.exit_code == 0 and the_job().attempt == 3, declined.output
    assert [(r["job"], r["kind"]) for r in during if r["action"] == "record"] == [("train", "held")], during
    assert not [r for r in during if r["action"] != "record"]
    result, lines = watch(runner, "--no-poll", "--events-dir", str(ev))
    assert result.exit_code == 0 and [(r["job"], r["action"], r["result"]) for r in lines if r["action"] != "record"] == \
        [("train", "resume", "applied")], result.output
    assert the_job().attempt == 4


def test_a_stack_file_named_through_a_link_shares_its_lock(project):
    """Two paths to one file (a link and its target) took two locks: concurrent edits lost one another's."""
    shared = project / "shared"
    shared.mkdir()
    target = shared / "Pulumi.example-gcp.yaml"
    (project / "stacks" / "Pulumi.example-gcp.yaml").rename(target)
    link = project / "stacks" / "Pulumi.example-gcp.yaml"
    link.symlink_to(os.path.relpath(target, link.parent))
    assert stackfile.lock_path(link) == stackfile.lock_path(target) == shared / ".Pulumi.example-gcp.yaml.lock"
    from cli.watch.journal import lease_path

    assert lease_path(link) == lease_path(target)
    probe = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from cli.lifecycle import stackfile
        try:
            with stackfile.locked(__import__("pathlib").Path({str(target)!r}), timeout=0.2):
                print("free")
        except Exception as exc:
            print("held", exc)
    """)
    with stackfile.locked(link):  # this process holds it through the link: another, through the target, waits
        other = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert other.stdout.startswith("held"), other.stdout + other.stderr


def test_a_notice_alone_is_preempting_not_needs_resume(aws_stack, runner, fake_pulumi, tmp_path):
    """A notice: the VM checkpoints until it is gone. `resume` replaced it at once (the watcher waits)."""
    ev = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "started", 0), ("train", 3, 0, "preemption-notice", 30))
    status = runner.invoke(app, ["status", "train", "--stack", "team", "--events-dir", str(ev), "--json"])
    assert '"status": "preempting"' in status.output, status.output
    resumed = runner.invoke(app, ["resume", "train", "--stack", "team", "--events-dir", str(ev), "--yes"])
    assert resumed.exit_code == 0 and "got a preemption notice" in resumed.output, resumed.output
    assert not ups(fake_pulumi) and the_job().attempt == 3
    events_file(ev, ("train", 3, 0, "preempted", 31))
    assert runner.invoke(app, ["resume", "train", "--stack", "team", "--events-dir", str(ev), "--yes"]).exit_code == 0
    assert the_job().attempt == 4


@pytest.mark.parametrize("comment", ["", "  # cleared by spotctl"])
def test_an_empty_value_is_set_in_place_with_the_comments_where_they_were(tmp_path, comment):
    """A cleared ``applying:`` (empty, as the round trip writes null) sent every later edit of it
    through the round trip, which moved the next job's comment into this job."""
    text = ("config:\n  spotctl:jobs:\n    - id: a\n      attempt: 1\n      applying:" + comment + "\n"
            "    # the second job\n    - id: b\n      attempt: 2\n")
    out = stackfile._splice_job_fields(text, "a", {"applying": "attempt=2 (since now)", "attempt": 2})
    assert out == text.replace("attempt: 1", "attempt: 2").replace(
        "applying:" + comment, "applying: attempt=2 (since now)" + (" " + comment.lstrip() if comment else ""))


def test_a_key_set_to_missing_loses_its_line_and_nothing_else():
    """The undo of an edit that added a key (the ``applying`` mark) and the mark's clearing remove its
    line in place: the round trip they took moved comments and re-flowed other keys."""
    text = "config:\n  spotctl:jobs:\n    - id: a\n      applying: x (since now)\n      attempt: 1\n    # b\n    - id: b\n"
    assert stackfile._splice_job_fields(text, "a", {"applying": stackfile.MISSING}) == text.replace("      applying: x (since now)\n", "")
    assert stackfile._splice_job_fields(text, "a", {"nothere": stackfile.MISSING}) == text
    commented = text.replace("(since now)", "(since now)  # a comment of the user's")
    assert stackfile._splice_job_fields(commented, "a", {"applying": stackfile.MISSING}) is None  # the round trip, which keeps it
