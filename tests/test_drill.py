"""`spotctl drill`: the example is reentrant with identical outputs; broken variants are caught;
both clouds' scripts run; nothing is left running, also after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.app import app
from cli.drill.runner import Attempt, account_lost_work, checkpoint_interval, judge, parse_progress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = f"{sys.executable} {ROOT / 'examples' / 'reentrant_train.py'}"
VARIANT = f"{sys.executable} {ROOT / 'tests' / 'fixtures' / 'variant_train.py'}"


def leftover(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def drill_json(runner, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["drill", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_example_is_reentrant_with_identical_outputs(runner, cloud):
    code, report = drill_json(runner, "--cloud", cloud, "--time-scale", "60", "--preempt-every", "0.8", "--verify", "--", EXAMPLE)
    assert code == 0, report
    assert report["verdict"] == "reentrant" and report["ok"] is True
    assert report["preemptions"] >= 2
    assert report["outputs_identical"] is True
    attempts = report["attempts"]
    assert attempts[-1]["outcome"] == "completed" and attempts[-1]["end_progress"] == 600
    for cur, nxt in zip(attempts, attempts[1:], strict=False):
        assert nxt["start_progress"] == cur["end_progress"] + 1  # SIGTERM checkpoint: nothing lost
    assert report["lost_work"] == [0] * report["preemptions"]
    assert report["checkpoint_interval"] == 50
    assert not leftover("reentrant_train.py")


def test_variant_that_ignores_checkpoints_restarts_from_scratch(runner):
    result = runner.invoke(app, ["drill", "--json", "--preempt-every", "1", "--max-attempts", "3", "--", VARIANT],
                           env={"MODE": "ignore"})
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["verdict"] == "restarts-from-scratch"
    assert report["attempts"][1]["start_progress"] == 1 and report["attempts"][1]["checkpoint_at_start"] is True


def test_variant_that_checkpoints_only_at_the_end_loses_work(runner):
    result = runner.invoke(app, ["drill", "--json", "--preempt-every", "1", "--max-attempts", "3", "--", VARIANT],
                           env={"MODE": "end"})
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["verdict"] == "restarts-from-scratch"  # it never saves before the end: every attempt starts at 1
    assert report["attempts"][0]["lost_work"] > 100


def test_failing_command_did_not_finish(runner):
    code, report = drill_json(runner, "--", "echo 'SPOTCTL_PROGRESS 1/10'; exit 3")
    assert code == 1
    assert report["verdict"] == "did-not-finish" and report["attempts"][0]["outcome"] == "failed"


def test_drill_a_stack_job(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text().replace("command: python eval.py", f"command: {EXAMPLE} --steps 200")
    path.write_text(text)
    code, report = drill_json(runner, "--stack", "example-gcp", "--job", "bert-eval", "--preempt-every", "0.6")
    assert code == 0, report
    assert report["command"] == f"{EXAMPLE} --steps 200"
    result = runner.invoke(app, ["drill", "--stack", "example-gcp", "--job", "nope"])
    assert result.exit_code == 1
    assert result.output.startswith("error: stacks/Pulumi.example-gcp.yaml: job nope: expected one of 'llm-pretrain', 'vit-finetune', 'bert-eval'")


def test_ctrl_c_leaves_nothing_running(tmp_path):
    marker = f"sleep 300.{os.getpid()}"  # unique, and visible as the process's own argv
    cmd = f"{marker}; true"
    own_tmp = tmp_path / "drill-tmp"  # the drill's temp dirs live here: only its own processes are checked
    own_tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "drill", "--preempt-every", "100", "--", cmd],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(own_tmp)})
    try:
        deadline = time.monotonic() + 20
        while not leftover(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftover(marker), "the drill never started the command"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)  # a loaded CI machine: slow is fine, hanging is not
    finally:
        if proc.poll() is None:  # the test failed early: still interrupt it, so it cleans up
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=90)
    assert proc.returncode == 130
    assert "interrupted" in err
    time.sleep(0.3)
    assert leftover(marker) == []
    assert leftover(str(own_tmp)) == []


# ---- the pure judge ----------------------------------------------------------------------------------


def test_parse_progress_and_checkpoints():
    progress, ckpts = parse_progress("x\nSPOTCTL_PROGRESS 3/10\nSPOTCTL_CHECKPOINT 3\nSPOTCTL_PROGRESS 4\n")
    assert progress == [(3, 10), (4, None)] and ckpts == [3]


def attempt(n, start, end, outcome, ckpt=False, marks=()):
    return Attempt(attempt=n, start_progress=start, end_progress=end, outcome=outcome, checkpoint_at_start=ckpt,
                   checkpoints=list(marks))


def test_judge_lost_work_beyond_one_interval():
    attempts = [attempt(1, 1, 180, "preempted", marks=[50, 100, 150]), attempt(2, 51, 300, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert attempts[0].lost_work == 130
    assert judge(attempts, checkpoint_interval(attempts))[0] == "lost-work"


def test_judge_within_one_interval_is_reentrant():
    attempts = [attempt(1, 1, 180, "preempted", marks=[50, 100, 150]), attempt(2, 151, 300, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert attempts[0].lost_work == 30
    assert judge(attempts, checkpoint_interval(attempts)) == ("reentrant", "every attempt resumed where the last one stopped")


def test_trace_driven_preemptions(runner, tmp_path):
    trace = tmp_path / "trace.json"
    # 1 = spot available. Runs of 2 ticks x 30 s at time-scale 60 -> preempted after 1 s each time.
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [1, 1, 0, 0, 1, 1, 0, 1, 1, 0] + [1] * 50}))
    code, report = drill_json(runner, "--trace", str(trace), "--time-scale", "60", "--", f"{EXAMPLE} --step-seconds 0.01")
    assert code == 0, report
    assert report["preemptions"] == 3
    assert [a["outcome"] for a in report["attempts"]] == ["preempted"] * 3 + ["completed"]
    assert all(0.9 < a["seconds"] < 6 for a in report["attempts"][:3])  # 1 s of spot, then the shutdown path


def test_bad_trace_file_is_one_clear_error(runner, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    result = runner.invoke(app, ["drill", "--trace", str(trace), "--", "true"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: {trace}: not a spot-traces availability file")


def test_an_attempt_with_nothing_left_to_do_is_not_a_restart():
    """Preempted at the very end: the next attempt finds the work done and reports no progress."""
    attempts = [attempt(1, 1, 83, "preempted", marks=[50]), attempt(2, 84, 200, "preempted", ckpt=True, marks=[100, 150, 200]),
                attempt(3, None, None, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert attempts[1].lost_work is None
    assert judge(attempts, checkpoint_interval(attempts))[0] == "reentrant"
