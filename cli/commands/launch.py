"""``spotctl launch`` (add a job and apply only it) and ``spotctl stop`` (its VMs go, its disks stay),
and the cost preview the applying commands show before they ask."""

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
    warn,
)
from infra.basics import ConfigError


def shipped_trace(path: Path) -> Optional[Path]:
    """``path`` under the trace folders ``simulate`` reads (``cli.commands.traces``), or None: the cost
    preview then samples a trace instead of failing."""
    from cli.commands.traces import SPOT_TRACES_SUBDIR, trace_roots

    for root in trace_roots():
        for folder in (root, root / SPOT_TRACES_SUBDIR):
            if (folder / path).is_file():
                return folder / path
    return None


def _shown(value) -> str:
    if isinstance(value, dict) and set(value) == {"type", "count"}:
        return f"{value['type']} x{value['count']}"
    return str(value)


def cost_preview(ref, cfg, jobs, expected_for=(), enabled: bool = True) -> dict:
    """The cost preview's numbers (``cli.lifecycle.estimate.preview``): $/h of ``jobs`` and the
    always-on parts, and the expected cost of the jobs in ``expected_for`` (a spinner while they replay)."""
    from cli.lifecycle import estimate
    from cli.lifecycle.capacity import learned_path, read_learned

    learned = dict(read_learned(learned_path(ref.path, ref.name)))
    expected = []
    for job in expected_for:
        with progress(f"job {job.id}: replaying its policy {job.policy} for the expected cost", enabled=enabled):
            found = estimate.expected_cost(cfg, job, learned, shipped_trace)
        if found is not None:
            expected.append(found)
    return estimate.preview(cfg, jobs, expected)


def echo_cost(doc: dict, err: bool = False) -> None:
    import shutil

    from cli.lifecycle.estimate import render

    for line in render(doc, min(shutil.get_terminal_size((80, 24)).columns, 100)):
        typer.echo(line, err=err)


class JobCost:
    """One job's cost as the stack file has it when asked (after the edit): shown before the question of
    ``resume`` and ``failover`` (its $/h at its capacity now, the always-on parts, the expected cost under
    its policy, on stderr with Pulumi's preview) and given in their --json ($/h only: no replay)."""

    def __init__(self, stack, stack_file, job_id: str):
        self.stack, self.stack_file, self.job_id = stack, stack_file, job_id

    def _now(self):
        from cli.lifecycle import stackfile

        ref = stackfile.resolve(self.stack, self.stack_file)
        cfg = stackfile.load(ref)  # (whole: the always-on parts are the stack's)
        return ref, cfg, cfg.job(self.job_id)

    def before(self, confirm):
        def ask(question: str) -> bool:
            ref, cfg, job = self._now()
            echo_cost(cost_preview(ref, cfg, [job], [job]), err=True)
            return confirm(question)

        return ask

    def figures(self) -> dict:
        ref, cfg, job = self._now()
        return cost_preview(ref, cfg, [job], enabled=False)


