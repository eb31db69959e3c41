"""``spotctl logs``: a job's trainer log, per attempt and node."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli.commands import EventsOpt, StackFileOpt, StackOpt, app, fail, stack_jobs


@app.command(
    short_help="A job's trainer log.  Example: spotctl logs llm-pretrain --events-dir ./disk/.spotctl",
    help="The output (stdout and stderr) of a job's command for one attempt and node (default: the latest attempt, "
    "node 0), from a copy of the job disk's .spotctl/ or of the event bucket (--events-dir). --follow keeps "
    "printing what is appended until the attempt's events say it ended (or Ctrl-C).\n\n"
    "Example: spotctl logs llm-pretrain --attempt 3 --node 1 --events-dir ./events --tail 50",
)
def logs(
    job: Annotated[str, typer.Argument(help="The job id.")],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_dir: EventsOpt = None,
    attempt: Annotated[Optional[int], typer.Option("--attempt", min=1, help="Which attempt (default: the latest).")] = None,
    node: Annotated[int, typer.Option("--node", min=0, help="Which node of a multi-node job (NODE_RANK).")] = 0,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new output until the attempt ends.")] = False,
    lines: Annotated[int, typer.Option("--tail", min=0, help="Only the last N lines (0: all).")] = 0,
) -> None:
    import sys
    import time

    from cli.lifecycle import logs as joblogs
    from cli.lifecycle.events import load_events

    stack_jobs(stack, stack_file, job)  # the job must exist in the stack
    if events_dir is None:
        raise fail(f"job {job}: where is its log? give --events-dir DIR (a copy of the job disk's .spotctl/ or of the event bucket)")
    if not events_dir.exists():
        raise fail(f"--events-dir {events_dir}: no such file or directory")
    try:
        key = joblogs.pick(joblogs.available(events_dir, job), attempt, node)
    except joblogs.LogError as exc:
        raise fail(f"job {job}: {exc} in {events_dir}") from None
    shown = joblogs.read(events_dir, job, key)
    sys.stdout.write(joblogs.tail(shown.decode(errors="replace"), lines))
    sys.stdout.flush()
    ended = ("completed", "failed", "preempted", "stopped")
    try:
        while follow and not any(e.attempt == key.attempt and e.event in ended for e in load_events(events_dir, job)):
            time.sleep(1.0)
            data = joblogs.read(events_dir, job, key)
            if len(data) > len(shown):
                sys.stdout.write(data[len(shown):].decode(errors="replace"))
                sys.stdout.flush()
                shown = data
        if follow:  # what was written between the last read and the end
            sys.stdout.write(joblogs.read(events_dir, job, key)[len(shown):].decode(errors="replace"))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
