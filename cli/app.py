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
NoApplyOpt = Annotated[bool, typer.Option("--no-apply", help="Only edit the stack file; do not run pulumi.")]
BucketOpt = Annotated[
    Optional[str], typer.Option("--events-bucket", metavar="NAME", help="Read events from the stack's event bucket (the eventBucket output).")
]
ObserveOpt = Annotated[
    bool, typer.Option("--observe", help="Also ask the cloud (boto3 / google-cloud-compute) what the job's VMs are doing now.")
]
EventsOpt = Annotated[
    Optional[Path],
    typer.Option("--events-dir", metavar="DIR", help="Recorded events: the event bucket synced locally, or a job disk's .spotctl/."),
]


def _stack_jobs(stack: Optional[str], stack_file: Optional[Path], job: Optional[str]):
    """(ref, config, jobs): the stack's jobs, or only ``job``; errors name the file (and the job)."""
    from cli import stackfile

    ref = None
    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
        return ref, cfg, ([cfg.job(job)] if job else list(cfg.jobs))
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except KeyError as exc:
        raise fail(f"{ref.path if ref else 'spotctl'}: job {job}: {exc.args[0]}") from None


def _observer(cfg, stack: str):
    from cli.inventory import observer_for

    return _cloud_call(lambda: observer_for(cfg, stack))


