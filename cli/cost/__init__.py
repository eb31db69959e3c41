"""What spot saved: the cost ledger of a stack's jobs (``spotctl cost``).

Owns: the pure ledger (``ledger``: events -> attempts with capacity, machine type, nodes and
VM-hours; changeovers, preemptions, work lost, zone moves; dollars at given prices, the all-on-demand
counterfactual and the savings), where prices come from (``prices``: the stack file, the shipped
dated table ``prices.json``, the cloud's price APIs; snapshot storage from the table) with
``price_ratio`` for policies, and the plot (``plot``, matplotlib imported lazily).

May import: ``cli.cloud`` (the price lookup and ``CloudError``, never an SDK) and ``infra.config``.
Never ``cli.lifecycle`` (which imports this part for ``status``) or ``cli.app``: events arrive as
objects with ``attempt``, ``node``, ``event``, ``time`` and ``details``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cli.cost.ledger import Costed, SnapshotPrice, cost_job, job_json, job_ledger, total_json
from cli.cost.prices import Lookup, price_ratio, resolve, snapshot_price

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    from infra.config import Job, StackConfig

__all__ = ["report", "price_ratio", "Report"]


class Report:
    """A stack's cost report: per-job ledgers at prices, their JSON and notes about prices."""

    def __init__(self, stack: str, costed: list[Costed], notes: list[str], now: datetime, snapshot: SnapshotPrice | None = None):
        self.stack, self.costed, self.notes, self.now, self.snapshot = stack, costed, notes, now, snapshot

    def json(self) -> dict[str, Any]:
        snap = {"per_gb_month": self.snapshot.per_gb_month, "source": self.snapshot.source} if self.snapshot else None
        return {"stack": self.stack, "as_of": self.now.isoformat(), "jobs": [job_json(c) for c in self.costed],
                "total": total_json(self.costed), "snapshot_price": snap, "notes": self.notes}


def report(cfg: StackConfig, stack: str, jobs: Iterable[Job], events: Mapping[str, Iterable[Any]], now: datetime,
           lookup: Lookup | None = None) -> Report:
    """The cost report of ``jobs`` from their recorded ``events`` (by job id) as of ``now`` (later
    events are left out).
    ``lookup`` asks the cloud's price APIs for machine types the stack file and table lack."""
    ledgers = [job_ledger(job, [e for e in events.get(job.id, []) if e.time <= now], now) for job in jobs]
    prices, notes = resolve(cfg, [t for led in ledgers for t in led.machine_types], lookup)
    snapshot = snapshot_price(cfg.cloud, cfg.region)
    if snapshot is None and any(led.moves for led in ledgers):
        notes.append(f"no snapshot storage price for {cfg.cloud} {cfg.region}: the moves' snapshot storage is not priced")
    return Report(stack, [cost_job(led, prices.get, snapshot) for led in ledgers], notes, now, snapshot)
