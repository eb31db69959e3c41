"""``spotctl simulate --zones``: the zone choice replayed on time-aligned traces of several zones."""

from __future__ import annotations

import typer

from cli.commands import fail, progress


def simulate_zones(traces: list, names: list[str], job, starts: int, seed: int, move_hours: float, json_out: bool,
                   plot_path) -> None:
    import json
    from dataclasses import asdict

    from cli.policy import multizone

    if len(traces) < 2:
        raise fail("--zones needs at least two --trace files (one per zone, time-aligned)")
    if plot_path is not None:
        raise fail("--plot draws one zone's run: it cannot be combined with --zones")
    move = multizone.Move(move_hours)
    try:
        zones = multizone.aligned(traces)
        with progress(f"simulating the zone choice on {len(traces)} zones x {starts} starts", enabled=not json_out):
            rows = multizone.evaluate_zones(zones, names, job, starts, seed, move)
    except ValueError as exc:
        raise fail(f"--zones: {exc}") from None
    if json_out:
        doc = {"job": asdict(job), "zones": zones.names, "move_hours": move_hours, "starts": starts, "seed": seed,
               "results": [asdict(r) for r in rows]}
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        typer.echo(multizone.render_zones(rows, move), nl=False)
