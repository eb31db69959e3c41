"""status: the stack file, the recorded events and the cloud merged; a Rich table that fits."""

from __future__ import annotations

import json

import pytest

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
    assert llm.split()[1] == "starting" and "None" not in table.stdout  # no `started` of its attempt in the events read


def test_a_28_character_job_id_does_not_break_the_table(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    path.write_text(path.read_text().replace("id: vit-finetune", f"id: {LONG_ID}"))
    (project / "events").mkdir()  # read, and empty: 0 preemptions (with no events source they would be unknown: ?)
    result = runner.invoke(app, ["status", "--stack", "example-gcp", "--events-dir", str(project / "events")], env={"COLUMNS": "80"})
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


def _rich_table(columns, rows, width: int) -> str:
    """What rich.table.Table prints for these columns and rows (the layout StatusTable reproduces)."""
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for col in columns:
        table.add_column(col.header, justify=col.justify, no_wrap=True)
    for r in rows:
        table.add_row(*(Text(col.text(r)) for col in columns))
    out = io.StringIO()
    Console(file=out, width=width, soft_wrap=False, highlight=False).print(table)
    return out.getvalue()


def _mine(columns, rows, width: int) -> str:
    import io

    from rich.console import Console

    from cli.commands.jobs import StatusTable

    out = io.StringIO()
    Console(file=out, width=width, soft_wrap=False, highlight=False).print(StatusTable(columns, rows))
    return out.getvalue()


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_status_table_is_laid_out_as_richs_table(width):
    """StatusTable (ready lines: a Table measures every cell, too slow for status) prints what rich.table.Table
    prints for the columns fit_columns chose, wide characters and bracket text included."""
    from cli.lifecycle.status import fit_columns

    rows = [{"job": "llm-pretrain", "status": "needs-resume", "capacity": "spot", "attempt": 12, "zone": "us-central1-a",
             "preemptions": 3, "hours_running": 10.25, "spot_hours": 41.0, "on_demand_hours": 0.0,
             "last_event": {"event": "[red]preempted", "attempt": 12, "time": "2026-11-21T11:00:20+00:00"}},
            {"job": "vit", "status": "running", "capacity": "on-demand", "attempt": 1, "zone": "us-central1-b",
             "preemptions": 0, "hours_running": 1.0, "spot_hours": 0.0, "on_demand_hours": 2.0, "note": "日本語 :smile:",
             "last_event": None}]
    shown, _ = fit_columns(rows, width)
    assert _mine(shown, rows, width) == _rich_table(shown, rows, width)


# ---- status of a file validated before: the per-job cache -------------------------------------------

PROBE = """
import sys
from cli.commands.startup import main
sys.argv = ["spotctl", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print("LOADED", *sorted(m for m in ("pydantic", "infra.config", "yaml", "rich.table") if m in sys.modules))
"""


def status_run(project, *args: str) -> tuple[str, list[str]]:
    """`spotctl status ARGS` in a new process: (its output, which heavy modules it loaded)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", PROBE, "status", *args], cwd=project, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "150", "PYTHONPATH": str(root)}, check=True).stdout
    body, loaded = out.rsplit("LOADED", 1)
    return body, loaded.split()


def test_a_file_validated_before_is_shown_without_validating_it_and_any_change_is_seen(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    first, loaded = status_run(project, "--stack", "example-gcp")
    assert "pydantic" in loaded and "vit-finetune" in first  # validated whole, then cached per job
    again, loaded = status_run(project, "--stack", "example-gcp")
    assert again == first and loaded == ["yaml"]  # (Pulumi.yaml names the stack dir) no pydantic, no Rich Table
    assert status_run(project, "--stack-file", str(path))[1] == []  # and no YAML parse at all
    assert status_run(project, "--stack", "example-gcp", "--json")[0] == \
        runner.invoke(app, ["status", "--stack", "example-gcp", "--json"]).stdout
    # a hand edit (same length, the same second) is seen: the file's hash no longer matches its index
    path.write_text(path.read_text().replace("state: running", "state: stopped", 1))
    edited, loaded = status_run(project, "--stack", "example-gcp")
    assert "pydantic" in loaded and edited != first and "stopped" in edited
    # an edit by spotctl (the index follows it): only the changed job is validated again
    assert runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--no-apply", "--force"]).exit_code == 0
    resumed, _ = status_run(project, "--stack", "example-gcp", "--json")
    for cache in (project / "stacks" / ".spotctl").glob("*.status/*.json"):
        cache.unlink()
    assert json.loads(resumed) == json.loads(status_run(project, "--stack", "example-gcp", "--json")[0])


def test_a_damaged_or_foreign_status_cache_only_means_the_file_is_read(project, runner):
    from cli.lifecycle.status import status_cache_path

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    expected = runner.invoke(app, ["status", "--stack", "example-gcp", "--json"]).stdout
    from cli.lifecycle import cachefile
    from cli.lifecycle.stackfile import CACHE_LIMIT

    entries = sorted(status_cache_path(path).iterdir())
    assert len(entries) == 3  # one entry per job
    good = {e: json.loads(cachefile.read(e, CACHE_LIMIT)) for e in entries}
    for damage in ("{not json", "[" * 100_000, "another spotctl", "broken", "other job"):
        for entry, doc in good.items():
            if damage == "another spotctl":
                text = json.dumps({**doc, "fingerprint": "another spotctl", "facts": {"model": {"id": "x"}}})
            elif damage == "broken":
                text = json.dumps({**doc, "facts": {"id": doc["job"]}})
            elif damage == "other job":  # an entry copied under another job's name
                text = json.dumps(good[entries[0] if entry != entries[0] else entries[1]])
            else:
                text = damage
            cachefile.write(entry, text.encode())  # (sealed: as a bug of ours would write it)
        assert status_run(project, "--stack", "example-gcp", "--json")[0] == expected, damage
    # nor a cache this user's spotctl did not seal (a commit carried it, someone else wrote it), however right it looks
    for entry, doc in good.items():
        entry.write_text(json.dumps({**doc, "facts": {"model": {**doc["facts"]["model"], "attempt": 99}}}))
    assert status_run(project, "--stack", "example-gcp", "--json")[0] == expected


def test_status_of_one_job_reads_only_that_jobs_entry(project, runner, monkeypatch):
    """``status JOB`` opens one entry of the per-job cache, whatever the stack's size; an edit of one job
    replaces its entry alone."""
    from cli.lifecycle import cachefile
    from cli.lifecycle.status import status_cache_path

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    assert runner.invoke(app, ["status", "--stack", "example-gcp"]).exit_code == 0
    before = sorted(p.name for p in status_cache_path(path).iterdir())
    opened: list[str] = []
    real = cachefile.read
    monkeypatch.setattr(cachefile, "read", lambda target, limit: opened.append(target.name) or real(target, limit))
    result = runner.invoke(app, ["status", "vit-finetune", "--stack", "example-gcp", "--json"])
    assert result.exit_code == 0, result.output
    assert [n for n in opened if ".status" in str(n) or n.startswith("vit-finetune.")] == \
        [n for n in before if n.startswith("vit-finetune.")]
    assert runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--no-apply", "--force"]).exit_code == 0
    assert runner.invoke(app, ["status", "--stack", "example-gcp"]).exit_code == 0
    after = sorted(p.name for p in status_cache_path(path).iterdir())
    assert len(after) == 3 and [a for a in after if a not in before][0].startswith("vit-finetune.")
    assert [b for b in before if b not in after][0].startswith("vit-finetune.")


def test_the_cached_view_of_a_job_reads_as_the_validated_job():
    """Every field, nested ones included, with its type: a field added to the model is cached too."""
    from cli.lifecycle.status import Record, job_facts, job_view
    from infra.config import Job

    job = Job.model_validate({
        "id": "llm", "machineType": "n1-standard-8", "zone": "us-central1-b", "command": "python t.py", "nodes": 2,
        "attempt": 4, "state": "stopped", "capacity": "on-demand", "diskGb": 300, "env": {"A": "1", "B": {"secure": "x"}},
        "diskReplicaZones": ["us-central1-b", "us-central1-c"], "diskKind": "regional", "stopReason": "a node failed",
        "move": {"from": "us-central1-b", "to": "us-central1-c", "step": "restore", "began": "2026-11-21T10:00:00Z"},
        "zoneHistory": [{"zone": "us-central1-a", "lastAttempt": 2, "moveBegan": "2026-11-20T09:30:00.5+01:00"},
                        {"zone": "us-central1-c", "lastAttempt": 3, "sameDisk": True}]})

    from pydantic import BaseModel

    def same(model, view) -> None:
        assert isinstance(view, Record) and set(view.__dict__) == set(type(model).model_fields)
        for name in type(model).model_fields:
            mine, theirs = getattr(view, name), getattr(model, name)
            if isinstance(theirs, BaseModel):
                same(theirs, mine)
            elif isinstance(theirs, (list, tuple)) and theirs and isinstance(theirs[0], BaseModel):
                assert type(mine) is type(theirs) and len(mine) == len(theirs)
                for a, b in zip(theirs, mine, strict=True):
                    same(a, b)
            elif isinstance(theirs, dict):
                assert mine.keys() == theirs.keys()
                for k in theirs:
                    if isinstance(theirs[k], BaseModel):
                        same(theirs[k], mine[k])
                    else:
                        assert mine[k] == theirs[k]
            else:
                assert mine == theirs and type(mine) is type(theirs), name

    view = job_view(json.loads(json.dumps(job_facts(job))))
    same(job, view)
    assert view.active == job.active and view.move.began.tzinfo is not None


def test_a_job_whose_vm_stopped_itself_shows_as_finished_before_complete_with_a_failures_log_tail(project, runner, tmp_path):
    """The agent records `completed` (or `failed`, with why and its log's end) and powers the VM off:
    status says so, and how the stack file catches up, before anyone ran `complete`."""
    log = tmp_path / "events.jsonl"
    rows = [{"job": "vit-finetune", "attempt": 3, "node": 0, "event": "started", "time": "2026-11-21T10:00:00Z", "details": {}},
            {"job": "vit-finetune", "attempt": 3, "node": 0, "event": "completed", "time": "2026-11-21T12:00:00Z", "details": {}},
            {"job": "bert-eval", "attempt": 2, "node": 0, "event": "started", "time": "2026-11-21T10:00:00Z", "details": {}},
            {"job": "bert-eval", "attempt": 2, "node": 0, "event": "failed", "time": "2026-11-21T10:01:00Z",
             "details": {"reason": "job bert-eval: setup failed (exit 1)", "key": "setup", "exit_code": "1",
                         "log_tail": "Collecting torch==9\nERROR: No matching distribution found for torch==9"}}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    path.write_text(path.read_text().replace("      state: completed\n", "      state: running\n"))
    result = runner.invoke(app, ["status", "--stack", "example-gcp", "--events-dir", str(log)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    text = " ".join(line.strip() for line in lines)  # (reasons are wrapped at the terminal's width)
    assert ("vit-finetune: attempt 3 completed (its events) and its VMs powered themselves off; the stack file still says "
            "running: `spotctl complete vit-finetune` (or `spotctl watch`) records it") in text
    assert ("bert-eval: attempt 2 failed (its events: job bert-eval: setup failed (exit 1)) and its VMs powered themselves "
            "off; the stack file still says running: `spotctl logs bert-eval` shows why; `spotctl watch` retries it while "
            "maxFailures allows") in text
    # (the event reader makes every value one line: the tail's lines come joined by spaces)
    assert "    | Collecting torch==9 ERROR: No matching distribution found for torch==9" in lines
    (row,) = json.loads(runner.invoke(app, ["status", "bert-eval", "--stack", "example-gcp", "--events-dir", str(log),
                                            "--json"]).stdout)
    assert row["status"] == "failed?" and row["log_tail"][-1].endswith("ERROR: No matching distribution found for torch==9")
