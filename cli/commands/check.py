"""``spotctl check``: what this machine has and lacks to apply a stack, one line each."""

from typing import Annotated, Optional

import typer

from cli.commands import JsonOpt, StackFileOpt, StackOpt, app


@app.command(
    short_help="Is this machine ready?  Example: spotctl check --stack example-gcp",
    help="One line each for what applying a stack needs: the pulumi CLI (and its minimum version), the backend "
    "login, the stack (--stack, $PULUMI_STACK or the selected one) and its file, each cloud's credentials, and the "
    "stack's event bucket (the synced one, else the eventBucket output). Exits 1 when something needed is missing; "
    "the event bucket and the other cloud's credentials are informational.\n\n"
    "Example: spotctl check --stack example-gcp --json",
)
def check(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    outputs: Annotated[bool, typer.Option("--outputs/--no-outputs", help="Ask `pulumi stack output` for the event bucket "
                                          "when this machine knows none (needs the backend).")] = True,
    json_out: JsonOpt = False,
) -> None:
    import json

    from cli.lifecycle import readiness

    findings = readiness.judge(_observe(stack, stack_file, outputs))
    if json_out:
        typer.echo(json.dumps(readiness.as_json(findings), indent=2, sort_keys=True))
    else:
        import shutil
        import textwrap

        width = max(len(f.what) for f in findings)
        columns = max(60, min(shutil.get_terminal_size((80, 24)).columns, 120))
        indent = " " * (9 + width + 2)
        for f in findings:
            typer.echo(textwrap.fill(f"{f.mark:<8} {f.what:<{width}}  {f.detail}", columns, subsequent_indent=indent,
                                     break_on_hyphens=False, break_long_words=False))
    if any(f.needed and not f.ok for f in findings):
        raise typer.Exit(1)


def _observe(stack: Optional[str], stack_file, outputs: bool):
    """Every fact ``readiness.judge`` needs; nothing here raises (a fact that cannot be had says why)."""
    import os

    from cli.cloud import credentials
    from cli.commands import applier_for
    from cli.lifecycle import readiness, stackfile
    from infra.basics import ConfigError

    env = readiness.environment()
    root = os.environ.get("SPOTCTL_PULUMI_ROOT")
    binary = None
    if root:
        candidate = os.path.join(root, "bin", "pulumi")
        binary = candidate if os.access(candidate, os.X_OK) else None
    else:
        import shutil

        binary = shutil.which("pulumi")
    version, version_error = readiness.pulumi_version(binary) if binary else (None, "")
    url, source, token = readiness.backend(env, readiness.pulumi_home(env))
    ref = cfg = None
    stack_error = ""
    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
    except ConfigError as exc:
        stack_error = str(exc).replace("\n", "; ")
    bucket, bucket_source = None, "this machine never synced the stack file and no stack was found"
    if ref is not None and cfg is not None:
        from cli.commands.hints import known_bucket
        from cli.lifecycle.apply import ApplyError

        bucket, bucket_source = known_bucket(ref)
        if not bucket and outputs and binary:
            try:
                bucket = applier_for(ref, False).outputs().get("eventBucket")
                bucket_source = "the stack's eventBucket output" if bucket else f"stack {ref.name} has no eventBucket output (not deployed?)"
            except ApplyError as exc:
                bucket_source = str(exc)
        elif not bucket:
            bucket_source = "no synced bucket" + ("" if binary else " and no pulumi to ask for the eventBucket output")
    return readiness.Seen(
        pulumi=binary, version=version, version_error=version_error, backend=url, backend_source=source, token=token,
        stack=ref.name if ref else None, stack_file=str(ref.path) if ref else None, stack_cloud=cfg.cloud if cfg else None,
        stack_error=stack_error, credentials={c: credentials.missing(c) for c in readiness.CLOUDS},
        bucket=bucket, bucket_source=bucket_source)
