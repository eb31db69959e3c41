"""Piped without COLUMNS, cost and plan fit 80 columns as status does, and no value is cut to fit."""

from __future__ import annotations

import json

import pytest

from cli.app import app
from cli.lifecycle import estimate

NO_COLUMNS = {"COLUMNS": None}


@pytest.mark.parametrize("stack", ["example-aws", "example-gcp"])
def test_plan_piped_fits_80_columns_and_cuts_no_value(project, runner, stack):
    result = runner.invoke(app, ["plan", "--stack", stack], env=NO_COLUMNS)
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    outputs = result.stdout.split("\nOutputs:\n")[1].split("\nwhat it costs")[0]
    assert "…" not in outputs
    doc = json.loads(runner.invoke(app, ["plan", "--stack", stack, "--json"]).stdout)
    flat = "".join(line.strip() for line in outputs.splitlines())
    for value in doc["outputs"].values():  # every top-level string output is there whole (lines joined)
        if isinstance(value, str):
            assert value in flat, value


def test_cost_piped_fits_80_columns(project, runner):
    (project / "events").mkdir()
    result = runner.invoke(app, ["cost", "--stack", "example-gcp", "--events-dir", "events"], env=NO_COLUMNS)
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "left out at 80 columns" in result.output


def test_a_long_path_in_the_cost_preview_is_never_broken_inside():
    path = "/home/someone/projects/spot/traces/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"
    text = estimate._fit(f"  6 h of work by 12 h; 8 runs on the trace at {path} (no history)", 80)
    assert any(path in line for line in text.splitlines())
