"""The job lifecycle commands: resume, failover, complete, status, events."""

from typing import Annotated, Optional

import typer

from cli.commands import (
    BucketOpt,
    EventsOpt,
    JsonOpt,
    NoApplyOpt,
    ObserveOpt,
    PreviewOnlyOpt,
    StackFileOpt,
    StackOpt,
    YesOpt,
    app,
    applier_for,
    cloud_for,
    confirmer,
    fail,
    guard,
    progress,
    pull_first,
    read_events,
    read_jobs_events,
    run_change,
    shared_copy,
    stack_jobs,
    warn,
)
from cli.commands.hints import Unread, events_source, source_place
from cli.commands.textfit import say_warning, wrapped
from cli.lifecycle import glossary
from infra.basics import Capacity

KeepCodeOpt = Annotated[
    bool,
    typer.Option("--keep-code", help="With code: in the job, run the code its entry records (codeDigest/codeCommit) "
                 "instead of packing the directory again."),
]
UpdateCodeOpt = Annotated[
    bool,
    typer.Option("--update-code", help="With code: {git: ...}: resolve the ref again, so the new attempt runs its newest "
                 "commit (default: the codeCommit the entry records, as at every attempt since launch)."),
]
FromAttemptOpt = Annotated[
    Optional[int],
    typer.Option("--from-attempt", metavar="N", min=1,
                 help="Retry-safe: act only on attempt N (the one you saw); once the job moved past it, this is a no-op."),
]


@app.command(
    short_help="Start a pending job, or a preempted one's next attempt.  Example: spotctl resume llm-pretrain -s example-gcp",
    help="Start a pending job's attempt 1 (what `spotctl launch --no-apply` writes): state running on new disks. Or give "
    "a preempted (or stopped, or --force: failed) job its next attempt: attempt + 1, state running, on the same disks, "
    "so training continues from its last checkpoint. Either way the capacity is the one its policy picks (or "
    "--capacity), then a targeted pulumi update of only that job's resources (--no-apply: only the stack file is "
    "written). Running it twice makes one new attempt. When the stack has several zones and a move to another pays "
    "(the zone choice: every job's and pool's events), the new attempt starts there, its disks moved as by `spotctl "
    "move`, after a preview of the move's time and price; --no-move resumes in place.\n\n"
    "Example: spotctl resume llm-pretrain --stack example-gcp --events-dir ./events",
)
def resume(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    capacity: Annotated[Optional[Capacity], typer.Option("--capacity", help="Force spot or on-demand instead of the policy's choice.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Start a new attempt even if nothing says the current one ended (or it failed).")] = False,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    observe: ObserveOpt = False,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    preview_only: PreviewOnlyOpt = False,
    from_attempt: FromAttemptOpt = None,
    keep_code: KeepCodeOpt = False,
    update_code: UpdateCodeOpt = False,
    json_out: JsonOpt = False,
    no_move: Annotated[bool, typer.Option("--no-move", help="Resume in the job's zone even when the zone choice says a "
                                          "move pays (it is only said).")] = False,
) -> None:
    from cli.commands import jobcode
    from cli.commands.costview import JobCost
    from cli.commands.zonehint import zone_decision
    from cli.lifecycle import capacity as capacity_choice
    from cli.lifecycle.states import decide_resume
    from cli.lifecycle.zonechoice import preview

    forced = capacity
    with pull_first(stack, stack_file, job, events_bucket, no_apply) as session:  # the shared copy's news first
        ref, cfg, (found,) = stack_jobs(stack, stack_file, job)
        if not (preview_only and no_apply):
            confirmer(yes, preview_only, no_apply)  # (a refusal comes before pulumi is asked anything)
        from infra.codespec import uncoded_warning

        if uncoded_warning(found):  # (as validate warns: the command would run in the empty job disk)
            warn(f"{ref.path}: {uncoded_warning(found)}")
        applier = applier_for(ref, no_apply)  # (asked for the eventBucket output only when nothing else knows it)
        bucket, where = events_source(ref, cfg, events_dir, events_bucket, session, applier)
        sourced = events_dir is not None or bool(bucket)
        try:
            if where and session is not None and session.offline:  # (the pull found it unreachable just now)
                raise Unread(f"{where} cannot be reached")
            events = read_events(ref, cfg, job, events_dir, bucket, where)
        except Unread as exc:  # (as without a bucket, as before one was looked for: the file's state decides)
            warn(f"{exc}: job {job} is decided without its events")
            events, sourced = [], False
        if observe:
            from datetime import UTC, datetime

            from cli.lifecycle.events import observed

            events += guard(lambda: observed(cloud_for(cfg, ref), cfg.job(job), datetime.now(UTC)))
        choose = capacity_choice.stack_capacity(ref.path, ref.name, cfg)
        where_to = zone_decision(ref, cfg, job, events, events_dir, bucket, where, choose)
        stay = "--no-move" if no_move else ("--capacity" if forced is not None else "")
        moves = where_to is not None and where_to.move and not stay
        if moves and found.state.value != "pending" and _resumes(found, events, force, choose, from_attempt):
            from cli.commands.resumemove import resume_by_move

            return resume_by_move(ref, cfg, found, events, where_to, events_dir=events_dir, bucket=bucket,
                                  applier=applier, no_apply=no_apply, yes=yes, preview_only=preview_only, json_out=json_out,
                                  costs=JobCost(stack, stack_file, job))
        zone = "" if moves else preview(found, where_to, f"{stay} keeps it here")
        code = jobcode.prepare(ref, cfg, job, events_bucket, session, applier, keep_code, repin=update_code)

        def decide(j):
            change = decide_resume(j, events, capacity=forced, force=force, choose=choose, from_attempt=from_attempt)
            if moves and not change.noop and j.state.value == "pending":  # no disk yet: placed there, free
                from dataclasses import replace

                change = replace(change, fields={**change.fields, "zone": where_to.zone},
                                 reason=f"{change.reason}; zone: {where_to.reason}")
            elif zone and not change.noop:  # where the zone choice would run it: said, not acted on
                from dataclasses import replace

                change = replace(change, reason=f"{change.reason}; {zone}")
            if change.noop and not sourced:  # (nothing could say it stopped: say where its events are)
                from dataclasses import replace

                from cli.commands.hints import sync_hint
                from cli.lifecycle.status import NO_EVENTS

                change = replace(change, reason=f"{change.reason}; no events source was found: {NO_EVENTS}, "
                                 f"or {sync_hint(ref)}")
            return change

        run_change(stack, stack_file, job, jobcode.with_code(decide, code), no_apply, json_out, yes, preview_only, applier,
                   costs=JobCost(stack, stack_file, job))


