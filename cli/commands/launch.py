"""``spotctl launch`` (add a job and apply only it) and ``spotctl stop`` (its VMs go, its disks stay)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.commands import (
    JsonOpt,
    NoApplyOpt,
    PreviewOnlyOpt,
    StackFileOpt,
    StackOpt,
    YesOpt,
    app,
    applier_for,
    confirmer,
    fail,
    interrupted,
    progress,
    pull_first,
    run_change,
    shell_cwd,
    shell_path,
    warn,
)
from cli.commands.costview import cost_preview, echo_cost, shown
from infra.basics import ConfigError


@app.command(
    short_help="Add a job and apply only it.  Example: spotctl launch --id sweep-08 --machine g2-standard-8 -s example-gcp",
    help="Add a job to the stack from a job file (the keys of a spotctl:jobs entry) or flags, validated within the "
    "stack; show what it costs (spot and on-demand $/h, the always-on parts, and the expected cost under its policy "
    "when it gives --job-hours and --deadline-hours); write it into the stack file (under the lock, comments kept); "
    "show Pulumi's preview of only its resources and ask; apply them with a targeted update (no, or an update that "
    "cannot start: the job is taken out again). An id the stack has is refused. --no-apply only writes the entry "
    "(state pending).\n\n"
    "Example: spotctl launch --id sweep-08 --machine g2-standard-8 --gpus nvidia-l4:1 --command 'python train.py' "
    "--job-hours 6 --deadline-hours 12 --stack example-gcp --no-apply",
)
def launch(
    job_file: Annotated[Optional[Path], typer.Argument(metavar="JOB_FILE", help="A YAML file with one job's keys.")] = None,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    job_id: Annotated[Optional[str], typer.Option("--id", metavar="NAME", help="The job id.")] = None,
    machine: Annotated[Optional[str], typer.Option("--machine", metavar="TYPE", help="machineType (GCP) or instanceType (AWS).")] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", metavar="TYPE:COUNT", help="The accelerator: nvidia-l4:1, l4:1 (short names as `spotctl catalog` takes), or a count of the machine's own GPU (1).")] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", metavar="N", min=1, help="Nodes of a multi-node job.")] = None,
    zone: Annotated[Optional[str], typer.Option("--zone", metavar="ZONE", help="Default: the stack's first zone.")] = None,
    command: Annotated[Optional[str], typer.Option("--command", metavar="CMD", help="What every node runs.")] = None,
    code: Annotated[Optional[str], typer.Option("--code", metavar="DIR", help="The job's code directory (its `code:` key): checked, and written relative to the project root.")] = None,
    deadline_hours: Annotated[Optional[float], typer.Option("--deadline-hours", metavar="H", help="Hours until the deadline.")] = None,
    job_hours: Annotated[Optional[float], typer.Option("--job-hours", metavar="H", help="Compute hours the job needs.")] = None,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    preview_only: PreviewOnlyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    import json

    from cli.lifecycle import launch as launching
    from cli.lifecycle import pipeline, stackfile
    from cli.lifecycle.apply import ApplyError
    from cli.lifecycle.states import LifecycleError

    if preview_only and no_apply:
        raise fail("--preview-only needs pulumi: it cannot be combined with --no-apply")
    flags = {"id": job_id, "machine": machine, "gpus": gpus, "nodes": nodes, "zone": zone, "command": command,
             "code": code, "deadlineHours": deadline_hours, "jobHours": job_hours}
    if job_file is not None:
        job_file = shell_path(job_file)  # (as the shell means it, also under -C DIR)
    if job_file is None and job_id is None:
        raise fail("give a JOB_FILE or --id NAME (with --machine, --command, ...)")
    confirm = confirmer(yes, preview_only, no_apply)  # (no terminal and no --yes: refused before anything)
    with pull_first(stack, stack_file, None, None, no_apply, bucket_option=False):
        try:
            ref = stackfile.resolve(stack, stack_file)
            current = stackfile.load(ref)
            given = launching.read_job_file(job_file) if job_file is not None else {}
            # A relative code directory is the job file's (--code: the working directory's, checked to
            # exist inside the project root); the entry records it relative to the project root, where
            # every later command reads it.
            root = stackfile.project_root(ref.path.parent)
            if code is not None:
                flags["code"] = launching.code_flag(code, root, shell_cwd())
            elif "code" in given:
                given["code"] = launching.rebased_code(given["code"], job_file.parent, root, str(job_file))
            if gpus is not None:
                named = machine or given.get("machineType") or given.get("instanceType")
                flags["gpus"] = parse_gpus(gpus, current.cloud, named if isinstance(named, str) else None)
            entry = launching.entry(current.cloud, list(current.zones), given, flags)
            source = str(job_file) if job_file is not None else f"launch of job {entry.get('id')}"
            # (the keys a flag gave, and every key a flag could give when there is no job file)
            named = {{"machine": "machineType", "gpus": "accelerator"}.get(f, f) for f, v in flags.items() if v is not None}
            flagged = {k for k in launching.FLAG_OF if job_file is None or k in named or (k == "instanceType" and "machineType" in named)}
            cfg = launching.check_new(ref, entry, source, flagged)
        except (ConfigError, LifecycleError) as exc:
            raise fail(str(exc)) from None
        job = cfg.job(entry["id"])
        if no_apply and job.code is not None:  # checked as an applied launch checks it; `resume` packs and uploads
            from cli.code import CodeError
            from cli.code.prepare import StackContext, prepare_code

            try:
                checked = prepare_code(job, StackContext(ref.name, stackfile.project_root(ref.path.parent)), upload=False)
            except CodeError as exc:
                raise fail(str(exc)) from None
            if checked is not None and checked.commit:  # a git ref is pinned now; a directory's digest waits for resume
                entry = {**entry, **checked.fields()}
        if not no_apply:  # packed and uploaded now, its digest in the entry; --no-apply leaves that to `resume`
            from cli.commands import jobcode

            code_ref = jobcode.prepare(ref, cfg, job.id, applier=applier_for(ref, False), bucket_option=False)
            if code_ref is not None:
                entry = {**entry, **code_ref.fields()}
        from infra import catalog
        from infra.codespec import uncoded_warning
        from infra.tokens import token_warnings

        if uncoded_warning(job):
            warn(f"{ref.path}: {uncoded_warning(job)}")
        for line in [*token_warnings(cfg), *catalog.warnings(cfg)]:  # (the new job is the last one)
            if line.startswith(f"spotctl:jobs[{len(cfg.jobs) - 1}]."):
                warn(f"{ref.path}: {line}")
        cost = cost_preview(ref, cfg, [job], [job], enabled=not json_out)
        if not json_out:
            typer.echo(f"job {job.id}: " + ", ".join(f"{k}={shown(v)}" for k, v in entry.items() if k != "id"))
            echo_cost(cost)
        try:
            with progress(f"job {job.id}: applying its first attempt", enabled=not json_out and not no_apply) as spinner:
                outcome = pipeline.change_job(ref, job.id, launching.first_attempt, new=entry,
                                              applier=None if no_apply else applier_for(ref, False, spinner.step),
                                              out=spinner.echo, confirm=spinner.paused(confirm) if confirm else None)
        except (ConfigError, LifecycleError) as exc:
            raise fail(str(exc)) from None
        except ApplyError as exc:
            kept = f"; the job stays in {ref.path}: `spotctl resume {job.id}` applies it" if exc.started else \
                f"; job {job.id} was taken out of {ref.path} again"
            raise fail(f"{exc}{kept}") from None
        except pipeline.Interrupted as exc:
            raise interrupted(exc) from None
    applied = bool(outcome and outcome.applied)
    declined = bool(outcome and outcome.declined)
    if json_out:
        typer.echo(json.dumps({"job": job.id, "entry": entry, "stack_file": str(ref.path), "written": not declined,
                               "applied": applied, "declined": declined, "cost": cost}, sort_keys=True))
    elif declined:
        typer.echo(f"job {job.id}: " + ("preview only" if preview_only else "not confirmed") + f": nothing changed, {ref.path} is as it was")
    elif applied:
        typer.echo(f"job {job.id}: state=running ({outcome.change.reason}) — applied")
    else:
        typer.echo(f"job {job.id}: written to {ref.path} (state pending); `spotctl resume {job.id}` applies it")


@app.command(
    short_help="Stop a job: its VMs go, its disks stay.  Example: spotctl stop vit-finetune -s example-gcp",
    help="Stop a job on purpose: it is written `state: stopped` with `stoppedBy: user`, and a targeted update deletes "
    "its VMs; its disks stay (protected). `spotctl watch` never resumes it; `spotctl resume JOB` starts the next "
    "attempt on the same disks.\n\nExample: spotctl stop vit-finetune --stack example-gcp",
)
def stop(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    preview_only: PreviewOnlyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli.lifecycle.states import decide_stop

    with pull_first(stack, stack_file, job, None, no_apply, bucket_option=False):
        run_change(stack, stack_file, job, decide_stop, no_apply, json_out, yes, preview_only)


def parse_gpus(text: str, cloud: str, machine: Optional[str]) -> dict:
    """``--gpus TYPE:COUNT``, ``TYPE`` (one) or ``COUNT`` (of the machine's own GPU, from the catalog) as
    the entry's ``accelerator``; a short TYPE as the catalog does (``l4:1`` -> nvidia-l4)."""
    from infra import catalog

    kind, _, count = text.partition(":")
    if kind.isdigit() and not count:
        own = catalog.machine_gpu(cloud, machine) if machine else None
        if own is None:
            raise ConfigError("--gpus", [f"{text!r}: a count alone needs a --machine whose GPU the catalog knows; "
                                         "give --gpus TYPE:COUNT (e.g. nvidia-l4:1)"])
        kind, count = own[0], kind
    if not kind or (count and not count.isdigit()) or count == "0" or kind == "0":
        raise ConfigError("--gpus", [f"expected TYPE:COUNT (e.g. nvidia-l4:1), COUNT or TYPE, got {text!r}"])
    return {"type": catalog.gpu_type(cloud, machine, kind), "count": int(count or 1)}
