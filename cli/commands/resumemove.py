"""``resume`` following the zone choice: when a move pays, the job's next attempt starts in the chosen
zone through the move machinery (``cli.lifecycle.mover``: snapshot, restore, start there, release;
a regional disk: one step, force-attached), after a line saying the move's measured time and its
price against staying. A job never applied (``pending``: no disk yet) is placed there by the
resume's own change, free. ``--no-move`` resumes in place and only says where the choice would go."""

from __future__ import annotations

import math

import typer


def figures(cfg, job, events: list, decision) -> dict:
    """The move as ``resume`` shows it before the change: its time (measured, else assumed), and the
    expected cost of the work left there (the move included) against staying, in USD where priced."""
    from cli.lifecycle.capacity import move_changeover_h
    from cli.lifecycle.estimate import job_rate

    free = job.state.value == "pending"
    move_h, measured = (0.0, 0) if free else move_changeover_h(job, events)
    rate = job_rate(cfg, job)

    def usd(spot_hours: float | None) -> float | None:
        if spot_hours is None or not math.isfinite(spot_hours) or rate.spot is None:
            return None
        return round(spot_hours * rate.spot, 2)

    there, staying = decision.costs.get(decision.zone), decision.costs.get(job.zone)
    return {"from": job.zone, "to": decision.zone, "how": _how(job, free), "move_hours": round(move_h, 3),
            "measured_moves": measured, "expected_there_usd": usd(there), "expected_staying_usd": usd(staying),
            "expected_there_spot_hours": _round(there), "expected_staying_spot_hours": _round(staying),
            "spot_per_h": rate.spot, "on_demand_per_h": rate.on_demand, "reason": decision.reason}


def _how(job, free: bool) -> str:
    if free:
        return "a first launch: no disk yet, nothing to carry"
    return "force-attach of its regional disk" if job.disk_replica_zones else "snapshot and restore of its disks"


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 3)


def line(job_id: str, f: dict) -> str:
    """The preview's zone line."""
    basis = (f"the median of its {f['measured_moves']} past move(s)" if f["measured_moves"]
             else "none measured yet: assumed" if f["move_hours"] else "free")

    def money(usd, hours) -> str:
        return f"${usd:.2f}" if usd is not None else (f"{hours:.2f} spot-hours" if hours is not None else "more than "
                                                       "on-demand allows in time")

    prices = (f"; spot ${f['spot_per_h']:.2f}/h, on-demand ${f['on_demand_per_h']:.2f}/h"
              if f["spot_per_h"] is not None and f["on_demand_per_h"] is not None else "")
    return (f"job {job_id}: zone {f['from']} -> {f['to']} ({f['how']}): the move takes {f['move_hours']:.2f} h ({basis}); "
            f"the work left is expected to cost {money(f['expected_there_usd'], f['expected_there_spot_hours'])} there, "
            f"move included, against {money(f['expected_staying_usd'], f['expected_staying_spot_hours'])} staying{prices}")


def resume_by_move(ref, cfg, job, events_of, decision, *, events_dir, bucket, applier, no_apply: bool, yes: bool,
                   preview_only: bool, json_out: bool, costs) -> None:
    """The move to ``decision.zone`` as the job's resume: every step the situation allows now
    (``applier``: the one the command already used, its stack selected once; None: --no-apply)."""
    import json

    from cli.commands import cloud_for, confirmer, fail, interrupted, progress, recorded_events
    from cli.lifecycle import pipeline
    from cli.lifecycle.apply import ApplyError
    from cli.lifecycle.mover import move_job
    from cli.lifecycle.states import LifecycleError
    from infra.basics import Capacity, ConfigError

    f = figures(cfg, job, events_of, decision)
    if preview_only and no_apply:
        raise fail("--preview-only needs pulumi: it cannot be combined with --no-apply")
    confirm = confirmer(yes, preview_only, no_apply)
    if confirm is not None:
        confirm = costs.before(confirm)
    if not json_out:
        typer.echo(line(job.id, f))
    try:
        with progress(f"job {job.id}: resuming in {decision.zone}", enabled=not json_out) as spinner:
            if applier is not None:
                applier.step = spinner.step
            result = move_job(
                ref, job.id, decision.zone,
                events=lambda: recorded_events(ref, cfg, job.id, events_dir, bucket) if (events_dir or bucket) else events_of,
                applier=applier, out=spinner.echo,
                confirm=spinner.paused(confirm) if confirm else None,
                inventory=lambda c: cloud_for(c, ref).inventory(),
                capacity=Capacity.SPOT,  # (a paid move goes only where spot is seen up now: cli/policy/zones.py)
            )
    except (ConfigError, LifecycleError, ApplyError) as exc:
        raise fail(str(exc)) from None
    except pipeline.Interrupted as exc:
        raise interrupted(exc) from None
    if json_out:
        typer.echo(json.dumps({"job": job.id, "changed": bool(result.steps) and not result.declined, "zone": f,
                               "steps": [{"fields": c.fields, "reason": c.reason} for c in result.steps],
                               "applied": result.applied, "declined": result.declined, "finished": result.finished,
                               "waiting": result.waiting, "snapshots": result.snapshots}, sort_keys=True))
        return
    from cli.commands.move import echo_outcome

    echo_outcome(ref, job.id, result, f"`spotctl move {job.id} --to-zone {decision.zone}` continues it; "
                 f"`spotctl resume {job.id} --no-move` before its first step resumes in place")
