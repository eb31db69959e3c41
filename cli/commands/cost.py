"""``spotctl cost``: what each job (and the stack) cost, and what spot saved against on-demand."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.commands import (
    BucketOpt,
    EventsOpt,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    cloud_for,
    fail,
    guard,
    progress,
    read_jobs_events,
    stack_jobs,
)
from cli.commands.hints import Unread, events_source


@app.command(
    short_help="What spot saved, per job and stack.  Example: spotctl cost --stack example-gcp --events-dir ./events",
    help="Per job and for the stack: VM-hours on spot and on on-demand (nodes x hours from each attempt's `started` "
    "event to its end, or now), changeover hours, preemptions, work lost where the events say, what it cost, what "
    "the same VM-hours would have cost on on-demand, and the savings. Prices: spotctl:prices in the stack file, else "
    "spotctl's dated table of list prices, else the cloud's price APIs; the report names each price's source.\n\n"
    "Example: spotctl cost llm-pretrain --stack example-gcp --events-bucket example-gcp-events-4d8689f7 --plot cost.png",
)
def cost(
    job: Annotated[Optional[str], typer.Argument(help="Only this job.")] = None,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    events_dir: EventsOpt = None,
    events_bucket: BucketOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", metavar="PNG", help="Also draw each job's timeline and the savings (matplotlib).")] = None,
    as_of: Annotated[Optional[str], typer.Option("--as-of", metavar="TIME", help="Report as of this ISO 8601 time (UTC if no offset; default: now): later events are ignored, running attempts end here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    import json
    from datetime import UTC, datetime

    from cli import cost as ledger

    now = datetime.now(UTC)
    if as_of is not None:
        try:
            now = datetime.fromisoformat(as_of.replace("Z", "+00:00"))
        except ValueError:
            raise fail(f"--as-of: expected an ISO 8601 time such as 2026-11-21T18:00:00Z, got {as_of!r}") from None
        now = now if now.tzinfo else now.replace(tzinfo=UTC)
    if plot is not None:  # refused before the events are read, not after
        from cli.cost.plot import png_path

        try:
            png_path(plot)
        except ValueError as exc:
            raise fail(str(exc)) from None
    ref, cfg, selected = stack_jobs(stack, stack_file, job)
    bucket, where = events_source(ref, cfg, events_dir, events_bucket)
    if events_dir is None and not bucket:  # every figure below comes from the events: none is 0 by default
        from cli.lifecycle.status import NO_EVENTS

        raise fail(f"no events source: every figure of the cost report (VM-hours, preemptions, costs) comes from the jobs' "
                   f"events; {NO_EVENTS}")
    with progress("reading the events and the prices", enabled=not json_out):
        try:
            events = read_jobs_events(ref, cfg, selected, events_dir, bucket, where)
        except Unread as exc:
            raise fail(f"{exc}; give --events-bucket NAME or --events-dir DIR") from None
        cloud = cloud_for(cfg, ref)
        rep = guard(lambda: ledger.report(cfg, ref.name, selected, events, now, lookup=cloud.prices))
    if plot is not None:
        from cli.cost.plot import draw

        try:
            plot = draw(rep.costed, plot, rep.now, f"spotctl cost {ref.name}")
        except OSError as exc:  # not writable, or the disk is full: one line, not a traceback
            raise fail(f"--plot: cannot write {exc.filename or plot}: {exc.strerror or exc}") from None
    data = rep.json()
    _fold_states(data, selected, events, now)
    if json_out:
        typer.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))
        return
    _print(data, plot)


def _fold_states(data: dict, jobs: list, events: dict[str, list], now) -> None:
    """Each job's state as `spotctl status` folds it from the file and the events (``needs-resume`` for a
    job the file says is running whose attempt the events say was preempted), as of ``now``; the file's
    own word stays in ``fileState``."""
    from cli.lifecycle.status import job_report

    by_id = {j.id: j for j in jobs}
    for row in data["jobs"]:
        if (job := by_id.get(row["id"])) is not None:
            seen = [e for e in events.get(job.id, []) if e.time <= now]
            row["fileState"], row["state"] = row["state"], job_report(job, seen, now=now)["status"]


def _usd(x) -> str:
    return "-" if x is None else f"${x:,.2f}"


def _move_line(job: str, m: dict) -> str:
    """One zone move: when, its changeover, its snapshots' storage so far (at most: the disks' size)."""
    hours = "?" if m["changeover_hours"] is None else f"{m['changeover_hours']:.2f} h"
    state = " (in progress)" if m["in_progress"] else ""
    kept = "" if m["snapshot_hours"] is None else f", kept {m['snapshot_hours']:.2f} h"
    return (f"move {job}: {m['from']} -> {m['to']} after attempt {m['after_attempt']}{state}: changeover {hours}; "
            f"snapshots <= {m['snapshot_gb']} GB{kept}: <= {_usd(m['snapshot_storage_cost'])}")


COST_COLUMNS = [("job", "left"), ("state", "left"), ("spot VM-h", "right"), ("on-dem VM-h", "right"),
                ("changeover h", "right"), ("preempt", "right"), ("lost h", "right"), ("moves", "right"),
                ("cost", "right"), ("all on-demand", "right"), ("saved", "right")]
# Dropped first when the table does not fit, in this order: money (cost, all on-demand, saved), the job
# and its state never are (a figure is never cut: the columns are no_wrap).
DROP_ORDER = [7, 6, 4, 5, 3, 2]


def _fitting(rows: list[list[str]], width: int) -> tuple[list[int], list[int]]:
    """The columns that fit ``width`` whole (Rich's heavy box: 3 columns of border and padding per
    column, plus 1), dropping ``DROP_ORDER`` one by one; and the ones dropped."""
    kept = list(range(len(COST_COLUMNS)))
    dropped: list[int] = []
    for i in DROP_ORDER:
        if _width(rows, kept) <= width:
            break
        kept.remove(i)
        dropped.append(i)
    return kept, dropped


def _width(rows: list[list[str]], kept: list[int]) -> int:
    return sum(max(len(COST_COLUMNS[i][0]), *(len(r[i]) for r in rows)) + 3 for i in kept) + 1


def _print(data: dict, plot: Optional[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    from cli.commands.textfit import columns

    console = Console()
    if not console.is_terminal:  # piped or captured: 80 columns unless COLUMNS says otherwise (as `status`)
        console = Console(width=columns())
    t = data["total"]
    pct = f" ({t['savings_pct']:.1f} %)" if t["savings_pct"] is not None else ""
    rows = []
    for j in data["jobs"]:
        saved = "-" if j["savings"] is None else f"{_usd(j['savings'])}" + (f" ({j['savings_pct']:.1f} %)" if j["savings_pct"] is not None else "")
        lost = "-" if j["work_lost_hours"] is None else f"{j['work_lost_hours']:.2f}"
        row = [j["id"], j["state"] + (" (so far)" if j["running"] else ""), f"{j['spot_hours']:.2f}",
               f"{j['on_demand_hours']:.2f}", f"{j['changeover_hours']:.2f}", str(j["preemptions"]), lost,
               str(len(j["moves"])), _usd(j["cost"]), _usd(j["on_demand_cost"]), saved]
        if j.get("no_events"):  # (it ran, and no event of it was read: unknown, not 0)
            row = row[:2] + ["?"] * (len(row) - 2)
        rows.append(row)
    rows.append(["total", "", f"{t['spot_hours']:.2f}", f"{t['on_demand_hours']:.2f}", f"{t['changeover_hours']:.2f}",
                 str(t["preemptions"]), "", str(t["moves"]), _usd(t["cost"]), _usd(t["on_demand_cost"]), f"{_usd(t['savings'])}{pct}"])
    if data["jobs"] and all(j.get("no_events") for j in data["jobs"]):
        rows[-1] = rows[-1][:2] + ["?"] * (len(rows[-1]) - 2)  # (nothing read: the total is unknown too)
    kept, dropped = _fitting(rows, console.width)
    if _width(rows, kept) > console.width:  # too narrow for even the money columns whole: one line per row
        for row in rows:
            console.print(f"{row[0]}: " + ", ".join(f"{COST_COLUMNS[i][0]} {row[i]}" for i in range(1, len(row)) if row[i]),
                          highlight=False)
        table, dropped = None, []
    else:
        table = Table(title=f"spotctl cost — stack {data['stack']}, as of {data['as_of'][:16].replace('T', ' ')} UTC")
        for i in kept:
            name, justify = COST_COLUMNS[i]
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for n, row in enumerate(rows):
            table.add_row(*(row[i] for i in kept), style="bold" if n == len(rows) - 1 else None)
    if table is not None:
        console.print(table)
    if dropped:
        console.print(f"left out at {console.width} columns: {', '.join(COST_COLUMNS[i][0] for i in dropped)} (--json has every figure)",
                      highlight=False)
    if t["running_cost"]:
        console.print(f"jobs still running have cost {_usd(t['running_cost'])} so far")
    for j in data["jobs"]:
        for m in j["moves"]:
            console.print(_move_line(j["id"], m), highlight=False)
    if t["moves"]:
        console.print(f"moves: {t['move_changeover_hours']:.2f} h of changeovers; snapshot storage so far at most "
                      f"{_usd(t['snapshot_storage_cost'])} (not in cost)", highlight=False)
        snap = data["snapshot_price"]
        if snap:
            console.print(f"price snapshot storage: ${snap['per_gb_month']:.4f}/GB-month — {snap['source']}", highlight=False)
    sources = {(mt, p["source"]) for j in data["jobs"] for mt, p in j["prices"].items() if p}
    for mt, source in sorted(sources):
        price = next(j["prices"][mt] for j in data["jobs"] if j["prices"].get(mt))
        console.print(f"price {mt}: spot ${price['spot']:.4f}/h, on-demand ${price['on_demand']:.4f}/h — {source}", highlight=False)
    unseen = [j["id"] for j in data["jobs"] if j.get("no_events")]
    if unseen:
        console.print(f"?: no event of {', '.join(unseen)} was read: {'its' if len(unseen) == 1 else 'their'} figures are "
                      "unknown and not in the total (is the events source the right one?)", highlight=False)
    for note in data["notes"]:
        console.print(f"note: {note}", highlight=False)
    if plot is not None:
        console.print(f"plot written to {plot}")
