"""status: the stack file, the recorded events and the cloud merged; a Rich table that fits."""

from __future__ import annotations

import json

from cli.app import app
from cli.commands.jobs import print_status

LONG_ID = "llm-pretrain-70b-dpo-ablation"  # 28 characters


def write_events(path, job: str, rows) -> None:
    path.write_text("\n".join(json.dumps({"job": job, "attempt": a, "node": 0, "event": e, "time": t, "details": {}})
                              for a, e, t in rows) + "\n")


def test_running_in_the_file_but_preempted_in_the_events_needs_resume(project, runner, tmp_path):
    log = tmp_path / "events.jsonl"
    write_events(log, "vit-finetune", [(3, "started", "2026-11-21T10:00:00Z"), (3, "preemption-notice", "2026-11-21T11:00:00Z"),
                                       (3, "preempted", "2026-11-21T11:00:20Z")])
    result = runner.invoke(app, ["status", "vit-finetune", "--stack", "example-gcp", "--events-dir", str(log), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["state"], row["status"], row["attempts"]) == ("running", "needs-resume", [3])
    assert row["status_reason"] == "attempt 3 was preempted (its events); run `spotctl resume vit-finetune`"
    table = runner.invoke(app, ["status", "--stack", "example-gcp", "--events-dir", str(log)], env={"COLUMNS": "120"})
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    (vit,) = [line for line in lines if line.startswith("vit-finetune ")]
    assert vit.split()[:4] == ["vit-finetune", "needs-resume", "on-demand", "3"]
    assert "vit-finetune: attempt 3 was preempted (its events); run `spotctl resume vit-finetune`" in lines
    assert any(line.startswith("vit-finetune") and "preempted (attempt 3, 11-21 11:00)" in line for line in lines)
    llm = next(line for line in lines if line.startswith("llm-pretrain "))
    assert llm.split()[1] == "running" and "None" not in table.stdout


def test_a_28_character_job_id_does_not_break_the_table(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    path.write_text(path.read_text().replace("id: vit-finetune", f"id: {LONG_ID}"))
    result = runner.invoke(app, ["status", "--stack", "example-gcp"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert any(line.startswith(LONG_ID + " ") for line in lines)  # whole, on one line
    assert lines[0].split()[:4] == ["job", "status", "capacity", "attempt"]
    below = " ".join(line.strip() for line in lines if not line.startswith(("job ", "llm-pretrain ", "bert-eval ", LONG_ID + " ")))
    assert f"{LONG_ID}: preempt 0, hours 0.0," in below and "last event -" in below  # what did not fit, under the table


def test_fields_other_parts_add_slot_into_the_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    rows = [{"job": "a", "status": "running", "capacity": "spot", "attempt": 2, "spot_hours": 3.25, "on_demand_hours": 0.0,
             "waiting_for_capacity": True, "last_action": {"action": "failover", "time": "x"}, "budget_left": 12,
             "last_event": None}]
    print_status(rows)
    header, line = capsys.readouterr().out.splitlines()[:2]
    for title in ("spot VM-h", "on-demand VM-h", "waiting", "last action", "budget left", "last event"):
        assert title in header
    assert "3.2" in line and "yes" in line and "failover" in line and " 12" in line and "None" not in line