def _cloud_call(fn):
    """Run a cloud API call; its failures (no credentials, denied, unreachable) become one error line."""
    from botocore.exceptions import BotoCoreError, ClientError
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from requests.exceptions import RequestException  # google-cloud-compute's REST transport

    try:
        return fn()
    except (BotoCoreError, ClientError, GoogleAPIError, GoogleAuthError, RequestException) as exc:
        raise fail(f"cannot ask the cloud: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def _recorded_events(ref, cfg, job_id: str, events_dir, bucket):
    """Events from --events-dir and/or --events-bucket (cloud errors become one error line)."""
    from cli import jobs

    found = jobs.load_events(events_dir, job_id)
    if bucket:
        found += _cloud_call(lambda: jobs.load_bucket_events(cfg.cloud, cfg.region, bucket, ref.name, job_id))
    return sorted(found, key=lambda e: (e.time, e.attempt, e.node))


def _observed_events(stack, stack_file, job_id: str):
    from datetime import UTC, datetime

    from cli import jobs

    ref, cfg, (job,) = _stack_jobs(stack, stack_file, job_id)
    observer = _observer(cfg, ref.name)
    return jobs.cloud_events(_cloud_call(lambda: observer.vms(job_id)), job, datetime.now(UTC))


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
        _, cfg, (spec_job,) = _stack_jobs(stack, stack_file, job)
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


def _applier(ref, no_apply: bool):
    import os

    from cli.apply import Applier
    from cli.stackfile import project_root

    if no_apply:
        return None
    root = os.environ.get("SPOTCTL_PULUMI_ROOT")  # a pulumi install outside PATH (dir with bin/pulumi)
    return Applier(project_root(ref.path.parent), ref.name, Path(root) if root else None)


def _run_change(stack, stack_file, job_id: str, decide, no_apply: bool, json_out: bool) -> None:
    import json

    from cli import jobs, stackfile
    from cli.apply import ApplyError
    from cli.lifecycle import LifecycleError

    try:
        ref = stackfile.resolve(stack, stack_file)
        outcome = jobs.change_job(ref, job_id, decide, applier=_applier(ref, no_apply), out=lambda line: typer.echo(line.rstrip("\n"), err=True))
    except (ConfigError, LifecycleError, ApplyError) as exc:
        raise fail(str(exc)) from None
    change = outcome.change
    if json_out:
        typer.echo(json.dumps({"job": change.job_id, "changed": not change.noop, "fields": change.fields,
                               "reason": change.reason, "applied": outcome.applied}, sort_keys=True))
    else:
        typer.echo(change.describe() + ("" if change.noop else (" — applied" if outcome.applied else f" — written to {ref.path}")))


def _capacity(value: Optional[str], option: str):
    from infra.config import Capacity

    if value is None:
        return None
    try:
        return Capacity(value)
    except ValueError:
        raise fail(f"{option}: expected 'spot' or 'on-demand', got {value!r}") from None


@app.command(
    short_help="New attempt of a preempted job, same disk.  Example: spotctl resume llm-pretrain --stack team-a",
    help="Give a preempted (or stopped, or --force: failed) job its next attempt: attempt + 1, state running, and the "
    "capacity its policy picks (or --capacity), then a targeted pulumi update of only that job's resources. The job "
    "disk stays, so training continues from its last checkpoint. Running it twice makes one new attempt.\n\n"
    "Example: spotctl resume llm-pretrain --stack team-a --events-dir ./events",
)
def resume(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    capacity: Annotated[Optional[str], typer.Option("--capacity", help="Force spot or on-demand instead of the policy's choice.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Start a new attempt even if nothing says the current one ended (or it failed).")] = False,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    observe: ObserveOpt = False,
    no_apply: NoApplyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli import jobs
    from cli.lifecycle import decide_resume

    forced = _capacity(capacity, "--capacity")
    ref, cfg, _ = _stack_jobs(stack, stack_file, job)
    events = _recorded_events(ref, cfg, job, events_dir, events_bucket)
    if observe:
        events += _observed_events(stack, stack_file, job)
    choose = jobs.policy_capacity()
    _run_change(stack, stack_file, job, lambda j: decide_resume(j, events, capacity=forced, force=force, choose=choose), no_apply, json_out)


@app.command(
    short_help="Switch a job to on-demand or spot, new attempt.  Example: spotctl failover vit --to on-demand -s team-a",
    help="Switch a job's capacity (default: to the other one) with a new attempt on the same disk, then a targeted "
    "update.\n\nExample: spotctl failover vit-finetune --to on-demand --stack team-a",
)
def failover(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    to: Annotated[Optional[str], typer.Option("--to", help="on-demand or spot (default: the other one).")] = None,
    no_apply: NoApplyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli.lifecycle import decide_failover

    target = _capacity(to, "--to")
    _run_change(stack, stack_file, job, lambda j: decide_failover(j, target), no_apply, json_out)


@app.command(
    short_help="Mark a job completed: its VMs go, its disks stay.  Example: spotctl complete bert-eval -s team-a",
    help="Mark a job completed: its VMs are deleted by a targeted update; its disks stay (no longer protected) until "
    "`spotctl cleanup`.\n\nExample: spotctl complete bert-eval --stack team-a",
)
def complete(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    no_apply: NoApplyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli.lifecycle import decide_complete

    _run_change(stack, stack_file, job, decide_complete, no_apply, json_out)


@app.command(
    short_help="Jobs' state, capacity, attempt, preemptions.  Example: spotctl status --stack team-a",
    help="Each job's state, capacity, attempt, zone, preemptions so far, time on spot vs on-demand and its last "
    "events (from --events-dir).\n\nExample: spotctl status llm-pretrain --stack team-a --events-dir ./events --json",
)
def status(
    job: Annotated[Optional[str], typer.Argument(help="Only this job.")] = None,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    observe: ObserveOpt = False,
    json_out: JsonOpt = False,
) -> None:
    import json

    from cli import jobs

    ref, cfg, selected = _stack_jobs(stack, stack_file, job)
    rows = [jobs.job_status(j, _recorded_events(ref, cfg, j.id, events_dir, events_bucket)) for j in selected]
    if observe:
        observer = _observer(cfg, ref.name)
        for row in rows:
            row["cloud"] = [vm.__dict__ for vm in _cloud_call(lambda r=row: observer.vms(r["job"]))]
    if json_out:
        typer.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    typer.echo(f"{'job':<16} {'state':<10} {'capacity':<10} {'attempt':>7} {'zone':<16} {'preempt':>7}  last event")
    for r in rows:
        last = r["last_event"]
        last_text = f"{last['event']} (attempt {last['attempt']}, {last['time']})" if last else "-"
        typer.echo(f"{r['job']:<16} {r['state']:<10} {r['capacity']:<10} {r['attempt']:>7} {r['zone']:<16} {r['preemptions']:>7}  {last_text}")
        for vm in r.get("cloud", []):
            flag = " PREEMPTED" if vm["preempted"] else ""
            typer.echo(f"    {vm['name']}: {vm['status']}{flag} (attempt {vm['attempt']}, node {vm['node']}) {vm['reason']}".rstrip())


@app.command(
    short_help="A job's recorded events.  Example: spotctl events llm-pretrain --stack team-a --events-dir ./events",
    help="The events a job's VMs recorded (started, preemption-notice, preempted, stopped, completed, failed, ...).\n\n"
    "Example: spotctl events llm-pretrain --stack team-a --events-bucket team-a-events-4d8689f7 --json",
)
def events(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    json_out: JsonOpt = False,
) -> None:
    import json

    from cli import jobs

    ref, cfg, _ = _stack_jobs(stack, stack_file, job)
    found = _recorded_events(ref, cfg, job, events_dir, events_bucket)
    if json_out:
        typer.echo(json.dumps([jobs.event_json(e) for e in found], indent=2, sort_keys=True))
        return
    for e in found:
        details = " ".join(f"{k}={v}" for k, v in e.details.items())
        typer.echo(f"{e.time.isoformat()}  attempt {e.attempt} node {e.node}  {e.event:<18} {details}".rstrip())


@app.command(
    short_help="Delete a completed job's disks, or orphans.  Example: spotctl cleanup bert-eval -s team-a --yes",
    help="Delete a job's disks, only when the job is completed (or failed, with --force): lift their Pulumi "
    "protection, drop the job from the stack file and delete its resources with a targeted update. --orphans finds "
    "disks/volumes carrying this stack's ownership labels that no job declares. Without --yes: a dry-run listing.\n\n"
    "Example: spotctl cleanup --orphans --stack team-a            (then again with --yes)",
)
def cleanup(
    job: Annotated[Optional[str], typer.Argument(help="The completed job whose disks go.")] = None,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    orphans: Annotated[bool, typer.Option("--orphans", help="Disks of this stack that no job declares.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Also for a failed job.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete (otherwise only list).")] = False,
    no_apply: NoApplyOpt = False,
) -> None:
    from cli import inventory, jobs, stackfile
    from cli.apply import ApplyError
    from cli.lifecycle import LifecycleError

    if (job is None) == (not orphans):
        raise fail("give a JOB or --orphans")
    try:
        ref = stackfile.resolve(stack, stack_file)
        if orphans:
            cfg = stackfile.load(ref)
            inv = inventory.inventory_for(cfg, ref.name)
            found = inventory.deletable_orphans(inv.disks(), cfg, ref.name)
            if not found:
                typer.echo(f"stack {ref.name}: no orphaned disks")
                return
            for disk, ok, why in found:
                verb = ("deleting" if yes else "would delete") if ok else "keeping"
                typer.echo(f"{verb} {disk.id} ({disk.zone}): {why}")
                if ok and yes:
                    inv.delete(disk)
            if not yes:
                typer.echo("dry run: nothing deleted (re-run with --yes)")
            return
        result = jobs.cleanup_job(ref, job, force=force, yes=yes, applier=_applier(ref, no_apply),
                                  out=lambda line: typer.echo(line.rstrip("\n"), err=True))
    except (ConfigError, LifecycleError, ApplyError) as exc:
        raise fail(str(exc)) from None
    if not result.done:
        typer.echo(f"job {job}: would delete {len(result.disks)} disks and {len(result.urns) - len(result.disks)} other resources:")
        for urn in result.urns:
            typer.echo(f"  {urn}")
        typer.echo("dry run: nothing changed (re-run with --yes)")
    elif no_apply:
        typer.echo(f"job {job}: removed from {ref.path}; its disks stay protected until `pulumi state unprotect` and `pulumi up`")
    else:
        typer.echo(f"job {job}: {len(result.disks)} disks and its other resources deleted; removed from {ref.path}")


def main() -> None:
    app()
