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
        from cli.lifecycle import pipeline
        pipeline.job_targets = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
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


# ---- a second look (a review of the fixes above) ------------------------------------------------------


def test_an_edit_proposed_through_a_link_is_seen_through_its_target(aws_stack):
    """The lock is per real file, so the proposal must be too: a watcher naming the target decided on
    an edit proposed through a link (and marked the replaced attempt stale), or pushed it."""
    link_dir = aws_stack.parent.parent / "linked"
    link_dir.mkdir()
    link = link_dir / aws_stack.name
    link.symlink_to(aws_stack)
    with stackfile.proposing(link):
        stackfile.note_proposal(link, "train", {"attempt": 3}, {"attempt": 4})
        assert stackfile.proposed_job(aws_stack) == stackfile.proposed_job(link) == "train"
        assert stackfile.held_back(aws_stack)
    from cli.watch.journal import holder_path, journal_path

    assert journal_path(link) == journal_path(aws_stack) and holder_path(link) == holder_path(aws_stack)


TWO = AWS_STACK + """    - id: old
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: python old.py
      attempt: 2
      state: completed
"""


def test_another_jobs_cleanup_at_the_question_does_not_refuse_the_update(project, runner, fake_pulumi, tmp_path, monkeypatch):
    """Its retiredJobs entry is that job's, not a change of this update's settings."""
    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text(TWO)
    ev = events_file(tmp_path / "ev.jsonl", *PREEMPTED)

    def ask(question: str) -> bool:
        done = subprocess.run([sys.executable, "-m", "cli", "cleanup", "old", "--stack", "team", "--no-apply", "--yes"],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stdout + done.stderr
        return True

    monkeypatch.setattr(commands, "interactive", lambda: True)
    monkeypatch.setattr(commands, "_ask", ask)
    result = runner.invoke(app, ["resume", "train", "--stack", "team", "--events-dir", str(ev)])
    assert result.exit_code == 0 and "applied" in result.output, result.output
    assert the_job().attempt == 4 and stackfile.read_config(path)["spotctl:retiredJobs"] == {"old": 2}


def test_a_reused_ids_earlier_job_counts_for_nothing(tmp_path):
    """A new `train` after a retired one (attempts 1-3): the old failures, attempts and hours were its."""
    from datetime import timedelta

    from cli.cost.ledger import job_ledger
    from cli.lifecycle.events import Event
    from cli.lifecycle.stackfile import namespaced
    from cli.lifecycle.status import job_report
    from cli.watch import decide as d
    from infra.config import validate
    from tests.test_watch import T0

    raw = {"spotctl:cloud": "aws", "spotctl:region": "us-east-1", "spotctl:zones": ["us-east-1a"],
           "spotctl:retiredJobs": {"train": 3},
           "spotctl:jobs": [{"id": "train", "instanceType": "p4d.24xlarge", "zone": "us-east-1a", "command": "t",
                             "attempt": 4, "state": "running", "maxFailures": 1}]}
    job = validate(namespaced(raw, "s"), "s").job("train")
    assert job.retired_after == 3

    def e(attempt: int, event: str, minute: float) -> Event:
        return Event("train", attempt, 0, event, T0 + timedelta(minutes=minute), {})

    old = [e(2, "started", 0), e(2, "failed", 5), e(3, "started", 10), e(3, "failed", 600)]
    new = [e(4, "started", 1000), e(4, "failed", 1010)]
    seen = {"train": [d.seen(x, "bucket") for x in old + new]}
    decisions = d.decide([job], seen, {}, set(), T0 + timedelta(minutes=1020))
    assert [(a.kind, a.attempt) for a in decisions.actions] == [("resume", 4)]  # its first failure: maxFailures 1 retries it
    row = job_report(job, old + new, now=T0 + timedelta(minutes=1020))
    assert row["attempts"] == [4]
    assert [a.attempt for a in job_ledger(job, old + new, T0 + timedelta(minutes=1020)).attempts] == [4]


def test_a_gang_stop_that_cannot_start_takes_the_mark_away_with_the_edit(project, runner, fake_pulumi, monkeypatch):
    """The mark came with the edit (--yes); the old gang's stop could not start (the stack was locked):
    the edit was undone and the mark stayed, so `status` said update-pending and `watch` re-applied."""
    monkeypatch.setenv("FAKE_PULUMI_LOCKED_AT", "1")
    before = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--force", "--yes"])
    assert result.exit_code == 1, result.output
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.state, job.attempt, job.applying) == (before.state, before.attempt, None)
