"""Paper cuts from a new user's walk: the cost table fits 80 columns without cutting money, help shows
flags as flags, every help example runs against the shipped example stacks, an unknown stack lists
the stacks there are, keys outside `config:` or without `spotctl:` get that hint, and a token written
in plain text is warned about."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from cli.app import app
from infra.tokens import looks_like

ROOT = Path(__file__).resolve().parent.parent


def test_the_cost_table_fits_80_columns_and_keeps_every_figure_whole(runner, project):
    from tests.test_cost import EVENTS, STACK

    (project / "stacks" / "Pulumi.team-a.yaml").write_text(STACK)
    (project / "events").mkdir()
    (project / "events" / "events.jsonl").write_text("\n".join(__import__("json").dumps(e) for e in EVENTS) + "\n")
    args = ["cost", "--stack", "team-a", "--events-dir", "events", "--as-of", "2026-11-21T14:45:00Z"]
    for width in (80, 60):
        result = runner.invoke(app, args, env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= width, width
        assert "…" not in result.stdout  # nothing cut
        text = " ".join(result.stdout.split())
        for figure in ("$146.58", "$401.49", "$254.91 (63.5 %)", "$140.90", "$393.27", "$252.37 (64.2 %)"):
            assert figure in text, (width, figure)
    wide = runner.invoke(app, args, env={"COLUMNS": "200"}).stdout
    assert "changeover h" in wide and "left out" not in wide


def test_help_shows_flags_as_flags(runner):
    result = runner.invoke(app, ["resume", "--help"], env={"COLUMNS": "120"})
    assert "<bool>" not in result.output
    assert re.search(r"--yes\s+-y\s+Apply without", result.output)
    assert "<spot|on-demand>" in result.output  # an option with a value keeps its type


def registered():
    for c in app.registered_commands:
        yield c.name or c.callback.__name__, f"{c.help or ''}\n{c.short_help or ''}"
    for g in app.registered_groups:
        for c in g.typer_instance.registered_commands:
            yield f"{g.name} {c.name or c.callback.__name__}", f"{c.help or ''}\n{c.short_help or ''}"


EXAMPLE_STACKS = {name: yaml.safe_load((ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text())["config"]
                  for name in ("example-gcp", "example-aws")}
STACKLESS = {"drill", "simulate", "catalog", "show-gpus"}  # commands that read no stack
JOB_COMMANDS = {"resume", "failover", "complete", "status", "events", "cleanup", "move", "cost", "logs", "stop"}


@pytest.mark.parametrize("command,text", list(registered()), ids=[n for n, _ in registered()])
def test_every_help_example_uses_the_shipped_example_stacks(command, text):
    for example in re.findall(r"Example: (spotctl .+?)(?:\s{2,}|$|\n)", text.replace("\n\n", "\n")):
        words = shlex.split(example.split("(")[0])
        stack = next((words[i + 1] for i, w in enumerate(words) if w in ("--stack", "-s")), None)
        if stack is None:
            assert command in STACKLESS, f"{command}: {example} names no stack"
            continue
        assert stack in EXAMPLE_STACKS, example
        if command in JOB_COMMANDS and len(words) > 2 and not words[2].startswith("-"):
            jobs = {j["id"] for j in EXAMPLE_STACKS[stack]["spotctl:jobs"]}
            assert words[2] in jobs, f"{example}: no job {words[2]} in {stack}"


def test_an_unknown_stack_lists_the_stacks_there_are(runner, project):
    result = runner.invoke(app, ["validate", "--stack", "example-gpc"])
    assert result.exit_code == 1
    assert result.output == ("error: stacks/Pulumi.example-gpc.yaml: stack file not found; the stacks in stacks/ are: "
                             "example-aws, example-gcp\n")


def test_keys_without_the_prefix_or_outside_config_get_that_hint(runner, project):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text()
    path.write_text(text.replace("  spotctl:cloud: gcp\n", "  cloud: gcp\n"))
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert result.output == "error: stacks/Pulumi.example-gcp.yaml: config.cloud: missing the `spotctl:` prefix: write `spotctl:cloud`\n"
    path.write_text("spotctl:cloud: gcp\n" + text.replace("  spotctl:cloud: gcp\n", ""))
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert result.output == ("error: stacks/Pulumi.example-gcp.yaml: spotctl:cloud: outside `config:`: Pulumi reads a "
                             "stack's settings only under `config:` (indent spotctl:cloud under a `config:` line)\n")


def test_a_plain_text_token_is_warned_about_without_showing_it(runner, project):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    token = "hf_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z"
    path.write_text(path.read_text().replace("    - id: bert-eval\n", f"    - id: bert-eval\n      env:\n        HF_TOKEN: {token}\n"
                                             "        DATA_DIR: /mnt/data/imagenet-2012-train\n"))
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    token_lines = [line for line in result.stderr.splitlines() if "HF_TOKEN" in line]
    assert token_lines == ["warning: stacks/Pulumi.example-gcp.yaml: spotctl:jobs[2].env.HF_TOKEN: looks like a Hugging Face "
                           "token in plain text: the stack file and every VM's script carry it; store it encrypted with "
                           "`pulumi config set --secret --path 'spotctl:jobs[2].env.HF_TOKEN'` (it asks for the value)"]
    assert token not in result.output


@pytest.mark.parametrize("name,value,what", [
    ("KEY", "AKIA" + "ABCDEFGHIJKLMNOP", "an AWS access key id"),
    ("GH", "ghp_" + "a" * 36, "a GitHub token"),
    ("WANDB_API_KEY", "3f9c1e7a2b4d6f8e0a1c3e5f7b9d2a4c6e8f0b1d", "a credential (named WANDB_API_KEY, a long random value)"),
    ("LR", "0.0003", ""),
    ("TOKENIZER", "meta-llama/Llama-3.1-8B", ""),
    ("SECRET_PATH", "/mnt/secrets/service-account.json", ""),
])
def test_what_looks_like_a_token(name, value, what):
    assert looks_like(name, value) == what
