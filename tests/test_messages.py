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
