"""The small things users trip over: --version, -h, completion, choices in --help, simulate --json
is valid JSON and finds traces, one error line without credentials, events needs a source."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from cli.app import app

ROOT = Path(__file__).resolve().parent.parent


def test_version_and_short_help(runner):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"spotctl {version}\n"
    short = runner.invoke(app, ["-h"])
    assert short.exit_code == 0 and "--install-completion" in short.stdout and "resume" in short.stdout
    sub = runner.invoke(app, ["resume", "-h"])
    assert sub.exit_code == 0 and "--preview-only" in sub.stdout


@pytest.mark.parametrize(("command", "option", "choices"), [
    ("resume", "--capacity", "spot|on-demand"), ("failover", "--to", "spot|on-demand"), ("drill", "--cloud", "gcp|aws"),
])
def test_choices_are_shown_and_enforced(runner, command, option, choices):
    help_text = runner.invoke(app, [command, "--help"], terminal_width=200).stdout
    assert f"<{choices}>" in help_text
    bad = runner.invoke(app, [command, "x", option, "spto"] if command != "drill" else [command, option, "spto", "--", "true"])
    assert bad.exit_code == 2 and "'spto' is not one of" in bad.output


def write_trace(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": [1, 1, 0, 1, 1, 1, 0, 0, 1, 1] * 3}))
    return path


def no_nan(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def test_simulate_json_is_valid_json_and_traces_are_found_through_the_env(runner, tmp_path, monkeypatch):
    write_trace(tmp_path / "traces" / "aws" / "t1.json")
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path / "traces"))
    monkeypatch.chdir(tmp_path)
    args = ["simulate", "--trace", "aws/t1.json", "--policy", "greedy", "--job-hours", "4", "--deadline-hours", "8",
            "--changeover-hours", "0", "--starts", "2", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = no_nan(result.stdout)
    omniscient = next(r for r in doc["results"] if r["policy"] == "omniscient")
    assert omniscient["spot_h"] is None and omniscient["od_h"] is None


def test_simulate_finds_the_documented_paths_in_the_shared_traces_layout(runner, tmp_path, monkeypatch):
    """$SPOTCTL_TRACES holding skypilot-spot-traces/availability/...: the simulate docs' relative path and a bare
    file name both resolve; a bare name two traces share is one error listing them."""
    traces = tmp_path / "traces"
    oct22 = write_trace(traces / "skypilot-spot-traces" / "availability" / "1-node" / "aws-10-26-2022" / "us-west-2b_v100_1.json")
    monkeypatch.setenv("SPOTCTL_TRACES", str(traces))
    monkeypatch.chdir(tmp_path)
    args = ["--policy", "greedy", "--job-hours", "4", "--deadline-hours", "8", "--changeover-hours", "0", "--starts", "2", "--json"]
    readme = runner.invoke(app, ["simulate", "--trace", "availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json", *args])
    assert readme.exit_code == 0, readme.output
    bare = runner.invoke(app, ["simulate", "--trace", "us-west-2b_v100_1.json", *args])
    assert bare.exit_code == 0, bare.output
    assert json.loads(bare.stdout) == json.loads(readme.stdout)
    write_trace(traces / "skypilot-spot-traces" / "availability" / "1-node" / "aws-02-15-2023" / "us-west-2b_v100_1.json")
    both = runner.invoke(app, ["simulate", "--trace", "us-west-2b_v100_1.json", *args])
    assert both.exit_code == 1 and both.output.count("\n") == 1
    assert both.output == (f"error: us-west-2b_v100_1.json: 2 trace files of that name under {traces}; give one of: "
                           "skypilot-spot-traces/availability/1-node/aws-02-15-2023/us-west-2b_v100_1.json, "
                           f"{oct22.relative_to(traces)}\n")
    missing = runner.invoke(app, ["simulate", "--trace", "nope.json"])
    assert missing.exit_code == 1 and missing.output.count("\n") == 1
    for pattern in ("*", "us-west-2?_v100_1.json", "[u]s-west-2b_v100_1.json"):  # a name, never a pattern
        literal = runner.invoke(app, ["simulate", "--trace", pattern, *args])
        assert literal.exit_code == 1 and literal.output.startswith(f"error: {pattern}: trace file not found"), literal.output
    assert missing.output.startswith(f"error: nope.json: trace file not found here, nor under {traces}, "
                                     f"{traces / 'skypilot-spot-traces'} or their subfolders")
    assert "shared" not in missing.output  # (no folder beside spotctl's checkout is searched)


def test_drill_help_lists_every_verdict_the_drill_guide_lists(runner):
    readme = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "drill.md").read_text()
    verdicts = re.findall(r"`(reentrant|not-exercised|restarts-from-scratch|lost-work|did-not-finish)`", readme.split("Verdicts:")[1][:800])
    assert len(set(verdicts)) == 5
    result = runner.invoke(app, ["drill", "-h"], terminal_width=400)
    assert result.exit_code == 0
    for verdict in verdicts:
        assert verdict in result.output, verdict


def test_simulate_missing_or_bad_trace_is_one_line_without_python_text(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path))
    missing = runner.invoke(app, ["simulate", "--trace", "nope/t.json"])
    assert missing.exit_code == 1
    assert missing.output.startswith(f"error: nope/t.json: trace file not found here, nor under {tmp_path}, ")
    assert missing.output.endswith("(set SPOTCTL_TRACES to your traces directory)\n")
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": []}')
    result = runner.invoke(app, ["simulate", "--trace", str(bad)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(f"error: {bad}: not a trace file: expected a spot-traces JSON")
    csv = tmp_path / "bad.csv"
    csv.write_text("1,2\n")
    result = runner.invoke(app, ["simulate", "--trace", str(csv)])
    assert result.exit_code == 1 and "list index out of range" not in result.output and "not a trace file" in result.output


def test_simulate_plot_is_written(runner, tmp_path):
    trace = write_trace(tmp_path / "t.json")
    png = tmp_path / "run.png"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--trace", str(trace), "--policy", "greedy", "--policy", "on-demand",
                                 "--job-hours", "4", "--deadline-hours", "8", "--changeover-hours", "0", "--starts", "2",
                                 "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("where,message", [
    ("t.json/x.png", "error: --plot: {tmp}/t.json is not a directory\n"),  # a file where a folder must be
    ("plots", "error: --plot: {tmp}/plots is a directory; give a file name in it, such as {tmp}/plots/simulate.png\n"),
])
def test_simulate_plot_where_none_can_be_written_is_one_error_before_any_run(runner, tmp_path, where, message):
    """As ``cost --plot``: no traceback after the simulation, no PLOTS.png written beside a directory."""
    trace = write_trace(tmp_path / "t.json")
    (tmp_path / "plots").mkdir()
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--policy", "greedy", "--job-hours", "4",
                                 "--deadline-hours", "8", "--starts", "2", "--plot", str(tmp_path / where)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr == message.format(tmp=tmp_path)
    assert result.stdout == ""  # (refused before the table: nothing was simulated)
    assert not (tmp_path / "plots.png").exists() and not list((tmp_path / "plots").iterdir())


def test_cleanup_orphans_without_credentials_is_one_error_line(project, runner, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = runner.invoke(app, ["cleanup", "--orphans", "--stack", "example-aws"])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot ask the cloud: no AWS credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ")
    assert result.output.count("\n") == 1


def test_events_needs_a_source_and_an_existing_dir(project, runner):
    none = runner.invoke(app, ["events", "llm-pretrain", "--stack", "example-gcp"])
    assert none.exit_code == 1 and none.output.startswith("error: job llm-pretrain: where are its events? give --events-dir DIR")
    missing = runner.invoke(app, ["events", "llm-pretrain", "--stack", "example-gcp", "--events-dir", "gone"])
    assert missing.exit_code == 1 and missing.output == "error: --events-dir gone: no such file or directory\n"
    status = runner.invoke(app, ["status", "--stack", "example-gcp", "--events-dir", "gone"])
    assert status.exit_code == 1 and status.output == "error: --events-dir gone: no such file or directory\n"
