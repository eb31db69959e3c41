"""A pool as the cloud sees it: each part's target and VMs, the demand last published, VMs by
zone and type, busy/idle, and recent preemptions (``spotctl pool status``)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from cli.pools.demand import find_pool, groups
from infra.config import StackConfig

RECENT = timedelta(hours=24)


def status(cloud, cfg: StackConfig, stack: str, pool_name: str, now: datetime) -> dict:
    """Plain data for the table and ``--json``."""
    pool = find_pool(cfg, pool_name)
    view = cloud.view(pool_name, groups(cfg, stack, pool), now - RECENT, now)
    targets = dict(view.targets)
    if "asg" in targets:  # AWS: one mixed group holds the on-demand base and the spot part above it
        desired = targets.pop("asg")
        targets["ondemand"] = min(desired, pool.on_demand)
        targets["spot"] = max(desired - pool.on_demand, 0)
    parts = {}
    for part in ("ondemand", "spot", "fallback"):
        vms = [vm for vm in view.vms if vm.part == part]
        if part in targets or vms:
            parts[part] = {"target": targets.get(part, 0), "vms": len(vms)}
    by_zone: dict[str, Counter] = {}
    for vm in view.vms:
        by_zone.setdefault(vm.zone, Counter())[vm.machine_type] += 1
    known = [vm for vm in view.vms if vm.busy is not None]
    return {
        "pool": pool.name,
        "cloud": cfg.cloud,
        "config": {"onDemand": pool.on_demand, "spotMin": pool.spot_min, "spotMax": pool.spot_max,
                   "fallbackToOnDemand": pool.fallback_to_on_demand},
        "parts": parts,
        "metrics": view.metrics,
        "zones": {zone: dict(sorted(types.items())) for zone, types in sorted(by_zone.items())},
        "busy": sum(1 for vm in known if vm.busy) if known else None,
        "idle": sum(1 for vm in known if not vm.busy) if known else None,
        "vms": [{"name": vm.name, "part": vm.part, "zone": vm.zone, "type": vm.machine_type, "status": vm.status,
                 "busy": vm.busy} for vm in sorted(view.vms, key=lambda v: (v.part, v.zone, v.name))],
        "preemptions": view.preemptions,
    }
