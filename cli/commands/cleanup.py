"""`spotctl cleanup`: a completed job's disks, orphaned disks, and the snapshots moves left."""

from typing import Annotated, Optional

import typer

from cli.commands import (
    BucketOpt,
    EventsOpt,
    JsonOpt,
    NoApplyOpt,
    PreviewOnlyOpt,
    StackFileOpt,
    StackOpt,
    app,
    applier_for,
    cloud_for,
    confirmer,
    fail,
    interactive,
    interrupted,
    progress,
    pull_first,
    read_events,
    warn,
)
from cli.commands.hints import Unread, events_source
from cli.commands.textfit import urn_line, wrapped
from infra.basics import ConfigError, counted


@app.command(
    short_help="Delete a completed job's disks, or orphans.  Example: spotctl cleanup bert-eval -s example-gcp",
    help="Delete a job's disks, only when the job is completed (or failed, with --force) and its disks carry this "
    "stack's ownership labels: lift their Pulumi protection, drop the job from the stack file and delete its "
    "resources with a targeted update, all decided under the stack file's lock. --orphans lists data disks/volumes "
    "of this stack that no job declares; one is deleted only when its job is in neither the file nor the Pulumi "
    "state and recorded a `completed` event (--events-dir/--events-bucket). --snapshots lists the snapshots "
    "`spotctl move` left; one is deleted once it is older than spotctl:eventRetentionDays, carries this stack's "
    "ownership labels and its job is not moving. Lists what would go, then asks; "
    "--yes deletes without asking; --preview-only (or no terminal) only lists. A job `launch --no-apply` wrote and "
    "nothing applied goes with --no-apply --yes: only its entry is removed.\n\n"
    "Example: spotctl cleanup --orphans --stack example-gcp --events-dir ./events",
)
def cleanup(
    job: Annotated[Optional[str], typer.Argument(help="The completed job whose disks go.")] = None,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    orphans: Annotated[bool, typer.Option("--orphans", help="Disks of this stack that no job declares.")] = False,
    snapshots: Annotated[bool, typer.Option("--snapshots", help="Move snapshots older than eventRetentionDays.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Also for a failed job.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    preview_only: PreviewOnlyOpt = False,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    no_apply: NoApplyOpt = False,
    json_out: JsonOpt = False,
) -> None:

    from cli.cloud import CloudError
    from cli.lifecycle import bucketevents, pipeline, stackfile
    from cli.lifecycle import orphans as unclaimed
    from cli.lifecycle.apply import ApplyError
    from cli.lifecycle.states import LifecycleError

    if (job is not None) + orphans + snapshots != 1:
        raise fail("give a JOB, --orphans or --snapshots")
    # --json: the same decisions as one document on stdout (no question: --yes deletes, else it lists).
    doc: dict = {"job": job} if job is not None else {"orphans" if orphans else "snapshots": True, "items": []}
    echo = (lambda text: None) if json_out else typer.echo
    if json_out and not yes:
        preview_only = True
    # Cleanup never deleted without --yes: with no terminal to ask on, it stays a listing.
    ask = None if yes else (confirmer(False, preview_only) if interactive() and not json_out else (lambda question: False))

    def inventory(cfg):
        return cloud_for(cfg, ref).inventory()

    source: list = []  # (the bucket found once per command)

    def completed(cfg, job_id):
        if not source:
            source.append(events_source(ref, cfg, events_dir, events_bucket))  # (given neither: the synced bucket)
        bucket, where = source[0]
        try:
            found = read_events(ref, cfg, job_id, events_dir, bucket, where) if where else \
                bucketevents.recorded(cloud_for(cfg, ref), job_id, events_dir, bucket, warn)
        except Unread as exc:  # nothing could say which jobs completed: no disk can be decided on
            raise fail(f"{exc}: nothing deleted; give --events-bucket NAME or --events-dir DIR") from None
        return max((e.time for e in found if e.event == "completed"), default=None)

    with pull_first(stack, stack_file, job, events_bucket, no_apply):  # the shared copy's news first
        try:
            ref = stackfile.resolve(stack, stack_file)
            if snapshots:
                _prune_snapshots(ref, inventory, ask, preview_only, echo, doc["items"])
                _print_json(doc, json_out)
                return
            if orphans:
                applier = applier_for(ref, no_apply)

                def orphan_run(delete, report):
                    return unclaimed.cleanup_orphans(ref, inventory, applier, completed, delete=delete, report=report)

                _list_then_delete(orphan_run, lambda disk: f"{disk.id} ({disk.zone})", ask, preview_only,
                                  f"the disks of stack {ref.name}", f"stack {ref.name}: no orphaned disks",
                                  f"orphaned disks of stack {ref.name}", echo, doc["items"])
                _print_json(doc, json_out)
                return
            from cli.lifecycle import launch as launching

            if no_apply and yes and launching.listed_never_applied(ref, job):  # (undoes `launch --no-apply`)
                launching.forget(ref, job)
                echo(f"job {job}: never applied: removed from {ref.path}")
                _print_json({**doc, "removed": True, "neverApplied": True, "applied": False, "disks": []}, json_out)
                return

            def show(listed) -> None:  # what the targeted update deletes, before the question
                doc["resources"] = list(listed.urns)
                if json_out:
                    return
                typer.echo(wrapped(f"job {job}: a targeted update would delete {counted(len(listed.disks), 'disk')} (protection "
                                   f"lifted first) and {counted(len(listed.urns) - len(listed.disks), 'other resource')}, and "
                                   f"drop the job from {ref.path}:"))
                for urn in listed.urns:
                    left = " (in Pulumi's state: the job's completion was never applied)" if urn in listed.leftovers else ""
                    typer.echo(urn_line(urn, left))

            with progress(f"job {job}: deciding what its cleanup deletes") as spinner:
                result = pipeline.remove_job(ref, job, force=force, applier=applier_for(ref, no_apply, spinner.step),
                                             inventory=inventory, out=spinner.echo,
                                             confirm=spinner.paused(ask) if ask else None, show=spinner.paused(show))
            if result.declined:
                echo(_declined("nothing changed", preview_only))
                _print_json({**doc, "removed": False, "declined": True, "applied": False, "disks": []}, json_out)
                return
        except ApplyError as exc:  # (cleanup edits the stack file with --no-apply only when --yes says so too)
            raise fail(str(exc).replace("pass --no-apply to only edit the stack file", "re-run with --no-apply --yes to only "
                                        "drop the job from the stack file (its disks stay, protected)")) from None
        except (ConfigError, LifecycleError, CloudError) as exc:
            raise fail(str(exc)) from None
        except pipeline.Interrupted as exc:
            raise interrupted(exc) from None
    if no_apply:
        echo(f"job {job}: removed from {ref.path}; its disks stay protected until `pulumi state unprotect` and `pulumi up`")
    else:
        echo(f"job {job}: {counted(len(result.disks), 'disk')} and its other resources deleted; removed from {ref.path}")
    _print_json({**doc, "removed": True, "declined": False, "applied": not no_apply, "disks": [str(d) for d in result.disks]},
                json_out)


def _print_json(doc: dict, json_out: bool) -> None:
    if json_out:
        import json

        typer.echo(json.dumps(doc, indent=1, sort_keys=True))


def _prune_snapshots(ref, inventory, ask, preview_only: bool, echo, items: list) -> None:
    """``cleanup --snapshots``: list the move snapshots, then delete the expired ones (asked, or --yes)."""
    from datetime import UTC, datetime

    from cli.lifecycle import orphans

    def run(delete, report):
        return orphans.prune_snapshots(ref, inventory, datetime.now(UTC), delete=delete, report=report)

    _list_then_delete(run, lambda snap: f"snapshot {snap.id}", ask, preview_only, f"the snapshots of stack {ref.name}",
                      f"stack {ref.name}: no move snapshots", f"expired snapshots of stack {ref.name}", echo, items)


def _list_then_delete(run, name, ask, preview_only: bool, listing: str, none: str, what: str, echo, items: list) -> None:
    """List what may go and why, then delete it: at once with --yes (``ask`` None), else what the
    user confirms. ``run(delete, report)`` decides and deletes under the stack lock (``delete``:
    None for every deletable one, else only those ids)."""

    def report(item, ok, why, deleting):
        items.append({"id": item.id, "name": name(item), "deletable": bool(ok), "deleted": bool(ok and deleting), "why": why})
        echo(f"{('deleting' if deleting else 'would delete') if ok else 'keeping'} {name(item)}: {why}")

    with progress(f"listing {listing}"):
        found = run(set() if ask else None, None if ask else report)
    if not found:
        echo(none)
        return
    if ask is None:
        return
    for item, ok, why in found:
        report(item, ok, why, False)
    deletable = {item.id for item, ok, _ in found if ok}
    if deletable and ask(f"Delete {len(deletable)} {what}?"):
        items.clear()  # (what the deletion reports replaces the listing)
        with progress("deleting"):
            run(deletable, report)
    elif deletable:
        echo(_declined("nothing deleted", preview_only))


def _declined(what: str, preview_only: bool) -> str:
    return f"{what} (not confirmed)" if interactive() and not preview_only else f"dry run: {what} (re-run with --yes)"

