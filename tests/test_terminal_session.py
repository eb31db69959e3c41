"""The README's real-cloud flow in a real terminal (pexpect, a pty): select a stack, see a preempted
job as needs-resume, resume it: Pulumi's preview, the question, the answer, the result. The `pulumi`
is tests/fixtures/fake_pulumi.py, which records every call."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import signal
import sys
from pathlib import Path

import pexpect
import pytest

from tests.conftest import STACKS_ONLY, copy_example_code, pulumi_calls

ROOT = Path(__file__).resolve().parent.parent


def updates(log: Path) -> list[str]:
    """preview/up, in the order the fake pulumi was called."""
    verbs = [next((a for a in call if not a.startswith("-")), "") for call in pulumi_calls(log)]
    return [v for v in verbs if v in ("preview", "up")]


def session(tmp_path: Path, **env_over: str):
    """The README's project (a copy of stacks/, team-a selected, vit-finetune preempted in events/)
    and a ``spotctl(*args)`` that starts it in a pty; returns (project, spotctl, pulumi log, transcript)."""
    project = tmp_path / "infra-team"
    shutil.copytree(ROOT / "stacks", project / "stacks", ignore=STACKS_ONLY)
    shutil.copy(ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
    copy_example_code(project)
    # cp stacks/Pulumi.example-gcp.yaml stacks/Pulumi.team-a.yaml; pulumi stack select team-a
    shutil.copy(project / "stacks" / "Pulumi.example-gcp.yaml", project / "stacks" / "Pulumi.team-a.yaml")
    home = tmp_path / "pulumi-home"
    (home / "workspaces").mkdir(parents=True)
    digest = hashlib.sha1(str(project.resolve() / "Pulumi.yaml").encode()).hexdigest()
    (home / "workspaces" / f"spotctl-{digest}-workspace.json").write_text(json.dumps({"stack": "team-a"}))
    install = tmp_path / "pulumi-install" / "bin"
    install.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "fake_pulumi.py", install / "pulumi")
    (install / "pulumi").chmod(0o755)
    log = tmp_path / "pulumi-argv.jsonl"
    events = project / "events"
    events.mkdir()
    (events / "vit.jsonl").write_text("".join(json.dumps({"job": "vit-finetune", "attempt": 3, "node": 0, "event": e, "time": t}) + "\n"
                                              for e, t in [("started", "2026-11-21T10:00:00Z"), ("preempted", "2026-11-21T13:00:00Z")]))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PULUMI_HOME": str(home), "SPOTCTL_PULUMI_ROOT": str(install.parent),
           "FAKE_PULUMI_LOG": str(log), "COLUMNS": "100", "LINES": "40", "PYTHONPATH": str(ROOT), "TERM": "dumb",
           "PYTHONFAULTHANDLER": "1", **env_over}  # SIGABRT prints every thread's stack (``expect_or_dump``)
    transcript = io.StringIO()

    def spotctl(*args: str, preexec_fn=None) -> pexpect.spawn:
        child = pexpect.spawn(sys.executable, ["-m", "cli", *args], cwd=str(project), env=env, encoding="utf-8",
                              timeout=180, dimensions=(40, 100), preexec_fn=preexec_fn)
        child.logfile_read = transcript
        return child

    return project, spotctl, log, transcript


def expect_or_dump(child: pexpect.spawn, pattern: str, transcript: io.StringIO, timeout: float = 90) -> None:
    """``child.expect(pattern)``; if it never comes, the child's threads' stacks (faulthandler, on
    SIGABRT) and the whole transcript go into the failure, so a hang says where it hung."""
    try:
        child.expect(pattern, timeout=timeout)
    except pexpect.EOF:
        pytest.fail(f"the process ended without {pattern!r}; the transcript:\n{transcript.getvalue()}")
    except pexpect.TIMEOUT:
        child.kill(signal.SIGABRT)
        with contextlib.suppress(pexpect.TIMEOUT, pexpect.EOF):
            child.expect(pexpect.EOF, timeout=15)
        pytest.fail(f"no {pattern!r} within {timeout} s; the transcript, then the stacks:\n{transcript.getvalue()}")


def test_readme_flow_in_a_terminal(tmp_path):
    project, spotctl, log, transcript = session(tmp_path)
    status = spotctl("status", "--events-dir", "events")
    status.expect(r"vit-finetune +needs-resume")
    status.expect(r"vit-finetune: attempt 3 was preempted \(its events\); run `spotctl resume vit-finetune`")
    status.expect(pexpect.EOF)

    resume = spotctl("resume", "vit-finetune", "--events-dir", "events")
    resume.expect(r"Previewing update \(team-a\):")
    resume.expect(r"\+-  gcp:compute/instance:Instance +job-vit-finetune-n0-vm +replace")
    resume.expect(r"Do you want to perform this update of job vit-finetune\? \[y/N\]: ")
    assert updates(log) == ["preview"]  # asked before any update
    resume.sendline("y")
    resume.expect(r"job vit-finetune: attempt=4, state=running .*— applied")
    resume.expect(pexpect.EOF)
    resume.close()
    assert resume.exitstatus == 0, transcript.getvalue()
    assert updates(log) == ["preview", "up"]
    assert "attempt: 4" in (project / "stacks" / "Pulumi.team-a.yaml").read_text()

    again = spotctl("complete", "vit-finetune")  # the default answer is no: nothing is deleted
    again.expect(r"Do you want to perform this update of job vit-finetune\? \[y/N\]: ")
    again.sendline("")
    again.expect(r"not confirmed: nothing changed")
    again.expect(pexpect.EOF)
    assert updates(log) == ["preview", "up", "preview"]
    assert "state: running" in (project / "stacks" / "Pulumi.team-a.yaml").read_text().split("vit-finetune")[1][:400]
    (tmp_path / "session.txt").write_text(transcript.getvalue())  # the recorded session, for a person to read


def test_applies_show_their_step_on_a_terminal_and_json_stays_clean(tmp_path):
    """A spinner names the step under way (here Pulumi's update, made slow) on a real terminal;
    the same command with --json prints only its JSON, even on a terminal."""
    project, spotctl, log, transcript = session(tmp_path, TERM="xterm-256color", FAKE_PULUMI_UP_SLEEP="3")
    resume = spotctl("resume", "vit-finetune", "--events-dir", "events", "--yes")
    resume.expect(r"pulumi up: refreshing and updating \d+ resources of stack team-a")
    resume.expect(r"job vit-finetune: attempt=4, state=running .*— applied")
    resume.expect(pexpect.EOF)
    resume.close()
    assert resume.exitstatus == 0, transcript.getvalue()

    as_json = spotctl("failover", "vit-finetune", "--to", "spot", "--yes", "--json")
    as_json.expect(pexpect.EOF)
    as_json.close()
    assert as_json.exitstatus == 0, as_json.before
    printed = as_json.before.replace("\r\n", "\n")
    assert "\x1b" not in printed and "pulumi up:" not in printed  # no spinner, no cursor control
    assert json.loads(printed.strip().splitlines()[-1])["applied"] is True
