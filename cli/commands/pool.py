"""``spotctl pool``: publish a shared pool's demand, and see the pool as the cloud does."""

from typing import Annotated

import typer

from cli.commands import JsonOpt, StackFileOpt, StackOpt, app, cloud_for, fail, guard, progress, warn

pool_app = typer.Typer(
    name="pool",
    help="Shared GPU pools: publish demand (the autoscalers follow it), see sizes, VMs, busy/idle and preemptions.",
    no_args_is_help=True,
)
app.add_typer(pool_app, name="pool")


def _stack(stack, stack_file):
    from cli.lifecycle import stackfile
    from infra.config import ConfigError

    try:
        ref = stackfile.resolve(stack, stack_file)
        return ref, stackfile.load(ref)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _run(fn):
    from cli.pools.demand import PoolError

    try:
        return guard(fn)
    except PoolError as exc:
        raise fail(str(exc)) from None


@pool_app.command(
    short_help="Publish how many VMs a pool's work wants.  Example: spotctl pool demand g5 6 --stack example-aws",
    help="Publish a pool's demand: the VMs its scheduler wants (work running plus work waiting). The on-demand base "
    "holds its size; the spot part is sized to the rest (0..spotMax) by the cloud's autoscaler, from zero. Count "
    "running work: the target never drops below it. The demand is also kept in the stack's event bucket, and the "
    "stack's watcher publishes it again every minute until it changes (without a watcher, publish every minute "
    "yourself); with fallbackToOnDemand each publication also checks how much spot demand is unmet.\n\n"
    "Example: spotctl pool demand g5 6 --stack example-aws",
)
def demand(
    pool: Annotated[str, typer.Argument(help="The pool name.")],
    # (max: a sanity bound far above any pool; a larger integer would not even convert to the metric's float)
    vms: Annotated[int, typer.Argument(metavar="N", min=0, max=1_000_000, help="VMs wanted: running plus waiting work.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    json_out: JsonOpt = False,
    events_bucket: Annotated[str | None, typer.Option(
        "--events-bucket", metavar="NAME",
        help="Keep the demand in this event bucket (the eventBucket output) for the watcher; default: the synced one.")] = None,
) -> None:
    import json
    from datetime import UTC, datetime

    from cli.cloud import pool_cloud
    from cli.commands.hints import known_bucket, sync_hint
    from cli.pools import demand as pool_demand
    from cli.pools import record

    ref, cfg = _stack(stack, stack_file)
    now = datetime.now(UTC)
    with progress(f"pool {pool}: publishing its demand", enabled=not json_out):
        decision = _run(lambda: pool_demand.publish(pool_cloud(cfg, ref.name), cfg, ref.name, pool, vms, now))
        bucket = events_bucket or known_bucket(ref)[0]
        if bucket:  # kept for the watcher, which publishes it again every minute
            _run(lambda: record.write(cloud_for(cfg, ref), bucket, ref.name, record.Record(pool, vms, now)))
        elif cfg.watcher is not None:
            warn(f"no event bucket known: the watcher cannot publish pool {pool}'s demand again every minute "
                 f"(give --events-bucket NAME, or {sync_hint(ref)})")
    if json_out:
        typer.echo(json.dumps({"pool": pool, **decision.metrics(), "reason": decision.reason}, sort_keys=True))
    else:
        typer.echo(f"pool {pool}: published {', '.join(f'{k}={v:g}' for k, v in decision.metrics().items())} ({decision.reason})")


@pool_app.command(
    short_help="A pool's sizes, demand, VMs by zone and type, busy/idle, preemptions.  Example: spotctl pool status g5 -s example-aws",
    help="What the cloud says about a pool now: each part's target and VMs (on-demand base, spot, fallback), the demand "
    "last published, VMs by zone and type, busy/idle (AWS: scale-in protection; GCP does not say) and the "
    "preemptions of the last 24 hours.\n\nExample: spotctl pool status g5 --stack example-aws --json",
)
def status(
    pool: Annotated[str, typer.Argument(help="The pool name.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    json_out: JsonOpt = False,
) -> None:
    import json
    from datetime import UTC, datetime

    from cli.cloud import pool_cloud
    from cli.pools.status import status as pool_status

    ref, cfg = _stack(stack, stack_file)
    with progress(f"pool {pool}: asking the cloud", enabled=not json_out):
        data = _run(lambda: pool_status(pool_cloud(cfg, ref.name), cfg, ref.name, pool, datetime.now(UTC)))
    if json_out:
        typer.echo(json.dumps(data, sort_keys=True, default=str))
        return
    _print(data)


def _print(data: dict) -> None:
    import shutil

    from rich.console import Console
    from rich.table import Table

    console = Console(width=min(shutil.get_terminal_size((80, 24)).columns, 100))  # (textfit's rule)
    metrics = ", ".join(f"{k} {v:g}" for k, v in data["metrics"].items()) or "none published in the last 24 h"
    console.print(f"pool {data['pool']} ({data['cloud']}): demand: {metrics}")
    parts = Table("part", "target", "VMs")
    for part, p in data["parts"].items():
        parts.add_row(part, str(p["target"]), str(p["vms"]))
    console.print(parts)
    busy = "unknown (GCP does not report it)" if data["busy"] is None else f"{data['busy']} busy, {data['idle']} idle"
    console.print(f"VMs: {busy}")
    vms = Table("VM", "part", "zone", "type", "status", "busy")
    for vm in data["vms"]:
        vms.add_row(vm["name"], vm["part"], vm["zone"], vm["type"], vm["status"], "-" if vm["busy"] is None else str(vm["busy"]).lower())
    if data["vms"]:
        console.print(vms)
    zones = "; ".join(f"{z}: " + ", ".join(f"{n} {t}" for t, n in types.items()) for z, types in data["zones"].items())
    console.print(f"by zone: {zones or 'no VMs'}")
    console.print("preemptions (24 h): " + ("; ".join(data["preemptions"]) if data["preemptions"] else "none"))
