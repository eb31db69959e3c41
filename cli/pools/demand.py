"""Pool demand -> the metrics the pool's autoscalers follow (observe -> decide -> act).

``demand`` is the VMs the pool's scheduler wants: work running plus work waiting. The on-demand
base holds its size, so the spot part is asked for the rest (``spot_demand``, 0..spotMax). With
``fallbackToOnDemand: M`` the spot VMs actually running are observed too: ``unmet`` is the spot
demand they do not cover, and once it has stayed above zero for M minutes (read back from the
cloud's own history of ``unmet``) the fallback part is asked for the smallest shortfall of that
window (``fallback_demand``); when spot returns, the shortfall drops and so does the fallback.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from infra.config import Pool, StackConfig
from infra.naming import stack_slug


class PoolError(Exception):
    """A pool command cannot go on; ``str()`` names the pool and what is wrong."""


@dataclass(frozen=True)
class Demand:
    """What one publication says; each field but ``reason`` is a pool metric (infra.naming.POOL_METRICS)."""

    demand: int
    spot_demand: int
    unmet: int | None  # None: not observed (no fallback part: nothing reads it)
    fallback_demand: int | None
    reason: str

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items() if k != "reason" and v is not None}


def find_pool(cfg: StackConfig, name: str) -> Pool:
    for pool in cfg.pools:
        if pool.name == name:
            return pool
    import difflib

    names = [p.name for p in cfg.pools]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise PoolError(f"pool {name!r} is not declared; pools: {', '.join(names) or 'none'}{hint}")


def groups(cfg: StackConfig, stack: str, pool: Pool) -> dict[str, str]:
    """The cloud's groups of a pool, as ``infra`` names them: AWS {"asg", "fallback"} -> ASG name
    (the mixed group holds on-demand base and spot); GCP {part} -> MIG name."""
    base = f"{stack_slug(stack)}-{pool.name}"
    fallback = pool.fallback_to_on_demand is not None and pool.spot_max > 0
    if cfg.cloud == "aws":
        return {"asg": base, **({"fallback": f"{base}-fallback"} if fallback else {})}
    parts = (["ondemand"] if pool.on_demand else []) + (["spot"] if pool.spot_max else []) + (["fallback"] if fallback else [])
    return {part: f"{base}-{part}" for part in parts}


def fallback_size(minutes: int, unmet_now: int, history: list[tuple[datetime, float]], now: datetime) -> int:
    """On-demand VMs to stand in for spot: the smallest shortfall of the last ``minutes``, once the
    shortfall has lasted that long without a break (``history``: earlier ``unmet`` points, any order)."""
    if unmet_now <= 0:
        return 0
    window_start = now - timedelta(minutes=minutes)
    streak_start, lowest = now, unmet_now
    for at, value in sorted(history, reverse=True):
        if at > now:
            continue
        if value <= 0:
            break
        streak_start = at
        if at >= window_start:
            lowest = min(lowest, math.ceil(value))
    return lowest if streak_start <= window_start else 0


def decide(pool: Pool, demand: int, now: datetime, spot_running: int | None = None,
           unmet_history: list[tuple[datetime, float]] | None = None) -> Demand:
    """The metrics for ``demand`` (pure). ``spot_running`` and ``unmet_history`` only matter with a fallback."""
    if demand < 0:
        raise PoolError(f"pool {pool.name}: demand must be >= 0, got {demand}")
    spot = min(max(demand - pool.on_demand, 0), pool.spot_max)
    why = f"{demand} wanted: {min(demand, pool.on_demand)} on the on-demand base, {spot} on spot (spotMax {pool.spot_max})"
    if pool.fallback_to_on_demand is None or spot_running is None:
        return Demand(demand, spot, None, None, why)
    unmet = max(spot - spot_running, 0)
    fallback = fallback_size(pool.fallback_to_on_demand, unmet, unmet_history or [], now)
    if fallback:
        why += f"; spot short by {unmet} for {pool.fallback_to_on_demand}+ min: {fallback} on-demand fallback"
    elif unmet:
        why += f"; spot short by {unmet} (fallback after {pool.fallback_to_on_demand} min of shortage)"
    return Demand(demand, spot, unmet, fallback, why)


def publish(cloud, cfg: StackConfig, stack: str, pool_name: str, demand: int, now: datetime) -> Demand:
    """Observe (only with a fallback: spot VMs running, the shortage's history), decide, publish."""
    pool = find_pool(cfg, pool_name)
    if pool.spot_max == 0:
        raise PoolError(f"pool {pool_name}: spotMax is 0, nothing scales on demand (the on-demand base holds its size)")
    decision = decide(pool, demand, now)
    if pool.fallback_to_on_demand is not None:
        since = now - timedelta(minutes=pool.fallback_to_on_demand + 2)
        view = cloud.view(pool_name, groups(cfg, stack, pool), since, now)
        running = sum(1 for vm in view.vms if vm.part == "spot" and vm.status in ("InService", "RUNNING"))
        decision = decide(pool, demand, now, running, cloud.history(pool_name, "unmet", since, now))
    cloud.publish(pool_name, decision.metrics(), now)
    return decision
