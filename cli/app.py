"""The ``spotctl`` command line. Commands are thin: parse, call the core, print; domain errors are
caught here only. Cloud SDKs and pulumi are imported inside the commands that need them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from infra.config import ConfigError

app = typer.Typer(
    name="spotctl",
    help="Spot/preemptible GPU training as code: validate and plan stacks offline, resume jobs after preemption.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

StackOpt = Annotated[
    Optional[str], typer.Option("--stack", "-s", metavar="NAME", help="Stack name: reads stacks/Pulumi.NAME.yaml.")
]
StackFileOpt = Annotated[
    Optional[Path], typer.Option("--stack-file", metavar="PATH", help="A Pulumi.<stack>.yaml file anywhere.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def fail(message: str) -> typer.Exit:
    """Print one error (already naming file/key/job) and return the exit to raise."""
    for line in message.splitlines():
        typer.echo(f"error: {line}", err=True)
    return typer.Exit(1)


@app.command(
    short_help="Check a stack file offline.  Example: spotctl validate --stack example-gcp",
    help="Check a stack file: every spotctl: key, its type and value, unique job ids, zones in the region.\n\n"
    "Example: spotctl validate --stack example-gcp",
)
def validate(stack: StackOpt = None, stack_file: StackFileOpt = None) -> None:
    from cli import stackfile

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"{ref.path}: ok ({cfg.cloud}, {len(cfg.pools)} pools, {len(cfg.jobs)} jobs)")


@app.command(
    short_help="Show every resource the stack declares, offline.  Example: spotctl plan --stack example-gcp",
    help="Evaluate the real Pulumi program under Pulumi's mocks (no cloud account, no pulumi CLI) and print "
    "the resource tree: type, name, parent and key inputs. --json prints inputs in Pulumi's wire form.\n\n"
    "Example: spotctl plan --stack example-aws --json > plan.json",
)
def plan(stack: StackOpt = None, stack_file: StackFileOpt = None, json_out: JsonOpt = False) -> None:
    from cli import plan as planner
    from cli import stackfile

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    result = planner.run(cfg, ref.name)
    typer.echo(result.to_json() if json_out else planner.render_tree(result), nl=False)


def main() -> None:
    app()
