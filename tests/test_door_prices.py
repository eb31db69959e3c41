"""GCP GPU machine types of us-central1 are priced from the shipped table (Cyclenerd's pricing.yml, cited
per entry); one it lacks is said unpriced with why."""

from __future__ import annotations

import json

import pytest

from cli.app import app

PRICED = {  # cli/cost/prices.json gcp/us-central1, from pricing.yml @fd66b26 (hour / hour_spot)
    "g2-standard-4": None, "g2-standard-12": None, "g2-standard-16": None, "g2-standard-24": None,
    "g2-standard-32": None, "g2-standard-48": None, "g2-standard-96": None, "a2-highgpu-2g": (3.85604, 7.34677),
    "a2-ultragpu-1g": (2.759546, 5.068798), "a2-megagpu-16g": (29.25568, 55.739504),
}


@pytest.mark.parametrize("machine", sorted(PRICED))
def test_launch_prices_gcp_gpu_types_of_us_central1(project, runner, machine):
    job = project / "job.yaml"
    job.write_text(f"id: priced\nmachineType: {machine}\ncommand: python3 -V\n")
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = stack.read_text()
    result = runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    (rate,) = json.loads(result.stdout)["cost"]["jobs"]
    assert rate["spot"] is not None and rate["on_demand"] is not None and rate["spot"] < rate["on_demand"]
    assert "pricing.yml @fd66b26" in rate["source"]
    if PRICED[machine]:
        assert (rate["spot"], rate["on_demand"]) == tuple(round(x, 4) for x in PRICED[machine])
    assert "id: priced" in stack.read_text() and stack.read_text().startswith(before.split("  spotctl:jobs:")[0])


def test_an_unpriced_machine_says_why(project, runner):
    job = project / "job.yaml"
    job.write_text("id: mega\nmachineType: a3-megagpu-8g\ncommand: python3 -V\n")  # (not in the shipped table)
    result = runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("(the whole stack; unpriced: a3-megagpu-8g: neither spotctl:prices nor spotctl's shipped price table has it in "
            "us-central1; add it to spotctl:prices)") in text, text[-600:]
