"""``spotctl status``: a job as the stack file declares it and as its events tell it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cli.cost.ledger import job_ledger
from cli.lifecycle.events import Event, Timeline, event_json
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
    }
