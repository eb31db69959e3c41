"""``spotctl watch``: jobs resume, fail over and complete on their own."""

from typing import Annotated, Optional

import typer

from cli.commands import (
    BucketOpt,
    EventsOpt,
    JsonOpt,
    NoApplyOpt,
    StackFileOpt,
    StackOpt,
    app,
    applier_for,
    cloud_for,
    fail,
    shared_copy,
)
from infra.basics import WATCH_INTERVAL_MAX_S, ConfigError


@app.command(
    short_help="Resume, complete and fail jobs on their own.  Example: spotctl watch --stack example-gcp",
    help="Watch a stack's jobs and act on what really happened to their current attempt: a preempted or stopped VM "
    "-> resume (the job's policy picks the capacity), completed on every node -> complete (VMs go, disks stay), failed "
    "-> marked failed (retried only while the job's maxFailures allows). Notices (interruption warning, rebalance) are "
    "recorded, not acted on. A capacity refusal is retried with exponential backoff (status shows "
    "waiting-for-capacity). Events come from the event bucket, --events-dir, the AWS interruption queue, the GCP "
    "preemption subscription and a poll of the cloud. One watcher per stack (a lease in the event bucket when the "
    "stack file is shared, else a lock on this machine); it acts without asking.\n\n"
    "Example: spotctl watch --stack example-gcp --interval 30          (or --once from cron)",
)
def watch(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Handle what is pending, then exit (0 when every action succeeded).")] = False,
    interval: Annotated[float, typer.Option("--interval", metavar="SECONDS", min=0.0, max=WATCH_INTERVAL_MAX_S, help="Seconds between cycles.")] = 5.0,
    poll_every: Annotated[float, typer.Option("--poll-every", metavar="SECONDS", min=0.0,
                                              help="Ask the cloud about every running job's VMs this often (the fallback poll).")] = 300.0,
    no_poll: Annotated[bool, typer.Option("--no-poll", help="Never ask the cloud about VMs; only events and messages.")] = False,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    queue_url: Annotated[Optional[str], typer.Option("--queue-url", metavar="URL",
                                                     help="AWS interruption queue (default: the stack's interruptionQueue output).")] = None,
    subscription: Annotated[Optional[str], typer.Option("--subscription", metavar="NAME",
                                                        help="GCP preemption subscription (default: the stack's preemptionSubscription output).")] = None,
    wait: Annotated[float, typer.Option("--wait", metavar="SECONDS", min=0.0,
                                        help="If another watcher holds the stack (here, or anywhere through the lease in the event bucket), "
                                             "wait this long for it to stop or its lease to expire (default: exit).")] = 0.0,
    no_apply: NoApplyOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from cli.lifecycle import stackfile
    from cli.lifecycle.apply import ApplyError
    from cli.watch import observe, watcher
    from cli.watch.lease import LeaseHeld

    def warn(line: str) -> None:
        typer.echo(f"warning: {line}", err=True)

    try:
        ref = stackfile.resolve(stack, stack_file)
        cfg = stackfile.load(ref)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    applier = applier_for(ref, no_apply)
    unset = _unset(cfg.cloud, events_bucket, queue_url, subscription)
    if applier is not None and unset:
        try:  # fill in what the flags left out from the stack's outputs
            outputs = applier.outputs()
        except ApplyError as exc:
            warn(f"{exc}; pass {' and '.join(unset)}")
            outputs = {}
        events_bucket = events_bucket or outputs.get("eventBucket")
        queue_url = queue_url or (outputs.get("interruptionQueue") if cfg.cloud == "aws" else None)
        subscription = subscription or (outputs.get("preemptionSubscription") if cfg.cloud == "gcp" else None)
    import json

    sources = observe.Sources(events_dir, events_bucket, queue_url, subscription, poll=not no_poll)
    report = watcher.Report(emit=lambda rec: typer.echo(json.dumps(rec, sort_keys=True) if json_out else _text(rec)),
                            warn=warn, out=lambda line: typer.echo(line.rstrip("\n"), err=True))
    if not json_out:
        typer.echo(f"watching stack {ref.name}: " + ", ".join(_describe(sources)), err=True)
    import contextlib

    # The stack file's shared copy (when it is shared: a watcher stack, or synced here): pulled at the
    # start of every cycle and under the lock of every action, pushed after every edit.
    # A watcher that never synced (the watcher VM's fresh clone of the repository) takes the shared
    # copy's version of a job both changed: the team's live copy is newer than any commit.
    shared = shared_copy(ref, cfg, events_bucket, keep_unsynced="shared")
    # Its bucket also holds the stack's watch lease, so watchers on other machines are kept apart too.
    settings = watcher.Settings(ref, sources, applier, interval, poll_every, once, wait, shared=shared)
    try:
        with stackfile.sharing(ref.path, shared) if shared else contextlib.nullcontext():
            ok = watcher.run(settings, report, cloud_for=lambda c: cloud_for(c, ref))
    except LeaseHeld as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(0 if ok else 1)


def _unset(cloud: str, bucket, queue_url, subscription) -> list[str]:
    """The sources this cloud's watcher reads from the stack's outputs that no option gave (with the output's name)."""
    unset = [] if bucket else ["--events-bucket NAME (the stack's eventBucket output)"]
    if cloud == "aws" and not queue_url:
        unset.append("--queue-url URL (its interruptionQueue output)")
    if cloud == "gcp" and not subscription:
        unset.append("--subscription NAME (its preemptionSubscription output)")
    return unset


def _describe(sources) -> list[str]:
    parts = [f"events dir {sources.events_dir}" if sources.events_dir else "",
             f"bucket {sources.bucket}" if sources.bucket else "",
             f"queue {sources.queue_url}" if sources.queue_url else "",
             f"subscription {sources.subscription}" if sources.subscription else "",
             "cloud poll" if sources.poll else ""]
    return [p for p in parts if p] or ["nothing (give --events-dir, --events-bucket, --queue-url or --subscription)"]


def _text(rec: dict) -> str:
    if rec["action"] == "publish":
        return f"pool {rec['pool']}: published " + ", ".join(f"{k}={v:g}" for k, v in rec["metrics"].items()) + f" ({rec['reason']})"
    if rec["action"] == "record":
        return f"job {rec['job']}: {rec['kind']}: {rec['reason']}"
    what = ", ".join(f"{k}={v}" for k, v in rec["fields"].items())
    tail = f" (next try {rec['next_try']})" if rec.get("next_try") else ""
    detail = f": {rec['detail']}" if rec.get("detail") and not rec["fields"] else ""
    return f"job {rec['job']}: {rec['action']} {what + ' ' if what else ''}— {rec['result']}{tail} ({rec['reason']}){detail}"
