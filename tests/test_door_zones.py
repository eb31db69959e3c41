"""A GCP zone the region does not have is refused by validate and plan, as AWS's are (on real temp files)."""

from __future__ import annotations

from cli.app import app
from infra import catalog

ZONE_LINE = "    - us-central1-c\n"


def test_validate_and_plan_refuse_a_gcp_zone_the_region_lacks(project, runner):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = stack.read_text()
    assert ZONE_LINE in text
    stack.write_text(text.replace(ZONE_LINE, ZONE_LINE + "    - us-central1-q\n"))
    before = stack.read_bytes()
    for command in (["validate"], ["plan"]):
        result = runner.invoke(app, [*command, "--stack", "example-gcp"])
        assert result.exit_code != 0, result.output
        assert ("spotctl:zones[3]: zone 'us-central1-q' does not exist in region us-central1 "
                "(its zones: us-central1-a, us-central1-b, us-central1-c, us-central1-f)") in result.output
        assert "ok" not in result.stdout.split()
        assert stack.read_bytes() == before


def test_a_real_gcp_zone_passes_and_a_region_the_table_lacks_is_not_refused(project, runner):
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    stack.write_text(stack.read_text().replace(ZONE_LINE, ZONE_LINE + "    - us-central1-f\n"))
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    assert catalog._zone_exists("gcp", "africa-south1", "africa-south1-q") is None  # newer than the zone table
    assert "does not exist" in catalog._zone_exists("gcp", "europe-west4", "europe-west4-d")


def test_catalog_says_what_a_gcp_question_mark_means(runner):
    result = runner.invoke(app, ["catalog", "--cloud", "gcp", "--gpu", "l4", "--region", "us-central1"])
    assert result.exit_code == 0, result.output
    assert 'gcp zones "?": some of the region\'s zones (the source lists regions, not zones)' in result.output
    assert max(map(len, result.output.splitlines())) <= 80
