"""Stack commands: ``validate``, ``plan`` and ``sync`` (the stack file's shared copy)."""

import enum
from typing import Annotated, Optional

import typer

from cli.commands import BucketOpt, JsonOpt, StackFileOpt, StackOpt, app, fail, progress
from infra.basics import ConfigError, counted


@app.command(
    short_help="Check a stack file offline.  Example: spotctl validate --stack example-gcp",
    help="Check a stack file: every spotctl: key, its type and value, unique job ids, zones in the region, machine "
    "types, their GPUs and regions against the shipped catalog (`spotctl catalog`), and the cloud limits the stack's "
    "values can break (tags, labels, user data size, names); warn "
    "(exit 0) where a job's policy will have nothing to weigh, its command or code will not be found on the VM, or "
    "a well-formed machine type is not in the catalog (not checked, not priced). "
    "With --cloud (AWS), also refuse a second deployment of this stack name in the account (another region, or "
    "this one with another event bucket).\n\n"
    "Example: spotctl validate --stack example-gcp",
)
def validate(stack: StackOpt = None, stack_file: StackFileOpt = None,
             cloud: Annotated[bool, typer.Option("--cloud", help="Also ask the cloud, read-only, what only it knows: "
                                                 "(AWS) whether this stack name is already deployed in the account by "
                                                 "another deployment, in any region (IAM names are account-wide).")] = False,
             events_bucket: BucketOpt = None, json_out: JsonOpt = False) -> None:
    import json

    from cli.lifecycle import stackfile
    from infra.stack_limits import stack_problems

    def refuse(source: str, errors: list[str]) -> typer.Exit:
        if json_out:  # (the same errors, one per line on stderr as without --json)
            typer.echo(json.dumps({"file": source, "ok": False, "errors": errors, "warnings": []}, indent=1))
        return fail("\n".join(f"{source}: {e}" for e in errors))

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
        if problems := stack_problems(cfg, ref.name):  # limits that need the stack's name or its scripts
            raise ConfigError(str(ref.path), problems)
        from cli.code.prepare import dir_problems

        if problems := dir_problems(cfg, stackfile.project_root(ref.path.parent)):
            raise ConfigError(str(ref.path), problems)
    except ConfigError as exc:
        raise refuse(exc.source, exc.problems) from None
    if cloud and cfg.cloud == "aws":
        from cli.cloud import CloudError
        from cli.cloud.deployments import aws_boundary, clash
        from cli.commands.hints import known_bucket

        # This deployment's event bucket: given, or the one this stack file was synced with.
        bucket = events_bucket or known_bucket(ref)[0]
        try:
            problem = clash(ref.name, cfg.region, aws_boundary(cfg.region, ref.name), bucket)
        except CloudError as exc:
            raise refuse(str(ref.path), [f"spotctl:region: {exc}"]) from None
        if problem:
            raise refuse(str(ref.path), [f"spotctl:region: {problem}"])
    from cli.code.prepare import dir_warnings
    from infra import catalog
    from infra.codespec import code_warnings
    from infra.config import policy_warnings
    from infra.config.gangs import gang_warnings
    from infra.tokens import token_warnings

    code_dirs = dir_warnings(cfg, stackfile.project_root(ref.path.parent))
    warnings = [*policy_warnings(cfg), *gang_warnings(cfg), *token_warnings(cfg), *code_warnings(cfg), *code_dirs,
                *catalog.warnings(cfg)]
    for warning in warnings:
        typer.echo(f"warning: {ref.path}: {warning}", err=True)
    if json_out:
        typer.echo(json.dumps({"file": str(ref.path), "ok": True, "cloud": cfg.cloud, "pools": len(cfg.pools),
                               "jobs": len(cfg.jobs), "errors": [], "warnings": warnings}, indent=1))
        return
    typer.echo(f"{ref.path}: ok ({cfg.cloud}, {counted(len(cfg.pools), 'pool')}, {counted(len(cfg.jobs), 'job')})")


@app.command(
    short_help="Show every resource the stack declares, offline.  Example: spotctl plan --stack example-gcp",
    help="Evaluate the real Pulumi program under Pulumi's mocks (no cloud account, no pulumi CLI) and print "
    "the resource tree: type, name, parent and key inputs, then what it costs per hour (each job's spot and "
    "on-demand $/h, the always-on parts; --expected: each running job's expected cost under its policy). --json "
    "prints inputs in Pulumi's wire form, and the cost figures under \"cost\".\n\n"
    "Example: spotctl plan --stack example-aws --json > plan.json",
)
def plan(stack: StackOpt = None, stack_file: StackFileOpt = None, json_out: JsonOpt = False,
         expected: Annotated[bool, typer.Option("--expected", help="Also replay each running job's policy for its "
                                                "expected cost (jobHours and deadlineHours; seconds per job).")] = False) -> None:
    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner
    from infra.contract import ContractError
    from infra.stack_limits import stack_problems

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
        if problems := stack_problems(cfg, ref.name):
            raise ConfigError(str(ref.path), problems)
        with progress(f"evaluating the Pulumi program for stack {ref.name} under mocks", enabled=not json_out):
            result = planner.run(cfg, ref.name)
    except (ConfigError, ContractError) as exc:
        raise fail(str(exc)) from None
    from cli.commands.costview import cost_preview

    cost = cost_preview(ref, cfg, list(cfg.jobs), [j for j in cfg.jobs if j.active] if expected else (), enabled=not json_out)
    if json_out:
        import json

        typer.echo(json.dumps(result.as_json() | {"cost": cost}, indent=2, sort_keys=True))
        return
    import textwrap

    from cli.commands.textfit import columns as fitting
    from cli.lifecycle.estimate import render as render_cost
    from cli.plan.tree import render

    columns = fitting()
    typer.echo(render(result, columns), nl=False)
    for note in result.notes:  # rules on what only the cloud answers: the real engine checks them
        typer.echo(textwrap.fill(f"note: {note}", width=max(columns, 40), subsequent_indent="  "), err=True)
    typer.echo("\nwhat it costs per hour, in USD:")
    for line in render_cost(cost, columns):
        typer.echo(line)


