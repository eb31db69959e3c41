"""Cloud limits a stack file's values break by themselves (tags, spot-only and Hyperdisk-only machine
types), each naming the stack key to change; ``infra.config`` runs :func:`config_problems` on every load.
Those that need the stack's name or its rendered scripts are ``infra.stack_limits``.

The rules and their sources live in the contract tables (``infra/contract/``); the contract checks every
declared resource again at registration. Here the same limits are read back onto the stack file.
"""

from __future__ import annotations

from typing import Any

from infra.basics import Capacity
from infra.contract import get


def config_problems(cfg: Any, out: list[tuple[str, str]]) -> None:
    """(key, message) for the limits a stack file breaks by itself (no stack name, no rendering)."""
    from infra.contract import aws as aws_rules
    from infra.contract import gcp as gcp_rules

    if cfg.cloud == "aws":
        out += [("labels" if key == "" else f"labels.{key}", msg) for key, msg in aws_rules.tag_problems(cfg.labels)]
        return
    items = [(f"pools[{i}]", p.machine_type, "pool") for i, p in enumerate(cfg.pools)]
    items += [(f"jobs[{i}]", j.machine_type, "job") for i, j in enumerate(cfg.jobs)]
    for key, machine, _ in items:
        if machine and (why := gcp_rules.hyperdisk_only(machine)):
            out.append((f"{key}.machineType", why))
    for i, pool in enumerate(cfg.pools):
        if pool.machine_type and gcp_rules.spot_only(pool.machine_type):
            if pool.on_demand:
                out.append((f"pools[{i}].onDemand", _spot_only(pool.machine_type, "set onDemand: 0 (spot VMs only)")))
            elif pool.fallback_to_on_demand is not None:
                out.append((f"pools[{i}].fallbackToOnDemand", _spot_only(pool.machine_type, "remove fallbackToOnDemand")))
    for i, job in enumerate(cfg.jobs):
        if job.machine_type and gcp_rules.spot_only(job.machine_type):
            if job.capacity is Capacity.ON_DEMAND:
                out.append((f"jobs[{i}].capacity", _spot_only(job.machine_type, "use capacity: spot, or a3-highgpu-8g for on-demand")))
            elif job.policy == "on-demand":
                out.append((f"jobs[{i}].policy", _spot_only(job.machine_type, "pick a policy that stays on spot")))


def _spot_only(machine: str, fix: str) -> str:
    r = get("gcp.a3-high-spot-only")
    return f"{machine} runs only as a Spot (or Flex-start) VM, never on-demand: {fix} ({r.id}; {r.source})"
