"""Where a machine type's prices come from, in this order (the report names the source of each):

1. ``spotctl:prices`` in the stack file (``{<type>: {spot, onDemand}}``, validated in
   ``infra/config/``): what the team really pays wins.
2. The shipped table ``prices.json``: public list prices with their source and date, refreshed by
   ``tools/refresh_prices.py`` (AWS from SkyPilot's catalog; GCP machine types as the sum of their
   Cloud Billing Catalog SKUs from Cyclenerd's pricing.yml; see there).
3. The cloud's own price APIs (``cli.cloud``: EC2 spot price history + the AWS Price List; GCP's
   Cloud Billing Catalog SKUs for the machine type's vCPUs, memory and GPUs), asked only for the
   types still missing, and only when the caller passes the lookup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from cli.cost.ledger import Price, SnapshotPrice

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    from infra.config import StackConfig

TABLE = Path(__file__).with_name("prices.json")

# types -> {type: (spot, on-demand, source)}; raises cli.cloud.CloudError
Lookup = Callable[[list[str]], dict[str, tuple[float, float, str]]]


@cache
def shipped_table() -> dict:
    return json.loads(TABLE.read_text())


def stack_price(cfg: StackConfig, machine_type: str) -> Price | None:
    p = cfg.prices.get(machine_type)
    return Price(p.spot, p.on_demand, "stack file (spotctl:prices)") if p else None


def table_price(cloud: str, region: str, machine_type: str) -> Price | None:
    entry = shipped_table().get(cloud, {}).get(region, {}).get(machine_type)
    if not entry:
        return None
    return Price(float(entry["spot"]), float(entry["onDemand"]), f"shipped table, {entry['date']}: {entry['source']}")


def snapshot_price(cloud: str, region: str) -> SnapshotPrice | None:
    """Snapshot storage per GB-month in ``region`` from the shipped table (``snapshotStorage``), or None."""
    entry = shipped_table().get("snapshotStorage", {}).get(cloud, {}).get(region)
    if not entry:
        return None
    return SnapshotPrice(float(entry["perGbMonth"]),
                         f"shipped table, {entry['date']}: {entry['source']}; location {entry['location']}")


def offline_price(cfg: StackConfig, machine_type: str, region: str | None = None) -> Price | None:
    """The stack file's price, else the shipped table's (no cloud call)."""
    return stack_price(cfg, machine_type) or table_price(cfg.cloud, region or cfg.region, machine_type)


def resolve(cfg: StackConfig, machine_types: Iterable[str], lookup: Lookup | None = None) -> tuple[dict[str, Price | None], list[str]]:
    """Prices of ``machine_types`` and notes on what could not be priced (e.g. the API's error).
    ``lookup`` asks the cloud for the types neither the stack file nor the table knows."""
    from cli.cloud import CloudError

    found: dict[str, Price | None] = {t: offline_price(cfg, t) for t in sorted(set(machine_types)) if t}
    missing = [t for t, p in found.items() if p is None]
    notes = []
    if missing and lookup is not None:
        try:
            for t, (spot, od, source) in lookup(missing).items():
                found[t] = Price(spot, od, source)
        except CloudError as exc:
            notes.append(f"cloud price API not used: {exc}")
    still = [t for t, p in found.items() if p is None]
    if still:
        notes.append(f"no price for {', '.join(still)}: add them to spotctl:prices in the stack file")
    return found, notes


def price_ratio(cfg: StackConfig, machine_type: str, region: str | None = None) -> float | None:
    """Spot price / on-demand price of a machine type (stack file, else the shipped table), or None.

    For policies that weigh spot against on-demand (the ``C/R`` of the policy engine): offline,
    no cloud call."""
    p = offline_price(cfg, machine_type, region)
    return p.spot / p.on_demand if p and p.on_demand > 0 else None
