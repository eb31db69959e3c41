"""spotctl logs: a job's trainer log per attempt and node, from a job disk copy or a synced bucket."""

from __future__ import annotations

import json

from cli.app import app


def disk_copy(root, logs: dict[str, str]):
    d = root / "disk" / ".spotctl" / "logs"
    d.mkdir(parents=True)
    for name, text in logs.items():
        (d / name).write_text(text)
    return root / "disk" / ".spotctl"


def test_latest_attempt_by_default_and_any_by_option(project, runner, tmp_path):
    src = disk_copy(tmp_path, {"attempt-1-node-0.log": "step 1\nstep 2\n", "attempt-2-node-0.log": "resumed at 2\nstep 3\n",
                               "attempt-2-node-1.log": "worker 1\n"})
    latest = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src)])
    assert latest.exit_code == 0 and latest.stdout == "resumed at 2\nstep 3\n"
    first = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--attempt", "1", "--tail", "1"])
    assert first.exit_code == 0 and first.stdout == "step 2\n"
    worker = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--node", "1"])
    assert worker.stdout == "worker 1\n"
    missing = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--attempt", "3"])
    assert missing.exit_code == 1
    assert missing.output == (f"error: job diffusion: no log of attempt 3 node 0 (there are: attempt 1 node 0, "
                              f"attempt 2 node 0, attempt 2 node 1) in {src}\n")


def test_uploaded_chunks_are_joined_in_order_without_repeats(project, runner, tmp_path):
    base = tmp_path / "bucket" / "example-aws" / "diffusion" / "attempt-3" / "node-0" / "logs"
    base.mkdir(parents=True)
    (base / "000000000000.log").write_text("first line\n")       # 11 bytes
    (base / "000000000011.log").write_text("second line\nthird")  # then a retry that overlaps:
    (base / "000000000023.log").write_text("third line\n")
    result = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path / "bucket")])
    assert result.exit_code == 0, result.output
    assert result.stdout == "first line\nsecond line\nthird line\n"


def test_follow_stops_when_the_attempt_ended(project, runner, tmp_path):
    src = disk_copy(tmp_path, {"attempt-2-node-0.log": "step 9\nTraceback: out of memory\n"})
    (src / "events.jsonl").write_text(json.dumps({"job": "diffusion", "attempt": 2, "node": 0, "event": "failed",
                                                  "time": "2026-11-21T10:00:00Z", "details": {"exit_code": "1"}}) + "\n")
    result = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--follow"])
    assert result.exit_code == 0 and result.stdout.endswith("Traceback: out of memory\n")


def test_logs_need_a_source_and_a_known_job(project, runner, tmp_path):
    none = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws"])
    assert none.exit_code == 1 and none.output.startswith("error: job diffusion: where is its log? give --events-dir DIR")
    empty = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path)])
    assert empty.exit_code == 1 and empty.output == f"error: job diffusion: no log found in {tmp_path}\n"
    unknown = runner.invoke(app, ["logs", "nope", "--stack", "example-aws", "--events-dir", str(tmp_path)])
    assert unknown.exit_code == 1 and "job nope" in unknown.output
