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


@app.command(
    short_help="Preempt a training script locally and judge if it resumes.  Example: spotctl drill -- python train.py",
    help="Run COMMAND under the same scripts a cloud VM runs, preempt it the way GCP or AWS would, resume it on "
    "the same (temporary) disk, and judge whether training survives: reentrant, restarts-from-scratch, lost-work "
    "or did-not-finish. Exits non-zero unless reentrant. The script may print `SPOTCTL_PROGRESS step/total` and "
    "`SPOTCTL_CHECKPOINT step` lines.\n\n"
    "Example: spotctl drill --preempt-every 1.5 --verify -- python examples/reentrant_train.py",
)
def drill(
    command: Annotated[Optional[list[str]], typer.Argument(help="The training command, after `--`.", show_default=False)] = None,
    cloud: Annotated[str, typer.Option("--cloud", help="Whose preemption to play: gcp (30 s) or aws (2-minute notice).")] = "gcp",
    preempt_every: Annotated[Optional[float], typer.Option("--preempt-every", metavar="SECONDS", help="Preempt each attempt after this long.")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", metavar="FILE", help="Preempt when a spot-traces JSON file says spot went away.")] = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Trace seconds (and AWS's notice) per drill second.")] = 1.0,
    max_attempts: Annotated[int, typer.Option("--max-attempts", min=1, help="Give up after this many attempts.")] = 10,
    verify: Annotated[bool, typer.Option("--verify", help="Also run uninterrupted and compare the final output files.")] = False,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    job: Annotated[Optional[str], typer.Option("--job", metavar="ID", help="With --stack: drill this job's command and env.")] = None,
    json_out: JsonOpt = False,
) -> None:
    import json
    import sys

    from cli import drill as drills

    if cloud not in ("gcp", "aws"):
        raise fail(f"--cloud: expected 'gcp' or 'aws', got {cloud!r}")
    if preempt_every is not None and trace is not None:
        raise fail("give --preempt-every or --trace, not both")
    if preempt_every is not None and preempt_every <= 0:
        raise fail(f"--preempt-every: expected a positive number of seconds, got {preempt_every}")
    if time_scale <= 0:
        raise fail(f"--time-scale: expected a positive number, got {time_scale}")
    env: dict[str, str] = {}
    job_id = "drill"
    if stack is not None or stack_file is not None:
        if command:
            raise fail("give a COMMAND or --stack/--job, not both")
        if not job:
            raise fail("--stack needs --job ID")
        from cli import stackfile

        try:
            cfg = stackfile.load(stackfile.resolve(stack, stack_file))
            spec_job = cfg.job(job)
        except ConfigError as exc:
            raise fail(str(exc)) from None
        except KeyError as exc:
            raise fail(f"--job {job}: {exc.args[0]}") from None
        command_text, env, job_id, cloud = spec_job.command, dict(spec_job.env), spec_job.id, cfg.cloud
    elif command:
        command_text = drills.command_string(command)
    else:
        raise fail("nothing to drill: give a command after `--` (or --stack NAME --job ID)")
    preempt_after = None
    if trace is not None:
        try:
            ups, _ = drills.availability_runs(trace)
        except (OSError, ValueError, KeyError) as exc:
            raise fail(f"{trace}: not a spot-traces availability file ({exc})") from None
        preempt_after = [u / time_scale for u in ups]
    spec = drills.DrillSpec(
        command=command_text, cloud=cloud, job_id=job_id, env=env,
        preempt_every=preempt_every if preempt_every is not None else (None if trace else 2.0),
        preempt_after=preempt_after, time_scale=time_scale, max_attempts=max_attempts, verify=verify,
    )
    live = sys.stderr.isatty()

    def status(line: str) -> None:
        if live:
            sys.stderr.write("\r\033[K" + line)
            sys.stderr.flush()

    try:
        report = drills.run_drill(spec, status)
    except KeyboardInterrupt:
        typer.echo("\ndrill interrupted: every process it started was stopped", err=True)
        raise typer.Exit(130) from None
    if live:
        sys.stderr.write("\r\033[K")
    typer.echo(json.dumps(report.as_json(), indent=2, sort_keys=True) if json_out else drills.render_report(report), nl=json_out)
    if not report.ok:
        raise typer.Exit(1)


@app.command(
    short_help="Replay spot traces against policies.  Example: spotctl simulate --trace us-west-2b_v100_1.json",
    help="For each trace and random start, run every policy and the omniscient optimum (an exact DP over the trace) "
    "and report mean cost normalised to all-on-demand, p25/p75, misses, spot/on-demand hours and the gap to the "
    "optimum.\n\n"
    "Example: spotctl simulate --trace us-west-2b_v100_1.json --job-hours 48 --deadline-hours 60 --changeover-hours 0.2 --plot run.png",
)
def simulate(
    trace: Annotated[list[Path], typer.Option("--trace", metavar="FILE", help="A spot-traces JSON or probe CSV; repeatable.")],
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
) -> None:
    import json
    from dataclasses import asdict

    from cli import simulate as sim
    from cli.policy import policy_names

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
    for path in trace:
        try:
            traces.append(sim.load_trace(path, inverted=inverted))
        except (OSError, ValueError, KeyError, IndexError, json.JSONDecodeError) as exc:
            raise fail(f"{path}: not a trace file ({exc})") from None
    job = sim.Job(job_hours, deadline_hours, changeover_hours, price_ratio or sim.PAPER_PRICE_RATIO)
    try:
        rows = sim.evaluate(traces, names, job, starts, seed)
    except ValueError as exc:
        raise fail(str(exc)) from None
    everything = rows + (sim.overall(rows) if len(traces) > 1 else [])
    if json_out:
        typer.echo(json.dumps({"job": asdict(job), "starts": starts, "seed": seed,
                               "results": [asdict(r) for r in everything]}, indent=2, sort_keys=True))
    else:
        typer.echo(sim.render_table(everything), nl=False)
    if plot_path is not None:
        first = traces[0]
        sim.plot(plot_path, first, sim.starts_for(first, job, starts, seed)[0], job, names, rows)
        typer.echo(f"plot written to {plot_path}", err=True)


def main() -> None:
    app()
