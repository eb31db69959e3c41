"""Pulumi's stack conventions: --stack optional (PULUMI_STACK, the workspace's selected stack),
org/project/stack names, the stack config dir from Pulumi.yaml, --cwd."""

from __future__ import annotations

import hashlib
import json

import pytest

from cli.app import app
from tests.conftest import pulumi_calls


def select(project, stacks: dict | None = None, legacy: str | None = None, current: str | None = None) -> None:
    """Write the workspace file `pulumi stack select` writes (pkg/workspace/workspace.go)."""
    home = project / "pulumi-home"
    digest = hashlib.sha1(str(project.resolve() / "Pulumi.yaml").encode()).hexdigest()
    (home / "workspaces").mkdir(parents=True, exist_ok=True)
    doc = {**({"stacks": stacks} if stacks else {}), **({"stack": legacy} if legacy else {})}
    (home / "workspaces" / f"spotctl-{digest}-workspace.json").write_text(json.dumps(doc))
    if current:
        (home / "credentials.json").write_text(json.dumps({"current": current, "accessTokens": {}}))


def test_pulumi_stack_env_selects_the_stack(project, runner, monkeypatch):
    monkeypatch.setenv("PULUMI_STACK", "example-aws")
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "stacks/Pulumi.example-aws.yaml: ok (aws, 1 pool, 3 jobs)\n"


@pytest.mark.parametrize("how", ["per-backend", "legacy"])
def test_the_workspace_selected_stack_is_used(project, runner, how):
    if how == "per-backend":
        select(project, {"https://api.pulumi.com": "example-aws", "file://~": "example-gcp"}, current="file://~")
    else:
        select(project, legacy="example-gcp")
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("stacks/Pulumi.example-gcp.yaml: ok (gcp")


def test_the_option_wins_over_the_environment(project, runner, monkeypatch):
    monkeypatch.setenv("PULUMI_STACK", "example-aws")
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.stdout.startswith("stacks/Pulumi.example-gcp.yaml: ok")


def test_fully_qualified_names(project, runner, fake_pulumi):
    ok = runner.invoke(app, ["validate", "--stack", "acme/spotctl/example-gcp"])
    assert ok.exit_code == 0 and ok.stdout.startswith("stacks/Pulumi.example-gcp.yaml: ok")
    other = runner.invoke(app, ["validate", "--stack", "acme/billing/example-gcp"])
    assert other.exit_code == 1
    assert other.output.startswith("error: spotctl: --stack 'acme/billing/example-gcp': stack of project 'billing', "
                                   "but this is project 'spotctl'")
    applied = runner.invoke(app, ["resume", "diffusion", "--stack", "acme/spotctl/example-aws", "--yes"])
    assert applied.exit_code == 0, applied.output
    (up,) = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    assert up[-2:] == ["--stack", "acme/spotctl/example-aws"]  # Pulumi selects it by its full name
    assert "attempt: 3" in (project / "stacks" / "Pulumi.example-aws.yaml").read_text()


def test_stack_config_dir_comes_from_pulumi_yaml(project, runner):
    pulumi_yaml = project / "Pulumi.yaml"
    pulumi_yaml.write_text(pulumi_yaml.read_text().replace("stackConfigDir: stacks", "stackConfigDir: config/stacks"))
    (project / "config").mkdir()
    (project / "stacks").rename(project / "config" / "stacks")
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 0 and result.stdout.startswith("config/stacks/Pulumi.example-gcp.yaml: ok")
    pulumi_yaml.write_text(pulumi_yaml.read_text().replace("stackConfigDir: config/stacks\n", ""))
    missing = runner.invoke(app, ["validate", "--stack", "example-gcp"])  # Pulumi's default: next to Pulumi.yaml
    assert missing.exit_code == 1 and missing.output == "error: Pulumi.example-gcp.yaml: stack file not found; ./ has no Pulumi.<stack>.yaml\n"


def test_cwd_finds_the_project_from_elsewhere(project, runner, tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    result = runner.invoke(app, ["--cwd", str(project), "validate", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    bad = runner.invoke(app, ["-C", str(project / "nope"), "validate"])
    assert bad.exit_code == 1 and bad.output == f"error: --cwd {project / 'nope'}: No such file or directory\n"


def test_no_stack_anywhere_says_how_to_pick_one(project, runner):
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 1
    assert result.output == ("error: spotctl: no stack: give --stack NAME (or --stack-file PATH), set PULUMI_STACK, "
                             "or select one with `pulumi stack select NAME`\n")