class Side(enum.StrEnum):
    """Which side wins a conflict in ``spotctl sync --keep``."""

    LOCAL = "local"
    SHARED = "shared"


@app.command(
    short_help="Pull and push the stack file's shared copy.  Example: spotctl sync --stack example-gcp",
    help="Sync the stack file with its shared copy in the stack's event bucket (--events-bucket, else the bucket "
    "last synced with, else the stack's eventBucket output): merge what others wrote there (the watcher's "
    "resumes, a teammate's new jobs) into this file, job by job, then write this file's own changes back with a "
    "conditional write. The same job changed on both sides is an error naming it (nothing is written) unless "
    "--keep says which side wins. Once synced, every command that changes the file pulls first and pushes after.\n\n"
    "Example: spotctl sync --stack example-gcp --events-bucket example-gcp-events-4d8689f7",
)
def sync(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_bucket: BucketOpt = None,
    keep: Annotated[Optional[Side], typer.Option("--keep", help="On a conflict, keep this side's version of the job; a side that is not a valid stack file is replaced by the other (a broken local file is saved aside).")] = None,
    json_out: JsonOpt = False,
) -> None:
    import json

    from cli.commands import applier_for, shared_copy
    from cli.lifecycle import stackfile
    from cli.lifecycle import sync as syncing
    from cli.lifecycle.apply import ApplyError

    try:
        ref = stackfile.resolve(stack, stack_file)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    try:
        cfg = stackfile.load(ref)
    except ConfigError as exc:
        # --keep shared replaces a broken local file: where its shared copy is comes from the copy last synced
        cfg = syncing.last_synced_config(ref.path) if keep is Side.SHARED else None
        if cfg is None:
            if keep is Side.SHARED:
                note = ("\n--keep shared finds the shared copy through the copy this machine last synced, and there is "
                        "none: fix the file by hand")
            elif syncing.read_record(ref.path) is not None:
                note = (f"\n`spotctl sync --stack {ref.name} --keep shared` replaces it with the shared copy "
                        "(this file saved aside)")
            else:
                note = ""
            raise fail(f"{exc}{note}") from None
    where = f"{ref.path}: where is its shared copy?"
    if not events_bucket and syncing.read_record(ref.path) is None:  # never synced here: the stack's output says
        try:
            events_bucket = applier_for(ref, False).outputs().get("eventBucket")
        except ApplyError as exc:
            raise fail(f"{where} {exc}: give --events-bucket NAME (the stack's eventBucket output)") from None
        if not events_bucket:
            raise fail(f"{where} stack {ref.name} has no eventBucket output (is it deployed?): give --events-bucket NAME")
    session = shared_copy(ref, cfg, events_bucket, always=True, keep=keep.value if keep else None)
    if session is None:  # (a record naming no bucket: shared_copy warned)
        raise fail(f"{where} give --events-bucket NAME (the stack's eventBucket output)")
    try:
        with progress(f"syncing {ref.path} with {session.where()}", enabled=not json_out):
            report = syncing.sync(session)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    if report.offline:
        raise fail(f"{session.where()} cannot be reached: nothing synced")
    pulled = report.pulled
    if json_out:
        typer.echo(json.dumps({"stack": ref.name, "file": str(ref.path), "bucket": session.bucket, "key": session.key,
                               "generation": report.generation, "pulled": pulled is not None, "pushed": report.pushed is not None,
                               "from_shared": pulled.from_shared if pulled else [], "from_local": pulled.from_local if pulled else []},
                              sort_keys=True))
        return
    if pulled is not None:
        typer.echo(f"{ref.path}: merged {session.where()}" + (f": from there {', '.join(pulled.from_shared)}" if pulled.from_shared else "")
                   + (f"; kept from here {', '.join(pulled.from_local)}" if pulled.from_local else ""))
    if report.pushed is not None:
        typer.echo(f"{ref.path}: written to {session.where(report.pushed)}")
    if pulled is None and report.pushed is None:
        typer.echo(f"{ref.path}: in sync with {session.where(report.generation)}")
