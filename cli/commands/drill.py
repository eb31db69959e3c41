"""``spotctl drill``: preempt a training command locally under the real VM scripts."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.commands import CloudName, JsonOpt, StackFileOpt, StackOpt, app, fail, stack_jobs
from cli.commands.traces import TRACE_LOOKUP, find_trace


def _code(make):
    """``make()``'s DrillCode; a CodeError is the command's one error line."""
    from cli.code import CodeError

    try:
        return make()
    except CodeError as exc:
        raise fail(str(exc)) from None


def _packed(directory: Path, what: str, **keys: str):
    from cli.code.prepare import pack_directory
    from cli.drill.code import DrillCode

    archive = pack_directory(directory, what)
    return DrillCode(archive.data, archive.sha256, **keys)


def _job_code(ref, job):
    """The job's code as ``resume`` would deliver it (None without ``code:``): its directory packed, or
    its git ref pinned to the commit the job records (else resolved now)."""
    if job.code is None:
        return None
    from cli.code.gitref import resolve
    from cli.code.prepare import StackContext, pack_dir
    from cli.drill.code import DrillCode
    from cli.lifecycle.stackfile import project_root

    keys = {"setup": job.setup or "", "workdir": job.workdir or "", "container": job.container or ""}
    if job.code.git is not None:
        commit = job.code_commit or _code(lambda: resolve(job.code.git, job.code.git_ref, f"job {job.id}: code.ref"))
        return DrillCode(git_url=job.code.git, git_commit=commit, **keys)
    archive = _code(lambda: pack_dir(job, StackContext(ref.name, project_root(ref.path.parent))))
    return DrillCode(archive.data, archive.sha256, **keys)


@app.command(
    short_help="Preempt a training script locally and judge if it resumes.  Example: spotctl drill -- python train.py",
    help="Run COMMAND under the same scripts a cloud VM runs, in a copy of the current directory (or of --code DIR), preempt it the way GCP or AWS would, resume it on "
    "the same (temporary) disk, and judge whether training survives: reentrant, not-exercised (no preemption "
    "came before the command finished), restarts-from-scratch, lost-work or did-not-finish. Exits non-zero unless "
    "reentrant. The script may print `SPOTCTL_PROGRESS step/total` and "
    "`SPOTCTL_CHECKPOINT step` lines.\n\n"
    "Example: spotctl drill --preempt-every 1.5 --verify -- python examples/reentrant_train.py",
)
def drill(
    command: Annotated[Optional[list[str]], typer.Argument(help="The training command, after `--`.", show_default=False)] = None,
    cloud: Annotated[CloudName, typer.Option("--cloud", help="Whose preemption to play: gcp (30 s) or aws (2-minute notice).")] = CloudName.GCP,
    preempt_every: Annotated[Optional[float], typer.Option("--preempt-every", metavar="SECONDS", help="Preempt each attempt this long after its command started (setup is never preempted).")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", metavar="FILE", help="A trace file (JSON, the spot-traces availability format): preempt when it says spot went away. " + TRACE_LOOKUP)] = None,
    time_scale: Annotated[Optional[float], typer.Option("--time-scale", help="Trace seconds (and AWS's notice) per drill second; with --trace the default puts the trace's first preemption 2 s into the run.")] = None,
    max_attempts: Annotated[int, typer.Option("--max-attempts", min=1, help="Give up after this many attempts.")] = 10,
    verify: Annotated[bool, typer.Option("--verify", help="Also run uninterrupted and compare the final output files.")] = False,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    job: Annotated[Optional[str], typer.Option("--job", metavar="ID", help="Drill this job's command, env and code (of --stack, else $PULUMI_STACK or the selected stack).")] = None,
    code: Annotated[Optional[Path], typer.Option("--code", metavar="DIR", help="Pack DIR as a job's code: the command runs in it, unpacked on the drill's disk.")] = None,
    setup: Annotated[Optional[str], typer.Option("--setup", metavar="CMD", help="With --code: run once per disk and code before the command.")] = None,
    workdir: Annotated[Optional[str], typer.Option("--workdir", metavar="W", help="With --code: where the command runs, relative to the code.")] = None,
    json_out: JsonOpt = False,
) -> None:
    import json
    import sys

    from cli.drill import runner as drills
    from cli.drill.verdict import render_report

    if preempt_every is not None and trace is not None:
        raise fail("give --preempt-every or --trace, not both")
    if preempt_every is not None and preempt_every <= 0:
        raise fail(f"--preempt-every: expected a positive number of seconds, got {preempt_every}")
    if time_scale is not None and time_scale <= 0:
        raise fail(f"--time-scale: expected a positive number, got {time_scale}")
    env: dict[str, str] = {}
    secret_keys: tuple[str, ...] = ()
    job_id, cloud, drill_code, capacity = "drill", cloud.value, None, "spot"
    here: Path | None = None  # the directory the drill runs a copy of, when no code was given
    if (setup is not None or workdir is not None) and code is None:
        raise fail("--setup and --workdir go with --code DIR")
    if stack is not None or stack_file is not None or job is not None:
        if command or code is not None:
            raise fail("give a COMMAND (and --code) or --stack/--job, not both")
        if not job:
            raise fail("--stack needs --job ID")
        ref, cfg, (spec_job,) = stack_jobs(stack, stack_file, job)
        command_text, env, job_id, cloud = spec_job.command, spec_job.plain_env, spec_job.id, cfg.cloud
        secret_keys, capacity = spec_job.secret_keys, spec_job.capacity.value
        drill_code = _job_code(ref, spec_job)
    elif command:
        command_text = drills.command_string(command)
        if code is not None:
            drill_code = _code(lambda: _packed(code.resolve(), f"--code {code}", setup=setup or "", workdir=workdir or ""))
        else:
            # As SkyPilot and dstack run a task in a copy of its workdir: the command runs in a fresh copy
            # of this directory on the drill's scratch disk, so its files never land in the user's
            # checkout, a second drill starts from nothing, and --verify finds what it wrote.
            here = Path.cwd()  # (packed once the spec is made: a bad trace is the error to show first)
    else:
        raise fail("nothing to drill: give a command after `--` (or --job ID of a stack)")
    trace = None if trace is None else find_trace(trace)  # as simulate finds it
    try:
        spec = drills.make_spec(command=command_text, cloud=cloud, job_id=job_id, capacity=capacity, env=env, secret_keys=secret_keys,
                                code=drill_code, preempt_every=preempt_every,
                                trace=trace, time_scale=time_scale, max_attempts=max_attempts, verify=verify)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if here is not None:
        import dataclasses

        spec = dataclasses.replace(spec, code=_code(lambda: _packed(
            here, "the current directory (a drill runs in a copy of it; --code DIR picks another)")))
    live = sys.stderr.isatty()

    def status(line: str) -> None:
        if live:
            sys.stderr.write("\r\033[K" + line)
            sys.stderr.flush()

    if here is not None:
        typer.echo(f"drill: running in a copy of {here} on a scratch disk, removed afterwards "
                   "(this directory is not touched)", err=True)
    try:
        report = drills.run_drill(spec, status)
    except KeyboardInterrupt:
        typer.echo("\ndrill interrupted: every process it started was stopped", err=True)
        raise typer.Exit(130) from None
    if live:
        sys.stderr.write("\r\033[K")
    typer.echo(json.dumps(report.as_json(), indent=2, sort_keys=True) if json_out else render_report(report), nl=json_out)
    if not report.ok:
        raise typer.Exit(1)
