"""Stack commands: ``validate`` and ``plan``."""

from __future__ import annotations

import typer

from cli.commands import JsonOpt, StackFileOpt, StackOpt, app, fail, progress
from infra.basics import ConfigError


@app.command(
    short_help="Check a stack file offline.  Example: spotctl validate --stack example-gcp",
    help="Check a stack file: every spotctl: key, its type and value, unique job ids, zones in the region; warn "
    "(exit 0) where a job's policy will have nothing to weigh.\n\n"
    "Example: spotctl validate --stack example-gcp",
)
def validate(stack: StackOpt = None, stack_file: StackFileOpt = None) -> None:
    from cli.lifecycle import stackfile

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    from infra.config import policy_warnings

    for warning in policy_warnings(cfg):
        typer.echo(f"warning: {ref.path}: {warning}", err=True)
    typer.echo(f"{ref.path}: ok ({cfg.cloud}, {len(cfg.pools)} pools, {len(cfg.jobs)} jobs)")


@app.command(
    short_help="Show every resource the stack declares, offline.  Example: spotctl plan --stack example-gcp",
    help="Evaluate the real Pulumi program under Pulumi's mocks (no cloud account, no pulumi CLI) and print "
    "the resource tree: type, name, parent and key inputs. --json prints inputs in Pulumi's wire form.\n\n"
    "Example: spotctl plan --stack example-aws --json > plan.json",
)
def plan(stack: StackOpt = None, stack_file: StackFileOpt = None, json_out: JsonOpt = False) -> None:
    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner
    from infra.contract import ContractError

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
        with progress(f"evaluating the Pulumi program for stack {ref.name} under mocks", enabled=not json_out):
            result = planner.run(cfg, ref.name)
    except (ConfigError, ContractError) as exc:
        raise fail(str(exc)) from None
    if json_out:
        typer.echo(result.to_json(), nl=False)
        return
    import shutil

    from cli.plan.tree import render

    typer.echo(render(result, shutil.get_terminal_size((100, 24)).columns), nl=False)
