"""``spotctl logs``: a job's trainer log, per attempt and node."""

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
    cloud_for,
    fail,
    guard,
    progress,
    stack_jobs,
)


@app.command(
    short_help="A job's trainer log.  Example: spotctl logs llm-pretrain -s example-gcp --follow",
    help="The output (stdout and stderr) of a job's command for one attempt and node (default: the latest attempt, "
    "node 0), from the stack's event bucket (--events-bucket, default: the stack's eventBucket output), where the VM "
    "uploads it in chunks, or from a copy of the job disk's .spotctl/ or of the bucket (--events-dir). --follow "
    "keeps printing what is uploaded until the attempt's events say it ended (or Ctrl-C).\n\n"
    "Example: spotctl logs llm-pretrain --stack example-gcp --attempt 1 --node 1 --tail 50",
)
def logs(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    attempt: Annotated[Optional[int], typer.Option("--attempt", min=1, help="Which attempt (default: the latest).")] = None,
    node: Annotated[int, typer.Option("--node", min=0, help="Which node of a multi-node job (NODE_RANK).")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new output until the attempt ends.")] = False,
    lines: Annotated[int, typer.Option("--tail", min=0, help="Only the last N lines (0: all).")] = 0,
    json_out: JsonOpt = False,
) -> None:
    import json
    import sys

    from cli.lifecycle import logs as joblogs
    from cli.lifecycle.apply import ApplyError

    if json_out and follow:
        raise fail("--json prints the log once, as one document: leave out --follow (or --json, to follow the text)")
    ref, cfg, _ = stack_jobs(stack, stack_file, job)  # the job must exist in the stack
    if events_dir is not None:
        if not events_dir.exists():
            raise fail(f"--events-dir {events_dir}: no such file or directory")
        source: joblogs.LogSource = joblogs.DirLogs(events_dir, job, ref.name)
    else:
        if events_bucket is None:
            from cli.commands.hints import known_bucket

            events_bucket = known_bucket(ref)[0]  # (the synced one: no pulumi run)
        if events_bucket is None:
            try:
                with progress(f"reading the outputs of stack {ref.name}"):
                    events_bucket = applier_for(ref, False).outputs().get("eventBucket")
            except ApplyError as exc:
                raise fail(f"job {job}: where is its log? {exc}: give --events-bucket NAME (the stack's eventBucket output) "
                           "or --events-dir DIR (a copy of the job disk's .spotctl/)") from None
            if not events_bucket:
                raise fail(f"job {job}: stack {ref.name} has no eventBucket output (is it deployed?): give --events-bucket NAME "
                           "or --events-dir DIR (a copy of the job disk's .spotctl/)")
        source = joblogs.BucketLogs(cloud_for(cfg, ref), events_bucket, job)

    from cli.lifecycle.events import terminal_safe

    shown = terminal_safe if _to_terminal() else str  # (a file or a pipe gets the log as the VM wrote it)
    held: list[str] = []

    def write(text: str) -> None:
        if json_out:  # (one document: the log is held, as --tail holds its last lines; JSON escapes it)
            held.append(text)
            return
        sys.stdout.write(shown(text))
        sys.stdout.flush()

    try:
        key = guard(lambda: joblogs.show(source, attempt, node, write, lines=lines, follow=follow))
        if json_out:
            typer.echo(json.dumps({"job": job, "attempt": key.attempt, "node": key.node, "source": source.where,
                                   "log": "".join(held)}, indent=1, sort_keys=True))
    except joblogs.LogError as exc:
        raise fail(f"job {job}: {exc} in {source.where}") from None
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def _to_terminal() -> bool:
    import sys

    return sys.stdout.isatty()