def _resumes(job, events, force: bool, choose, from_attempt) -> bool:
    """Whether ``resume`` would start a new attempt now (else the resume itself says why not)."""
    from cli.lifecycle.states import LifecycleError, decide_resume

    try:
        return not decide_resume(job, events, force=force, choose=choose, from_attempt=from_attempt).noop
    except LifecycleError:
        return False


@app.command(
    short_help="Switch a job to on-demand or spot, new attempt.  Example: spotctl failover diffusion --to on-demand -s example-aws",
    help="Switch a job's capacity (default: to the other one) with a new attempt on the same disk, then a targeted "
    "update.\n\nExample: spotctl failover diffusion --to on-demand --stack example-aws",
)
def failover(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    to: Annotated[Optional[Capacity], typer.Option("--to", help="The capacity to switch to (default: the other one).")] = None,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    preview_only: PreviewOnlyOpt = False,
    from_attempt: FromAttemptOpt = None,
    keep_code: KeepCodeOpt = False,
    update_code: UpdateCodeOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli.commands import jobcode
    from cli.commands.costview import JobCost
    from cli.lifecycle.states import decide_failover

    with pull_first(stack, stack_file, job, None, no_apply, bucket_option=False):
        ref, cfg, _ = stack_jobs(stack, stack_file, job)
        applier = applier_for(ref, no_apply) if cfg.job(job).code is not None else None  # (else run_change's own)
        code = jobcode.prepare(ref, cfg, job, applier=applier, keep=keep_code, bucket_option=False, repin=update_code)
        run_change(stack, stack_file, job, jobcode.with_code(lambda j: decide_failover(j, to, from_attempt), code),
                   no_apply, json_out, yes, preview_only, applier, costs=JobCost(stack, stack_file, job))


@app.command(
    short_help="Mark a job completed: its VMs go, its disks stay.  Example: spotctl complete vit-finetune -s example-gcp",
    help="Mark a job completed: its VMs are deleted by a targeted update; its disks stay (no longer protected) until "
    "`spotctl cleanup`.\n\nExample: spotctl complete vit-finetune --stack example-gcp",
)
def complete(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    no_apply: NoApplyOpt = False,
    yes: YesOpt = False,
    preview_only: PreviewOnlyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli.lifecycle.states import decide_complete

    with pull_first(stack, stack_file, job, None, no_apply, bucket_option=False):
        run_change(stack, stack_file, job, decide_complete, no_apply, json_out, yes, preview_only)


@app.command(
    short_help="Jobs' state, capacity, attempt, preemptions.  Example: spotctl status --stack example-gcp",
    help="Each job's state, capacity, attempt, zone, preemptions so far, time on spot vs on-demand and its last "
    "events (from --events-bucket or --events-dir; without either those are unknown: ?). The status column is the "
    "job's state, or what its events make of it:\n\n" + glossary.help_text()
    + "\n\nExample: spotctl status llm-pretrain --stack example-gcp --events-dir ./events --json",
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

    from cli.lifecycle.status import job_report

    ref, cfg, selected = stack_jobs(stack, stack_file, job, for_status=True, whole=observe or bool(events_bucket))
    cloud = cloud_for(cfg, ref) if observe else None
    session = None
    if cfg is not None and (events_bucket or synced(ref.path)):  # a shared stack file: is this copy behind it?
        session = shared_copy(ref, cfg, events_bucket)
        behind = session.behind() if session else None  # (first: it tells whether the bucket answers at all)
        for line in (behind or "").splitlines():
            say_warning(line, json_out)
    bucket, where = events_source(ref, cfg, events_dir, events_bucket, session)
    sourced, unread = events_dir is not None or bool(bucket), ""
    if where and session is not None and session.offline:  # (not waiting on a bucket that did not answer)
        sourced, unread = False, f"{where} cannot be reached; "
    with progress(f"reading the events{' and asking the cloud' if observe else ''}", enabled=not json_out):
        try:
            found = read_jobs_events(ref, cfg, selected, events_dir, bucket, where) if sourced else {}
        except Unread as exc:  # a bucket found, not given, and unreachable: the file's columns still stand
            sourced, unread = False, f"{exc}; "
        rows = [job_report(j, found[j.id] if sourced else None,
                           guard(lambda j=j: cloud.vms(j.id)) if cloud else None) for j in selected]
    if not sourced and selected:
        from cli.lifecycle.status import NO_EVENTS

        # (after the rows: a command that fails, e.g. on the cloud, says only why) what the file says
        # stands; what only events say is unknown, not 0
        say_warning(f"no events source: preemptions, hours, VM-hours and last event are unknown (shown as ?); {unread}{NO_EVENTS}",
                    json_out)
    unseen = [j.id for j in selected if sourced and j.state.value != "pending" and not found.get(j.id)]
    if unseen:  # (as `cost` says it) a wrong folder or bucket reads as "0 preemptions, 0 hours"
        say_warning(f"no event of {', '.join(unseen)} was read from {source_place(events_dir, bucket)}: {'its' if len(unseen) == 1 else 'their'} "
                    "preemptions, hours and VM-hours are unknown, not 0 (is the events source the right one?)", json_out)
    from cli.watch.journal import watcher_view

    seen_by_watcher = watcher_view(ref.path, selected)
    for row in rows:
        if row["job"] in seen_by_watcher:
            row["watcher"] = seen_by_watcher[row["job"]]
    if json_out:
        typer.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    print_status(rows)
    from cli.watch.journal import holder_path

    if session is not None or holder_path(ref.path).exists():  # (the lease part only where a watcher ran)
        from datetime import UTC, datetime

        from cli.watch.lease import watcher_line

        line = watcher_line(ref.path, datetime.now(UTC), session if session and not session.offline else None)
        if line:
            typer.echo(wrapped(line))


def synced(path) -> bool:
    """Whether this machine synced the stack file (status_jobs then reads it whole: its config is needed)."""
    from cli.lifecycle.stackfile import sync_record_path

    if not sync_record_path(path).exists():
        return False  # (without importing the sync part)
    from cli.lifecycle.sync import read_record

    return read_record(path) is not None


def print_status(rows: list[dict]) -> None:
    """A Rich table that fits the terminal: columns are taken in order while they fit whole (a job
    id is never broken); what does not fit is listed under the table, one line per job."""
    import textwrap

    from rich.console import Console

    from cli.lifecycle.status import fit_columns

    console = Console(soft_wrap=False, highlight=False)
    shown, rest = fit_columns(rows, console.width)
    console.print(StatusTable(shown, rows))

    def say(text: str) -> None:  # wrapped at the terminal's width, continuation indented
        typer.echo(textwrap.fill(text, width=console.width, subsequent_indent="    ", break_on_hyphens=False))

    for r in rows:
        if rest:
            say(f"{r['job']}: " + ", ".join(f"{col.header} {col.text(r)}" for col in rest))
        if r.get("status_reason"):
            say(f"{r['job']}: {r['status_reason']}")
        for line in r.get("log_tail") or ():
            typer.echo(f"    | {line}")
        if r.get("watcher"):
            w = r["watcher"]
            say(f"{r['job']}: watcher: {w['status']}" + (f", next try {w['next_try']}" if w.get("next_try") else "")
                + (f"; last action {w['last_action']}" if w.get("last_action") else ""))
        if r.get("move"):
            m = r["move"]
            held = f" (the disks left in {', '.join(m['held'])} stay protected until it started)" if m.get("held") else ""
            into = f" into a regional disk in {', '.join(m['replica_zones'])}" if m.get("replica_zones") else ""
            say(f"{r['job']}: moving from {m['from']} to {m['to']}{into}, step {m['step']} written{held}; "
                f"`spotctl move {r['job']} --to-zone {m['to']}` continues it")
        for vm in r.get("cloud", []):
            flag = " PREEMPTED" if vm["preempted"] else ""
            typer.echo(f"  {vm['name']}: {vm['status']}{flag} (attempt {vm['attempt']}, node {vm['node']}) {vm['reason'] or ''}".rstrip())


class StatusTable:
    """The status table as Rich prints ``rich.table.Table(box=None, pad_edge=False, padding=(0, 1),
    header_style="bold")`` of columns that fit (each as wide as its widest cell, two spaces apart;
    tests/test_status.py checks they agree), as ready lines. A Table measures and renders every cell
    on its own (~35 ms for 100 jobs, most of ``spotctl status``'s time); cells are plain
    text here, never markup or emoji codes (an event name holding ``[red]`` stays as written)."""

    def __init__(self, columns, rows: list[dict]):
        from rich.cells import cell_len

        def width(text: str) -> int:
            return len(text) if text.isascii() else cell_len(text)

        cells = [[col.header for col in columns], *([col.text(r) for col in columns] for r in rows)]
        widths = [max(width(line[i]) for line in cells) for i in range(len(columns))]
        self.lines = ["  ".join(" " * (w - width(v)) + v if col.justify == "right" else v + " " * (w - width(v))
                                for col, w, v in zip(columns, widths, values, strict=True)) for values in cells]

    def __rich_console__(self, console, options):
        from rich.segment import Segment
        from rich.style import Style

        header = Style(bold=True)
        for i, line in enumerate(self.lines):
            yield Segment(line, None if i else header)
            yield Segment.line()


@app.command(
    short_help="A job's recorded events.  Example: spotctl events llm-pretrain --stack example-gcp --events-dir ./events",
    help="The events a job's VMs recorded (started, preemption-notice, preempted, stopped, completed, failed, ...).\n\n"
    "Example: spotctl events llm-pretrain --stack example-gcp --events-bucket example-gcp-events-4d8689f7 --json",
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

    from cli.lifecycle.events import event_json

    ref, cfg, _ = stack_jobs(stack, stack_file, job)
    with progress(f"job {job}: reading its events", enabled=not json_out):
        bucket, where = events_source(ref, cfg, events_dir, events_bucket)
        try:
            found = read_events(ref, cfg, job, events_dir, bucket, where)
        except Unread as exc:
            raise fail(f"job {job}: {exc}; give --events-bucket NAME or --events-dir DIR") from None
    if not (bucket or events_dir is not None):
        raise fail(f"job {job}: where are its events? give --events-dir DIR (a synced bucket or a job disk's .spotctl/) "
                   "or --events-bucket NAME (the stack's eventBucket output)")
    if json_out:
        typer.echo(json.dumps([event_json(e) for e in found], indent=2, sort_keys=True))
        return
    if not found:  # not a silent success: the person may have given the wrong folder or bucket
        typer.echo(f"no events of {job} in {source_place(events_dir, bucket)}", err=True)
    for e in found:
        details = " ".join(f"{k}={v}" for k, v in e.details.items())
        typer.echo(f"{e.time.isoformat()}  attempt {e.attempt} node {e.node}  {e.event:<18} {details}".rstrip())
