"""``spotctl simulate`` (replay spot traces against the policies) and ``spotctl policy fit`` (learn from the
stack's history)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.commands import (
    BucketOpt,
    EventsOpt,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    applier_for,
    fail,
    progress,
    read_events,
    stack_jobs,
)
from cli.commands.traces import TRACE_LOOKUP, find_trace
from infra.basics import counted


@app.command(
    short_help="Replay spot traces against policies.  Example: spotctl simulate --trace availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json",
    help="For each trace and random start, run every policy and the omniscient optimum (an exact DP over the trace) "
    "and report mean cost normalised to all-on-demand, p25/p75, misses, spot/on-demand hours and the gap to the "
    "optimum.\n\n"
    "The traces are third-party data (github.com/skypilot-org/spot-traces), not shipped with spotctl: the example "
    "needs them where --trace finds them (a path, or under SPOTCTL_TRACES).\n\n"
    "Example: spotctl simulate --trace availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json --job-hours 48 --deadline-hours 60 --changeover-hours 0.2 --plot run.png",
)
def simulate(
    trace: Annotated[list[Path], typer.Option("--trace", metavar="FILE", help="A trace file (JSON in the spot-traces format, or a probe CSV); repeatable. " + TRACE_LOOKUP)],
    policy: Annotated[Optional[list[str]], typer.Option("--policy", metavar="NAME", help="Repeatable; default: all.")] = None,
    job_hours: Annotated[float, typer.Option("--job-hours", help="C: compute hours the job needs.")] = 48.0,
    deadline_hours: Annotated[float, typer.Option("--deadline-hours", help="R: hours from start to the deadline.")] = 60.0,
    changeover_hours: Annotated[float, typer.Option("--changeover-hours", help="d: hours lost (and billed) per launch.")] = 0.2,
    price_ratio: Annotated[Optional[float], typer.Option("--price-ratio", help="k: on-demand / spot price (default p3.2xlarge's).")] = None,
    starts: Annotated[int, typer.Option("--starts", min=1, help="Random start points per trace.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the start points.")] = 0,
    inverted: Annotated[bool, typer.Option("--inverted", help="JSON values mean 1 = unavailable (ADRS copies).")] = False,
    json_out: JsonOpt = False,
    plot_path: Annotated[Optional[Path], typer.Option("--plot", metavar="PNG", help="Draw one run's timeline and a cost bar chart.")] = None,
    zones: Annotated[bool, typer.Option("--zones", help="The traces are time-aligned zones: replay the zone choice "
                                        "(moves between them) against staying in the first.")] = False,
    move_hours: Annotated[float, typer.Option("--move-hours", min=0, help="With --zones: a move's time "
                                              "(snapshot + restore).")] = 0.5,
) -> None:
    import json
    from dataclasses import asdict

    from cli.policy import simulate as sim
    from cli.policy.policies import policy_names

    names = policy or ["default", "uniform-progress", "uniform-progress-nh", "greedy", "n-preemptions", "on-demand"]
    for name in names:
        if name not in policy_names():
            raise fail(f"--policy {name}: unknown; valid: {', '.join(policy_names())}")
    if not 0 < job_hours <= deadline_hours:
        raise fail(f"--job-hours must be > 0 and <= --deadline-hours ({job_hours} vs {deadline_hours})")
    if changeover_hours < 0:
        raise fail(f"--changeover-hours must be >= 0, got {changeover_hours}")
    if price_ratio is not None and price_ratio < 1:
        raise fail(f"--price-ratio must be >= 1 (on-demand costs more than spot), got {price_ratio}")
    traces = []
    for given in trace:
        path = find_trace(given)
        try:
            traces.append(sim.load_trace(path, inverted=inverted))
        except OSError as exc:
            raise fail(f"{path}: cannot read: {exc.strerror}") from None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError, RecursionError):
            raise fail(f"{path}: not a trace file: expected a spot-traces JSON "
                       '({"metadata": {"gap_seconds": N}, "data": [0/1, ...]}) or a probe CSV (index,timestamp,fail)') from None
    job = sim.Job(job_hours, deadline_hours, changeover_hours, price_ratio or sim.PAPER_PRICE_RATIO)
    if plot_path is not None and not zones:  # refused before the simulation runs, not after
        from cli.cost.plot import png_path

        try:
            plot_path = png_path(plot_path, "simulate.png")
        except ValueError as exc:
            raise fail(str(exc)) from None
    if zones:
        from cli.commands.zonesim import simulate_zones

        return simulate_zones(traces, names, job, starts, seed, move_hours, json_out, plot_path)
    try:
        with progress(f"simulating {counted(len(names), 'policy', 'policies')} on {counted(len(traces), 'trace')} x {counted(starts, 'start')}", enabled=not json_out):
            rows = sim.evaluate(traces, names, job, starts, seed)
    except ValueError as exc:
        raise fail(str(exc)) from None
    everything = rows + (sim.overall(rows) if len(traces) > 1 else [])
    if json_out:
        doc = {"job": asdict(job), "starts": starts, "seed": seed, "results": [asdict(r) for r in everything]}
        typer.echo(json.dumps(finite(doc), indent=2, sort_keys=True, allow_nan=False))
    else:
        typer.echo(sim.render_table(everything), nl=False)
    if plot_path is not None:
        first = traces[0]
        try:
            with progress(f"drawing {plot_path}"):
                sim.plot(plot_path, first, sim.starts_for(first, job, starts, seed)[0], job, names, rows)
        except OSError as exc:
            raise fail(f"--plot: cannot write {exc.filename or plot_path}: {exc.strerror or exc}") from None
        typer.echo(f"plot written to {plot_path}", err=True)


policy_app = typer.Typer(help="The policy engine's learning: what the stack's history says about spot in each zone.",
                         no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@policy_app.command(
    "fit",
    short_help="Learn spot windows and changeovers from the stack's events.  Example: spotctl policy fit -s example-gcp",
    help="Read every job's recorded events (--events-dir and/or --events-bucket; given neither, the bucket the stack "
    "file was synced with, else the stack's eventBucket output), measure spot windows (started to "
    "preempted) and changeovers (started to the first progress event) per zone and machine type, fit the hazards "
    "of spot windows with the shipped regimes as prior, and write stacks/.spotctl/<stack>.policy.json, which "
    "`resume` reads.\n\nExample: spotctl policy fit --stack example-gcp --events-dir ./events --json",
)
def policy_fit(stack: StackOpt = None, stack_file: StackFileOpt = None, events_dir: EventsOpt = None,
               events_bucket: BucketOpt = None, json_out: JsonOpt = False) -> None:
    import json
    from datetime import UTC, datetime

    from cli.commands.hints import Unread, events_source, sync_hint
    from cli.lifecycle.capacity import fit_stack

    if events_dir is not None and not events_dir.exists():
        raise fail(f"--events-dir {events_dir}: no such file or directory")
    ref, cfg, jobs = stack_jobs(stack, stack_file, None)
    # Given neither option: the bucket the file was synced with, else the stack's eventBucket output.
    bucket, where = events_source(ref, cfg, events_dir, events_bucket, applier=applier_for(ref, False))
    if events_dir is None and not bucket:
        raise fail(f"policy fit: no events source found for stack {ref.name}: give --events-dir DIR (the bucket synced "
                   f"locally) and/or --events-bucket NAME (the stack's eventBucket output), or {sync_hint(ref)}")
    try:
        path, doc = fit_stack(ref.path, ref.name, jobs, lambda job_id: read_events(ref, cfg, job_id, events_dir, bucket, where),
                              datetime.now(UTC))
    except Unread as exc:
        raise fail(f"policy fit: {exc}; give --events-bucket NAME or --events-dir DIR") from None
    if where and not json_out:
        typer.echo(f"events from {where}")
    if json_out:
        typer.echo(json.dumps({"path": str(path), **doc}, indent=2, sort_keys=True))
        return
    typer.echo(f"wrote {path}")
    for key, pool in doc["pools"].items():
        change = "not measured" if pool["changeover_h"] is None else f"{pool['changeover_h']:.3f} h"
        typer.echo(f"  {key}: {counted(pool['spot_windows'], 'spot window')} ({pool['open_windows']} open), "
                   f"expected window {pool['mean_window_h']:.2f} h, changeover {change}")


def finite(value):
    """JSON has no NaN: a mean over no runs (the omniscient row's hours) becomes null."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
