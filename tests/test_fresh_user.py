"""What a fresh user meets with no `pulumi` CLI and no events source (README "Everyday use of the command
line"): every hint names only options the command has, and what --events-bucket / --events-dir would
tell is never shown as 0. CliRunner on real temp stack files; the stack file is the same afterwards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer

from cli.app import app

OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


@pytest.fixture
def no_pulumi(project: Path, monkeypatch) -> None:
    """No `pulumi` anywhere spotctl looks (SPOTCTL_PULUMI_ROOT: a directory without bin/pulumi)."""
    monkeypatch.setenv("SPOTCTL_PULUMI_ROOT", str(project / "no-pulumi"))


def options_of(*command: str) -> set[str]:
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]  # type: ignore[attr-defined]
    return {opt for param in group.params for opt in param.opts if opt.startswith("--")}


def named(text: str) -> set[str]:
    """Every --option a message names (`spotctl sync --events-bucket` in a hint is sync's own, not this command's)."""
    return set(OPTION.findall(re.sub(r"`spotctl sync [^`]*`", "", text)))


def unchanged(project: Path):
    files = {p: p.read_bytes() for p in (project / "stacks").glob("Pulumi.*.yaml")}
    return lambda: all(p.read_bytes() == data for p, data in files.items())


@pytest.mark.parametrize("argv", [["logs", "diffusion", "--stack", "example-aws"], ["logs", "vit-finetune", "--stack", "example-gcp"],
                                  ["sync", "--stack", "example-aws"]])
def test_no_pulumi_is_one_error_naming_only_the_commands_options(project, runner, no_pulumi, argv):
    same = unchanged(project)
    result = runner.invoke(app, argv)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.exception, result.output)
    (line,) = result.output.splitlines()
    assert line.startswith("error: ") and "no `pulumi` CLI found" in line and "--events-bucket NAME" in line, line
    assert "--no-apply" not in line and named(line) <= options_of(argv[0]), line
    assert same()


@pytest.mark.parametrize("stack, missing, given", [
    ("example-aws", ["--events-bucket", "--queue-url"], []),
    ("example-aws", ["--queue-url"], ["--events-bucket", "b"]),
    ("example-gcp", ["--subscription"], ["--events-bucket", "b"]),
    ("example-aws", [], ["--events-bucket", "b", "--queue-url", "q"]),
])
def test_watch_without_pulumi_names_what_is_still_missing(project, runner, no_pulumi, no_credentials, stack, missing, given):
    same = unchanged(project)
    result = runner.invoke(app, ["watch", "--once", "--no-poll", "--stack", stack, *given])
    assert not isinstance(result.exception, Exception), result.exception  # an exit, never a traceback
    about_outputs = [line for line in result.stderr.splitlines() if "cannot read the outputs" in line]
    if not missing:
        assert about_outputs == [], result.stderr  # every source given: the outputs are not asked for
    else:
        (line,) = about_outputs
        assert line.startswith("warning: ") and "no `pulumi` CLI found" in line
        assert sorted(named(line)) == sorted(missing), line  # not the options already given, nor the other cloud's
    for line in result.stderr.splitlines():
        assert named(line) <= options_of("watch"), line
    assert same()  # the resume it decided could not start without pulumi: nothing edited


@pytest.mark.parametrize("command", ["failover", "complete"])
def test_a_shared_stacks_warning_suggests_only_what_the_command_has(project, runner, command):
    """failover and complete have no --events-bucket: the bucket of a watcher stack's shared copy comes from `spotctl sync`."""
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    text = path.read_text()
    assert "spotctl:watcher:" not in text
    path.write_text(text.replace("  spotctl:jobs:\n", "  spotctl:watcher:\n    backend: s3://team-state/pulumi\n"
                                 "    repo: https://github.com/team/infra.git\n    passphraseSecret: /spotctl/team/passphrase\n"
                                 "    externalIp: true\n  spotctl:jobs:\n", 1))
    result = runner.invoke(app, [command, "llm-pretrain", "--stack", "example-aws", "--no-apply"])
    warnings = [line for line in result.stderr.splitlines() if "shared copy" in line]
    assert len(warnings) == 1 and "`spotctl sync --stack example-aws --events-bucket NAME`" in warnings[0], result.stderr
    assert named(warnings[0]) <= options_of(command), warnings[0]


def test_status_without_an_events_source_shows_unknown_not_zero(project, runner):
    same = unchanged(project)
    result = runner.invoke(app, ["status", "--stack", "example-aws", "--json"])
    assert result.exit_code == 0, result.output
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("warning: no events source: preemptions, hours, VM-hours and last event are unknown")
    assert named(warning) <= options_of("status") and {"--events-bucket", "--events-dir"} <= named(warning)
    rows = {r["job"]: r for r in json.loads(result.stdout)}
    running = rows["llm-pretrain"]
    assert running["state"] == "running" and running["attempt"] == 4  # the file's facts stand
    assert [running[k] for k in ("preemptions", "spot_hours", "on_demand_hours", "hours_running")] == [None] * 4
    assert "spot_hours" in running["unknown"]
    table = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-aws"], env={"COLUMNS": "200"})
    assert table.exit_code == 0
    (row,) = [line.split() for line in table.stdout.splitlines() if line.startswith("llm-pretrain")]
    assert row[:5] == ["llm-pretrain", "running", "spot", "4", "us-east-1a"] and set(row[5:9]) == {"?"}, table.stdout
    assert same()


def test_status_and_cost_with_an_events_dir_show_the_figures_and_no_warning(project, runner, tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"job": "llm-pretrain", "attempt": 4, "node": 0, "event": "started",
                                  "time": "2026-11-22T10:00:00+00:00", "details": {"capacity": "spot"}}) + "\n")
    status = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-aws", "--events-dir", str(events), "--json"])
    assert status.exit_code == 0 and status.stderr == "", status.output
    (row,) = json.loads(status.stdout)
    assert row["preemptions"] == 0 and row["spot_hours"] > 0 and "unknown" not in row
    cost = runner.invoke(app, ["cost", "llm-pretrain", "--stack", "example-aws", "--events-dir", str(events), "--json"])
    assert cost.exit_code == 0, cost.output
    assert json.loads(cost.stdout)["jobs"][0]["spot_hours"] > 0


def test_cost_without_an_events_source_refuses_with_one_line(project, runner):
    same = unchanged(project)
    result = runner.invoke(app, ["cost", "--stack", "example-aws"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    (line,) = result.output.splitlines()
    assert line.startswith("error: no events source: every figure of the cost report") and "$0.00" not in result.output
    assert named(line) <= options_of("cost") and {"--events-bucket", "--events-dir"} <= named(line)
    assert same()