@app.command(
    short_help="Add a job and apply only it.  Example: spotctl launch --id sweep-08 --machine g2-standard-8 -s example-gcp",
    help="Add a job to the stack from a job file (the keys of a spotctl:jobs entry) or flags, validated within the "
    "stack; show its resources and what it costs (spot and on-demand $/h, the always-on parts, and the expected "
    "cost under its policy when it gives --job-hours and --deadline-hours); ask; write it into the stack file "
    "(under the lock, comments kept) and apply only its resources with a targeted update. An id the stack has "
    "is refused. --no-apply only writes the entry (state pending).\n\n"
    "Example: spotctl launch --id sweep-08 --machine g2-standard-8 --gpus nvidia-l4:1 --command 'python train.py' "
    "--job-hours 6 --deadline-hours 12 --stack example-gcp --no-apply",
)
def launch(
    job_file: Annotated[Optional[Path], typer.Argument(metavar="[JOB_FILE]", help="A YAML file with one job's keys.")] = None,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    job_id: Annotated[Optional[str], typer.Option("--id", metavar="NAME", help="The job id.")] = None,
    machine: Annotated[Optional[str], typer.Option("--machine", metavar="TYPE", help="machineType (GCP) or instanceType (AWS).")] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", metavar="TYPE:COUNT", help="The accelerator, e.g. nvidia-l4:1.")] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", min=1, help="Nodes of a multi-node job.")] = None,
    zone: Annotated[Optional[str], typer.Option("--zone", metavar="ZONE", help="Default: the stack's first zone.")] = None,
    command: Annotated[Optional[str], typer.Option("--command", metavar="CMD", help="What every node runs.")] = None,
    code: Annotated[Optional[str], typer.Option("--code", metavar="DIR", help="The job's code (its `code:` key).")] = None,
    deadline_hours: Annotated[Optional[float], typer.Option("--deadline-hours", metavar="H", help="Hours until the deadline.")] = None,
    job_hours: Annotated[Optional[float], typer.Option("--job-hours", metavar="H", help="Compute hours the job needs.")] = None,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    preview_only: PreviewOnlyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    import json

    from cli.lifecycle import launch as launching
    from cli.lifecycle import operations, stackfile
    from cli.lifecycle.apply import ApplyError
    from cli.lifecycle.states import LifecycleError

    if preview_only and no_apply:
        raise fail("--preview-only needs pulumi: it cannot be combined with --no-apply")
    flags = {"id": job_id, "machine": machine, "gpus": gpus, "nodes": nodes, "zone": zone, "command": command,
             "code": code, "deadlineHours": deadline_hours, "jobHours": job_hours}
    if job_file is None and job_id is None:
        raise fail("give a JOB_FILE or --id NAME (with --machine, --command, ...)")
    confirm = confirmer(yes, preview_only, no_apply)  # (no terminal and no --yes: refused before anything)
    with pull_first(stack, stack_file, None, None, no_apply, bucket_option=False):
        try:
            ref = stackfile.resolve(stack, stack_file)
            current = stackfile.load(ref)
            given = launching.read_job_file(job_file) if job_file is not None else {}
            entry = launching.entry(current.cloud, list(current.zones), given, flags)
            source = str(job_file) if job_file is not None else f"launch of job {entry.get('id')}"
            cfg = launching.check_new(ref, entry, source)
        except (ConfigError, LifecycleError) as exc:
            raise fail(str(exc)) from None
        job = cfg.job(entry["id"])
        from infra.tokens import token_warnings

        for line in token_warnings(cfg):  # (the new job is the last one)
            if line.startswith(f"spotctl:jobs[{len(cfg.jobs) - 1}]."):
                warn(f"{ref.path}: {line}")
        cost = cost_preview(ref, cfg, [job], [job], enabled=not json_out)
        if not json_out:
            typer.echo(f"job {job.id}: " + ", ".join(f"{k}={_shown(v)}" for k, v in entry.items() if k != "id"))
            echo_cost(cost)
        try:
            launching.add(ref, entry)
            if no_apply:
                outcome = None
            else:
                with progress(f"job {job.id}: applying its first attempt", enabled=not json_out) as spinner:
                    outcome = launching.apply_first(ref, job.id, operations.change_job,
                                                    applier=applier_for(ref, False, spinner.step), out=spinner.echo,
                                                    confirm=spinner.paused(confirm) if confirm else None)
        except (ConfigError, LifecycleError) as exc:
            raise fail(str(exc)) from None
        except ApplyError as exc:
            kept = f"; the job stays in {ref.path}: `spotctl resume {job.id}` applies it" if exc.started else \
                f"; job {job.id} was taken out of {ref.path} again"
            raise fail(f"{exc}{kept}") from None
        except operations.Interrupted as exc:
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
