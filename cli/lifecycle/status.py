"""``spotctl status``: a job as the stack file declares it and as its events tell it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cli.cost.ledger import job_ledger
from cli.lifecycle.events import Event, Timeline, cloud_events, event_json
from infra.config import Capacity, Job


def job_status(job: Job, events: list[Event], now: datetime | None = None) -> dict[str, Any]:
    """A job as the stack file declares it and as its events tell it."""
    now = now or datetime.now(UTC)
    tl = Timeline.of(events, now)
    run_h = sum(max(0.0, (b - a).total_seconds() / 3600) for a, b, _ in tl.runs)
    # VM-hours (nodes x hours) by the capacity each attempt really ran on (its `started` event)
    ledger = job_ledger(job, events, now)
    return {
        "job": job.id,
        "state": job.state.value,
        "capacity": job.capacity.value,
        "attempt": job.attempt,
        "zone": job.zone,
        "nodes": job.nodes,
        "preemptions": sum(how == "preempted" for _, _, how in tl.runs),
        "hours_running": round(run_h, 3),
        "spot_hours": round(ledger.vm_hours(Capacity.SPOT.value), 3),
        "on_demand_hours": round(ledger.vm_hours(Capacity.ON_DEMAND.value), 3),
        "last_event": event_json(events[-1]) if events else None,
        # `spotctl move`: the move in progress (its last step written) and the zones the job left.
        "move": ({"from": job.move.from_, "to": job.move.to, "step": job.move.step}
                 | ({"held": list(job.move.held)} if job.move.held else {})
                 | ({"replica_zones": list(job.move.replica_zones)} if job.move.replica_zones else {})) if job.move else None,
        "disk_kind": job.disk_kind,
        "zone_history": [{"zone": z.zone, "last_attempt": z.last_attempt, **({"same_disk": True} if z.same_disk else {})}
                         for z in job.zone_history],
    }


def job_report(job: Job, events: list[Event], vms: list[Any] | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Status merged from the stack file, the recorded events and (``vms``: ``--observe``) the
    cloud: ``status`` is what should happen next when they disagree, e.g. ``needs-resume`` for a
    job the file says is running whose current attempt the events (or the cloud) say was preempted."""
    from cli.lifecycle.states import attempt_outcome

    now = now or datetime.now(UTC)
    seen = list(events) + (cloud_events(vms, job, now) if vms is not None else [])
    row = job_status(job, events, now)
    outcome = attempt_outcome(seen, job.attempt)
    status, reason = job.state.value, ""
    if job.state.value in ("running", "pending") and outcome is not None and outcome.value in ("preempted", "stopped"):
        source = "the cloud" if any(e.details.get("source") == "cloud" for e in seen if e.attempt == job.attempt) else "its events"
        status, reason = "needs-resume", f"attempt {job.attempt} was {outcome.value} ({source}); run `spotctl resume {job.id}`"
    elif job.state.value == "running" and outcome is not None and outcome.value in ("failed", "completed"):
        status = f"{outcome.value}?"
        reason = f"attempt {job.attempt} {outcome.value} (its events); the stack file still says running"
    if job.state.value == "stopped" and job.stop_reason and not reason:
        reason = f"stopped by spotctl: {job.stop_reason}"
    row["status"], row["status_reason"] = status, reason
    row["attempts"] = sorted({e.attempt for e in events if e.event == "started"})
    if vms is not None:
        row["cloud"] = [dict(vm.__dict__) for vm in vms]
    return row


@dataclass(frozen=True)
class Column:
    """One column of the status table: the row key it shows, its header, how a value is written."""

    key: str
    header: str
    fmt: Callable[[Any], str] = str
    justify: str = "left"

    def text(self, row: dict[str, Any]) -> str:
        return self.fmt(row[self.key]) if row.get(self.key) is not None else "-"

    def width(self, rows: list[dict[str, Any]]) -> int:
        return max([len(self.header), *(len(self.text(r)) for r in rows)])


def plain(value: Any) -> str:
    """A value as a person reads it: never ``None``/``True``, a record by its main field."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        main = value.get("action") or value.get("event") or value.get("reason")
        return str(main) if main else ", ".join(f"{k}={plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value)
    return str(value)


def _hours(value: Any) -> str:
    return f"{value:.1f}"


def _last(value: Any) -> str:
    return f"{value['event']} (attempt {value['attempt']}, {value['time'][5:16].replace('T', ' ')})" if value else "-"


# Other parts add keys to the rows (cost: spot/on-demand hours; watch: what it waits for, its last
# action); a key listed here gets its header and format, any other plain value is shown as it is.
STATUS_COLUMNS: list[Column] = [
    Column("job", "job"),
    Column("status", "status"),
    Column("capacity", "capacity"),
    Column("attempt", "attempt", justify="right"),
    Column("zone", "zone"),
    Column("preemptions", "preempt", justify="right"),
    Column("hours_running", "hours", _hours, "right"),
    Column("spot_hours", "spot VM-h", _hours, "right"),
    Column("on_demand_hours", "on-demand VM-h", _hours, "right"),
    Column("waiting_for_capacity", "waiting", lambda v: plain(v)),
    Column("last_action", "last action", lambda v: plain(v)),
    Column("last_event", "last event", _last),
]
HIDDEN = {"state", "nodes", "status_reason", "attempts", "cloud", "disk_kind"}  # shown elsewhere (or only in --json)


def table_columns(rows: list[dict[str, Any]]) -> list[Column]:
    """The columns these rows have: the known ones in order, then any other plain value."""
    keys = [k for r in rows for k in r]
    known = [c for c in STATUS_COLUMNS if c.key in keys]
    listed = {c.key for c in STATUS_COLUMNS} | HIDDEN
    extra = [Column(k, k.replace("_", " "), plain) for k in dict.fromkeys(keys)
             if k not in listed and all(isinstance(r.get(k), (str, int, float, bool, type(None))) for r in rows)]
    return known + extra


def fit_columns(rows: list[dict[str, Any]], width: int, gap: int = 2) -> tuple[list[Column], list[Column]]:
    """(columns that fit whole in ``width``, in order; the others). The job column always fits."""
    shown, rest, used = [], [], 0
    for col in table_columns(rows):
        need = col.width(rows) + (gap if shown else 0)
        if not shown or (not rest and used + need <= width):
            shown.append(col)
            used += need
        else:
            rest.append(col)
    return shown, rest
