"""validate, cleanup and logs take --json: one document on stdout, errors still one line each on stderr."""

from __future__ import annotations

import json

from cli.app import app


def test_validate_json_ok_and_refused(project, runner):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    ok = runner.invoke(app, ["validate", "--stack", "example-gcp", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc == {"file": "stacks/Pulumi.example-gcp.yaml", "ok": True, "cloud": "gcp", "pools": 2, "jobs": 3,
                   "errors": [], "warnings": doc["warnings"]}
    stack.write_text(stack.read_text().replace("    - us-central1-c\n", "    - us-central1-c\n    - us-central1-q\n"))
    before = stack.read_bytes()
    bad = runner.invoke(app, ["validate", "--stack", "example-gcp", "--json"])
    assert bad.exit_code == 1
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["file"] == "stacks/Pulumi.example-gcp.yaml"
    assert doc["errors"] == ["spotctl:zones[3]: zone 'us-central1-q' does not exist in region us-central1 "
                             "(its zones: us-central1-a, us-central1-b, us-central1-c, us-central1-f)"]
    assert bad.stderr.startswith("error: stacks/Pulumi.example-gcp.yaml: spotctl:zones[3]: zone 'us-central1-q'")
    assert stack.read_bytes() == before


def test_cleanup_json_lists_without_yes_and_removes_a_never_applied_job(project, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTCTL_PULUMI_ROOT", str(tmp_path / "no-pulumi"))
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = stack.read_text()
    listed = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--json"])
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.stdout)
    assert doc["job"] == "bert-eval" and doc["removed"] is False and doc["declined"] is True
    assert any(u.endswith("::job-bert-eval-n0-disk") for u in doc["resources"])
    assert stack.read_text() == before
    job = project / "job.yaml"
    job.write_text("id: extra\nmachineType: g2-standard-8\naccelerator: {type: nvidia-l4, count: 1}\ncommand: python3 -V\n")
    assert runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"]).exit_code == 0
    gone = runner.invoke(app, ["cleanup", "extra", "--stack", "example-gcp", "--no-apply", "--yes", "--json"])
    assert gone.exit_code == 0, gone.output
    assert json.loads(gone.stdout) == {"job": "extra", "removed": True, "neverApplied": True, "applied": False, "disks": []}
    assert stack.read_text() == before


def test_logs_json_is_one_document_and_refuses_follow(project, runner, tmp_path):
    logs = tmp_path / "disk" / ".spotctl" / "logs"
    logs.mkdir(parents=True)
    (logs / "attempt-1-node-0.log").write_text("step 1\n")
    (logs / "attempt-2-node-0.log").write_text("resumed\nstep 3\n")
    args = ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path / "disk" / ".spotctl")]
    result = runner.invoke(app, [*args, "--json", "--tail", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"job": "diffusion", "attempt": 2, "node": 0, "log": "step 3\n",
                                         "source": str(tmp_path / "disk" / ".spotctl")}
    both = runner.invoke(app, [*args, "--json", "--follow"])
    assert both.exit_code == 1 and both.stdout == ""
    assert both.stderr.startswith("error: --json prints the log once")
