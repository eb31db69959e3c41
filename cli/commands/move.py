"""``spotctl move``: a job and its disks to another zone of the stack (snapshot, restore, start, release)."""

from typing import Annotated, Optional

import typer

from cli.commands import (
    BucketOpt,
    EventsOpt,
    JsonOpt,
    NoApplyOpt,
    StackFileOpt,
    StackOpt,
    YesOpt,
    app,
    applier_for,
    cloud_for,
    confirmer,
    fail,
    interrupted,
    progress,
    pull_first,
    recorded_events,
)
from infra.basics import ConfigError


@app.command(
    short_help="Move a job and its disks to another zone.  Example: spotctl move vit-finetune -s example-gcp --to-zone us-central1-a",
    help="Move a job to another zone of the stack with its disks, one targeted update per step: snapshot every "
    "node's disk (the job's VMs go), restore new disks from the snapshots in the target zone, start the next "
    "attempt there on them, and once that attempt has started (its `started` events, from --events-dir or "
    "--events-bucket) delete the old disks. The stack file records the step: if the move is interrupted, run "
    "the same command again and it continues; a `spotctl watch` of the stack continues it too, from the step the "
    "file records (also one written with --no-apply). With --replica-zones (GCP) the disks are restored as regional "
    "persistent disks replicated in those two zones: a zonal job disk converted (--to-zone may be the job's zone).\n\n"
    "Example: spotctl move llm-pretrain --to-zone us-central1-b --stack example-gcp --events-dir ./events --yes",
)
def move(
    job: Annotated[str, typer.Argument(help="The job id.")],
    to_zone: Annotated[str, typer.Option("--to-zone", metavar="ZONE", help="A zone of spotctl:zones.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    json_out: JsonOpt = False,
    replica_zones: Annotated[Optional[str], typer.Option(
        "--replica-zones", metavar="ZONE,ZONE",
        help="GCP: restore into regional disks replicated in these two zones of spotctl:zones (converts a zonal job disk).")] = None,
) -> None:
    confirm = confirmer(yes, False, no_apply)
    replicas = [z.strip() for z in replica_zones.split(",")] if replica_zones is not None else None
    with pull_first(stack, stack_file, job, events_bucket, no_apply):  # the shared copy's news first
        _move(job, to_zone, stack, stack_file, events_dir, events_bucket, no_apply, json_out, confirm, replicas)


def _move(job: str, to_zone: str, stack, stack_file, events_dir, events_bucket, no_apply: bool, json_out: bool, confirm,
          replicas: list[str] | None = None) -> None:
    import json

    from cli.lifecycle import pipeline, stackfile
    from cli.lifecycle.apply import ApplyError
    from cli.lifecycle.mover import move_job
    from cli.lifecycle.states import LifecycleError

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
        with progress(f"job {job}: moving to {to_zone}", enabled=not json_out) as spinner:
            result = move_job(
                ref, job, to_zone,
                events=lambda: recorded_events(ref, cfg, job, events_dir, events_bucket),
                applier=applier_for(ref, no_apply, spinner.step), out=spinner.echo,
                confirm=spinner.paused(confirm) if confirm else None,
                inventory=lambda c: cloud_for(c, ref).inventory(),
                replicas=replicas,
            )
    except (ConfigError, LifecycleError, ApplyError) as exc:
        raise fail(str(exc)) from None
    except pipeline.Interrupted as exc:
        raise interrupted(exc) from None
    if json_out:
        typer.echo(json.dumps({"job": job, "to_zone": to_zone, "steps": [{"fields": c.fields, "reason": c.reason} for c in result.steps],
                               "applied": result.applied, "declined": result.declined, "finished": result.finished,
                               "waiting": result.waiting, "snapshots": result.snapshots}, sort_keys=True))
        return
    echo_outcome(ref, job, result, "run the command again to continue")


def echo_outcome(ref, job: str, result, again: str) -> None:
    """Each step written or applied, then why the move stopped (``again``: how to continue it)."""
    for change, applied in zip(result.steps, result.applied_steps, strict=True):
        done = " — applied" if applied else (" — not confirmed: undone" if result.declined and change is result.steps[-1]
                                             else f" — written to {ref.path}")
        typer.echo(change.describe() + done)
    if result.declined:
        typer.echo(f"job {job}: not confirmed: the move stops here ({again})")
    elif result.waiting:
        typer.echo(f"job {job}: {result.waiting}")
    if result.snapshots:
        typer.echo(f"stack {ref.name}: {result.snapshots}")
