"""Drills that cannot pass without proving anything: not-exercised, a trace's time scale picked so a
preemption falls inside the run, two restarts from zero end the drill (and the report says so),
checkpoints said in words, the tail of a failed attempt's log."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from cli.app import app
from cli.drill import runner as drills
from cli.drill.verdict import Attempt, Report, account_lost_work, judge, render_report

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = f"{sys.executable} {ROOT / 'examples' / 'reentrant_train.py'}"
VARIANT = f"{sys.executable} {ROOT / 'tests' / 'fixtures' / 'variant_train.py'}"


def test_no_preemption_is_not_exercised_and_fails(runner):
    result = runner.invoke(app, ["drill", "--preempt-every", "60", "--", "echo 'SPOTCTL_PROGRESS 1/1'"])
    assert result.exit_code == 1
    assert result.stdout.startswith("verdict: not-exercised  (no preemption happened: the command finished in ")
    assert "None" not in result.stdout and "no checkpoints seen" in result.stdout


def test_two_restarts_from_zero_end_the_drill_early(runner):
    result = runner.invoke(app, ["drill", "--json", "--preempt-every", "1", "--max-attempts", "10", "--", f"MODE=end STEPS=100000 {VARIANT}"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["verdict"] == "restarts-from-scratch"
    # Attempt 1 may be preempted before its first step on a loaded host (then it proves nothing and
    # attempts 3 and 4 are the restarts); either way the drill stops at the second restart from zero.
    found = re.search(r"attempts (\d+), (\d+) started from zero \(no checkpoints seen", report["reason"])
    assert found, report["reason"]
    first, second = int(found[1]), int(found[2])
    assert second == first + 1 and len(report["attempts"]) == second  # no attempt after the second restart
    assert all(a["end_progress"] for a in report["attempts"][first - 2:second - 1])  # each followed real progress
    assert report["stopped_early"] == {"after_attempt": second, "max_attempts": 10, "reason": NOTHING_NEW}


def test_trace_without_time_scale_puts_a_preemption_inside_the_run(runner, tmp_path):
    trace = tmp_path / "trace.json"
    # 10-minute ticks: 20 minutes of spot, then lost; a time scale of 600 makes that 2 s.
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1, 1, 0] + [1] * 50}))
    result = runner.invoke(app, ["drill", "--json", "--trace", str(trace), "--", f"{EXAMPLE} --step-seconds 0.01"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0, report
    assert report["time_scale"] == 600 and report["preemptions"] == 1 and report["verdict"] == "reentrant"


def test_trace_that_never_loses_capacity_says_it_cannot(runner, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 20}))
    result = runner.invoke(app, ["drill", "--trace", str(trace), "--", "true"])
    assert result.exit_code == 1
    assert result.output == (f"error: {trace}: spot capacity is never lost in this trace, so it cannot preempt the run "
                             "(use --preempt-every SECONDS)\n")


def test_a_failed_attempt_prints_the_end_of_its_log(runner):
    result = runner.invoke(app, ["drill", "--", "echo 'SPOTCTL_PROGRESS 1/10'; echo 'Traceback: CUDA out of memory' >&2; exit 3"])
    assert result.exit_code == 1
    assert "verdict: did-not-finish  (attempt 1 failed)" in result.stdout
    assert "attempt 1 failed; the end of its log:\n  | SPOTCTL_PROGRESS 1/10\n  | Traceback: CUDA out of memory\n" in result.stdout


def test_judge_without_checkpoints_says_so_in_words():
    attempts = [Attempt(1, 1, 80, outcome="preempted", seconds=1.0), Attempt(2, 1, 100, outcome="completed", seconds=1.2)]
    verdict, reason = judge(attempts, None)
    assert verdict == "restarts-from-scratch" and "no checkpoints seen" in reason
    text = render_report(Report(verdict, "gcp", "x", attempts, 1, None, 2.2, reason=reason))
    assert "no checkpoints seen" in text and "None" not in text and "unknown" not in text


def test_judge_completed_without_preemption_is_not_exercised():
    verdict, reason = judge([Attempt(1, 1, 100, outcome="completed", seconds=3.0)], None)
    assert verdict == "not-exercised" and "finished in 3.0 s" in reason


NOTHING_NEW = "two restarts from zero; more attempts would prove nothing new"


def restarted_twice() -> list[Attempt]:
    """Attempts 2 and 3 each began at step 1 after a preemption had ended real progress."""
    return [Attempt(1, 1, 80, outcome="preempted", seconds=1.0), Attempt(2, 1, 60, outcome="preempted", seconds=1.0),
            Attempt(3, 1, 70, outcome="preempted", seconds=1.0)]


def resumed() -> list[Attempt]:
    return [Attempt(1, 1, 80, outcome="preempted", seconds=1.0), Attempt(2, 81, 100, outcome="completed", seconds=1.0)]


@pytest.mark.parametrize("history,stop", [(restarted_twice, 3), (resumed, None)], ids=["restarted-twice", "resumed"])
def test_the_report_says_when_and_why_the_drill_stopped_before_max_attempts(runner, monkeypatch, tmp_path, history, stop):
    """The real drill and report on a recorded history (no trainer runs): a user who asked for 10 attempts
    and got 3 reads why, in the table's report and in --json; a drill that ended by itself says nothing."""
    def recorded(self, emu, disk, *, preempt):
        attempts = history()
        account_lost_work(attempts)
        return attempts

    monkeypatch.setattr(drills.Drill, "run_attempts", recorded)
    (tmp_path / "train.py").write_text("")  # (the drill packs the current directory: it must hold a file)
    monkeypatch.chdir(tmp_path)
    text = runner.invoke(app, ["drill", "--max-attempts", "10", "--", "python train.py"])
    doc = runner.invoke(app, ["drill", "--json", "--max-attempts", "10", "--", "python train.py"])
    report = json.loads(doc.stdout)
    assert report["max_attempts"] == 10
    if stop is None:
        assert text.exit_code == 0 and doc.exit_code == 0, text.output
        assert report["stopped_early"] is None and "stopped after" not in text.stdout
        return
    assert text.exit_code == 1 and doc.exit_code == 1
    assert report["stopped_early"] == {"after_attempt": stop, "max_attempts": 10, "reason": NOTHING_NEW}
    assert len(report["attempts"]) == stop and report["verdict"] == "restarts-from-scratch"
    lines = text.stdout.split("\n")
    at = lines.index("stopped after attempt 3 of 10 (--max-attempts): two restarts from zero;")
    assert lines[at + 1] == "more attempts would prove nothing new"
    # Every line of the report fits 80 columns but the trainer's own log lines (quoted as written).
    assert all(len(line) <= 80 for line in lines if not line.startswith("  | ")), text.stdout


@pytest.mark.parametrize("attempts,max_attempts", [
    (restarted_twice()[:2] + [Attempt(3, 1, 100, outcome="completed")], 10),  # two restarts, but it finished
    (restarted_twice(), 3),  # the third attempt was the last one asked for
    (restarted_twice()[:2] + [Attempt(3, 61, 70, outcome="preempted")], 10),  # one restart: it went on
], ids=["completed", "ran-all-asked-for", "one-restart"])
def test_a_drill_that_ran_out_its_attempts_or_finished_did_not_stop_early(attempts, max_attempts):
    verdict, reason = judge(attempts, None)
    report = Report(verdict, "gcp", "x", attempts, 3, None, 3.0, reason=reason, max_attempts=max_attempts)
    assert report.stopped_early is None and report.as_json()["stopped_early"] is None
    assert "stopped after" not in render_report(report)
