"""What spotctl says when something is off: one clear line naming the file, job or option, the right
exit code, and the stack file untouched by a refused command (CliRunner on real temp files)."""

from __future__ import annotations

import json
from pathlib import Path

from cli.app import app

GCP = Path("stacks") / "Pulumi.example-gcp.yaml"


def test_plot_under_a_file_is_one_error(project: Path, runner):
    (project / "events").mkdir()
    before = GCP.read_bytes()
    result = runner.invoke(app, ["cost", "-s", "example-gcp", "--events-dir", "events", "--plot", "Pulumi.yaml/x.png"])
    assert result.exit_code == 1
    assert result.stderr == "error: --plot: Pulumi.yaml is not a directory\n"
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert GCP.read_bytes() == before


def test_plot_at_a_directory_is_refused_not_written_beside_it(project: Path, runner):
    (project / "events").mkdir()
    (project / "plots").mkdir()
    result = runner.invoke(app, ["cost", "-s", "example-gcp", "--events-dir", "events", "--plot", "plots"])
    assert result.exit_code == 1
    assert result.stderr == "error: --plot: plots is a directory; give a file name in it, such as plots/cost.png\n"
    assert not (project / "plots.png").exists() and not list((project / "plots").iterdir())


def test_events_of_a_job_with_none_says_so(project: Path, runner):
    (project / "events").mkdir()
    result = runner.invoke(app, ["events", "vit-finetune", "-s", "example-gcp", "--events-dir", "events"])
    assert result.exit_code == 0
    assert (result.stdout, result.stderr) == ("", "no events of vit-finetune in events\n")
    result = runner.invoke(app, ["events", "vit-finetune", "-s", "example-gcp", "--events-dir", "events", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout) == [] and result.stderr == ""


def test_status_warns_when_the_events_source_holds_no_event(project: Path, runner):
    result = runner.invoke(app, ["status", "-s", "example-gcp", "--events-dir", "Pulumi.yaml"])
    assert result.exit_code == 0
    said = " ".join(result.stderr.split())
    # bert-eval completed and llm-pretrain runs: neither ran without an event (a pending job may)
    assert ("warning: no event of llm-pretrain, vit-finetune, bert-eval was read from Pulumi.yaml: their preemptions, "
            "hours and VM-hours are unknown, not 0 (is the events source the right one?)") in said


def test_status_counts_the_lines_that_are_not_json_once(project: Path, runner):
    (project / "events").mkdir()
    good = {"job": "vit-finetune", "attempt": 3, "node": 0, "event": "started", "time": "2026-11-20T10:00:00Z",
            "stack": "example-gcp"}
    (project / "events" / "events.jsonl").write_text(f"not json\n{json.dumps(good)}\n{{broken\n\n")
    result = runner.invoke(app, ["status", "-s", "example-gcp", "--events-dir", "events", "--json"])
    assert result.exit_code == 0
    json.loads(result.stdout)
    lines = result.stderr.splitlines()
    assert lines.count("warning: event events.jsonl: skipped 2 lines that are not JSON") == 1
    assert "warning: no event of llm-pretrain, bert-eval was read from events" in result.stderr


def test_a_failed_apply_says_what_is_known_and_the_next_stop_reads_well(project: Path, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_UP_EXIT", "1")
    result = runner.invoke(app, ["stop", "vit-finetune", "-s", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert "error: pulumi up failed: exit code 1, nothing on stderr" in result.stderr
    assert "stderr:" not in result.stderr
    monkeypatch.delenv("FAKE_PULUMI_UP_EXIT")
    result = runner.invoke(app, ["stop", "vit-finetune", "-s", "example-gcp", "--yes"])
    assert result.exit_code == 0
    assert "job vit-finetune: finishing the update an earlier command started and did not finish (state=stopped" in result.stdout
    assert "None" not in result.output


def test_a_trace_not_found_without_spotctl_traces_reads_well(tmp_path: Path, runner, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOTCTL_TRACES", raising=False)
    result = runner.invoke(app, ["drill", "--trace", "nofile.json", "--", "true"])
    assert result.exit_code == 1
    assert result.stderr == (f"error: nofile.json: trace file not found in {tmp_path}, and SPOTCTL_TRACES is not set "
                             "(set it to your traces directory, or give the file's path)\n")


def write_stack(project: Path, config: dict) -> Path:
    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text("# kept\nconfig:\n" + "".join(f"  spotctl:{k}: {json.dumps(v)}\n" for k, v in config.items()))
    return path


def test_git_ls_remote_failure_keeps_gits_own_words(project: Path, runner, tmp_path):
    from tests.conftest import GCP_BASE, gcp_job, stack_config

    empty = tmp_path / "not-a-repo"
    empty.mkdir()
    path = write_stack(project, stack_config(GCP_BASE, jobs=[gcp_job(id="other")]))
    (project / "job.yaml").write_text(json.dumps(gcp_job(code={"git": f"file://{empty}", "ref": "main"})))
    before = path.read_bytes()
    result = runner.invoke(app, ["launch", "job.yaml", "-s", "team", "--no-apply"])
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert f"fatal: '{empty}' does not appear to be a git repository; fatal: Could not read from remote repository." in said
    assert "and the repository exists.)" not in said
    assert path.read_bytes() == before


def test_a_link_to_the_code_dir_itself_is_called_a_loop(project: Path, runner):
    from tests.conftest import GCP_BASE, gcp_job, stack_config

    path = write_stack(project, stack_config(GCP_BASE, jobs=[gcp_job(id="other")]))
    (project / "mycode").mkdir()
    (project / "mycode" / "train.py").write_text("print(1)\n")
    (project / "mycode" / "loop").symlink_to(".")
    (project / "job.yaml").write_text(json.dumps(gcp_job(code="./mycode")))
    before = path.read_bytes()
    result = runner.invoke(app, ["launch", "job.yaml", "-s", "team", "--no-apply"])
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert "loop is a link to ., a loop (a link to a directory that contains it;" in said, said
    assert "outside the code" not in said
    assert path.read_bytes() == before


def test_a_pulumi_failure_keeps_its_stderr_when_there_is_one():
    from pulumi.automation._cmd import CommandResult
    from pulumi.automation.errors import CommandError

    from cli.lifecycle.apply import _last_line

    said = CommandError(CommandResult("Updating\n    error: update failed\n", "warning: x\nerror: quota exceeded\n", 255))
    assert _last_line(said) == "error: quota exceeded"
    quiet = CommandError(CommandResult("Updating\nDiagnostics:\n    error: update failed\n", "", 255))
    assert _last_line(quiet) == "exit code 255, nothing on stderr; its output: error: update failed"


HOLDER = """
import sys
from pathlib import Path
from cli.lifecycle import stackfile
with stackfile.locked(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_wait_for_the_lock_is_said_once_with_its_holder(project: Path, runner, monkeypatch):
    import os
    import socket
    import subprocess
    import sys

    from cli.lifecycle.stackfile import locking

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(GCP.resolve())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parent.parent)
    try:
        assert holder.stdout.readline() == "held\n"
        told: list[str] = []

        def release(line: str) -> None:  # the notice came first; then the other spotctl finishes
            told.append(line)
            holder.stdin.write("done\n")
            holder.stdin.flush()

        monkeypatch.setattr(locking, "ON_WAIT", [*locking.ON_WAIT, release])
        result = runner.invoke(app, ["stop", "vit-finetune", "-s", "example-gcp", "--no-apply", "--yes", "--json"])
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    lock = os.path.realpath(GCP.parent / f".{GCP.name}.lock")
    assert len(told) == 1 and told[0].startswith(f"waiting up to 30 s for the lock on {lock} held by pid {holder.pid} "
                                                 f"on {socket.gethostname()} since 20")
    assert result.stderr.count("waiting up to 30 s for the lock") == 1
    assert "state: stopped" in GCP.read_text()
    assert Path(lock).read_text() == ""  # released: no stale holder told to the next waiter


def test_nothing_to_resume_is_said_before_pulumi_is_looked_for(project: Path, runner, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("SPOTCTL_PULUMI_ROOT", raising=False)
    before = GCP.read_bytes()
    result = runner.invoke(app, ["resume", "bert-eval", "-s", "example-gcp", "--yes"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: job bert-eval is completed; there is nothing to resume"), result.stderr
    assert "pulumi" not in result.stderr
    assert GCP.read_bytes() == before
    # a job that does need an update still says first that pulumi is missing, the file untouched
    result = runner.invoke(app, ["stop", "vit-finetune", "-s", "example-gcp", "--yes"])
    assert result.exit_code == 1 and result.stderr.startswith("error: cannot apply: no `pulumi` CLI found")
    assert GCP.read_bytes() == before
